"""Where a run's wall time goes, by phase: building environments, starting workers, running jobs, shrinking.
One clock per process (the executor resets it per attempt); threads of packed workers add to it together.
The attempt's `phases_s` in meta.json holds the sums, and `nox -s bench` prints them for a cold and a warm run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseClock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, float] = {}

    def reset(self) -> None:
        with self._lock:
            self._sums = {}

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._sums[phase] = self._sums.get(phase, 0.0) + max(0.0, seconds)

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(phase, time.monotonic() - start)

    def sums(self) -> dict[str, float]:
        with self._lock:
            return {k: round(v, 2) for k, v in sorted(self._sums.items())}


#: The process's clock: phases are "environments", "worker-start", "jobs" (every job, shrink probes included;
#: summed over packed workers, so it can exceed wall time), "shrinking" (wall time inside the shrinker).
CLOCK = PhaseClock()
