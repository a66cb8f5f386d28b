"""The fault-injection ledger: fault tests add a row each, conftest prints the summary after the run.

A module of its own (imported as tests.fault_ledger everywhere) so that conftest and the tests share
one list, however pytest names the conftest module.
"""

from __future__ import annotations

#: One row per injected fault: (fault, expected, observed, classified correctly, records lost, orphans, wrong
#: outcomes: keys whose outcome, signature or metrics differ from an uninterrupted run).
LEDGER: list[tuple[str, str, str, bool, int, int, int]] = []


def record_fault(fault: str, expected: str, observed: str, lost: int = 0, orphans: int = 0, wrong: int = 0) -> None:
    """Fault tests call this before asserting, so the summary shows every fault, passed or not."""
    LEDGER.append((fault, expected, observed, expected == observed, lost, orphans, wrong))


def summary_lines() -> list[str]:
    if not LEDGER:
        return []
    lines = []
    for fault, expected, observed, ok, lost, orphans, wrong in LEDGER:
        mark = "ok " if ok and not lost and not orphans and not wrong else "BAD"
        counts = f"lost {lost} orphans {orphans} wrong {wrong}"
        lines.append(f"{mark} {fault:<44} expected {expected:<26} observed {observed:<26} {counts}")
    lines.append(
        f"faults injected: {len(LEDGER)}; classified correctly: {sum(r[3] for r in LEDGER)}; "
        f"records lost: {sum(r[4] for r in LEDGER)}; orphan processes: {sum(r[5] for r in LEDGER)}; "
        f"wrong outcomes: {sum(r[6] for r in LEDGER)}"
    )
    return lines
