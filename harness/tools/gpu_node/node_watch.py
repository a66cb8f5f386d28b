"""The release watch on a GPU node: each release published after the GPU atlas's newest day, moved alone onto that
day's stack over the node's torch, run with the day's configs, its effect per scenario against the day.

A node has no index, so the watch runs in two steps, as the atlas's own node flips do (`node_flips.py`):
1. `compat-matrix watch --profile gpu-history-ws2` (connected) finds the new releases and writes each as a probe day
   (`<day>+<package>-<version>`: the day's era packages with that one moved, resolved over the node's torch) into the
   probe profile's era lock, then prints the pack and node commands. `results/watch/<today>/<profile>/plan.json` says
   what it planned.
2. On the node the probe profile runs those days (`scripts/gpu-node-run.sh`); the records are imported under
   `results/watch/<today>/<profile>/runs/`, and `watch` again judges them: the same effects, `watch.json` and named
   flips as the CPU watch (`atlas_growth.effect`, `watch_flips`).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from harness.define.profile import Profile
from harness.paths import MATRIX_DIR, WATCH_FOLDER, records_file
from harness.recording.packing import run_dirs
from harness.recording.records import read_records
from harness.tools.gpu_node.node_flips import probe_day
from harness.tools.growth import atlas_growth


def newest_day(profile: Profile, evidence: dict[str, set[str]]) -> str:
    """The newest day of the profile's era lock that the table holds records of (`evidence`: day -> scenarios)."""
    from harness.versions import lock_file

    lock = lock_file.read_lock(lock_file.lock_path(MATRIX_DIR, profile.name))
    days = set(evidence) & set(lock["days"])
    if not days:
        from harness.errors import OptionError

        raise OptionError(f"watch: no day of profile {profile.name} in the table")
    return max(days)


def plan(profile: Profile, results_dir: Path, on: dt.date, say: Any = print) -> dict[str, Any]:
    """Find the releases after the newest GPU day and write their probe days (one package moved each) into the
    probe profile's lock; returns the plan (also written to `plan.json`)."""
    from harness.define.packages import AXIS_PACKAGES
    from harness.tools.gpu_node.node_flips import write_probe_profile

    evidence = atlas_growth.atlas_evidence(results_dir, profile.name)  # every record of the profile: read once
    day = newest_day(profile, evidence)
    versions = atlas_growth.day_versions(results_dir, profile.name, day)
    found = [r for r in atlas_growth.new_releases(list(AXIS_PACKAGES), day, on) if versions.get(r[0]) != r[1]]
    found = [r for r in found if r[0] in profile.era_packages]  # the node's own torch is held: never moved
    scenarios = sorted(evidence[day])
    probes = [probe_day(day, package, version) for package, version, _ in found]
    body = {
        "profile": profile.name,
        "newest_day": day,
        "watched_on": on.isoformat(),
        "versions": versions,
        "releases": [
            {"package": p, "version": v, "uploaded": u, "probe_day": probe_day(day, p, v)} for p, v, u in found
        ],
        "scenarios": scenarios,
    }
    folder = results_dir / WATCH_FOLDER / on.isoformat() / profile.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(body, indent=1) + "\n")
    if not probes:
        watched = [p for p in AXIS_PACKAGES if p in profile.era_packages]
        say(f"No release of {', '.join(watched)} since the newest GPU day ({day}), as of {on}.")
        return body
    write_probe_profile(profile, probes, scenarios, MATRIX_DIR)
    from harness.versions import lock_file

    resolved = lock_file.read_lock(lock_file.lock_path(MATRIX_DIR, f"{profile.name}-probes"))["days"]
    for day in [d for d in probes if not (resolved.get(d) or {}).get("resolved")]:
        say(f"  {day}: cannot be resolved over the node's torch, not packed: {(resolved.get(day) or {}).get('error')}")
    probes = [d for d in probes if (resolved.get(d) or {}).get("resolved")]
    if not probes:
        return body
    days = " ".join(f"--day {d}" for d in probes)
    cells = " ".join(f"--cell '*{d}'" for d in probes)
    say(f"{len(probes)} release(s) to watch on {day}'s stack: {', '.join(probes)}")
    say(f"next: python -m harness wheelhouse --profile {profile.name}-probes {days} --pack .gpu-pack/watch.tar.xz")
    say(f"      on the node: scripts/gpu-node-run.sh {profile.name}-probes .gpu-pack/watch.tar.xz OUT {cells}")
    say(f"      python -m harness import-run --results-dir {folder} OUT/<run-id>.records.jsonl; then watch again")
    return body


def judge(body: dict[str, Any], results_dir: Path, say: Any = print) -> list[atlas_growth.Watched]:
    """Each planned release's effect per scenario, from the probe records imported so far; a release with no record
    yet is left out (not run), never read as 'no change'."""
    from harness.define.registry import discover
    from harness.recording.signatures import rename_all
    from harness.recording.verdicts import verdict

    folder = results_dir / WATCH_FOLDER / body["watched_on"] / body["profile"]
    records: dict[str, list[dict[str, Any]]] = {}
    for run_dir in run_dirs(folder):
        for record in rename_all(read_records(records_file(run_dir))):
            day = (record.get("pins") or {}).get("date", "")
            records.setdefault(day, []).append(record | {"run_id": run_dir.name})
    specs = {s.id: s.spec for s in discover()}
    day_records = atlas_growth.day_records(results_dir, body["profile"], body["newest_day"])
    watched = []
    for release in body["releases"]:
        mine = [r for r in records.get(release["probe_day"], []) if r["variant"] == "baseline"]
        if not mine:
            say(f"  {release['package']} {release['version']}: not run yet ({release['probe_day']})")
            continue
        item = atlas_growth.Watched(
            release["package"], release["version"], release["uploaded"], body["newest_day"], mine[0]["run_id"]
        )
        for scenario in body["scenarios"]:
            theirs = [r for r in day_records if r["scenario"] == scenario]
            ours = [r for r in mine if r["scenario"] == scenario]
            before = verdict(theirs, specs.get(scenario)) if theirs else None
            after = verdict(ours, specs.get(scenario)) if ours else None
            item.effects[scenario] = atlas_growth.effect(scenario, before, after)
        changes = sorted({e for e in item.effects.values() if e != "no change"})
        item.summary = "; ".join(changes) if changes else "no change"
        say(f"  {item.package} {item.version}: {item.summary}")
        watched.append(item)
    atlas_growth.write_watch(folder, watched, body["newest_day"], dt.date.fromisoformat(body["watched_on"]))
    atlas_growth.write_flips(folder, watched, body["versions"])
    return watched


def watch(profile: Profile, results_dir: Path, say: Any = print) -> tuple[list[atlas_growth.Watched], str]:
    """Plan today's GPU watch, or where today's plan exists, judge what the node ran of it."""
    on = atlas_growth.today()
    planned = results_dir / WATCH_FOLDER / on.isoformat() / profile.name / "plan.json"
    # Today's plan is judged once the node ran it; a plan that found nothing is made again (a release may be new).
    body = json.loads(planned.read_text()) if planned.is_file() else None
    if body is None or not body["releases"]:
        body = plan(profile, results_dir, on, say)
    if not body["releases"]:
        return [], f"No release since the newest GPU day ({body['newest_day']}), as of {on}."
    watched = judge(body, results_dir, say)
    return watched, "\n".join(f"- {w.package} {w.version} (GPU): {w.summary}" for w in watched)
