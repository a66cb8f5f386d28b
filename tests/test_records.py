"""Records: durable appends, truncated-line repair, de-duplication, and the documented schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

from harness.recording.records import SCHEMA_PATH, RecordWriter, merge, read_records, record_key


def make(cell: str = "c", variant: str = "baseline", config_id: str = "0123456789", outcome: str = "pass") -> dict:
    return {
        "record_version": 1,
        "run_id": "cpu-1",
        "cell": cell,
        "scenario": "S3-x",
        "variant": variant,
        "config": {"r": 1},
        "config_id": config_id,
        "outcome": outcome,
        "signature": None if outcome == "pass" else "sig",
        "known_issue": [],
        "message": "",
        "metrics": {},
        "versions": {"python": "3.11.7"},
        "hardware": {"device": "cpu", "gpu_name": None, "gpu_count": 0, "world_size": 1},
        "duration_s": 0.1,
        "started_at": "2026-11-21T00:00:00+00:00",
    }


def test_schema_accepts_a_record_and_rejects_a_broken_one() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.validate(make(), schema)
    jsonschema.validate(make(outcome="fail"), schema)
    bad = make(outcome="fail") | {"signature": None}
    try:
        jsonschema.validate(bad, schema)
    except jsonschema.ValidationError:
        return
    raise AssertionError("a failing record without a signature must not validate")


def test_append_skips_duplicates_across_writers(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        assert writer.append(make())
        assert not writer.append(make())
    with RecordWriter(path) as writer:  # a resumed run
        assert not writer.append(make())
        assert writer.append(make(variant="fix"))
    assert len(read_records(path)) == 2


def test_truncated_last_line_is_repaired(tmp_path: Path, capsys) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        writer.append(make())
    with open(path, "a") as handle:
        handle.write('{"cell": "c", "scen')  # killed mid-write
    with RecordWriter(path) as writer:
        writer.append(make(variant="fix"))
    records = read_records(path)
    assert [r["variant"] for r in records] == ["baseline", "fix"]
    assert "truncated" in capsys.readouterr().err


records_strategy = st.lists(
    st.builds(
        make,
        st.sampled_from("ab"),
        st.sampled_from(["baseline", "f"]),
        st.sampled_from(["0" * 10, "1" * 10]),
        st.sampled_from(["pass", "fail"]),
    ),
    max_size=12,
)


@given(records_strategy, records_strategy)
def test_merge_is_idempotent_and_keeps_conflicts(a: list[dict], b: list[dict]) -> None:
    once = merge([a, b])
    assert merge([once, once]) == once
    assert merge([once, a, b]) == once
    keys_with_outcomes = {(record_key(r), r["outcome"]) for r in a + b}
    assert {(record_key(r), r["outcome"]) for r in once} == keys_with_outcomes
