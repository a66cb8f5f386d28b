"""Packed records: a finished run's records.jsonl stored xz-compressed (records.jsonl.xz), about 100x smaller.

Everything tracked travels with each GPU device call (64 MiB in all), and committed runs grew past 50 MB of
JSON text: packing leaves room for a call's wheels. Readers take either form (`open_records`); a run is packed
only once it is finished and no process writes it, and a resumed or imported run is unpacked first, so
records are only ever appended to plain JSONL. Packing is byte-exact: unpacking gives back the same file.
"""

from __future__ import annotations

import lzma
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from harness.paths import RECORDS_FILE

PACKED_SUFFIX = ".xz"
# Files of a run directory that are packed: the records, and the records a run set aside.
PACKABLE_GLOBS = (RECORDS_FILE, "discarded-*.jsonl")


def packed_path(path: Path) -> Path:
    """Where the packed form of a plain JSONL file lives."""
    return path.with_name(path.name + PACKED_SUFFIX)


def records_exist(path: Path) -> bool:
    """Whether a run's records are there, plain or packed."""
    return path.is_file() or packed_path(path).is_file()


def open_records(path: Path) -> BinaryIO | None:
    """The records file for reading (the plain file wins over a packed one), or None when neither exists."""
    if path.is_file():
        return open(path, "rb")
    if packed_path(path).is_file():
        return lzma.open(packed_path(path), "rb")
    return None


@dataclass(frozen=True)
class Packed:
    """One file packed: its plain and packed sizes in bytes."""

    path: Path
    plain_bytes: int
    packed_bytes: int


def pack_file(path: Path) -> Packed:
    """Compress one JSONL file beside itself, check the round trip, then remove the plain file."""
    data = path.read_bytes()
    target = packed_path(path)
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    if lzma.decompress(temporary.read_bytes()) != data:
        temporary.unlink()
        raise RuntimeError(f"{path}: the packed copy does not read back the same; left unpacked")
    os.replace(temporary, target)
    path.unlink()
    return Packed(path, len(data), target.stat().st_size)


def unpack_file(path: Path) -> bool:
    """Give a packed file its plain form back (before anything appends to it). Returns whether it unpacked."""
    source = packed_path(path)
    if path.exists() or not source.is_file():
        return False
    temporary = path.with_name(path.name + ".tmp")
    with lzma.open(source, "rb") as packed, open(temporary, "wb") as plain:
        while chunk := packed.read(1 << 20):
            plain.write(chunk)
    os.replace(temporary, path)
    source.unlink()
    return True


def packable_files(run_dir: Path) -> Iterator[Path]:
    """The plain JSONL files of a run directory that packing would compress."""
    for pattern in PACKABLE_GLOBS:
        yield from sorted(run_dir.glob(pattern))


def unpack_run(run_dir: Path) -> None:
    """Unpack every packed JSONL of a run (a resumed or imported run appends to plain JSONL)."""
    for pattern in PACKABLE_GLOBS:
        for source in sorted(run_dir.glob(pattern + PACKED_SUFFIX)):
            unpack_file(source.with_name(source.name.removesuffix(PACKED_SUFFIX)))


def run_dirs(results_dir: Path) -> list[Path]:
    """Every run directory under a results directory: results/runs/* and the probe runs kept under flips/."""
    return sorted({meta.parent for meta in results_dir.glob("**/runs/*/meta.json")})


def pack_runs(results_dir: Path, run_ids: list[str]) -> list[Packed]:
    """Pack the named runs (all of them when none is named), each under its writer lock so a run being
    written is never packed. A name that matches no run is bad input."""
    from harness.errors import UsageError
    from harness.recording.runs import RunLock

    every = run_dirs(results_dir)
    chosen = [d for d in every if not run_ids or d.name in run_ids]
    unknown = sorted(set(run_ids) - {d.name for d in every})
    if unknown:
        raise UsageError(f"no run named {', '.join(unknown)} under {results_dir}")
    packed = []
    for run_dir in chosen:
        lock = RunLock.acquire(run_dir)
        try:
            packed.extend(pack_file(path) for path in packable_files(run_dir))
        finally:
            lock.release()
    return packed
