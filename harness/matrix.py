"""Run a profile's matrix: every cell, every selected scenario x variant x config, into records."""

from __future__ import annotations

import fnmatch
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from harness import draws, envs, hardware, releases, runs
from harness.cells import Cell, expand
from harness.errors import UsageError
from harness.launcher import LaunchSpec, WorkerSession, stack_env
from harness.profile import Profile
from harness.progress import Progress
from harness.records import RecordWriter, read_records
from harness.reduction import reduce_cells
from harness.registry import Scenario, discover, select
from harness.scenario_run import RunContext, drawn_baseline_only, plain, run_scenario

REPO_ROOT = Path(__file__).resolve().parent.parent
MESSAGE_LIMIT = 600


@dataclass
class MatrixOptions:
    results_dir: Path
    install: envs.InstallOptions
    fresh: bool = False
    #: Continue this run id (even a complete one: nothing recorded is re-run, an attempt entry is added).
    resume_run: str | None = None
    scenario_patterns: tuple[str, ...] | None = None
    cell_patterns: tuple[str, ...] | None = None
    examples: int | None = None
    #: Only these config ids (re-running one config, e.g. after fixing a scenario).
    config_ids: tuple[str, ...] | None = None
    #: Hypothesis example database (failure memory); None keeps no memory.
    example_db: Path | None = None
    #: Overrides the profile's hypothesis_profile ("ci" | "explore").
    hypothesis_profile: str | None = None
    #: (I, N): run only every N-th cell starting at the I-th (1-based), for several machines.
    shard: tuple[int, int] | None = None
    #: Record drawn failures without shrinking them (quick runs, benchmarks of the batch itself).
    no_shrink: bool = False
    #: Skip reading package metadata to prune impossible cells.
    no_prune: bool = False
    #: Overrides the profile's `reduce` ("none" | "pairwise").
    reduce: str | None = None
    #: Workers a single-process scenario is packed over (default: one per GPU on CUDA, 1 on CPU).
    slots: int | None = None
    #: Multi-node: distributed scenarios span this many nodes (see harness/node_agent.py).
    nnodes: int = 1
    rdzv_endpoint: str | None = None


@dataclass
class MatrixSummary:
    run_id: str
    run_dir: Path
    written: int
    resumed: int
    outcomes: dict[str, int]
    interrupted: bool = False
    #: SIGINT or SIGTERM when interrupted.
    signal: str | None = None


def hypothesis_settings(profile: Profile, options: MatrixOptions) -> dict[str, float]:
    name = options.hypothesis_profile or profile.hypothesis_profile
    if name not in draws.HYPOTHESIS_PROFILES:
        known = ", ".join(draws.HYPOTHESIS_PROFILES)
        where = "--hypothesis-profile" if options.hypothesis_profile else f"{profile.path}: profile.hypothesis_profile"
        raise UsageError(f"{where}: unknown hypothesis profile {name!r} (known: {known})")
    return draws.HYPOTHESIS_PROFILES[name]


def plan(
    profile: Profile, scenarios: list[Scenario], options: MatrixOptions
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, int]]]:
    """The configs each scenario runs in every cell of this run (drawn once, from the profile's seed),
    and how they were drawn (so the shrinker can replay the draw)."""
    factor = int(hypothesis_settings(profile, options)["draw_factor"])
    planned, how = {}, {}
    for scenario in scenarios:
        settings = profile.settings_for(scenario.id)
        if options.examples is not None:
            count = options.examples
        else:
            count = (settings.examples if settings.examples is not None else profile.examples_per_scenario) * factor
        draw = draws.draw_plan(profile.hypothesis_seed, scenario.id, count)
        remembered = draws.remembered_configs(scenario.strategy(), draw, options.example_db, scenario.id)
        planned[scenario.id] = draws.plan_configs(
            scenario.examples(), list(settings.configs), scenario.strategy(), draw, remembered
        )
        how[scenario.id] = {"seed": draw.seed, "max_examples": draw.max_examples, "count": draw.count}
    return planned, how


def variants_for(profile: Profile, scenario: Scenario) -> tuple[str, ...]:
    """The scenario's variants, or the subset the profile names (an unknown name is a usage error)."""
    wanted = profile.settings_for(scenario.id).variants
    if wanted is None:
        return scenario.variants
    unknown = [v for v in wanted if v not in scenario.variants]
    if unknown:
        raise UsageError(
            f'{profile.path}: scenario."{scenario.id}".variants: unknown variant(s) {", ".join(unknown)} '
            f"(known: {', '.join(scenario.variants)})"
        )
    return tuple(wanted)


def run_matrix(profile: Profile, options: MatrixOptions, stream: TextIO | None = None) -> MatrixSummary:
    """Run (or resume) a profile's matrix. Everything that can be wrong with the input is checked before a run
    directory is created or touched; the run directory is written by this process alone (its writer lock)."""
    where = "--scenario" if options.scenario_patterns else f"{profile.path}: profile.scenarios"
    scenarios = select(options.scenario_patterns or profile.scenarios, where=where)
    _check_scenario_sections(profile)
    variants = {s.id: variants_for(profile, s) for s in scenarios}
    shrink_settings = hypothesis_settings(profile, options)  # validates the name before anything runs
    device = hardware.resolve_device(profile.device)
    machine = hardware.describe(device)
    runs.check_writable(options.results_dir / "runs", "results directory")
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
            if run_dir is not None:
                read_records(run_dir / "records.jsonl", warn=False)  # a line that is not a record: exit 2 here
            wheelhouse = options.install.wheelhouse if options.install.offline else None
            profile, resolved_axes = releases.resolve_axes(profile, wheelhouse, previous.get("resolved_axes"))
            cells, reduction = reduce_cells(expand(profile), options.reduce or profile.reduce)
            cells = _sliced_cells(cells, options, profile)
            pruned = {} if options.no_prune else _prune(cells, profile, wheelhouse)
            digests = {s.id: _source_digest(s) for s in scenarios}
            if run_dir is None:
                run_dir = runs.create_run_dir(options.results_dir, profile.name)
                lock = runs.RunLock.acquire(run_dir)
                why = "--fresh" if options.fresh else f"no unfinished run of profile {profile.name} to resume"
                _say(stream, f"new run {run_dir.name} ({why})")
            else:
                why = "--resume" if options.resume_run else "it did not finish; --fresh starts a new run instead"
                # We hold its lock now, so a `running` run's writer is gone: it was interrupted.
                status = "interrupted" if previous.get("status") == "running" else previous.get("status")
                _say(stream, f"resuming run {run_dir.name}, status {status} ({why})")
            meta = _meta_for_attempt(previous, run_dir, profile, options, scenarios, cells, digests, pruned, machine)
            meta.setdefault("reduction", reduction.as_json())
            meta.setdefault("resolved_axes", resolved_axes)
            runs.write_meta(run_dir, meta)  # inside the selection lock: the next invocation sees this run
        return _execute(profile, options, scenarios, variants, cells, meta, previous.get("status"), run_dir,
                        machine, shrink_settings, pruned, digests, stream)  # fmt: skip
    finally:
        if lock is not None:
            lock.release()


def _say(stream: TextIO | None, text: str) -> None:
    print(text, file=stream or sys.stdout, flush=True)


def _check_scenario_sections(profile: Profile) -> None:
    """A `[scenario."<id>"]` section must name a real scenario: a typo would silently drop its settings."""
    known = {s.id for s in discover()}
    for scenario_id in profile.scenario_settings:
        if scenario_id not in known:
            raise UsageError(f'{profile.path}: scenario."{scenario_id}": unknown scenario '
                             f"(known: {', '.join(sorted(known))})")  # fmt: skip


def _chosen_run(profile: Profile, options: MatrixOptions, digest: str, shard: list[int] | None) -> Path | None:
    """The run this invocation continues: --resume's, else the newest unfinished run of this profile file
    (never a complete one), else None for a new run."""
    if options.resume_run:
        run_dir = options.results_dir / "runs" / options.resume_run
        meta = runs.read_meta(run_dir)
        if not meta:
            raise UsageError(f"--resume {options.resume_run}: no run with meta.json under {run_dir.parent}")
        if meta.get("profile") != profile.name:
            raise UsageError(f"--resume {options.resume_run}: that run is of profile {meta.get('profile')!r}, "
                             f"not {profile.name!r} (pass --profile {meta.get('profile')})")  # fmt: skip
        return run_dir
    if options.fresh:
        return None
    return runs.find_resumable(options.results_dir, profile.name, digest, shard)


def _check_resume_options(previous: dict[str, Any], options: MatrixOptions, run_dir: Path | None) -> None:
    """Options that would change what an existing run draws are refused, not silently ignored."""
    if not previous:
        return
    recorded_profile = previous.get("hypothesis_profile")
    if options.hypothesis_profile and recorded_profile and options.hypothesis_profile != recorded_profile:
        raise UsageError(
            f"--hypothesis-profile {options.hypothesis_profile}: run {previous.get('run_id')} is being resumed and "
            f"was drawn with {recorded_profile!r}; add --fresh for a new run"
        )
    if options.examples is None:
        return
    counts = {how.get("count") for how in (previous.get("draws") or {}).values()}
    if counts != {options.examples}:
        shown = ", ".join(str(c) for c in sorted(c for c in counts if c is not None)) or "unknown"
        raise UsageError(
            f"--examples {options.examples}: run {previous.get('run_id')} is being resumed with the configs it "
            f"already drew ({shown} per scenario); add --fresh for a new run"
        )


def _sliced_cells(cells: list[Cell], options: MatrixOptions, profile: Profile) -> list[Cell]:
    """The cells this attempt runs (--cell globs, --shard); a slice that selects nothing is bad input."""
    chosen = [c for c in cells if _wanted(c, options.cell_patterns)]
    if options.cell_patterns and not chosen:
        known = ", ".join(c.cell_id for c in cells)
        raise UsageError(f"--cell {' '.join(options.cell_patterns)}: matches no cell of profile {profile.name} "
                         f"(its cells: {known})")  # fmt: skip
    if options.shard:
        index, count = options.shard
        chosen = [c for position, c in enumerate(chosen) if position % count == index - 1]
        if not chosen:
            raise UsageError(f"--shard {index}/{count}: no cell falls into this shard")
    return chosen


def _meta_for_attempt(
    previous: dict[str, Any],
    run_dir: Path,
    profile: Profile,
    options: MatrixOptions,
    scenarios: list[Scenario],
    cells: list[Cell],
    digests: dict[str, str],
    pruned: dict[str, str],
    machine: dict[str, Any],
) -> dict[str, Any]:
    """meta.json is append-only history: facts about records already written never change. A new attempt
    adds an `attempts` entry (its slice, digests, host, status) and only adds what the run did not have yet
    (scenarios, cells, their configs)."""
    commit = runs.git_commit(REPO_ROOT)
    meta = dict(previous)
    if not meta:
        meta = {
            "run_id": run_dir.name,
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
        more, more_how = plan(profile, new_scenarios, options)
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
    meta["pruned"] = pruned | (meta.get("pruned") or {})
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


def _execute(
    profile: Profile,
    options: MatrixOptions,
    scenarios: list[Scenario],
    variants: dict[str, tuple[str, ...]],
    cells: list[Cell],
    meta: dict[str, Any],
    previous_status: str | None,
    run_dir: Path,
    machine: dict[str, Any],
    shrink_settings: dict[str, float],
    pruned: dict[str, str],
    digests: dict[str, str],
    stream: TextIO | None,
) -> MatrixSummary:
    """Run the attempt's cells; always leave meta.json saying how the attempt ended."""
    configs, how = meta["configs"], meta["draws"]
    attempt = meta["attempts"][-1]

    def wanted_configs(sid: str) -> list[dict[str, Any]]:
        return [c for c in configs[sid] if not options.config_ids or c["config_id"] in options.config_ids]

    # Drawn configs count once (their baseline) until it fails; fix variants are added to the total then.
    jobs_total = sum(
        sum(1 if drawn_baseline_only(s, c) else len(variants[s.id]) for c in wanted_configs(s.id))
        for cell in cells
        for s in scenarios
        if _selected(profile, s, cell)
    )
    progress = Progress(len(cells), jobs_total, stream)
    summary = MatrixSummary(meta["run_id"], run_dir, 0, 0, {})
    writer = RecordWriter(run_dir / "records.jsonl")
    context = RunContext(
        profile, options, machine, meta["run_id"], run_dir, writer, progress, summary, how,
        shrink_settings, pruned, digests,
    )  # fmt: skip
    status = "interrupted"
    try:
        for cell in cells:
            work = [(s, variants[s.id], wanted_configs(s.id)) for s in scenarios if _selected(profile, s, cell)]
            _run_cell(cell, work, context)
            progress.cell_done()
        status = "complete"
    except KeyboardInterrupt as exc:
        summary.interrupted = True
        summary.signal = attempt["signal"] = getattr(exc, "signal_name", "SIGINT")
        progress.message("interrupted: records written so far are kept; run again to resume")
    except BaseException as exc:
        attempt["error"] = f"{type(exc).__name__}: {exc}"[:500]
        raise
    finally:
        writer.close()
        now = runs.now_iso()
        attempt |= {"status": status, "finished_at": now, "records_written": summary.written}
        if status != previous_status or summary.written:
            meta["finished_at"] = now
        meta["status"] = status
        runs.write_meta(run_dir, meta)
        progress.close()
    return summary


def _source_digest(scenario: Scenario) -> str:
    import hashlib

    return hashlib.sha1(Path(scenario.module.__file__ or "").read_bytes()).hexdigest()[:12]


def _prune(cells: list[Cell], profile: Profile, wheelhouse: Path | None) -> dict[str, str]:
    """Cells whose exact pins contradict each other's Requires-Dist (skipped with the reason, never built)."""
    from harness.pruning import conflict

    found = {}
    for cell in cells:
        if cell.excluded_reason or profile.install_mode == "system":
            continue
        reason = conflict(cell, profile.python, wheelhouse)
        if reason:
            found[cell.cell_id] = reason
    return found


def _selected(profile: Profile, scenario: Scenario, cell: Cell) -> bool:
    cells = profile.settings_for(scenario.id).cells
    return cells is None or _wanted_id(cell.cell_id, cells)


def _wanted(cell: Cell, patterns: tuple[str, ...] | None) -> bool:
    return not patterns or _wanted_id(cell.cell_id, patterns)


def _wanted_id(cell_id: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(cell_id, p) for p in patterns)


Work = list[tuple[Scenario, tuple[str, ...], list[dict[str, Any]]]]


def _run_cell(cell: Cell, work: Work, ctx: RunContext) -> None:
    writer, progress = ctx.writer, ctx.progress
    base = {"run_id": ctx.run_id, "cell": cell.cell_id, "pins": cell.pins}
    install = ctx.options.install
    install_info: dict[str, Any] = {"mode": install.mode(ctx.profile), "offline": install.offline}

    def recorded(scenario: Scenario, variant: str, planned: dict[str, Any]) -> bool:
        return (cell.cell_id, scenario.id, variant, planned["config_id"]) in writer

    def write(
        scenario: Scenario,
        variant: str,
        planned: dict[str, Any],
        outcome: dict[str, Any],
        versions: dict[str, str],
        world_size: int,
    ) -> None:
        record = (
            base
            | {
                "record_version": 1,
                "scenario": scenario.id,
                "variant": variant,
                "config": planned["config"],
                "config_id": planned["config_id"],
                "config_source": planned["source"],
                "versions": versions,
                "hardware": ctx.machine | {"world_size": world_size},
                "started_at": runs.now_iso(),
                "install": dict(install_info),
                "scenario_digest": ctx.scenario_digests.get(scenario.id),
            }
            | ({"config_also_from": planned["also_from"]} if planned.get("also_from") else {})
            | outcome
        )
        if writer.append(record):
            ctx.summary.written += 1
            ctx.summary.outcomes[record["outcome"]] = ctx.summary.outcomes.get(record["outcome"], 0) + 1
        progress.job_done(note=f"{cell.cell_id} {scenario.id} {variant}: {record['outcome']}")

    # Everything this cell would run up front, if nothing fails (drawn configs: the baseline only).
    first_pass = [
        (s, v, c)
        for s, variants, planned in work
        for c in planned
        for v in (variants[:1] if drawn_baseline_only(s, c) else variants)
    ]
    missing = [(s, v, c) for s, v, c in first_pass if not recorded(s, v, c)]
    fixes_due = [
        (s, variants, c)
        for s, variants, planned in work
        for c in planned
        if drawn_baseline_only(s, c) and writer.outcome_of((cell.cell_id, s.id, variants[0], c["config_id"])) == "fail"
    ]
    for _ in range(len(first_pass) - len(missing)):
        ctx.summary.resumed += 1
        progress.job_done(already_recorded=True)
    if not missing and not any(not recorded(s, v, c) for s, variants, c in fixes_due for v in variants[1:]):
        return

    if cell.excluded_reason:
        for scenario, variant, planned in missing:
            outcome = plain("skip", "excluded-by-profile", f"excluded: {cell.excluded_reason}")
            write(scenario, variant, planned, outcome, {}, 1)
        return
    if cell.cell_id in ctx.pruned:
        for scenario, variant, planned in missing:
            outcome = plain("skip", "pruned-incompatible-pins", f"pruned: {ctx.pruned[cell.cell_id]}")
            write(scenario, variant, planned, outcome, {}, 1)
        return

    progress.start_cell(cell.cell_id, "building environment")
    env = envs.ensure_env(cell, ctx.profile, ctx.options.install)
    install_info |= {"mode": env.mode, "overlaid": env.overlaid}
    if env.failure:
        progress.message(f"{cell.cell_id}: install-failed: {env.failure.splitlines()[0][:200]}")
        for scenario, variant, planned in missing:
            write(scenario, variant, planned, plain("install-failed", "install-failed", env.failure), {}, 1)
        return

    device = ctx.machine["device"]
    for scenario, variants, _ in work:
        pending = [(v, c) for s, v, c in missing if s is scenario]
        resumed_fixes = [(variants, c) for s, variants, c in fixes_due if s is scenario]
        if not pending and not resumed_fixes:
            continue
        per_node = _world_size(scenario, ctx.profile, ctx.machine)
        world_size = per_node * (ctx.options.nnodes if scenario.distributed else 1)  # what records report
        skip = _skip_reason(scenario, env.versions, device, world_size)
        if skip:
            for variant, planned in pending:
                write(scenario, variant, planned, plain("skip", "not-applicable", skip), env.versions, world_size)
            continue
        progress.start_cell(cell.cell_id, scenario.id)
        timeout = ctx.profile.settings_for(scenario.id).job_timeout_s or ctx.profile.job_timeout_s
        spec = LaunchSpec(
            python=env.python,
            module=scenario.module_name,
            preload=scenario.preload,
            device=device,
            world_size=per_node,
            env=_worker_env(device, ctx.options, env),
            workdir=ctx.run_dir / "worker" / cell.cell_id / scenario.id,
            job_timeout_s=timeout,
            start_timeout_s=ctx.profile.worker_start_timeout_s,
            stop_after_failure=bool(scenario.spec.get("restart_after_failure", True)),
            memory_limit_mb=ctx.profile.worker_memory_mb,
            nnodes=ctx.options.nnodes if scenario.distributed else 1,
            rdzv_endpoint=ctx.options.rdzv_endpoint,
        )

        def emit(variant: str, planned: dict[str, Any], fields: dict[str, Any]) -> None:
            write(scenario, variant, planned, fields, env.versions, world_size)  # noqa: B023 - used in this loop

        sessions = [WorkerSession(s) for s in _packed_specs(spec, scenario, ctx, len(pending))]
        try:
            run_scenario(scenario, variants, pending, resumed_fixes, sessions, emit, ctx, cell)
        finally:
            for session in sessions:
                session.close()


def _packed_specs(spec: LaunchSpec, scenario: Scenario, ctx: RunContext, jobs: int) -> list[LaunchSpec]:
    """One worker per GPU for a single-process scenario (or --slots N on CPU); otherwise just `spec`."""
    if scenario.distributed:
        return [spec]
    if ctx.options.slots is not None:
        count = ctx.options.slots
    else:
        count = int(ctx.machine["gpu_count"]) if spec.device == "cuda" else 1
    count = max(1, min(count, jobs))
    if count == 1:
        return [spec]
    gpus = _gpu_ids(int(ctx.machine["gpu_count"])) if spec.device == "cuda" else []
    packed = []
    for slot in range(count):
        env = dict(spec.env)
        described = {}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
            described["cuda_visible_devices"] = env["CUDA_VISIBLE_DEVICES"]
        packed.append(replace(spec, env=env, workdir=spec.workdir / f"slot-{slot}", slot=described))
    return packed


def _gpu_ids(count: int) -> list[str]:
    """The GPU ids this process may use, in order (respecting an existing CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [i.strip() for i in visible.split(",") if i.strip()]
    return [str(i) for i in range(count)]


def _world_size(scenario: Scenario, profile: Profile, machine: dict[str, Any]) -> int:
    if not scenario.distributed:
        return 1
    if profile.world_size == "all-gpus":
        return max(int(machine["gpu_count"]), 1)
    return int(profile.world_size)


def _skip_reason(scenario: Scenario, versions: dict[str, str], device: str, world_size: int) -> str | None:
    missing = [p for p in scenario.requires if p.lower() not in versions]
    if missing:
        return f"needs {', '.join(missing)}, which this cell does not install"
    wanted = scenario.spec.get("device", "any")
    if wanted != "any" and wanted != device:
        return f"needs device {wanted}, this run is on {device}"
    if scenario.distributed and world_size < 2:
        return f"needs at least 2 ranks, this run has {world_size}"
    return None


def _worker_env(device: str, options: MatrixOptions, env_result: envs.EnvResult) -> dict[str, str]:
    env = stack_env(device, options.install.envs_dir.parent / "torch_extensions" / _env_name(env_result))
    if env_result.pythonpath:
        env["PYTHONPATH"] = env_result.pythonpath
    env |= {k: v for k, v in os.environ.items() if k.startswith("COMPAT_MATRIX_SCENARIO_")}
    return env


def _env_name(env_result: envs.EnvResult) -> str:
    """A per-environment folder name for caches (JIT builds differ per deepspeed and torch release)."""
    if env_result.pythonpath:
        return Path(env_result.pythonpath).parent.name
    return env_result.python.parent.parent.name if env_result.python else "unknown"
