"""`compat-matrix lookup torch==2.4 transformers==4.44 peft==0.12`: the measured rows nearest a user's versions, the
verdict per scenario there and the first fix to try, saying plainly whether the answer is an exact match, lies
between two atlas dates, or is an extrapolation outside what was measured.

A version given as `2.4` matches every 2.4.x release (prefix on release components). Rows are the table's cells
(newest evidence per profile and GPU count), each with the versions its records imported.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.define.packages import AXIS_PACKAGES, public_version
from harness.define.profile import DATE_AXIS
from harness.errors import UsageError
from harness.recording.verdicts import first_change, headline, verdict

CASES = ("exact", "between atlas dates", "outside the atlas", "nearest only")


@dataclass
class Row:
    """One measured cell: its versions, device, date (atlas rows) and the records per scenario."""

    cell: str
    device: str
    versions: dict[str, str]
    date: str | None
    by_scenario: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class Answer:
    case: str
    rows: list[Row]
    #: package -> (wanted, found in the shown rows) where they differ.
    differs: dict[str, list[str]]


def parse_query(items: list[str]) -> dict[str, str]:
    """'torch==2.4' -> {'torch': '2.4'}; bad input is a usage error naming the item."""
    wanted: dict[str, str] = {}
    for item in items:
        name, sep, version = item.partition("==")
        name = canonicalize_name(name.strip())
        if not sep or name not in AXIS_PACKAGES:
            raise UsageError(f"{item!r}: expected PACKAGE==VERSION with PACKAGE one of {', '.join(AXIS_PACKAGES)}")
        try:
            Version(version)
        except InvalidVersion:
            raise UsageError(f"{item!r}: {version!r} is not a version") from None
        wanted[name] = version.strip()
    if not wanted:
        raise UsageError("give at least one PACKAGE==VERSION")
    return wanted


def matches(have: str | None, wanted: str) -> bool:
    """'2.4' matches 2.4.0 and 2.4.1; '2.4.1' only 2.4.1."""
    if not have:
        return False
    have_parts, wanted_parts = Version(public_version(have) or have).release, Version(wanted).release
    return have_parts[: len(wanted_parts)] == wanted_parts


def rows_of(records: list[dict[str, Any]]) -> list[Row]:
    """The table's cells as rows (records of one cell share its versions; the first with versions speaks)."""
    rows: dict[str, Row] = {}
    for record in records:
        row = rows.get(record["cell"])
        if row is None:
            device = str((record.get("hardware") or {}).get("device") or "cpu")
            row = rows[record["cell"]] = Row(record["cell"], device, {}, (record.get("pins") or {}).get(DATE_AXIS))
        if not row.versions and record.get("versions"):
            row.versions = {
                p: str(public_version(str(record["versions"][p]))) for p in AXIS_PACKAGES if record["versions"].get(p)
            }
        row.by_scenario.setdefault(record["scenario"], []).append(record)
    return list(rows.values())


def answer(rows: list[Row], wanted: dict[str, str], device: str | None = None) -> Answer:
    """Exact rows; else the two atlas dates whose stacks bracket the versions; else the nearest rows."""
    pool = [r for r in rows if device is None or r.device == device]
    exact = [r for r in pool if all(matches(r.versions.get(p), v) for p, v in wanted.items())]
    if exact:
        return Answer("exact", exact, {})
    by_device: dict[str, list[Row]] = defaultdict(list)
    for row in pool:
        if row.date:
            by_device[row.device].append(row)
    for dated in by_device.values():
        dated.sort(key=lambda r: r.date or "")
        older = [r for r in dated if all(_at_most(r.versions.get(p), v) for p, v in wanted.items())]
        newer = [r for r in dated if all(_at_least(r.versions.get(p), v) for p, v in wanted.items())]
        if older and newer:
            shown = [older[-1], newer[0]]
            return Answer("between atlas dates", shown, _differs(shown, wanted))
    nearest = sorted(pool, key=lambda r: (_distance(r, wanted), r.cell))[:2]
    inside = any(_at_most(r.versions.get(p), v) for r in pool for p, v in wanted.items()) and any(
        _at_least(r.versions.get(p), v) for r in pool for p, v in wanted.items()
    )
    return Answer("nearest only" if inside else "outside the atlas", nearest, _differs(nearest, wanted))


def _key(version: str) -> tuple[int, ...]:
    return Version(public_version(version) or version).release


def _at_most(have: str | None, wanted: str) -> bool:
    return bool(have) and (matches(have, wanted) or _key(have) < _key(wanted))  # type: ignore[arg-type]


def _at_least(have: str | None, wanted: str) -> bool:
    return bool(have) and (matches(have, wanted) or _key(have) > _key(wanted))  # type: ignore[arg-type]


def _distance(row: Row, wanted: dict[str, str]) -> tuple[int, int]:
    """(packages that differ, how far the first differing one is, in release components)."""
    off = [p for p, v in wanted.items() if not matches(row.versions.get(p), v)]
    gap = 0
    for package in off[:1]:
        have, want = _key(row.versions.get(package) or "0"), _key(wanted[package])
        gap = sum(abs(a - b) * 100 ** (2 - i) for i, (a, b) in enumerate(zip(have[:3], want[:3], strict=False)))
    return len(off), gap


def _differs(rows: list[Row], wanted: dict[str, str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for package, version in wanted.items():
        seen = sorted({r.versions.get(package) or "-" for r in rows})
        if not all(matches(r.versions.get(package), version) for r in rows):
            found[package] = [version, ", ".join(seen)]
    return found


def render(result: Answer, specs: dict[str, dict[str, Any]], scenarios: list[str] | None = None) -> str:
    """The terminal answer: the case, the rows with their versions, and per scenario the verdict and first fix."""
    notes = {
        "exact": "measured rows with these versions",
        "between atlas dates": "no row has these versions; the two atlas dates whose stacks bracket them",
        "outside the atlas": "EXTRAPOLATING: these versions lie outside everything measured; the nearest rows",
        "nearest only": "EXTRAPOLATING: no row matches and no two atlas dates bracket them; the nearest rows",
    }
    lines = [f"{result.case}: {notes[result.case]}"]
    for package, (want, have) in result.differs.items():
        lines.append(f"  differs: {package} {want} asked, {have} measured")
    for row in result.rows:
        stack = " ".join(f"{p} {row.versions[p]}" for p in AXIS_PACKAGES if p in row.versions)
        lines.append(f"\n{row.cell} ({row.device}{', ' + row.date if row.date else ''}): {stack}")
        for scenario in sorted(row.by_scenario, key=lambda s: (int(s[1:].split("-")[0]), s)):
            if scenarios and not any(scenario.startswith(s) for s in scenarios):
                continue
            spec = specs.get(scenario)
            lines.append(f"  {scenario}: {short_answer(verdict(row.by_scenario[scenario], spec), spec)}")
        if scenarios and not any(s.startswith(tuple(scenarios)) for s in row.by_scenario):
            lines.append(f"  (no records of {', '.join(scenarios)} in this row)")
    return "\n".join(lines)


def short_answer(found: Any, spec: dict[str, Any] | None) -> str:
    """One line: the verdict, and the first change to try (a real fix before a workaround)."""
    if found.state in ("target", "failures"):
        signatures = sorted({str(r.get("signature")) for r in found.target_records})
        head = f"FAILS ({', '.join(signatures)}) on {len(found.target_records)}/{found.candidates} configs"
        change = first_change(found, spec)
        return head + (f"; try: {change[0]} ({change[1]})" if change else "; no measured change removes it")
    if found.state in ("not-reproduced", "passes"):
        others = f"; other failures: {', '.join(sorted(found.others))}" if found.others else ""
        return f"target not reproduced (0/{found.candidates}){others}"
    return " | ".join(headline(found, spec))


def lookup(results_dir: Path, items: list[str], scenarios: list[str] | None, device: str | None) -> str:
    from harness.define.registry import discover
    from harness.publishing.report import select_runs

    wanted = parse_query(items)
    rows = rows_of(select_runs(results_dir).latest()[0])
    if not rows:
        raise UsageError(f"no records under {results_dir / 'runs'}")
    return render(answer(rows, wanted, device), {s.id: s.spec for s in discover()}, scenarios)
