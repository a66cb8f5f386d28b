"""Config drawing, failure memory and shrinking, on a cheap in-process property.

The matrix tests shrink a real scenario failure in a real cell; these pin down the Hypothesis
mechanics those rely on: the same seed gives the same draws, the shrinker replays the draw to
reach the failing config, and a shrunk failure saved in the database is drawn first next time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import strategies as st

from harness.define.profile import load_profile
from harness.define.registry import discover
from harness.execution.shrink import shrink
from harness.planning.draws import (
    HYPOTHESIS_PROFILES,
    DrawPlan,
    config_id,
    draw_configs,
    plan_configs,
    remembered_configs,
)
from harness.planning.plan import draw_configs as plan_draw_configs
from tests.conftest import REPO_ROOT

STRATEGY = st.fixed_dictionaries(
    {
        "r": st.integers(1, 64),
        "dtype": st.sampled_from(["float32", "bfloat16"]),
        "layers": st.integers(1, 8),
        "dora": st.booleans(),
    }
)


def fails(config: dict) -> str | None:
    """A stand-in for a cell: DoRA in bf16 with r >= 8 fails; more layers change nothing."""
    if config["dora"] and config["dtype"] == "bfloat16" and config["r"] >= 8:
        return "checkpoint-recompute-dtype"
    return None


DRAW_IN_A_NEW_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.test_draws import STRATEGY
from harness.planning.draws import DrawPlan, draw_configs
print(json.dumps(draw_configs(STRATEGY, DrawPlan(seed=123, max_examples=20, count=5))))
"""


def test_same_seed_same_configs() -> None:
    """The same seed draws the same configs in another process (another hash seed: a cell of a Slurm array, a
    resumed run), and another seed draws others: the draws come from the seed, not from the process."""
    plan = DrawPlan(seed=123, max_examples=20, count=5)
    here = draw_configs(STRATEGY, plan)
    env = os.environ | {"PYTHONHASHSEED": "4242"}
    proc = subprocess.run(
        [sys.executable, "-c", DRAW_IN_A_NEW_PROCESS, str(REPO_ROOT)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == here
    assert len({config_id(c) for c in here}) == 5
    assert draw_configs(STRATEGY, DrawPlan(seed=124, max_examples=20, count=5)) != here


def test_scenario_seed_does_not_depend_on_the_selection() -> None:
    """A scenario gets the same configs whether a run selects it alone or with others (in any order), and two
    scenarios of one run get different seeds."""
    profile = load_profile("ci", REPO_ROOT / "matrix")
    by_id = {s.id: s for s in discover()}
    s2, s3 = by_id["S2-qlora-grad-flags"], next(s for i, s in by_id.items() if i.startswith("S3"))
    hypothesis = HYPOTHESIS_PROFILES["ci"]
    alone, _ = plan_draw_configs(profile, [s2], hypothesis, None, None)
    together, how = plan_draw_configs(profile, [s3, s2], hypothesis, None, None)
    assert alone[s2.id] == together[s2.id] and len(alone[s2.id]) >= 3
    assert how[s2.id]["seed"] != how[s3.id]["seed"]


def test_seed_examples_keeps_the_first_of_a_scenarios_own_examples() -> None:
    """The ci profile's S7 runs its first seed example only (`seed_examples = 1`, `examples = 0`); another
    profile without the key runs all of them."""
    ci = load_profile("ci", REPO_ROOT / "matrix")
    history = load_profile("history", REPO_ROOT / "matrix")
    s7 = next(s for s in discover() if s.id.startswith("S7"))
    hypothesis = HYPOTHESIS_PROFILES["ci"]
    in_ci, _ = plan_draw_configs(ci, [s7], hypothesis, None, None)
    assert [p["config"] for p in in_ci[s7.id]] == s7.examples()[:1]
    everywhere, _ = plan_draw_configs(history, [s7], hypothesis, 0, None)
    assert [p["config"] for p in everywhere[s7.id]] == s7.examples() and len(s7.examples()) > 1


def test_examples_run_first_and_a_drawn_duplicate_is_noted() -> None:
    example = {"r": 16, "dtype": "float32", "layers": 1, "dora": False}
    plan = DrawPlan(seed=1, max_examples=12, count=3)
    drawn = draw_configs(STRATEGY, plan)
    planned = plan_configs([example, example, drawn[0]], [], STRATEGY, plan)
    assert planned[0] == {"config": example, "config_id": config_id(example), "source": "example"}
    assert len({p["config_id"] for p in planned}) == len(planned)
    assert planned[1]["also_from"] == ["hypothesis"]


def test_every_scenario_draws_json_configs() -> None:
    for scenario in discover():
        for config in draw_configs(scenario.strategy(), DrawPlan(7, 12, 3)) + scenario.examples():
            assert json.loads(json.dumps(config)) == config, scenario.id


def test_shrink_reaches_the_drawn_failure_and_keeps_its_signature(tmp_path: Path) -> None:
    plan = DrawPlan(seed=5, max_examples=200, count=50)
    failing = [c for c in draw_configs(STRATEGY, plan) if fails(c)]
    original = max(failing, key=lambda c: (c["r"], c["layers"]))
    calls: list[dict] = []

    def observe(config: dict) -> str | None:
        calls.append(config)
        return fails(config)

    result = shrink(STRATEGY, plan, original, "checkpoint-recompute-dtype", observe, max_seconds=60, max_runs=500)
    assert result.reached and not result.budget_spent
    assert fails(result.minimal) == "checkpoint-recompute-dtype"
    assert result.minimal["r"] == 8 and result.minimal["layers"] == 1  # the smallest that still fails
    assert result.runs == len(calls) <= 500


def test_shrink_budget_stops_the_search() -> None:
    plan = DrawPlan(seed=5, max_examples=200, count=50)
    original = next(c for c in draw_configs(STRATEGY, plan) if fails(c))
    result = shrink(STRATEGY, plan, original, "checkpoint-recompute-dtype", fails, max_seconds=60, max_runs=2)
    assert result.budget_spent and result.runs == 2
    assert fails(result.minimal) == "checkpoint-recompute-dtype"


def test_a_shrunk_failure_is_remembered_and_drawn_first(tmp_path: Path) -> None:
    from harness.planning.draws import ScenarioDatabase

    plan = DrawPlan(seed=5, max_examples=200, count=50)
    original = next(c for c in draw_configs(STRATEGY, plan) if fails(c))
    db_path = tmp_path / "db"
    result = shrink(
        STRATEGY,
        plan,
        original,
        "sig",
        lambda c: "sig" if fails(c) else None,
        max_seconds=60,
        max_runs=500,
        database=ScenarioDatabase(db_path, "S9-toy"),
    )
    remembered = remembered_configs(STRATEGY, plan, db_path, "S9-toy")
    assert remembered and remembered[0] == result.minimal
    assert remembered_configs(STRATEGY, plan, db_path, "S8-other") == []  # scenarios do not share memory
    planned = plan_configs([], [], STRATEGY, DrawPlan(5, 8, 2), remembered)
    assert planned[0]["source"] == "memory"
