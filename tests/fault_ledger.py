"""The fault-injection ledger: fault tests add a row each, conftest prints the summary after the run.

A module of its own (imported as tests.fault_ledger everywhere) so that conftest and the tests share
one list, however pytest names the conftest module. The rows travel to the summary on the test reports
(`user_properties`, as FAULT_PROPERTY), so the summary is the same when pytest-xdist runs the tests in
worker processes, whose lists the main process never sees.
"""

from __future__ import annotations

from typing import Any

#: One row: (fault, expected, observed, classified correctly, records lost, orphans, wrong outcomes: keys whose
#: outcome, signature or metrics differ from an uninterrupted run).
Row = tuple[str, str, str, bool, int, int, int]
#: The rows this process recorded, in order (conftest moves each onto the report of the test phase that made it).
LEDGER: list[Row] = []
#: The report property a row travels under.
FAULT_PROPERTY = "compat-matrix-fault"


def record_fault(fault: str, expected: str, observed: str, lost: int = 0, orphans: int = 0, wrong: int = 0) -> None:
    """Fault tests call this before asserting, so the summary shows every fault, passed or not."""
    LEDGER.append((fault, expected, observed, expected == observed, lost, orphans, wrong))


def rows_of(reports: list[Any]) -> list[Row]:
    """The rows the reports carry, in the order they were recorded within each report."""
    return [
        tuple(value)  # type: ignore[misc]
        for report in reports
        for name, value in getattr(report, "user_properties", None) or []
        if name == FAULT_PROPERTY
    ]


def summary_lines(rows: list[Row]) -> list[str]:
    if not rows:
        return []
    lines = []
    for fault, expected, observed, ok, lost, orphans, wrong in rows:
        mark = "ok " if ok and not lost and not orphans and not wrong else "BAD"
        counts = f"lost {lost} orphans {orphans} wrong {wrong}"
        lines.append(f"{mark} {fault:<44} expected {expected:<26} observed {observed:<26} {counts}")
    lines.append(
        f"faults injected: {len(rows)}; classified correctly: {sum(r[3] for r in rows)}; "
        f"records lost: {sum(r[4] for r in rows)}; orphan processes: {sum(r[5] for r in rows)}; "
        f"wrong outcomes: {sum(r[6] for r in rows)}"
    )
    return lines
