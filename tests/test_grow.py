"""`compat-matrix grow`, the session habit (issue 77): a day is added only where a release is newer than the newest
atlas day, a growth cut short is resumed first, a release already moved onto the newest day is not run again, the
new day pairs that change a target outcome are the flips it probes, and the growth's summary is made in a fresh
process. Time passes as in tests/test_atlas_keeps_up.py: an index served here, COMPAT_MATRIX_TODAY set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.define.profile import load_profile
from harness.paths import MATRIX_DIR, REPO_ROOT
from harness.tools.growth import atlas_growth, grow
from tests.test_atlas_keeps_up import index, write_atlas_run  # noqa: F401 (the served index is a fixture)

STACK = {"torch": "2.15.0", "transformers": "5.24.0", "peft": "0.21.2", "accelerate": "1.15.0",
         "deepspeed": "0.19.8", "bitsandbytes": "0.50.2"}  # fmt: skip
DAYS = ["2024-02-29", "2024-03-22", "2026-11-24"]


def _grow_plan(results: Path, today: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "grow", "--plan", "--results-dir", str(results)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
        env={**__import__("os").environ, atlas_growth.TODAY_VAR: today},
    )  # fmt: skip


def test_a_day_is_grown_only_where_a_release_is_newer_than_the_newest_day(
    tmp_path: Path,
    index: str,  # noqa: F811
) -> None:
    """The served index has transformers 5.25.0 (uploaded 2026-12-01) and peft 0.22.0 (2026-11-30) after the newest
    day 2026-11-24. On 2026-11-25 nothing is newer: today is no install day, nothing runs. On 2026-12-02 both are:
    today's day and the new peft minor's day run for every scenario."""
    history = load_profile("history", MATRIX_DIR)
    scenarios = atlas_growth.runnable_scenarios(history)
    write_atlas_run(tmp_path, "history-20261124T000000Z-aaaa", DAYS, scenarios, STACK)
    quiet = _grow_plan(tmp_path, "2026-11-25")
    assert quiet.returncode == 0, quiet.stderr
    assert "the newest day of history is 2026-11-24; releases of the six packages since: none" in quiet.stdout
    assert "no release of the six packages between the newest day (2026-11-24) and today" in quiet.stdout
    assert "grow: nothing to grow on 2026-11-25" in quiet.stdout and "would run" not in quiet.stdout
    busy = _grow_plan(tmp_path, "2026-12-02")
    assert "since: peft 0.22.0 (2026-11-30), transformers 5.25.0 (2026-12-01)" in busy.stdout, busy.stdout
    assert f"would run 2026-12-01, 2026-12-02 for {len(scenarios)} scenario(s)" in busy.stdout
    # A release uploaded today (peft 0.22.0 on 2026-11-30) is not in today's stack (the index as of today's start):
    # today is no install day, the watch moves the release alone onto the newest day instead.
    days, why = atlas_growth.days_to_grow(history, tmp_path, __import__("datetime").date(2026, 11, 30), True)
    assert days == DAYS[:2] and why.startswith("no release of the six packages between"), (days, why)


def test_a_growth_cut_short_is_resumed_before_anything_new(tmp_path: Path, index: str) -> None:  # noqa: F811
    history = load_profile("history", MATRIX_DIR)
    scenarios = atlas_growth.runnable_scenarios(history)
    write_atlas_run(tmp_path, "history-20261124T000000Z-aaaa", DAYS, scenarios, STACK)
    write_atlas_run(tmp_path, "history-20261202T000000Z-cut1", ["2026-12-02"], scenarios[:2], STACK)
    meta = tmp_path / "runs" / "history-20261202T000000Z-cut1" / "meta.json"
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"status": "running"}))  # its writer is gone
    assert atlas_growth.unfinished_runs(tmp_path, "history") == (["history-20261202T000000Z-cut1"], [])
    planned = _grow_plan(tmp_path, "2026-12-02")
    lines = planned.stdout.splitlines()
    assert "grow: would resume history-20261202T000000Z-cut1 (it did not finish)" in lines, planned.stdout
    assert lines.index("grow: would resume history-20261202T000000Z-cut1 (it did not finish)") < next(
        i for i, line in enumerate(lines) if "would run" in line
    )


def test_the_growth_summary_is_made_in_a_fresh_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The code under a long growth may change before its summary: the summary imports nothing into the growth's
    process (here the module cannot be imported in it at all, as an edited tree's could not be)."""
    write_atlas_run(tmp_path, "history-20261124T000000Z-aaaa", DAYS, ["S3-lora-sgd-scaling"], STACK)
    monkeypatch.setitem(sys.modules, "harness.publishing.growth", None)
    with pytest.raises(ImportError):
        __import__("harness.publishing.growth")
    text = atlas_growth.growth_summary(tmp_path, "history")
    assert text.startswith("## The newest day of history (2026-11-24)"), text
    assert "S3-lora-sgd-scaling: 2026-11-24 against 2024-03-22" in text


def test_a_release_already_moved_onto_the_newest_day_is_not_run_again(tmp_path: Path) -> None:
    out_root = tmp_path / "watch"
    done = atlas_growth.Watched("transformers", "5.25.0", "2026-12-01", "2026-11-24", "history-x", {}, "no change")
    cut = atlas_growth.Watched("peft", "0.22.0", "2026-11-30", "2026-11-24", "history-y", {}, "no change")
    atlas_growth.write_watch(
        out_root / "2026-12-02", [done, cut], "2026-11-24", __import__("datetime").date(2026, 12, 2)
    )
    for item, status in ((done, "complete"), (cut, "interrupted")):
        run = out_root / "2026-12-02" / f"{item.package}-{item.version}" / "runs" / str(item.run_id)
        run.mkdir(parents=True)
        (run / "meta.json").write_text(json.dumps({"run_id": item.run_id, "status": status}))
    found = atlas_growth.watched_before(out_root, "2026-11-24")
    assert list(found) == [("transformers", "5.25.0")] and found[("transformers", "5.25.0")].summary == "no change"
    assert atlas_growth.watched_before(out_root, "2026-12-02") == {}  # another newest day: everything runs


def _records(run: Path, day: str, scenario: str, outcome: str, signature: str | None, config: str) -> None:
    path = run / "records.jsonl"
    record = {"run_id": run.name, "cell": f"era_date-{day}", "scenario": scenario, "variant": "baseline",
              "config_id": config, "config": {}, "outcome": outcome, "signature": signature,
              "pins": {"date": day}, "versions": STACK, "hardware": {"device": "cpu", "world_size": 1},
              "metrics": {}, "started_at": run.name}  # fmt: skip
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def test_the_flips_it_probes_are_the_new_day_pairs_no_flips_file_holds(tmp_path: Path) -> None:
    """S5's target shows on the grown day and not before: a new flip, whose runs are named with the one whose flips
    are filed first. Once a flips.json holds it, it is not probed again; an old flip of an older pair never is."""
    scenario, target = "S5-dora-memory", "check-dora_layer_output_dtype"
    old = tmp_path / "runs" / "history-20261124T000000Z-aaaa"
    new = tmp_path / "runs" / "history-20261202T000000Z-bbbb"
    for run in (old, new):
        run.mkdir(parents=True)
        (run / "meta.json").write_text(json.dumps({"run_id": run.name, "profile": "history", "status": "complete",
                                                   "started_at": run.name}))  # fmt: skip
    _records(old, "2024-02-29", scenario, "pass", None, "c1")
    _records(old, "2024-03-22", scenario, "fail", target, "c1")  # an old onset
    _records(old, "2026-11-24", scenario, "pass", None, "c1")  # ... and its end, both before this growth
    _records(new, "2026-12-02", scenario, "fail", target, "c1")  # the grown day: a new onset
    (tmp_path / "flips" / old.name).mkdir(parents=True)
    (tmp_path / "flips" / old.name / "flips.json").write_text("[]")
    found = grow.new_flips(tmp_path, "history", since="2026-11-24")
    assert [(f.scenario, f.older, f.newer) for f in found] == [(scenario, "2026-11-24", "2026-12-02")]
    assert grow.pair_runs(tmp_path, "history", scenario, ("2026-11-24", "2026-12-02")) == [old.name, new.name]
    filed = [{"scenario": scenario, "older": "2026-11-24", "newer": "2026-12-02"}]
    (tmp_path / "flips" / old.name / "flips.json").write_text(json.dumps(filed))
    assert grow.new_flips(tmp_path, "history", since="2026-11-24") == []
