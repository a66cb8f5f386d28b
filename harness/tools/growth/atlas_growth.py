"""The atlas keeps up: `matrix --profile history --grow` adds the install days the date rule gives now to what the
table shows, for every scenario, and runs only what is missing; `watch` tries each release published after the
newest atlas day alone on that day's stack.

Both start from the evidence the table shows for the dated profile (every run of it that is not retired, the
newest per cell and scenario), never from one run picked by its name: a past "today" stays a day of the atlas, a
day that one scenario's re-check added is grown for the others, and a second growth on the same day finds nothing
to run. `COMPAT_MATRIX_TODAY` (YYYY-MM-DD) sets the day the rule and the watch take as today (tests make time pass
with it; unset, the UTC date).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from harness.define.profile import DATE_AXIS, RULE_PREFIX, Profile, parse_date_rule
from harness.errors import OptionError
from harness.knowledge.selection import retired
from harness.paths import FLIPS_FILE, REPO_ROOT, WATCH_FILE, profile_runs, records_file, run_path
from harness.recording import runs
from harness.recording.record import Record
from harness.recording.records import read_records

TODAY_VAR = "COMPAT_MATRIX_TODAY"
_CELL_DAY = re.compile(r"^era_date-(\d{4}-\d{2}-\d{2})$")


def today() -> dt.date:
    """The day the date rule and the watch take as today: `COMPAT_MATRIX_TODAY`, else the UTC date."""
    given = os.environ.get(TODAY_VAR)
    if not given:
        return dt.datetime.now(dt.UTC).date()
    try:
        return dt.date.fromisoformat(given)
    except ValueError:
        raise OptionError(f"{TODAY_VAR}={given!r}: expected YYYY-MM-DD") from None


def atlas_evidence(results_dir: Path, profile_name: str) -> dict[str, set[str]]:
    """Install day -> the scenarios with a record on that day's cell, over every run of the profile the table reads
    (retired runs left out)."""
    found: dict[str, set[str]] = defaultdict(set)
    for run_dir in profile_runs(results_dir, profile_name):
        meta = runs.read_meta(run_dir)
        if meta.get("profile") != profile_name or retired(meta):
            continue
        for record in read_records(records_file(run_dir), warn=False):
            day = _CELL_DAY.match(str(record.get("cell", "")))
            if day:
                found[day.group(1)].add(record["scenario"])
    return dict(found)


def rule_days(profile: Profile, on: dt.date) -> list[str]:
    """The install days the profile's date rule gives on `on` (the day after each minor of its package, and `on`)."""
    from harness.versions.releases import minor_release_days

    values = profile.axes.get(DATE_AXIS) or ()
    if not (len(values) == 1 and values[0].startswith(RULE_PREFIX)):
        raise OptionError(f'--grow: profile {profile.name} has no date rule (axes.date = "peft minors >=...")')
    rule = parse_date_rule(str(profile.path), "axes.date", values[0][len(RULE_PREFIX) :])
    return [d for d in minor_release_days(rule, on) if d <= on.isoformat()]


@dataclass(frozen=True)
class GrowthStep:
    """One run of the growth: these scenarios on these days (days missing the same scenarios run together)."""

    days: tuple[str, ...]
    scenarios: tuple[str, ...]


def growth_plan(
    evidence: dict[str, set[str]], days: list[str], scenarios: list[str], added: tuple[str, ...] = ()
) -> list[GrowthStep]:
    """What the growth runs: on each day the rule gives (and each `added` day), and on each day newer than the
    newest day that has every scenario (a re-check's new day, a growth cut short), the scenarios no record covers
    there; days missing the same scenarios form one step. Empty when the atlas already has them all."""
    complete = [d for d, have in evidence.items() if set(scenarios) <= have]
    frontier = [d for d in evidence if not complete or d > max(complete)]
    missing: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for day in sorted({*days, *added, *frontier}):
        lacking = tuple(s for s in scenarios if s not in evidence.get(day, set()))
        if lacking:
            missing[lacking].append(day)
    return [GrowthStep(tuple(d), s) for s, d in sorted(missing.items(), key=lambda item: item[1])]


def runnable_scenarios(profile: Profile, patterns: tuple[str, ...] | None = None) -> list[str]:
    """The profile's scenarios (or those `patterns` name) that can run on its device (S8 needs GPUs: a CPU atlas
    never has it, and growth must not wait for it)."""
    from harness.define.registry import select

    chosen = select(patterns or profile.scenarios, where="--scenario")
    return [s.id for s in chosen if s.spec.get("device", "any") in ("any", profile.device)]


def unfinished_runs(results_dir: Path, profile_name: str) -> tuple[list[str], list[str]]:
    """(interrupted runs of the profile, runs another process is writing now): what a growth cut short left. Its
    records count as evidence of their days, so the growth resumes them before planning anything new."""
    stopped, busy = [], []
    for run_dir in profile_runs(results_dir, profile_name):
        meta = runs.read_meta(run_dir)
        if meta.get("profile") != profile_name or retired(meta) or meta.get("status") in runs.FINISHED:
            continue
        (busy if runs.effective_status(run_dir, meta) == "running" else stopped).append(run_dir.name)
    return stopped, busy


def days_to_grow(profile: Profile, results_dir: Path, on: dt.date, only_if_new: bool) -> tuple[list[str], str]:
    """The install days the date rule gives on `on`, and why today is or is not among them: with `only_if_new`, today
    is an install day only where a release of the six packages first uploaded after the newest atlas day, and before
    today (today's stack is the index as of today's start), would be in it; else it would repeat the newest day."""
    days = rule_days(profile, on)
    if not only_if_new or on.isoformat() not in days:
        return days, ""
    newest, found = releases_since_newest(results_dir, profile.name, on)
    before_today = [r for r in found if r[2] < on.isoformat()]
    if newest is None or before_today:
        shown = ", ".join(f"{p} {v} ({d})" for p, v, d in before_today)
        return days, f"today's stack holds what the newest day ({newest}) lacks: {shown}" if newest else ""
    why = f"no release of the six packages between the newest day ({newest}) and today"
    return [d for d in days if d != on.isoformat()], why


def releases_since_newest(results_dir: Path, profile_name: str, on: dt.date) -> tuple[str | None, list[Any]]:
    """(the newest atlas day, each release of the six packages first uploaded from that day to `on` that its stack
    does not hold: (package, version, first upload day))."""
    from harness.define.packages import AXIS_PACKAGES

    evidence = atlas_evidence(results_dir, profile_name)
    if not evidence:
        return None, []
    newest = max(evidence)
    versions = day_versions(results_dir, profile_name, newest)
    return newest, [r for r in new_releases(list(AXIS_PACKAGES), newest, on) if versions.get(r[0]) != r[1]]


def grow(
    profile: Profile, options: Any, stream: TextIO | None = None, only_if_new: bool = False
) -> tuple[list[Any], str]:
    """Resume the growth runs a growth cut short, then run the growth plan as new runs of the profile (one per step),
    and say what the newest day changed (made in a fresh process: the code may have changed under a long growth).
    Returns (the runs' summaries, the Markdown summary)."""
    from harness.execution.matrix import run_matrix

    on = today()
    say = (lambda text: print(text, file=stream, flush=True)) if stream else (lambda text: print(text, flush=True))
    stopped, busy = unfinished_runs(options.results_dir, profile.name)
    if busy:
        raise OptionError(f"{{grow}}: run {busy[0]} is being written by another process: wait for it to end")
    summaries = []
    for run_id in stopped:
        say(f"growth: resuming {run_id}, which did not finish")
        summary = run_matrix(profile, replace(options, fresh=False, resume_run=run_id, grow=False, add_dates=(),
                                              dates=(), scenario_patterns=None))  # fmt: skip
        summaries.append(summary)
        if summary.interrupted:
            return summaries, ""
    evidence = atlas_evidence(options.results_dir, profile.name)
    wanted = runnable_scenarios(profile, options.scenario_patterns)
    days, why = days_to_grow(profile, options.results_dir, on, only_if_new)
    if why:
        say(f"growth: {why}")
    plan = growth_plan(evidence, days, wanted, options.add_dates)
    if not plan:
        text = (
            f"Nothing to grow on {on}: every install day the date rule gives ({', '.join(days)}) "
            f"already has every scenario in the table."
        )
        say(text)
        return summaries, text
    for step in plan:
        say(f"growth: {', '.join(step.days)} for {len(step.scenarios)} scenario(s): {', '.join(step.scenarios)}")
        step_options = replace(
            options, fresh=True, resume_run=None, grow=False, add_dates=(), dates=step.days,
            scenario_patterns=step.scenarios,
        )  # fmt: skip
        summary = run_matrix(profile, step_options)
        summaries.append(summary)
        if summary.interrupted:
            break
    text = growth_summary(options.results_dir, profile.name)
    say(text)
    return summaries, text


def growth_summary(results_dir: Path, profile_name: str) -> str:
    """Each scenario's newest day against its previous day (`publishing/growth.py`), made in a fresh interpreter from
    the code as it is now: a growth runs for many minutes, and a module loaded at its end from a tree edited
    meanwhile once stopped it with an ImportError (2026-12-05)."""
    done = subprocess.run(
        [sys.executable, "-m", "harness.publishing.growth", str(results_dir), profile_name],
        capture_output=True, text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return f"## The newest day of {profile_name}\n\nNot made: {said[-1] if said else f'exit {done.returncode}'}"
    return done.stdout.rstrip("\n")


# --- the release watch ------------------------------------------------------------------------------------------


@dataclass
class Watched:
    """One release published after the newest atlas day, moved alone onto that day's stack."""

    package: str
    version: str
    uploaded: str
    day: str
    run_id: str | None = None
    effects: dict[str, str] = field(default_factory=dict)
    summary: str = ""


def new_releases(packages: list[str], after: str, until: dt.date) -> list[tuple[str, str, str]]:
    """(package, version, first upload day) of every final release first uploaded on or after the day `after` (the
    newest atlas day's stack is the index as of that day's start) and no later than `until`, oldest first."""
    from harness.versions.releases import index_files, version_of

    found = []
    for package in packages:
        first: dict[str, dt.datetime] = {}
        for item in index_files(package):
            version, uploaded = version_of(item.get("filename", "")), item.get("upload-time")
            if version is None or version.is_prerelease or version.is_devrelease or not uploaded or item.get("yanked"):
                continue
            when = dt.datetime.fromisoformat(str(uploaded).replace("Z", "+00:00"))
            first[str(version)] = min(first.get(str(version), when), when)
        for version, when in first.items():
            if after <= when.date().isoformat() <= until.isoformat():
                found.append((package, version, when.date().isoformat()))
    return sorted(found, key=lambda item: (item[2], item[0], item[1]))


def write_watch(out_dir: Path, watched: list[Watched], day: str, on: dt.date) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / WATCH_FILE
    body = {"newest_day": day, "watched_on": on.isoformat(), "releases": [w.__dict__ for w in watched]}
    path.write_text(json.dumps(body, indent=1) + "\n")
    return path


def day_versions(results_dir: Path, profile_name: str, day: str) -> dict[str, str]:
    """The axis packages' releases the day's cell really imported (its records' `versions`, the fullest of them)."""
    from harness.define.packages import AXIS_PACKAGES, public_version
    from harness.knowledge.flips import fullest_versions

    versions = fullest_versions(_cell_records(results_dir, profile_name, day))
    return {p: public_version(str(versions[p])) for p in AXIS_PACKAGES if versions.get(p)}


def moved_alone(history: Profile, versions: dict[str, str], day: str, package: str, version: str) -> Profile:
    """The newest day's stack with `package` at `version` and every other axis package held at the day's release;
    what the day's stack does not pin resolves as of the day, the moved package's own requirements with it."""
    from harness.tools.release_search.flip_naming import held_stack, moving

    held = held_stack(history, versions | {package: version}, day, f"watch-{package}-{version}")
    return moving(held, package, today().isoformat())


def effect(scenario: str, before: Any, after: Any) -> str:
    """One scenario's change when a release moves alone, in the reader's words."""
    if after is None or after.state in ("install-failed", "env-broken"):
        return "cannot install" if after is None or after.state == "install-failed" else "cannot run (env)"
    if before is None:
        return f"new evidence: {after.state} ({len(after.target_records)}/{after.candidates})"
    shown, was = f"{len(after.target_records)}/{after.candidates}", f"{len(before.target_records)}/{before.candidates}"
    if after.state == "target" and before.state != "target":
        return f"breaks {scenario} (target now shows on {shown})"
    if before.state == "target" and after.state != "target":
        return f"fixes {scenario} ({shown} was {was})"
    if after.state == "target" and shown != was:
        return f"changes {scenario} (target on {shown}, was {was})"
    return "no change"


def watch(history: Profile, options: Any, out_root: Path, stream: TextIO | None = None) -> tuple[list[Watched], str]:
    """Every release of the six packages published after the newest atlas day, moved alone onto that day's stack and
    run with the day's configs (each scenario's seed configs, baselines): its effect per scenario against the day."""
    from dataclasses import replace as replaced

    from harness.define.packages import AXIS_PACKAGES
    from harness.define.registry import discover
    from harness.execution.matrix import run_matrix
    from harness.recording.signatures import rename_all
    from harness.recording.verdicts import verdict

    say = (lambda text: print(text, file=stream, flush=True)) if stream else (lambda text: print(text, flush=True))
    on = today()
    evidence = atlas_evidence(options.results_dir, history.name)
    if not evidence:
        raise OptionError(f"watch: no day of profile {history.name} in the table")
    newest = max(evidence)
    versions = day_versions(options.results_dir, history.name, newest)
    found = [r for r in new_releases(list(AXIS_PACKAGES), newest, on) if versions.get(r[0]) != r[1]]
    out_dir = out_root / on.isoformat()
    if not found:
        text = f"No release of {', '.join(AXIS_PACKAGES)} since the newest atlas day ({newest}), as of {on}."
        say(text)
        write_watch(out_dir, [], newest, on)
        return [], text
    specs = {s.id: s.spec for s in discover()}
    newest_records = day_records(options.results_dir, history.name, newest)
    earlier = watched_before(out_root, newest)
    watched = []
    for package, version, uploaded in found:
        if (package, version) in earlier:  # its run on this day's stack is complete: judged then, not run again
            item = earlier[(package, version)]
            say(f"watch: {package} {version} alone on {newest}'s stack: run {item.run_id} already did: {item.summary}")
            watched.append(item)
            write_watch(out_dir, watched, newest, on)
            write_flips(out_dir, watched, versions)
            continue
        say(f"watch: {package} {version} (uploaded {uploaded}) alone on {newest}'s stack")
        probe = moved_alone(history, versions, newest, package, version)
        probe_options = replaced(
            options, fresh=True, resume_run=None, grow=False, dates=(), results_dir=out_dir / f"{package}-{version}",
            examples=0, example_db=None,
        )  # fmt: skip
        summary = run_matrix(probe, probe_options)
        records = rename_all(read_records(records_file(summary.run_dir)))
        item = Watched(package, version, uploaded, newest, summary.run_id)
        for scenario in sorted({r["scenario"] for r in newest_records}):
            mine = [r for r in records if r["scenario"] == scenario and r["variant"] == "baseline"]
            theirs = [r for r in newest_records if r["scenario"] == scenario]
            before = verdict(theirs, specs.get(scenario)) if theirs else None
            after = verdict(mine, specs.get(scenario)) if mine else None
            item.effects[scenario] = effect(scenario, before, after)
        changes = sorted({e for e in item.effects.values() if e != "no change"})
        item.summary = "; ".join(changes) if changes else "no change"
        say(f"  {package} {version}: {item.summary}")
        watched.append(item)
        write_watch(out_dir, watched, newest, on)
        write_flips(out_dir, watched, versions)
        if summary.interrupted:
            break
    text = "\n".join(f"- {w.package} {w.version}: {w.summary}" for w in watched)
    return watched, text


def watched_before(out_root: Path, day: str) -> dict[tuple[str, str], Watched]:
    """(package, version) -> the release already moved onto `day`'s stack by an earlier watch whose run completed
    (any earlier watch folder): the watch is incremental, each release on each newest day runs once."""
    found: dict[tuple[str, str], Watched] = {}
    for path in sorted(out_root.glob(f"*/{WATCH_FILE}")):
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if body.get("newest_day") != day:
            continue
        for entry in body.get("releases") or []:
            item = Watched(**{k: entry[k] for k in Watched.__dataclass_fields__ if k in entry})
            run_dir = run_path(path.parent / f"{item.package}-{item.version}", str(item.run_id))
            if item.run_id and item.summary and runs.read_meta(run_dir).get("status") in runs.FINISHED:
                found[(item.package, item.version)] = item
    return found


def watch_flips(watched: list[Watched], versions: dict[str, str]) -> list[Any]:
    """A watched release that changes a scenario's target outcome is a named flip: the newest day against the day with
    that one release moved (`<day>+<package>-<version>`), the package and release named by the move itself."""
    from harness.recording.flip import Flip

    flips = []
    for item in watched:
        for scenario, said in sorted(item.effects.items()):
            if not said.startswith(("breaks", "fixes")):
                continue
            older_state, newer_state = (
                ("not-reproduced", "target") if said.startswith("breaks") else ("target", "not-reproduced")
            )
            flip = Flip(
                item.day, f"{item.day}+{item.package}-{item.version}", older_state, newer_state,
                {item.package: [versions.get(item.package), item.version]}, scenario=scenario,
            )  # fmt: skip
            flip.package, flip.release = item.package, item.version
            flip.last_release_before = versions.get(item.package)
            flip.reproducing = [item.package]
            flip.note = f"the release watch of its run {item.run_id}: {said}"
            flips.append(flip)
    return flips


def write_flips(out_dir: Path, watched: list[Watched], versions: dict[str, str]) -> Path:
    """results/watch/<today>/flips.json: the watch's named flips, in the atlas's layout."""
    path = out_dir / FLIPS_FILE
    path.write_text(json.dumps([f.as_atlas_json() for f in watch_flips(watched, versions)], indent=1) + "\n")
    return path


def day_records(results_dir: Path, profile_name: str, day: str) -> list[Record]:
    """The baseline records the table shows for the day's cell of the profile (newest per key)."""
    from harness.knowledge.selection import latest_by_key
    from harness.recording.signatures import rename_all

    latest, _ = latest_by_key(rename_all(_cell_records(results_dir, profile_name, day)))
    return [r for r in latest if r["variant"] == "baseline"]


def _cell_records(results_dir: Path, profile_name: str, day: str) -> list[Record]:
    """Every record of the day's cell in the profile's runs the table reads (retired runs left out)."""
    records = []
    for run_dir in profile_runs(results_dir, profile_name):
        meta = runs.read_meta(run_dir)
        if meta.get("profile") == profile_name and not retired(meta):
            records += [r for r in read_records(records_file(run_dir), warn=False) if r["cell"] == f"era_date-{day}"]
    return records
