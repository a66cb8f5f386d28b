"""The answer at a glance: the first table of COMPATIBILITY.md. Rows are named by the versions that were really
imported (not cell ids), newest first, grouped by device and world size; each entry is one symbol, the count,
and the first change to try (a real fix before a workaround: the first one the detailed entry lists)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.define.packages import AXIS_PACKAGES, public_version, short_name
from harness.recording.verdicts import first_change, verdict
from harness.textsafe import md

#: Longest entry of the glance table (the details are one anchor below).
ENTRY_LIMIT = 120
SYMBOLS = {
    "target": "✗",
    "failures": "✗",
    "not-reproduced": "✓",
    "passes": "✓",
    "skip": "n/a",
    "env-broken": "env",
    "install-failed": "inst",
}
LEGEND = (
    "✗ k/n: the failure shows on k of n configs, then the first change to try (fix, or workaround: w/a); "
    "✓: not reproduced; (!): other failures there; n/a: not applicable on this machine; env/inst: the stack "
    "could not run or install; -: not run. Details: the summary below and each scenario's section."
)


def entry(found: Any, spec: dict[str, Any] | None) -> str:
    """'✗ 5/6 · try cast_forward_inputs', '✓ 0/4 (!)', 'n/a', within ENTRY_LIMIT characters."""
    if found.state in ("empty", "no-baseline"):
        return "-"
    symbol = SYMBOLS.get(found.state, found.state)
    if found.state in ("target", "failures"):
        text = f"{symbol} {len(found.target_records)}/{found.candidates}"
        change = first_change(found, spec)
        if change:
            text += f" · try {change[0]}" + ("" if change[1] == "fix" else " (w/a)")
        else:
            text += " · no fix measured"
    elif found.state in ("not-reproduced", "passes"):
        text = f"{symbol} 0/{found.candidates}" + (" (!)" if found.others else "")
    else:
        text = symbol
    return text if len(text) <= ENTRY_LIMIT else text[: ENTRY_LIMIT - 1] + "…"


def column_labels(scenarios: list[str]) -> list[str]:
    """'S2' for a mode with one scenario; where a mode has several, each gets the words only it has
    ('S2', 'S2 fsdp')."""
    labels = []
    for scenario in scenarios:
        mode, words = scenario.split("-")[0], set(scenario.split("-")[1:])
        siblings = [set(s.split("-")[1:]) for s in scenarios if s.split("-")[0] == mode and s != scenario]
        own = [w for w in scenario.split("-")[1:] if siblings and all(w not in other for other in siblings)]
        labels.append(" ".join([mode, *own]) if words else mode)
    return labels


def version_label(versions: dict[str, Any]) -> str:
    return " ".join(f"{short_name(p)} {public_version(str(versions[p]))}" for p in AXIS_PACKAGES if versions.get(p))


def glance_markdown(records: list[dict[str, Any]], specs: dict[str, dict[str, Any]]) -> list[str]:
    """The glance table's lines: one table per (device, world size), rows named by versions, newest first."""
    by_cell: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_cell[record["cell"]].append(record)
    scenarios = sorted({r["scenario"] for r in records}, key=lambda s: (int(s[1:].split("-")[0]), s))
    groups: dict[tuple[str, int], list[tuple[tuple, str, str]]] = defaultdict(list)
    for cell, cell_records in by_cell.items():
        versions = next((r["versions"] for r in cell_records if r.get("versions")), {})
        hardware = [r.get("hardware") or {} for r in cell_records]
        device = "GPU" if any(h.get("device") == "cuda" for h in hardware) else "CPU"
        ranks = max((int(h.get("world_size") or 1) for h in hardware), default=1)
        label = version_label(versions) or cell
        date = next(((r.get("pins") or {}).get("date") for r in cell_records if (r.get("pins") or {}).get("date")), "")
        order = tuple(public_version(str(versions.get(p) or "0")) for p in AXIS_PACKAGES)
        groups[(device, ranks)].append((order, f"{label}{' (' + date + ')' if date else ''}", cell))
    lines = ["## The answer at a glance", "", LEGEND, ""]
    for (device, ranks), rows in sorted(groups.items()):
        lines += [f"### {device}, up to {ranks} rank{'s' if ranks > 1 else ''}", ""]
        lines.append("| versions | " + " | ".join(md(label) for label in column_labels(scenarios)) + " |")
        lines.append("|---|" + "---|" * len(scenarios))
        newest_first = sorted(rows, key=lambda row: (tuple(map(_as_version, row[0])), row[1]), reverse=True)
        for _, label, cell in newest_first:
            cells = []
            for scenario in scenarios:
                subset = [r for r in by_cell[cell] if r["scenario"] == scenario]
                cells.append(entry(verdict(subset, specs.get(scenario)), specs.get(scenario)) if subset else "-")
            lines.append(f"| {md(label)} | " + " | ".join(md(c) for c in cells) + " |")
        lines.append("")
    return lines


def _as_version(value: str | None) -> Version:
    try:
        return Version(value or "0")
    except InvalidVersion:
        return Version("0")
