"""`lookup --measure`: releases no record holds are built here over the nearest atlas day's stack, the scenario's seed
configs really run, the run is recorded under results/measured/, and the answer comes from its records at exactly
those releases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.recording.records import read_records
from harness.tools.answers.lookup import lookup

pytestmark = pytest.mark.matrix

DAY = "2026-11-27"
STACK = {"torch": "2.13.0", "transformers": "5.24.0", "peft": "0.21.2", "accelerate": "1.15.0"}


def _table(results: Path) -> None:
    """A table of one CPU atlas day (S9's one-batch identity passes there), as a dated run writes it."""
    run = results / "runs" / "history-t"
    run.mkdir(parents=True)
    record = {
        "cell": f"era_date-{DAY}", "pins": {"date": DAY}, "scenario": "S9-identity-batch-loss", "variant": "baseline",
        "config": {"adapter": "lora"}, "config_id": "c0", "outcome": "pass", "signature": None, "run_id": "history-t",
        "versions": STACK, "hardware": {"device": "cpu", "world_size": 1},
    }  # fmt: skip
    (run / "records.jsonl").write_text(json.dumps(record) + "\n")
    meta = {"run_id": "history-t", "profile": "history", "started_at": f"{DAY}T00:00:00Z",
            "attempts": [{"status": "complete"}]}  # fmt: skip
    (run / "meta.json").write_text(json.dumps(meta))


def test_a_release_no_record_holds_is_measured_and_answered_from_its_own_row(tmp_path: Path) -> None:
    _table(tmp_path)
    before = lookup(tmp_path, ["peft==0.21.1"], ["S9-identity-batch-loss"], None)
    assert "at these releases: no record" in before, before
    assert "--measure" in before  # the way to measure them is offered
    answer = lookup(tmp_path, ["peft==0.21.1"], ["S9-identity-batch-loss"], None, measure=True)
    assert answer.startswith("recorded: "), answer
    body = answer.split("\n\n", 1)[1]
    assert "at these releases: the target shows on" in body and "no record" not in body, body
    [run_dir] = [m.parent for m in (tmp_path / "measured").glob("*/runs/*/meta.json")]
    records = read_records(run_dir / "records.jsonl")
    assert {r["versions"]["peft"] for r in records} == {"0.21.1"}
    assert {r["versions"]["transformers"] for r in records} == {"5.24.0"}  # the day's other packages, held
    assert {r["config_id"] for r in records if r["variant"] == "baseline"} >= {"6827e2abe2", "b41ffad3bb"}
    assert all(r["outcome"] in ("pass", "fail") for r in records if r["variant"] == "baseline")
    assert "S9-identity-batch-loss:" in body
    # Asked again, the recorded run answers at once: nothing is built twice.
    again = lookup(tmp_path, ["peft==0.21.1"], ["S9-identity-batch-loss"], None, measure=True)
    assert again == body and len(list((tmp_path / "measured").glob("*/runs/*/meta.json"))) == 1
