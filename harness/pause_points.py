"""Deterministic interruption points, so that fault tests interrupt a run where they mean to, on any machine.

A test that interrupts a run "after a while" finds fewer points on a fast machine than on a slow one. Instead it
names the point in the environment of the harness it starts:

    COMPAT_MATRIX_TEST_PAUSE=records:N       after the run's records file holds N records (fsynced)
    COMPAT_MATRIX_TEST_PAUSE=point:NAME      when the harness reaches a named point (`POINTS`)
    COMPAT_MATRIX_TEST_PAUSED_FILE=PATH      written (the point reached) just before the harness stops

At the point the harness writes PATH and stops itself with SIGSTOP: every thread halts where it is, with
nothing written after the point. The test then delivers its fault (SIGKILL, or SIGINT followed by SIGCONT).
Each process pauses at most once. Without the variable nothing happens; stdlib only.
"""

from __future__ import annotations

import os
import signal
import threading

PAUSE_VAR = "COMPAT_MATRIX_TEST_PAUSE"
PAUSED_FILE_VAR = "COMPAT_MATRIX_TEST_PAUSED_FILE"
#: The named points: every rank of a scenario's workers has started (imports done, no job result yet).
POINTS = ("workers-ready",)

_lock = threading.Lock()
_paused = False


def after_record(count: int) -> None:
    """Called by the record writer after each record is durable; `count` is the records now in the file."""
    wanted = os.environ.get(PAUSE_VAR, "")
    if wanted.startswith("records:") and count >= int(wanted.split(":", 1)[1]):
        _pause(f"records:{count}")


def reached(point: str) -> None:
    """Called where the harness passes a named point."""
    if os.environ.get(PAUSE_VAR) == f"point:{point}":
        _pause(f"point:{point}")


def _pause(what: str) -> None:
    global _paused
    with _lock:
        if _paused:
            return
        _paused = True
        target = os.environ.get(PAUSED_FILE_VAR)
        if target:
            partial = f"{target}.partial"
            with open(partial, "w") as handle:
                handle.write(f"{what} pid {os.getpid()}\n")
            os.replace(partial, target)
        os.kill(os.getpid(), signal.SIGSTOP)
