"""Progress display for long matrix runs: a live status line on a TTY, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """Cells done / total, the current cell, jobs done / total, elapsed time and ETA."""

    def __init__(
        self, cells_total: int, jobs_total: int, stream: TextIO | None = None, tty: bool | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.cells_total = cells_total
        self.jobs_total = max(jobs_total, 1)
        self.cells_done = 0
        self.jobs_done = 0
        self.jobs_skipped = 0  # already recorded by an earlier, resumed attempt: not counted for the ETA
        self.current = ""
        self.started = time.monotonic()
        self._last_plain = 0.0

    def eta_s(self) -> float | None:
        worked = self.jobs_done - self.jobs_skipped
        if worked <= 0:
            return None
        rate = (time.monotonic() - self.started) / worked
        return rate * (self.jobs_total - self.jobs_done)

    def line(self) -> str:
        eta = self.eta_s()
        return (
            f"[cells {self.cells_done}/{self.cells_total}] [jobs {self.jobs_done}/{self.jobs_total}] "
            f"elapsed {_clock(time.monotonic() - self.started)} "
            f"eta {_clock(eta) if eta is not None else '--:--:--'}  {self.current}"
        )

    def start_cell(self, cell_id: str, what: str = "") -> None:
        self.current = f"{cell_id} {what}".strip()
        self._show(force=True)

    def job_done(self, already_recorded: bool = False, note: str = "") -> None:
        self.jobs_done += 1
        if already_recorded:
            self.jobs_skipped += 1
        if note:
            self.current = note
        self._show()

    def add_jobs(self, count: int) -> None:
        """Work found on the way (fix variants of a new failure) joins the total."""
        self.jobs_total += count

    def cell_done(self) -> None:
        self.cells_done += 1
        self._show(force=True)

    def message(self, text: str) -> None:
        """A line that stays (outcomes worth seeing, warnings), printed above the live status."""
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self._show(force=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.line() + "\n")
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def _show(self, force: bool = False) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.line()[:200])
            self.stream.flush()
        elif force or time.monotonic() - self._last_plain > 10:
            self._last_plain = time.monotonic()
            self.stream.write(self.line() + "\n")
            self.stream.flush()
