"""Records: one JSON line per scenario x variant x config x cell, appended and flushed as produced.

A killed run loses nothing that finished: each line is written, flushed and fsynced on its own. A
truncated last line (the process died mid-write) is detected on read, skipped with a warning, and
repaired before the next append so the file stays valid JSONL.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness import pause_points
from harness.errors import UsageError
from harness.recording.outcomes import OUTCOMES
from harness.recording.packing import open_records, unpack_file
from harness.recording.record import Record

SCHEMA_PATH = Path(__file__).with_name("record.schema.json")
RECORD_VERSION = 1
KEY_FIELDS = ("cell", "scenario", "variant", "config_id")


def record_key(record: Record) -> tuple[str, ...]:
    """Identity of a record within a run: re-running the same key replaces nothing, it is skipped."""
    return tuple(str(record[f]) for f in KEY_FIELDS)


def read_records(path: Path, warn: bool = True) -> list[Record]:
    """All complete records; a damaged line is skipped with a warning on stderr."""
    handle = open_records(path)
    if handle is None:
        return []
    records: list[Record] = []
    with handle:
        for number, raw in enumerate(handle, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                if warn:
                    print(f"warning: {path}:{number}: skipping a damaged record line", file=sys.stderr)
                continue
            problem = _not_a_record(record)
            if problem:
                # Valid JSON that no writer of ours produced: bad input, not damage to step over.
                raise UsageError(f"{path}:{number}: not a record: {problem}")
            records.append(record)
    return records


def _not_a_record(value: Any) -> str | None:
    """Why a parsed JSON line cannot be a record, or None when it has what every reader relies on."""
    if not isinstance(value, dict):
        return f"expected a JSON object, got {type(value).__name__}"
    missing = [k for k in (*KEY_FIELDS, "outcome") if not isinstance(value.get(k), str) or not value.get(k)]
    if missing:
        return f"missing or non-string key(s) {', '.join(missing)}"
    if value["outcome"] not in OUTCOMES:
        return f"key outcome: unknown outcome {value['outcome']!r}"
    return None


def repair_tail(path: Path) -> bool:
    """Cut a partial last line left by a killed writer. Returns True if something was cut."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with open(path, "rb+") as handle:
        data = handle.read()
        if data.endswith(b"\n"):
            return False
        keep = data.rfind(b"\n") + 1
        handle.truncate(keep)
    print(f"warning: {path}: removed a truncated last line left by an interrupted run", file=sys.stderr)
    return True


class RecordWriter:
    """Appends records durably and remembers which keys exist, so resumed runs add no duplicates."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        unpack_file(path)  # a packed run that is resumed appends to plain JSONL again
        repair_tail(path)
        self.outcomes = {record_key(r): str(r.get("outcome")) for r in read_records(path)}
        self.keys = set(self.outcomes)
        self._handle = open(path, "a", encoding="utf-8")

    def __contains__(self, key: tuple[str, ...]) -> bool:
        return key in self.keys

    def outcome_of(self, key: tuple[str, ...]) -> str | None:
        """The recorded outcome for a key (a resumed run decides from it whether fix variants are due)."""
        return self.outcomes.get(key)

    def append(self, record: Record) -> bool:
        """Write one record unless its key is already there. Returns whether it was written."""
        key = record_key(record)
        if key in self.keys:
            return False
        self._handle.write(json.dumps(record, sort_keys=True, default=repr) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.keys.add(key)
        self.outcomes[key] = str(record.get("outcome"))
        pause_points.after_record(len(self.keys))
        return True

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def merge(record_sets: Iterable[Iterable[Record]]) -> list[Record]:
    """Concatenate shards and drop exact duplicates of a (run, key); conflicting outcomes are kept."""
    seen: set[tuple[str, ...]] = set()
    merged = []
    for records in record_sets:
        for record in records:
            identity = (record.get("run_id", ""), *record_key(record), record.get("outcome", ""))
            if identity not in seen:
                seen.add(identity)
                merged.append(record)
    return merged
