"""Which records the table shows when several runs measured the same cells: the newest per (cell, scenario), and
for a run made with `--config`, the newest per config it ran (a new config on every day hides nothing else)."""

from __future__ import annotations

from harness.knowledge.selection import config_slices, newest_per_pair


def _record(run: str, config: str, outcome: str) -> dict:
    return {"run_id": run, "cell": "era_date-2024-02-29", "scenario": "S9-identity-merge", "config_id": config,
            "outcome": outcome}  # fmt: skip


def test_a_config_slice_updates_its_config_and_hides_no_other() -> None:
    whole = [_record("old", "lora", "pass"), _record("old", "dora", "pass"), _record("old", "qlora", "fail")]
    sliced = [_record("new", "qlora", "pass")]
    metas = {"old": {"attempts": [{"slice": None}]}, "new": {"attempts": [{"slice": {"config_ids": ["qlora"]}}]}}
    assert config_slices(metas) == {"new"}
    shown = {run: (fresh, hidden) for run, fresh, hidden in newest_per_pair([("new", sliced), ("old", whole)],
                                                                          config_slices(metas))}  # fmt: skip
    assert [r["config_id"] for r in shown["old"][0]] == ["lora", "dora"]  # still shown
    assert [r["config_id"] for r in shown["old"][1]] == ["qlora"]  # the newer slice measured it again
    # A whole run of the scenario on the cell hides every older record of it, as before.
    hidden = {run: h for run, _, h in newest_per_pair([("new", sliced), ("old", whole)])}
    assert len(hidden["old"]) == 3
