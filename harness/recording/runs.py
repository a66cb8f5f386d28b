"""Run directories: ids, meta.json, the writer lock, and finding the run to resume.

One run directory has one writer at a time. The writer holds an advisory lock (`writer.lock`, flock) for
the run's life; the kernel drops it when the writer dies, even by SIGKILL, so a run whose meta.json still
says `running` but whose lock is free was interrupted. Run ids are unique even within one second: the
directory is created atomically and a clash picks another id.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import secrets
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from harness.errors import UsageError
from harness.paths import meta_file, profile_runs, runs_folder

LOCK_NAME = "writer.lock"
#: Statuses after which `matrix` starts a new run instead of resuming (a finished run is evidence, not a draft).
FINISHED = ("complete",)


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_run_id(profile_name: str) -> str:
    """`<profile>-<UTC second>-<4 hex>`: sortable by time, unique even for runs started in the same second."""
    return f"{profile_name}-{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(2)}"


def create_run_dir(results_dir: Path, profile_name: str, meta_for: Callable[[str], dict[str, Any]]) -> Path:
    """A new run directory with a fresh id that appears with its meta.json already inside (written in
    `<results>/.run-staging/`, then renamed into place): a run killed at any moment is either absent or resumable,
    never an empty directory that the next invocation cannot resume. Callers hold the selection lock."""
    runs_root = runs_folder(results_dir)
    runs_root.mkdir(parents=True, exist_ok=True)
    staging_root = results_dir / ".run-staging"  # beside runs/, so nothing under runs/ is ever half-made
    staging_root.mkdir(exist_ok=True)
    for _ in range(100):
        run_id = new_run_id(profile_name)
        run_dir = runs_root / run_id
        if run_dir.exists():
            continue
        staging = Path(tempfile.mkdtemp(prefix=f"{run_id}-", dir=staging_root))
        write_meta(staging, meta_for(run_id))
        staging.rename(run_dir)
        try:
            staging_root.rmdir()  # leave no trace unless another staging is under way
        except OSError:
            pass
        return run_dir
    raise OSError(f"could not create a unique run directory under {runs_root}")


def profile_digest(profile_path: Path) -> str:
    return hashlib.sha256(profile_path.read_bytes()).hexdigest()[:16]


def read_meta(run_dir: Path) -> dict[str, Any]:
    path = meta_file(run_dir)
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    return meta


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Atomic replace, so a killed run never leaves half a meta.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f"meta.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, meta_file(run_dir))


class RunLock:
    """The exclusive writer lock of one run directory, held until `release` (or the process's death)."""

    def __init__(self, run_dir: Path, handle: TextIO) -> None:
        self.run_dir = run_dir
        self._handle = handle

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Take the lock, or raise UsageError naming who holds it."""
        handle = open(run_dir / LOCK_NAME, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_text(run_dir)
            handle.close()
            raise UsageError(
                f"run {run_dir.name} is being written by {holder}; wait for it to finish, or start a separate "
                "run with --fresh"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso()}) + "\n")
        handle.flush()
        return cls(run_dir, handle)

    def release(self) -> None:
        if not self._handle.closed:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()


def writer_alive(run_dir: Path) -> bool:
    """Whether some process holds the run's writer lock right now."""
    path = run_dir / LOCK_NAME
    if not path.is_file():
        return False
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _holder_text(run_dir: Path) -> str:
    try:
        holder = json.loads((run_dir / LOCK_NAME).read_text().strip() or "{}")
    except (OSError, json.JSONDecodeError):
        holder = {}
    if not holder:
        return "another process"
    return f"pid {holder.get('pid')} on {holder.get('host')} (since {holder.get('since')})"


def effective_status(run_dir: Path, meta: dict[str, Any] | None = None) -> str:
    """meta.json's status, except that a `running` run whose writer is gone (SIGKILL, power loss) is
    `interrupted`: the lock tells, not the file the dead writer could not update."""
    meta = read_meta(run_dir) if meta is None else meta
    status = str(meta.get("status", "unknown"))
    if status == "running" and not writer_alive(run_dir):
        return "interrupted"
    return status


@contextmanager
def selection_lock(results_dir: Path) -> Iterator[None]:
    """Serialises choosing-or-creating a run among invocations on one results directory, so two started in
    the same second cannot both pick (or both create) the same run."""
    runs_root = runs_folder(results_dir)
    runs_root.mkdir(parents=True, exist_ok=True)
    with open(runs_root / ".select.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def find_resumable(results_dir: Path, profile_name: str, digest: str, shard: list[int] | None) -> Path | None:
    """The newest unfinished run (interrupted, or whose writer is still at work) of this profile file and
    shard. A complete run is never resumed: a new invocation starts a new run and resolves `latest` afresh."""
    candidates = []
    for run_dir in profile_runs(results_dir, profile_name):
        meta = read_meta(run_dir)
        if meta.get("profile") != profile_name or meta.get("profile_digest") != digest:
            continue
        if meta.get("shard") != shard or effective_status(run_dir, meta) in FINISHED:
            continue
        candidates.append((meta.get("started_at", ""), run_dir.name, run_dir))
    return max(candidates)[2] if candidates else None


def check_writable(directory: Path, what: str) -> None:
    """Fail early, before anything runs, if `directory` cannot be created or written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{what} {directory} is not writable: {exc.strerror or exc}") from None


def git_commit(repo: Path) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
