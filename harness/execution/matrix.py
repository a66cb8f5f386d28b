"""One `matrix` invocation: choose the run (new, or the unfinished one it resumes), plan it, write its meta,
and hand the plan to the executor. Everything that can be wrong with the input is checked before a run
directory is created or touched; a run directory is written by one process at a time (its writer lock)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from harness.define.profile import Profile
from harness.environments import disk, envs
from harness.errors import OptionError
from harness.execution import hardware
from harness.execution.executor import execute
from harness.execution.options import MatrixOptions, MatrixSummary
from harness.paths import REPO_ROOT, records_file, run_path, runs_folder
from harness.planning.plan import RunPlan, build_plan, draw_configs, plan_scenarios
from harness.recording import runs
from harness.recording.records import read_records

__all__ = ["MatrixOptions", "MatrixSummary", "run_matrix"]


def run_matrix(profile: Profile, options: MatrixOptions, stream: TextIO | None = None) -> MatrixSummary:
    """Run (or resume) a profile's matrix."""
    scenario_plan = plan_scenarios(profile, options.scenario_patterns, options.hypothesis_profile)
    device = hardware.resolve_device(profile.device)
    machine = hardware.describe(device)
    runs.check_writable(runs_folder(options.results_dir), "results directory")
    runs.check_writable(options.install.envs_dir, "environments directory")
    digest = runs.profile_digest(profile.path)
    shard = list(options.shard) if options.shard else None

    lock: runs.RunLock | None = None
    try:
        with runs.selection_lock(options.results_dir):
            run_dir = _chosen_run(profile, options, digest, shard)
            lock = runs.RunLock.acquire(run_dir) if run_dir is not None else None
            previous = runs.read_meta(run_dir) if run_dir is not None else {}
            _check_resume_options(previous, options, run_dir)
            options, kept = _resumed_slice(previous, options)
            if kept:
                scenario_plan = plan_scenarios(profile, options.scenario_patterns, options.hypothesis_profile)
            if run_dir is not None:
                read_records(records_file(run_dir), warn=False)  # a line that is not a record: exit 2 here
            plan = build_plan(
                profile,
                scenario_plan,
                cell_patterns=options.cell_patterns,
                shard=options.shard,
                world_sizes=options.world_sizes,
                reduce=options.reduce,
                prune=not options.no_prune,
                wheelhouse=options.install.wheelhouse if options.install.offline else None,
                resolved=_resolved_axes(profile, previous, options),
            )
            # meta.json is written inside the selection lock: the next invocation sees this run.
            if run_dir is None:
                meta: dict[str, Any] = {}

                def first_meta(run_id: str) -> dict[str, Any]:
                    meta.update(_meta_for_attempt({}, run_id, plan, options, machine))
                    return meta

                run_dir = runs.create_run_dir(options.results_dir, profile.name, first_meta)
                lock = runs.RunLock.acquire(run_dir)
                why = "--fresh" if options.fresh else f"no unfinished run of profile {profile.name} to resume"
                _say(stream, f"new run {run_dir.name} ({why})")
            else:
                why = "--resume" if options.resume_run else "it did not finish; --fresh starts a new run instead"
                # We hold its lock now, so a `running` run's writer is gone: it was interrupted.
                status = "interrupted" if previous.get("status") == "running" else previous.get("status")
                _say(stream, f"resuming run {run_dir.name}, status {status} ({why})")
                if kept:
                    _say(stream, f"  with the slice it ran: {kept} (pass --scenario or --cell to choose another)")
                meta = _meta_for_attempt(previous, run_dir.name, plan, options, machine)
                runs.write_meta(run_dir, meta)
        _say(stream, disk_needed(plan, options).line())
        return execute(plan, options, meta, previous.get("status"), run_dir, machine, stream)
    finally:
        if lock is not None:
            lock.release()


def disk_needed(plan: RunPlan, options: MatrixOptions) -> disk.DiskNeed:
    """What the plan's environments will take (said before the run starts): the cells that run build or reuse one."""
    install = options.install
    wanted = [
        envs.planned_env(cell, plan.profile, install)
        for cell in plan.cells
        if not cell.excluded_reason and cell.cell_id not in plan.pruned
    ]
    return disk.estimate(wanted, install.envs_dir, install.cap())


def _say(stream: TextIO | None, text: str) -> None:
    print(text, file=stream or sys.stdout, flush=True)


def _chosen_run(profile: Profile, options: MatrixOptions, digest: str, shard: list[int] | None) -> Path | None:
    """The run this invocation continues: --resume's, else the newest unfinished run of this profile file
    (never a complete one), else None for a new run."""
    if options.resume_run:
        run_dir = run_path(options.results_dir, options.resume_run)
        meta = runs.read_meta(run_dir)
        if not meta:
            raise OptionError(f"{{resume_run}} {options.resume_run}: no run with meta.json under {run_dir.parent}")
        if meta.get("profile") != profile.name:
            raise OptionError(
                f"{{resume_run}} {options.resume_run}: that run is of profile {meta.get('profile')!r}, "
                f"not {profile.name!r} (pass {{profile}} {meta.get('profile')})"
            )
        return run_dir
    if options.fresh:
        return None
    return runs.find_resumable(options.results_dir, profile.name, digest, shard)


def _resumed_slice(previous: dict[str, Any], options: MatrixOptions) -> tuple[MatrixOptions, str]:
    """A resumed run continues what it ran: without --scenario it keeps the scenarios it drew, and without
    --cell (and no --shard or --grow, which choose cells themselves) the cells its attempts ran. A run
    started with `--scenario S7` must not grow every other scenario of the profile when resumed."""
    if not previous:
        return options, ""
    kept: list[str] = []
    scenarios, cells = options.scenario_patterns, options.cell_patterns
    if scenarios is None:
        from harness.define.registry import discover

        known = {s.id for s in discover()}
        drawn = tuple(s for s in previous.get("configs") or {} if s in known)
        if drawn:
            scenarios = drawn
            kept.append(f"{len(drawn)} scenario{'s' if len(drawn) != 1 else ''} ({', '.join(drawn)})")
    if cells is None and not options.shard and not options.grow:
        ran = tuple(
            dict.fromkeys(c for a in previous.get("attempts") or [] for c in (a.get("slice") or {}).get("cells") or [])
        )
        if ran:
            cells = ran
            kept.append(f"{len(ran)} cell{'s' if len(ran) != 1 else ''}")
    return replace(options, scenario_patterns=scenarios, cell_patterns=cells), ", ".join(kept)


def _resolved_axes(profile: Profile, previous: dict[str, Any], options: MatrixOptions) -> dict[str, list[str]] | None:
    """A resumed run's release lists (so it reproduces exactly), its date axis grown with --grow."""
    recorded = previous.get("resolved_axes")
    if options.dates:
        from harness.define.profile import DATE_AXIS

        if previous:
            raise OptionError(
                f"{{dates}}: run {previous.get('run_id')} would be resumed and keeps its days; "
                "add {fresh} for a new run"
            )
        if DATE_AXIS not in profile.axes:
            raise OptionError(f"{{dates}}: profile {profile.name} has no date axis")
        return {DATE_AXIS: sorted(set(options.dates))}
    if not options.grow:
        return recorded
    if not previous:
        raise OptionError("{grow} adds days to an existing dated run: pass {resume_run} RUN_ID")
    from harness.versions.releases import grown_dates

    return grown_dates(profile, recorded, options.add_dates)


def _check_resume_options(previous: dict[str, Any], options: MatrixOptions, run_dir: Path | None) -> None:
    """Options that would change what an existing run draws are refused, not silently ignored."""
    if not previous:
        return
    recorded_profile = previous.get("hypothesis_profile")
    if options.hypothesis_profile and recorded_profile and options.hypothesis_profile != recorded_profile:
        raise OptionError(
            f"{{hypothesis_profile}} {options.hypothesis_profile}: run {previous.get('run_id')} is being resumed "
            f"and was drawn with {recorded_profile!r}; add {{fresh}} for a new run"
        )
    if options.examples is None:
        return
    counts = {how.get("count") for how in (previous.get("draws") or {}).values()}
    if counts != {options.examples}:
        shown = ", ".join(str(c) for c in sorted(c for c in counts if c is not None)) or "unknown"
        raise OptionError(
            f"{{examples}} {options.examples}: run {previous.get('run_id')} is being resumed with the configs it "
            f"already drew ({shown} per scenario); add {{fresh}} for a new run"
        )


def _meta_for_attempt(
    previous: dict[str, Any], run_id: str, plan: RunPlan, options: MatrixOptions, machine: dict[str, Any]
) -> dict[str, Any]:
    """meta.json is append-only history: facts about records already written never change. A new attempt
    adds an `attempts` entry (its slice, digests, host, status) and only adds what the run did not have yet
    (scenarios, cells, their configs)."""
    profile, scenarios, cells = plan.profile, plan.scenarios, plan.cells
    digests = plan.scenario_plan.digests
    commit = runs.git_commit(REPO_ROOT)
    meta = dict(previous)
    if not meta:
        meta = {
            "run_id": run_id,
            "profile": profile.name,
            "profile_digest": runs.profile_digest(profile.path),
            "profile_file": str(profile.path.relative_to(REPO_ROOT))
            if profile.path.is_absolute() and profile.path.is_relative_to(REPO_ROOT)
            else str(profile.path),
            "hypothesis_seed": profile.hypothesis_seed,
            "hypothesis_profile": options.hypothesis_profile or profile.hypothesis_profile,
            "started_at": runs.now_iso(),
            "harness_commit": commit,
            "shard": list(options.shard) if options.shard else None,
            "hardware": machine,
            "configs": {},
            "draws": {},
            "scenario_digests": {},
            "cells": {},
            "pruned": {},
            "attempts": [],
        }
    new_scenarios = [s for s in scenarios if s.id not in meta["configs"]]
    if new_scenarios:
        more, more_how = draw_configs(
            profile, new_scenarios, plan.scenario_plan.hypothesis, options.examples, options.example_db
        )
        meta["configs"] = meta["configs"] | more
        meta["draws"] = meta.get("draws", {}) | more_how
    # Which scenario code produced the records (per record too): the first code of each scenario stays here.
    meta["scenario_digests"] = {**digests, **(meta.get("scenario_digests") or {})}
    known_cells = meta.get("cells") or {}
    meta["cells"] = known_cells | {
        c.cell_id: {"pins": c.pins, "requirements": c.requirements(), "excluded": c.excluded_reason}
        for c in cells
        if c.cell_id not in known_cells
    }
    meta["pruned"] = plan.pruned | (meta.get("pruned") or {})
    meta.setdefault("reduction", plan.reduction.as_json())
    meta.setdefault("resolved_axes", plan.resolved_axes)
    if options.grow:
        meta["resolved_axes"] = plan.resolved_axes  # the grown date axis: a later resume keeps the new days
    meta["status"] = "running"
    attempt = {
        "started_at": runs.now_iso(),
        "host": machine["host"],
        "pid": os.getpid(),
        "harness_commit": commit,
        "slice": {
            "scenarios": [s.id for s in scenarios],
            "cells": [c.cell_id for c in cells],
            "config_ids": list(options.config_ids) if options.config_ids else None,
        },
        "scenario_digests": digests,
        "status": "running",
    }
    # An earlier attempt still marked running died without a word (SIGKILL, power loss): we hold its lock now.
    earlier = [a | {"status": "killed"} if a.get("status") == "running" else a for a in meta.get("attempts") or []]
    meta["attempts"] = [*earlier, attempt]
    return meta
