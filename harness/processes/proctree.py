"""Find and kill every process a run started, including torchrun's children.

torchrun starts each rank with `start_new_session=True`, so killing the launcher's process group
misses the ranks. Instead every launched process carries a unique token in its environment, which
all descendants inherit (even after they are re-parented to init), and we kill whatever carries it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

TOKEN_VAR = "COMPAT_MATRIX_RUN_TOKEN"


#: Every launched process also carries the pid of the process that launched it (the orchestrator, or a node
#: agent): workers watch it, and tests use it to find anything left behind.
ORCHESTRATOR_VAR = "COMPAT_MATRIX_ORCHESTRATOR_PID"


def processes_with_env(name: str, value: str) -> list[int]:
    """PIDs (other than ours) whose environment holds name=value (Linux /proc)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def processes_with_token(token: str) -> list[int]:
    """PIDs whose environment holds TOKEN_VAR=token."""
    return processes_with_env(TOKEN_VAR, token)


def processes_started_by(pid: int) -> list[int]:
    """PIDs launched (directly or not) by the orchestrator or agent with this pid."""
    return processes_with_env(ORCHESTRATOR_VAR, str(pid))


def kill_started_by(pid: int) -> int:
    """SIGKILL every living process launched by the orchestrator `pid`; returns how many were still alive."""
    living = _alive(processes_started_by(pid))
    for child in living:
        send_signal(child, signal.SIGKILL)
    return len(living)


def kill_token(token: str, grace_s: float = 3.0) -> int:
    """SIGTERM, then SIGKILL after a grace period, everything carrying the token. Returns how many."""
    pids = processes_with_token(token)
    for pid in pids:
        send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(processes_with_token(token)):
        time.sleep(0.1)
    for _ in range(20):
        left = _alive(processes_with_token(token))
        if not left:
            break
        for pid in left:
            send_signal(pid, signal.SIGKILL)
        time.sleep(0.1)
    return len(pids)


def _alive(pids: list[int]) -> list[int]:
    """Drop zombies: they are dead and only wait to be reaped by their parent."""
    living = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            living.append(pid)
    return living


def send_signal(pid: int, sig: int) -> None:
    """os.kill, quiet when the process is already gone (or not ours)."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
