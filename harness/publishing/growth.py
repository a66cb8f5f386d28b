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
