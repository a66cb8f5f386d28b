"""What putting the changed code back showed, as an issue body's section: the blamed function(s) with their diffs, the
run that proves it, and the run the other way. A finding's issue (`publishing/findings.py`) and a bisect-script
verdict's (`publishing/upstream.py`) show the same section from the same blame.json."""

from __future__ import annotations

from typing import Any

from harness.recording.machine import describe_machine


def blame_section(blame: dict[str, Any] | None, changed: dict[str, Any] | None, package: str, newer: str) -> list[str]:
    """The section's lines ([] where nothing was blamed or tried); `changed`: the traced comparison (changed.json),
    whose diffs are shown; `newer`: the release the code was put back at."""
    if not blame:
        return []
    runs = blame.get("runs") or []
    lines = ["", "### What causes it\n", f"{blame['verdict'][0].upper()}{blame['verdict'][1:]} "
             f"({len(runs)} runs of the reproducer, {blame.get('seconds', 0)} s, on "
             f"{describe_machine(blame.get('machine'))})."]  # fmt: skip
    diffs = {f"{c['file']}::{c['qualname']}": c["diff"] for c in (changed or {}).get("changed", [])}
    for name in blame["blamed"]:
        if name in diffs:
            lines += ["", f"`{name}`:", "", "```diff", diffs[name], "```"]
        elif name.endswith(" (whole module)"):  # its changed functions, which could not be put back one by one
            module = name.removesuffix(" (whole module)")
            inside = [(n, d) for n, d in diffs.items() if n.split("::", 1)[0] == module]
            lines += ["", f"`{name}`: the functions of it that both runs executed and that changed:"]
            for function, diff in inside:
                lines += ["", f"`{function}`:", "", "```diff", diff, "```"]
    for name, helpers in (blame.get("helpers") or {}).items():
        if name in blame["blamed"]:
            lines += ["", f"`{name}` runs at {package} {newer} only with the helpers it calls put back too: "
                      + ", ".join(f"`{h}`" for h in helpers) + "."]  # fmt: skip
    proof = [r for r in runs if run_units(r) == sorted(blame["blamed"])]
    for run in proof[:1]:
        lines += ["", f"With only that put back at {package} {newer}: `{run['line']}` "
                  f"({run['outcome']} release's outcome, {run['seconds']} s)."]  # fmt: skip
    return lines


def run_units(run: dict[str, Any]) -> list[str]:
    """What a run put back, as the blame names it: its units (a function, or a file whole), or for a blame made
    before units, the functions and files it reverted."""
    if "units" in run:
        return sorted(run["units"])
    return sorted(n if n.endswith(" (whole module)") or "::" in n else f"{n} (whole module)" for n in run["reverted"])
