"""What the weekly growth of a dated run says: did the newest stack's outcomes change since the previous newest
day? (`matrix --resume RUN --grow` prints it and writes it beside the run as newest-change.md.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES, public_version
from harness.define.registry import discover
from harness.publishing.atlas import dated_verdicts
from harness.publishing.report import latest_by_key
from harness.recording.records import read_records
from harness.recording.signatures import rename_all


def newest_change_text(run_dir: Path) -> str:
    """Markdown: the newest day against the one before it, per scenario (target state and fixes), and what
    moved in the stack between them."""
    records, _ = latest_by_key(rename_all(read_records(run_dir / "records.jsonl")))
    dates, stacks, verdicts = dated_verdicts(records, {s.id: s.spec for s in discover()})
    if len(dates) < 2:
        return f"Newest stack: only {len(dates)} day recorded in {run_dir.name}, nothing to compare."
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


def newest_change_markdown(results_dir: Path, profile_name: str) -> str:
    """Markdown: for each scenario, its newest day in the table against its previous day there (the target state and
    the fixes that removed it), over every run of the dated profile the table reads, and what moved in the stack.
    What `matrix --grow` prints and the weekly workflow puts in its summary."""
    from harness.publishing.report import select_runs

    selection = select_runs(results_dir)
    mine = {m["run_id"] for m in selection.metas if m.get("profile") == profile_name}
    records, _ = selection.latest()
    records = [r for r in records if r.get("run_id") in mine]
    dates, stacks, verdicts = dated_verdicts(records, {s.id: s.spec for s in discover()})
    if not dates:
        return f"## The newest day\n\nNo day of profile {profile_name} is in the table."
    changed, same = [], []
    for scenario in sorted(verdicts):
        days = sorted(verdicts[scenario])
        if len(days) < 2:
            same.append(f"- {scenario}: only {days[-1]} recorded")
            continue
        old, new = days[-2], days[-1]
        before, after = _shown(verdicts[scenario][old]), _shown(verdicts[scenario][new])
        moved = _moved(stacks.get(old, {}), stacks.get(new, {})) or "no package moved"
        if before != after:
            changed.append(f"- {scenario}: {new} against {old}: {before} -> {after} ({moved})")
        else:
            same.append(f"- {scenario}: {new} against {old}: {after}")
    head = (
        f"**{len(changed)} scenario(s) changed on their newest day.**"
        if changed
        else "Every scenario's newest day has the outcomes of its previous day."
    )
    lines = [f"## The newest day of {profile_name} ({dates[-1]})", "", head, ""]
    if changed:
        lines += ["Changed:", *changed, ""]
    lines += ["Unchanged:" if changed else "Outcomes:", *same]
    return "\n".join(lines)


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
