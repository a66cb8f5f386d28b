"""Config drawing: the same seed gives the same configs, so every cell of a run sees the same ones."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from harness.draws import config_id, draw_configs, plan_configs
from harness.registry import discover

STRATEGY = st.fixed_dictionaries({"r": st.integers(1, 64), "dtype": st.sampled_from(["float32", "bfloat16"])})


def test_same_seed_same_configs() -> None:
    assert draw_configs(STRATEGY, 5, 123) == draw_configs(STRATEGY, 5, 123)
    assert len({config_id(c) for c in draw_configs(STRATEGY, 5, 123)}) == 5


def test_examples_run_first_and_are_not_duplicated() -> None:
    example = {"r": 16, "dtype": "float32"}
    planned = plan_configs([example, example], [], STRATEGY, 3, 1)
    assert planned[0] == {"config": example, "config_id": config_id(example), "source": "example"}
    assert len({p["config_id"] for p in planned}) == len(planned)


def test_every_scenario_draws_json_configs() -> None:
    for scenario in discover():
        for config in draw_configs(scenario.strategy(), 3, 7) + scenario.examples():
            assert json.loads(json.dumps(config)) == config, scenario.id
