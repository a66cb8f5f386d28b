"""A script verdict in words: the few lines `bisect-script` prints at its end (and the README's example shows), each
stack that could not be judged with its cause, and a named release said as a break or a fix."""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from harness.define.packages import AXIS_PACKAGES
from harness.publishing.upstream import setup_words
from harness.recording.flip import Flip

#: The states a run is evidence in (the failure asked about shows, or the script passes).
KNOWN = ("target", "pass")


def summary_lines(verdict: dict[str, Any]) -> list[str]:
    """The verdict in a few lines for the terminal (and the README's example)."""
    target = verdict["target"]
    lines = ["", f"verdict for {verdict['script']} ({verdict['nproc']} process(es)):"]
    asked = target["error"] or target["signature"]
    if asked:
        lines.append(f"  failure asked about: {asked}")
    elif verdict["match"]:
        lines.append(f"  no run matches --match {verdict['match']!r}: nothing to bisect")
    else:
        lines.append("  no stack fails: nothing to bisect")
    states = " ".join(f"{s['label']}:{_scan_word(s)}" for s in verdict["scan"])
    lines.append(f"  scan: {states}")
    for limit in verdict.get("machine_limits") or []:
        lines.append(f"  this machine's limit, not the script's failure: {limit}")
    ran = sorted({setup_words(s.get("setup")) for s in verdict["scan"]})
    lines += [f"  measured: {words}" for words in ran]
    known = {s["state"] for s in verdict["scan"] if s["state"] in KNOWN}
    if asked and not verdict["flips"]:
        why = "every stack that could run shows it" if known == {"target"} else "no two usable stacks differ"
        lines.append(f"  no flip: {why}")
    for flip in (Flip.from_json(f) for f in verdict["flips"]):
        where = f"between {flip.older} ({flip.older_state}) and {flip.newer} ({flip.newer_state})"
        if flip.package and flip.release:
            lines.append(f"  {flip.direction} with {flip.package} {flip.release} ({release_words(flip)}), {where}")
            held = ", ".join(f"{p} {v}" for p, v in flip.held.items() if p in AXIS_PACKAGES) or ", ".join(
                f"{p} {v}" for p, v in list(flip.held.items())[:8]
            )
            lines.append(f"    held: {held}")
            if flip.sweep:
                lines.append(f"    every change the sweep found: {flip.changes_words()}")
            search = "sweep" if flip.sweep else "bisect"
            lines.append(
                f"    probes: {len(flip.moves)} move(s), {len(flip.bisect_runs)} {search} run(s) over "
                f"{len(flip.candidates)} release(s)"
            )
        else:
            lines.append(f"  {where}: {flip.note or 'not named'}")
        if flip.note and flip.package:
            lines.append(f"    note: {flip.note}")
    lines += unusable_lines(verdict)
    for other in verdict["different_failures"]:
        where = [s["label"] for s in verdict["scan"] if s["signature"] == other["signature"] and s["state"] == "other"]
        lines.append(
            f"  a different failure ({', '.join(where) or 'in a probe'}): {other['error'] or other['signature']}"
        )
        for flip in (Flip.from_json(f) for f in other.get("flips") or []):
            lines.append("    " + _answer_line(flip))
        if where and "flips" in other and not other["flips"]:
            lines.append("    the scan does not bracket it (no stack around it passes)")
    cost = verdict["cost"]
    phases = ", ".join(f"{k} {v:.0f} s" for k, v in cost["phase_seconds"].items())
    lines.append(
        f"  cost: {cost['runs']} runs (+{cost['runs_reused']} from earlier), environments {cost['environments_built']} "
        f"built / {cost['environments_reused']} reused, overlays {cost['overlays_built']} built / "
        f"{cost['overlays_reused']} reused; {cost['runs_after_scan']} runs after the scan; {phases}"
    )
    calls = verdict.get("device_calls") or []
    if calls:
        per_call = ", ".join(f"{c['wall_s']:.0f} s / {c['runs']} runs" for c in calls)
        name = (verdict.get("device") or {}).get("name") or "the node"
        lines.append(f"  on {name}: {len(calls)} device call(s), {verdict['device_seconds']:.0f} s in all ({per_call})")
    return lines


def unusable_lines(verdict: dict[str, Any]) -> list[str]:
    """Every stack that could not be judged (it could not be built, it exited 77, or what ended it is this
    machine's limit), a scanned day, a move or a release probe, each with its cause line: no evidence either way,
    and the verdict says which and why."""
    found: list[tuple[str, str]] = []
    for scanned in verdict["scan"]:
        if scanned.get("state") == "unusable":
            found.append((str(scanned["label"]), scanned.get("error") or scanned.get("outcome") or ""))
    flips = [*verdict["flips"], *(f for other in verdict["different_failures"] for f in other.get("flips") or [])]
    for flip in flips:
        older = flip.get("older", "")
        for move in flip.get("moves") or []:
            if move.get("state") == "unusable":
                found.append((f"{older} + {move['package']}=={move['version']}", move.get("error") or ""))
        package = flip.get("package") or ""
        for probe in flip.get("bisect_runs") or []:
            if probe.get("state") == "unusable":
                found.append((f"{older} + {package}=={probe['version']}", probe.get("error") or ""))
    lines, seen = [], set()
    for label, why in found:
        if label in seen:
            continue
        seen.add(label)
        first = next((line.strip() for line in str(why).splitlines() if line.strip()), "") or "no cause recorded"
        lines.append(f"  unusable (no evidence either way): {label}: {first}")
    return lines


def _scan_word(scanned: dict[str, Any]) -> str:
    """A scanned stack's state in the scan line: 'fail (another failure)' where the script failed otherwise, 'past it
    (another failure later)' where it got past the failure asked about and failed further on."""
    if scanned.get("later"):
        return "past it (another failure later)"
    if scanned["state"] == "other" and scanned["outcome"] in ("fail", "timeout"):
        return f"{scanned['outcome']} (another failure)"
    return scanned["state"] or scanned["outcome"]


def release_words(flip: Flip) -> str:
    """The release before the named one, in words: a break names the first release that fails ('last pass: 0.9.0'),
    a fix the first release that passes ('the first release that passes; the last that fails: 0.17.1')."""
    if flip.newer_state == "target" or flip.older_state != "target":
        return f"last {flip.older_state}: {flip.last_release_before}"
    passes = "gets past it" if flip.note.startswith("where ") else "passes"  # a later failure takes over there
    return f"the first release that {passes}; the last that fails: {flip.last_release_before}"


def _answer_line(flip: Flip) -> str:
    """One answer for a different failure: 'ended with packaging 21.0 (the first release that passes; the last that
    fails: 20.0)', or why not named."""
    if flip.package and flip.release:
        line = f"{flip.direction} with {flip.package} {flip.release} ({release_words(flip)})"
        stepped = sorted({str(s["version"]) for s in flip.stepped_over or [] if isinstance(s, dict)}, key=Version)
        if stepped:
            line += f"; {', '.join(stepped)} showed no evidence (another failure or no install)"
        later = flip.note.split(". ")[0] if flip.note.startswith("where ") else ""
        return line + f", between {flip.older} and {flip.newer}" + (f"; {later}" if later else "")
    return (
        f"between {flip.older} ({flip.older_state}) and {flip.newer} ({flip.newer_state}): {flip.note or 'not named'}"
    )
