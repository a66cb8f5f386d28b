"""Where a dated GPU profile's era lock lives and how it is read: the one thing both the lock's builder
(`lock.py`) and the release rules (`releases.py`) need, kept apart so neither imports the other for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.errors import UsageError

LOCK_VERSION = 1


def lock_path(matrix_dir: Path, profile_name: str) -> Path:
    return matrix_dir / "locks" / f"{profile_name}.json"


def read_lock(path: Path) -> dict[str, Any]:
    """A committed lock, or a clear error naming the command that makes it."""
    if not path.is_file():
        raise UsageError(f"{path}: no era lock; make it on a connected machine: python -m harness lock --profile NAME")
    lock = json.loads(path.read_text())
    if lock.get("lock_version") != LOCK_VERSION:
        raise UsageError(f"{path}: lock_version {lock.get('lock_version')!r}, expected {LOCK_VERSION}")
    return lock
