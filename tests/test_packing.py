"""Packed records: byte-exact, read like plain ones, unpacked before a resume appends, and committed runs stay
small enough that a GPU device call still has room for its wheels."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

from test_records import make

from harness.paths import REPO_ROOT
from harness.recording.packing import pack_runs, packed_path
from harness.recording.records import RecordWriter, read_records

# The device tool carries the whole working tree, 64 MiB at most; committed results must leave most of it free.
TRACKED_RESULTS_LIMIT_BYTES = 16 * 2**20


def _run(results: Path, name: str, records: list[dict]) -> Path:
    run_dir = results / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"run_id": name, "status": "complete"}))
    with RecordWriter(run_dir / "records.jsonl") as writer:
        for record in records:
            writer.append(record)
    return run_dir


def test_packing_is_byte_exact_and_reads_the_same(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "cpu-1", [make(config_id=f"{i:010d}", outcome="fail") for i in range(50)])
    plain = (run_dir / "records.jsonl").read_bytes()
    before = read_records(run_dir / "records.jsonl")
    (packed,) = pack_runs(tmp_path, [])
    assert not (run_dir / "records.jsonl").exists()
    assert packed.packed_bytes < packed.plain_bytes / 5
    assert read_records(run_dir / "records.jsonl") == before
    assert lzma.decompress(packed_path(run_dir / "records.jsonl").read_bytes()) == plain


def test_a_resumed_packed_run_appends_without_duplicates(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "cpu-1", [make()])
    pack_runs(tmp_path, ["cpu-1"])
    with RecordWriter(run_dir / "records.jsonl") as writer:
        assert not writer.append(make())
        assert writer.append(make(variant="fix"))
    assert not packed_path(run_dir / "records.jsonl").exists()
    assert [r["variant"] for r in read_records(run_dir / "records.jsonl")] == ["baseline", "fix"]


def test_pack_refuses_an_unknown_run(tmp_path: Path) -> None:
    _run(tmp_path, "cpu-1", [make()])
    done = subprocess.run(
        [sys.executable, "-m", "harness", "pack", "nope", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "no run named nope" in done.stderr
    assert (tmp_path / "runs" / "cpu-1" / "records.jsonl").is_file()


def test_committed_results_are_packed_and_small() -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "results"], cwd=REPO_ROOT, capture_output=True)
    if listed.returncode != 0:
        return  # not a git checkout (an sdist): nothing committed to check
    paths = [REPO_ROOT / p for p in listed.stdout.decode().split("\0") if p]
    plain_runs = [p for p in paths if p.name == "records.jsonl" and p.parent.parent.name == "runs"]
    assert not plain_runs, f"run records committed unpacked (run `python -m harness pack`): {plain_runs[:3]}"
    total = sum(p.stat().st_size for p in paths if p.is_file())
    assert total < TRACKED_RESULTS_LIMIT_BYTES, f"results/ tracks {total / 2**20:.1f} MiB"
