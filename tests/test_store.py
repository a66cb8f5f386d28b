"""One store: a report reads each results file once, whatever views ask for it (issue 76)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from harness.recording import records as records_module
from tests.test_report import rec, write_run

SCENARIO = "S3-lora-sgd-scaling"


def results_with_probes(root: Path) -> list[Path]:
    """Two runs of one profile (the older one's records partly hidden by the newer), a flips.json, and a probe run
    under flips/: every kind of record file a report reads. Returns the record files."""
    write_run(root, "cpu-1", "cpu", "1", [rec("cpu-1", "a", SCENARIO, "pass"), rec("cpu-1", "b", SCENARIO, "pass")])
    write_run(root, "cpu-2", "cpu", "2", [rec("cpu-2", "a", SCENARIO, "fail", sig="s")])
    (root / "flips" / "cpu-2").mkdir(parents=True)
    (root / "flips" / "cpu-2" / "flips.json").write_text("[]")
    write_run(root / "flips" / "cpu-2", "probe-1", "probe", "3", [rec("probe-1", "p", SCENARIO, "pass")])
    return sorted(root.rglob("records.jsonl"))


def test_a_report_reads_each_record_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.publishing.stage import write_report

    files = results_with_probes(tmp_path)
    opened: Counter[str] = Counter()
    real = records_module.open_records

    def counting(path: Path):  # type: ignore[no-untyped-def]
        opened[str(path.resolve())] += 1
        return real(path)

    monkeypatch.setattr(records_module, "open_records", counting)
    write_report(tmp_path, None, None)
    assert set(opened) == {str(f.resolve()) for f in files}, "every record file is read (the probe's too)"
    assert max(opened.values()) == 1, opened
    document = json.loads((tmp_path / "matrix.json").read_text())
    assert {e["cell"] for e in document["entries"]} == {"a", "b"}, "the older run's hidden entry stays hidden"


def test_the_count_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stores read the same file twice: the count above would see a second reader."""
    from harness.knowledge.store import Store

    results_with_probes(tmp_path)
    opened: Counter[str] = Counter()
    real = records_module.open_records
    monkeypatch.setattr(records_module, "open_records", lambda p: opened.update([str(p)]) or real(p))
    Store(tmp_path).run_records("cpu-1")
    one = Store(tmp_path)
    one.run_records("cpu-1")
    one.run_records("cpu-1")
    assert max(opened.values()) == 2 and one.reads == 1
