"""Run directories: ids, meta.json, and finding the run to resume."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from harness.errors import UsageError


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_run_id(profile_name: str) -> str:
    return f"{profile_name}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}"


def profile_digest(profile_path: Path) -> str:
    return hashlib.sha256(profile_path.read_bytes()).hexdigest()[:16]


def read_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Atomic replace, so a killed run never leaves half a meta.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / "meta.json")


def find_resumable(results_dir: Path, profile_name: str, digest: str) -> Path | None:
    """The newest run of this profile made from the same profile file, if any."""
    candidates = []
    for run_dir in (results_dir / "runs").glob(f"{profile_name}-*"):
        meta = read_meta(run_dir)
        if meta.get("profile") == profile_name and meta.get("profile_digest") == digest:
            candidates.append((meta.get("started_at", ""), run_dir))
    return max(candidates)[1] if candidates else None


def check_writable(results_dir: Path) -> None:
    """Fail early, before anything runs, if results cannot be written."""
    try:
        (results_dir / "runs").mkdir(parents=True, exist_ok=True)
        probe = results_dir / "runs" / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"results directory {results_dir} is not writable: {exc.strerror or exc}") from None


def git_commit(repo: Path) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
