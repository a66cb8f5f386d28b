"""The orphan guard: when the harness dies, even by SIGKILL, everything it started dies with it.

A worker's own watchdog is a Python thread, and it cannot run while the worker's main thread holds the GIL
in C code (a catastrophic regex, a long native call). `PR_SET_PDEATHSIG` is tied to the *thread* that
forked the child, and workers are started from short-lived packing threads too. So the guard is a separate
small process: it blocks reading a pipe whose only writer is the harness. The kernel closes that pipe when
the harness exits for any reason; the guard then kills every process that carries the harness's pid in
`COMPAT_MATRIX_ORCHESTRATOR_PID` (torchrun's ranks included: they inherit the environment) and exits.

Run as `python -m harness.processes.guard PID` by `ensure_started`; stdlib only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from harness.paths import REPO_ROOT

_started: subprocess.Popen | None = None
_lock = threading.Lock()
_keep: list[int] = []  # the pipe's write end, held open for this process's life


def ensure_started() -> None:
    """Start this process's guard once (idempotent, thread-safe)."""
    global _started
    with _lock:
        if _started is not None and _started.poll() is None:
            return
        read_end, write_end = os.pipe()
        os.set_inheritable(read_end, True)
        _started = subprocess.Popen(
            [sys.executable, "-m", "harness.processes.guard", str(os.getpid())],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal must not take the guard down before the harness
            close_fds=True,
            cwd=str(REPO_ROOT),
        )
        os.close(read_end)
        # Only this process holds the write end; not inherited by workers (close_fds), so EOF means we are gone.
        os.set_inheritable(write_end, False)
        _keep.append(write_end)


def _serve(orchestrator_pid: int) -> int:
    from harness.processes.proctree import kill_started_by

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while os.read(0, 4096):  # returns b"" only when every write end is closed: the harness has exited
        pass
    # Whatever is still running now was started by a harness that no longer exists.
    deadline = time.monotonic() + 10
    while kill_started_by(orchestrator_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1])))
