"""Which records a flip search reads: one dated run, or several runs of one profile read together (a GPU profile's
days measured over several device calls, a CPU run whose configs a later run measured again), chosen as the table
chooses them, so that a flip is a flip of what the table shows."""

from __future__ import annotations

import json
from pathlib import Path

from harness.paths import FLIPS_FILE, meta_file, records_file
from harness.recording.record import Record
from harness.recording.records import read_records
from harness.recording.signatures import rename_all


def filed_elsewhere(run_dirs: list[Path], out_root: Path) -> list[str]:
    """The runs after the first whose own flips folder exists: a second filing of the same flips would show them
    twice in the table, and its probes would not be read."""
    return [run_dir.name for run_dir in run_dirs[1:] if (out_root / run_dir.name / FLIPS_FILE).is_file()]


def usable_runs(run_dirs: list[Path], profile_name: str) -> None:
    """Refuse runs that are not one profile's evidence: another profile's run, or one the table leaves out
    (superseded or withdrawn: its records are no evidence, so a flip read from them would be none either)."""
    from harness.errors import UsageError
    from harness.knowledge.selection import retired

    for run_dir in run_dirs:
        meta_path = meta_file(run_dir)
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        if meta.get("profile", profile_name) != profile_name:
            raise UsageError(f"--run {run_dir.name} is a run of {meta['profile']}, not of --profile {profile_name}")
        if retired(meta):
            why = meta.get("withdrawn") or f"superseded by {', '.join(meta['superseded_by'])}"
            raise UsageError(f"--run {run_dir.name} is no evidence any more ({why})")


def run_records(run_dirs: list[Path]) -> list[Record]:
    """The runs' records judged by today's rules, chosen as the table chooses them (`report.select_runs`): runs
    newest first (by their start), each giving the (cell, scenario) pairs no newer run of them covers, then the
    newest record per key."""
    from harness.knowledge.selection import config_slices, latest_by_key, newest_per_pair

    metas = {d.name: json.loads(meta_file(d).read_text()) for d in run_dirs if meta_file(d).is_file()}

    def started(run_dir: Path) -> tuple[str, str]:  # its start, then its id (which begins with its start time)
        return str(metas.get(run_dir.name, {}).get("started_at", "")), run_dir.name

    newest_first = sorted(run_dirs, key=started, reverse=True)
    runs = ((d.name, rename_all(read_records(records_file(d)))) for d in newest_first)
    return latest_by_key([r for _, fresh, _ in newest_per_pair(runs, config_slices(metas)) for r in fresh])[0]
