"""What the weekly growth of a dated run says: did the newest stack's outcomes change since the previous newest
day? (`matrix --resume RUN --grow` prints it and writes it beside the run as newest-change.md.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES, public_version
from harness.define.registry import discover
from harness.knowledge import pitfalls as knowledge
from harness.knowledge.atlas import Atlas
from harness.knowledge.flips import dated_verdicts
from harness.knowledge.selection import latest_by_key
from harness.knowledge.store import Store
from harness.textsafe import md


def newest_change_text(store: Store, run_id: str) -> str:
    """Markdown: the newest day against the one before it, per scenario (target state and fixes), and what
    moved in the stack between them, in one dated run."""
    records, _ = latest_by_key(store.run_records(run_id))
    dates, stacks, verdicts = dated_verdicts(records, {s.id: s.spec for s in discover()})
    if len(dates) < 2:
        return f"Newest stack: only {len(dates)} day recorded in {run_id}, nothing to compare."
    old, new = dates[-2], dates[-1]
    moved = _moved(stacks.get(old, {}), stacks.get(new, {}))
    changed, same = [], []
    for scenario in sorted(verdicts):
        before, after = _shown(verdicts[scenario].get(old)), _shown(verdicts[scenario].get(new))
        (changed if before != after else same).append(
            f"- {scenario}: {before} -> {after}" if before != after else f"- {scenario}: {after}"
        )
    head = (
        f"**The newest stack ({new}) changed outcomes against the previous newest ({old}).**"
        if changed
        else f"The newest stack ({new}) has the same outcomes as the previous newest ({old})."
    )
    lines = [f"## Newest stack: {new} against {old}", "", head, "", f"Stack: {moved or 'no package moved'}", ""]
    if changed:
        lines += ["Changed:", *changed, ""]
    lines += ["Unchanged:" if changed else "Outcomes:", *same]
    return "\n".join(lines)


def newest_changes(records: list[dict[str, Any]]) -> tuple[str | None, list[str], list[str]]:
    """(the newest day, changed, unchanged): for each scenario of the dated `records`, its newest day against its
    previous day there (the target state and the fixes that removed it, and what moved in the stack). A config that
    fails on every release (a pitfall, `knowledge.pitfalls`) is no change of any day: it is left out."""
    specs = {s.id: s.spec for s in discover()}
    records, _ = knowledge.without_pitfalls(records, knowledge.pitfalls(records, specs))
    dates, stacks, verdicts = dated_verdicts(records, specs)
    changed, same = [], []
    for scenario in sorted(verdicts):
        days = sorted(verdicts[scenario])
        if len(days) < 2:
            same.append(f"{scenario}: only {days[-1]} recorded")
            continue
        old, new = days[-2], days[-1]
        before, after = _shown(verdicts[scenario][old]), _shown(verdicts[scenario][new])
        moved = _moved(stacks.get(old, {}), stacks.get(new, {})) or "no package moved"
        if before != after:
            changed.append(f"{scenario}: {new} against {old}: {before} -> {after} ({moved})")
        else:
            same.append(f"{scenario}: {new} against {old}: {after}")
    return (dates[-1] if dates else None), changed, same


def newest_change_markdown(atlas: Atlas, profile_name: str) -> str:
    """Markdown: each scenario's newest day against its previous day in the table, over every run of the dated
    profile the table reads. What `matrix --grow` prints and the weekly workflow puts in its summary."""
    newest, changed, same = newest_changes(atlas.records_of_profile(profile_name))
    if newest is None:
        return f"## The newest day\n\nNo day of profile {profile_name} is in the table."
    head = (
        f"**{len(changed)} scenario(s) changed on their newest day.**"
        if changed
        else "Every scenario's newest day has the outcomes of its previous day."
    )
    lines = [f"## The newest day of {profile_name} ({newest})", "", head, ""]
    if changed:
        lines += ["Changed:", *(f"- {c}" for c in changed), ""]
    lines += ["Unchanged:" if changed else "Outcomes:", *(f"- {u}" for u in same)]
    return "\n".join(lines)


def lately(atlas: Atlas, profile_name: str = "history") -> dict[str, Any]:
    """'What changed lately', for the table and the site: what each scenario's newest day of the dated atlas changed
    against its previous day, and the newest release watch (results/watch/<day>/watch.json)."""
    newest, changed, _ = newest_changes(atlas.records_of_profile(profile_name))
    return {"newest_day": newest, "changed": changed, "watch": atlas.store.newest_watch}


def lately_markdown(found: dict[str, Any]) -> list[str]:
    """The section's lines (empty where there is no dated atlas)."""
    if not found.get("newest_day"):
        return []
    lines = ["## What changed lately", ""]
    if found["changed"]:
        lines += [f"On its newest day (the atlas's newest: {found['newest_day']}):", ""]
        lines += [f"- {md(c)}" for c in found["changed"]]
    else:
        lines.append(f"No scenario changed on its newest atlas day (the newest: {found['newest_day']}).")
    watch = found.get("watch")
    if watch:
        lines += ["", f"Release watch of {watch['watched_on']} (each release since {watch['newest_day']} alone on it):"]
        lines += [f"- {md(r['package'])} {md(r['version'])}: {md(r['summary'])}" for r in watch["releases"]] or [
            f"- no release of the six packages since {watch['newest_day']}"
        ]
    return [*lines, ""]


def _shown(found: Any) -> str:
    """The target state and the fixes that removed it, as one comparable phrase."""
    if found is None:
        return "not run"
    fixes = f" (fixed by {', '.join(found.fixed)})" if found.state == "target" and found.fixed else ""
    return f"{found.state}{fixes}"


def _moved(old: dict[str, Any], new: dict[str, Any]) -> str:
    parts = []
    for package in AXIS_PACKAGES:
        before, after = old.get(package), new.get(package)
        if before != after:
            parts.append(
                f"{package} {public_version(before) if before else '-'} -> {public_version(after) if after else '-'}"
            )
    return ", ".join(parts)


if __name__ == "__main__":  # `atlas_growth.growth_summary`: the summary in a fresh interpreter
    import sys

    print(newest_change_markdown(Atlas(Path(sys.argv[1])), sys.argv[2]))
