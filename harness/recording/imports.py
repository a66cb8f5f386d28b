"""File a run brought back from another machine (a GPU node, a shard) under results/runs/<run-id>/:
concatenation plus de-duplication by record key, nothing overwritten, never into a run being written."""

from __future__ import annotations

import json
from pathlib import Path

from harness.errors import UsageError
from harness.paths import records_file, run_path
from harness.recording.packing import unpack_run
from harness.recording.records import merge, read_records
from harness.recording.runs import RunLock, write_meta
from harness.textsafe import slug


def import_run(path: Path, results_dir: Path) -> tuple[Path, int, int]:
    """(the run's directory, records added, records in all) for one `<run-id>.records.jsonl` beside its
    `<run-id>.meta.json`."""
    if not path.name.endswith(".records.jsonl") or not path.is_file():
        raise UsageError(f"{path}: expected an existing <run-id>.records.jsonl")
    run_id = path.name.removesuffix(".records.jsonl")
    meta_path = path.with_name(f"{run_id}.meta.json")
    if not meta_path.is_file():
        raise UsageError(f"{meta_path}: missing (the run's meta.json travels with its records)")
    run_dir = run_path(results_dir, slug(run_id, 120))
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock.acquire(run_dir)
    try:
        unpack_run(run_dir)
        existing = read_records(records_file(run_dir))
        merged = merge([existing, read_records(path)])
        with open(records_file(run_dir), "w") as handle:
            handle.writelines(json.dumps(r, sort_keys=True) + "\n" for r in merged)
        write_meta(run_dir, json.loads(meta_path.read_text()))
    finally:
        lock.release()
    return run_dir, len(merged) - len(existing), len(merged)
