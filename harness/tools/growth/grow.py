"""`compat-matrix grow` (`nox -s grow`): what the weekly growth and the daily release watch do, as one command a
session runs at its start when a release of the six packages is newer than the newest atlas day.

In order, each phase printing its progress: the growth (`atlas_growth.grow`: the runs a growth cut short resumed
first, then the install days the date rule gives that the table lacks; today only where a release first uploaded
after the newest day would be in today's stack), the release watch (each release since the newest day alone on its
stack; one already moved onto that day is not run again), the flips of the new day pairs (each scenario whose
newest day changed against its previous day, swept to the release that changed it; one already named is not probed
again), and the report. Incremental and resumable: run again, it does only what is left. The phases after the
growth run in fresh processes (`python -m harness ...`), so a tree edited during a long growth cannot stop them
with the code loaded at the start (an ImportError ended the growth of 2026-12-05 that way); the modules this one
needs are imported before the growth starts. It ends with what changed and the time of each phase.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.define.profile import load_profile
from harness.define.registry import discover
from harness.environments.envs import InstallOptions, default_envs_dir
from harness.errors import UsageError
from harness.execution.options import MatrixOptions
from harness.knowledge.atlas import Atlas
from harness.paths import (
    FLIPS_FILE,
    FLIPS_FOLDER,
    MATRIX_DIR,
    REPO_ROOT,
    WATCH_FILE,
    WATCH_FOLDER,
    flips_file,
    profile_runs,
    records_file,
)
from harness.recording import runs
from harness.recording.flip import Flip
from harness.recording.records import read_records
from harness.tools.growth import atlas_growth
from harness.tools.release_search.flip_naming import dated_states, flips_in


@dataclass
class Phase:
    """One phase of the session: how long it took and what it found."""

    name: str
    seconds: float = 0.0
    said: list[str] = field(default_factory=list)
    failed: bool = False


def command(args: argparse.Namespace) -> int:
    """Plan (and with --plan, only say) what the atlas lacks, then grow, watch, name the new flips and report."""
    profile = load_profile(args.profile, MATRIX_DIR)
    if profile.era_packages:
        raise UsageError(f"--profile {profile.name}: an era-locked GPU profile grows on a node (docs/atlas.md)")
    results = args.results_dir
    on = atlas_growth.today()
    newest, found = atlas_growth.releases_since_newest(results, profile.name, on)
    if newest is None:
        raise UsageError(f"no day of profile {profile.name} in {results / 'runs'}: run the profile first")
    shown = ", ".join(f"{p} {v} ({d})" for p, v, d in found) or "none"
    print(
        f"grow: the newest day of {profile.name} is {newest}; releases of the six packages since: {shown}", flush=True
    )
    if args.plan:
        return _plan_only(profile, results, on)
    install = InstallOptions(
        envs_dir=args.envs_dir or default_envs_dir(), max_env_gb=args.max_env_gb, torch_index=args.torch_index
    )
    options = MatrixOptions(results_dir=results, install=install, example_db=None)
    phases = [_growth(profile, options)]
    passed = [f"--results-dir={results}", *_install_args(args)]
    if not phases[0].failed:
        if not args.no_watch:
            phases.append(_fresh("watch", ["watch", "--profile", profile.name, *passed]))
        if not args.no_flips:  # found and probed in a fresh interpreter too
            phases.append(_fresh_flips(profile.name, results, newest, passed))
        if not args.no_report:
            phases.append(_fresh("report", ["report", f"--results-dir={results}"]))
    _what_changed(phases, results)
    return 1 if any(p.failed for p in phases) else 0


def _plan_only(profile: Any, results: Path, on: Any) -> int:
    """What a growth would run now, and nothing else."""
    stopped, busy = atlas_growth.unfinished_runs(results, profile.name)
    for run_id in busy:
        print(f"grow: run {run_id} is being written by another process")
    for run_id in stopped:
        print(f"grow: would resume {run_id} (it did not finish)")
    days, why = atlas_growth.days_to_grow(profile, results, on, only_if_new=True)
    if why:
        print(f"grow: {why}")
    evidence = atlas_growth.atlas_evidence(results, profile.name)
    plan = atlas_growth.growth_plan(evidence, days, atlas_growth.runnable_scenarios(profile))
    for step in plan:
        print(
            f"grow: would run {', '.join(step.days)} for {len(step.scenarios)} scenario(s): {', '.join(step.scenarios)}"
        )
    if not plan and not stopped:
        print(f"grow: nothing to grow on {on}")
    print("grow: then the release watch, the flips of each scenario whose newest day changes, and the report")
    return 0


def _growth(profile: Any, options: MatrixOptions) -> Phase:
    phase = Phase("growth")
    started = time.monotonic()
    summaries, text = atlas_growth.grow(profile, options, only_if_new=True)
    phase.seconds = time.monotonic() - started
    if text:
        (options.results_dir / "growth-summary.md").write_text(text + "\n")
    for summary in summaries:
        phase.said.append(f"run {summary.run_id}: {summary.written} new records; {json.dumps(summary.outcomes)}")
    stopped = next((s for s in summaries if s.interrupted), None)
    if stopped is not None:
        phase.failed = True
        phase.said.append(f"interrupted ({stopped.signal}): run `compat-matrix grow` again to go on")
    changed = [line for line in text.splitlines() if line.startswith("- ") and "->" in line]
    phase.said += changed or ([f"no scenario's newest day changed ({len(summaries)} run(s))"] if summaries else [])
    return phase


def _fresh(name: str, argv: list[str]) -> Phase:
    """A phase as `python -m harness ARGV` in a fresh interpreter, its output passed through as it comes."""
    phase = Phase(name)
    print(f"grow: {name}: python -m harness {' '.join(argv)}", flush=True)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "harness", *argv], cwd=REPO_ROOT, stdin=subprocess.DEVNULL)
    phase.seconds = time.monotonic() - started
    if done.returncode != 0:
        phase.failed = True
        phase.said.append(f"exit {done.returncode}")
    return phase


def new_flips(results: Path, profile_name: str, since: str) -> list[Flip]:
    """The flips of the table's records of the profile whose newer day is after `since` (the newest day before this
    growth) or is its scenario's newest day, that no flips.json under results/flips/ holds yet."""
    specs = {s.id: s.spec for s in discover()}
    found = flips_in(dated_states(Atlas(results, specs).records_of_profile(profile_name), specs))
    newest: dict[str, str] = {}
    for flip in found:
        newest[flip.scenario] = max(newest.get(flip.scenario, ""), flip.newer)
    filed = set()
    for path in (results / FLIPS_FOLDER).glob(f"*/{FLIPS_FILE}"):
        try:
            filed |= {(e.get("scenario"), e.get("older"), e.get("newer")) for e in json.loads(path.read_text())}
        except (OSError, ValueError, AttributeError):
            continue
    return [
        f for f in found
        if (f.newer > since or f.newer == newest[f.scenario]) and (f.scenario, f.older, f.newer) not in filed
    ]  # fmt: skip


def pair_runs(results: Path, profile_name: str, scenario: str, days: tuple[str, str]) -> list[str]:
    """The runs of the profile the table reads that hold the scenario on either day, the one whose flips are filed
    already first (flips are filed under the first run named; a second filing is refused)."""
    from harness.knowledge.selection import retired

    cells = {f"era_date-{d}" for d in days}
    found = []
    for run_dir in profile_runs(results, profile_name):
        meta = runs.read_meta(run_dir)
        if meta.get("profile") != profile_name or retired(meta):
            continue
        records = read_records(records_file(run_dir), warn=False)
        if any(r["scenario"] == scenario and r["cell"] in cells for r in records):
            found.append(run_dir.name)
    return sorted(found, key=lambda run: not flips_file(results, run).is_file())


def _flips(profile_name: str, results: Path, since: str, passed: list[str]) -> Phase:
    phase = Phase("flips")
    started = time.monotonic()
    pending = new_flips(results, profile_name, since)
    if not pending:
        phase.said.append("no new day pair changes a target outcome")
    for scenario in sorted({f.scenario for f in pending}):
        mine = [f for f in pending if f.scenario == scenario]
        span = (min(f.older for f in mine), max(f.newer for f in mine))
        chosen = pair_runs(results, profile_name, scenario, span)
        filed = [r for r in chosen[1:] if flips_file(results, r).is_file()]
        argv = ["flips", "--profile", profile_name, *(f"--run={r}" for r in chosen), "--scenario", scenario,
                "--from", span[0], "--to", span[1], *passed]  # fmt: skip
        if filed:  # two runs with flips of their own: which one files these is a person's choice
            phase.said.append(f"{scenario} {span[0]} .. {span[1]}: not probed (flips filed under {', '.join(chosen)})")
            continue
        done = _fresh(f"flips of {scenario} {span[0]} .. {span[1]}", argv)
        phase.failed |= done.failed
        phase.said += [*_named(flips_file(results, chosen[0]), mine), *done.said]
    phase.seconds = time.monotonic() - started
    return phase


def _fresh_flips(profile_name: str, results: Path, since: str, passed: list[str]) -> Phase:
    """The flips phase in a fresh interpreter (`python -m harness.tools.growth.grow`), its lines read back."""
    phase = Phase("flips")
    print("grow: flips of the new day pairs", flush=True)
    started = time.monotonic()
    argv = [sys.executable, "-m", "harness.tools.growth.grow", profile_name, str(results), since, *passed]
    done = subprocess.run(argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    phase.seconds = time.monotonic() - started
    for line in done.stdout.splitlines():
        print(line, flush=True)
        if line.startswith(_SAID):
            phase.said.append(line.removeprefix(_SAID))
    phase.failed = done.returncode != 0
    return phase


_SAID = "grow: found: "


def _named(path: Path, flips: list[Flip]) -> list[str]:
    """Each flip as its flips.json now names it (`describe`), or that it was not filed."""
    from harness.tools.release_search.flip_naming import describe

    try:
        filed = [Flip.from_json(e) for e in json.loads(path.read_text())]
    except (OSError, ValueError):
        filed = []
    lines = []
    for flip in flips:
        match = [f for f in filed if (f.scenario, f.older, f.newer) == (flip.scenario, flip.older, flip.newer)]
        lines += [describe(f) for f in match] or [f"{flip.scenario} {flip.older} .. {flip.newer}: not filed"]
    return lines


def _install_args(args: argparse.Namespace) -> list[str]:
    given = [("--max-env-gb", args.max_env_gb), ("--torch-index", args.torch_index)]
    return [f"{flag}={value}" for flag, value in given if value is not None]


def _what_changed(phases: list[Phase], results: Path) -> None:
    """The end: what each phase found (the watch's lines from its file), and the time of each."""
    print("\n## What the growth changed", flush=True)
    watch = sorted((results / WATCH_FOLDER).glob(f"*/{WATCH_FILE}"))
    for phase in phases:
        lines = list(phase.said)
        if phase.name == "watch" and watch:
            body = json.loads(watch[-1].read_text())
            lines = [f"- {r['package']} {r['version']}: {r['summary']}" for r in body.get("releases", [])] or [
                f"no release since {body.get('newest_day')}"
            ]
        print(f"{phase.name}:{' (failed)' if phase.failed else ''}")
        for line in lines or ["nothing"]:
            print(f"  {line.removeprefix('- ')}")
    print("\n| phase | seconds |\n|---|---|")
    for phase in phases:
        print(f"| {phase.name} | {phase.seconds:.0f} |")
    print(f"| all | {sum(p.seconds for p in phases):.0f} |", flush=True)


if __name__ == "__main__":  # the flips phase, as `_fresh_flips` starts it: PROFILE RESULTS SINCE [passed flags]
    found = _flips(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
    for said in found.said:
        print(f"{_SAID}{said}", flush=True)
    sys.exit(1 if found.failed else 0)
