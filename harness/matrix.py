"""Run a profile's matrix: every cell, every selected scenario x variant x config, into records."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from harness import draws, envs, hardware, releases, runs
from harness.cells import Cell, expand
from harness.errors import UsageError
from harness.launcher import LaunchSpec, WorkerSession
from harness.profile import Profile
from harness.progress import Progress
from harness.records import RecordWriter
from harness.reduction import reduce_cells
from harness.registry import Scenario, select
from harness.scenario_run import RunContext, drawn_baseline_only, plain, run_scenario

REPO_ROOT = Path(__file__).resolve().parent.parent
MESSAGE_LIMIT = 600


@dataclass
class MatrixOptions:
    results_dir: Path
    install: envs.InstallOptions
    fresh: bool = False
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


def hypothesis_settings(profile: Profile, options: MatrixOptions) -> dict[str, float]:
    name = options.hypothesis_profile or profile.hypothesis_profile
    if name not in draws.HYPOTHESIS_PROFILES:
        known = ", ".join(draws.HYPOTHESIS_PROFILES)
        raise UsageError(f"unknown hypothesis profile {name!r} (known: {known})")
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
    scenarios = select(options.scenario_patterns or profile.scenarios)
    variants = {s.id: variants_for(profile, s) for s in scenarios}
    shrink_settings = hypothesis_settings(profile, options)  # validates the name before anything runs
    device = hardware.resolve_device(profile.device)
    machine = hardware.describe(device)
    runs.check_writable(options.results_dir)

    digest = runs.profile_digest(profile.path)
    run_dir = None if options.fresh else runs.find_resumable(options.results_dir, profile.name, digest)
    if run_dir is not None and runs.read_meta(run_dir).get("shard") != (list(options.shard) if options.shard else None):
        run_dir = None  # another shard's run: never resume into it
    recorded = runs.read_meta(run_dir).get("resolved_axes") if run_dir is not None else None
    wheelhouse = options.install.wheelhouse if options.install.offline else None
    profile, resolved_axes = releases.resolve_axes(profile, wheelhouse, recorded)
    cells, reduction = reduce_cells(expand(profile), options.reduce or profile.reduce)
    cells = [c for c in cells if _wanted(c, options.cell_patterns)]
    if options.shard:
        index, count = options.shard
        cells = [c for position, c in enumerate(cells) if position % count == index - 1]
    pruned = {} if options.no_prune else _prune(cells, profile, wheelhouse)
    if run_dir is not None:
        meta = runs.read_meta(run_dir)
        configs = meta["configs"]
        how = meta.setdefault("draws", {})
        if set(s.id for s in scenarios) - set(configs):
            # A resumed run gains scenarios the earlier attempt did not select: plan just those.
            more, more_how = plan(profile, [s for s in scenarios if s.id not in configs], options)
            configs |= more
            how |= more_how
    else:
        run_id = runs.new_run_id(profile.name)
        run_dir = options.results_dir / "runs" / run_id
        configs, how = plan(profile, scenarios, options)
        meta = {
            "run_id": run_id,
            "profile": profile.name,
            "profile_digest": digest,
            "profile_file": str(profile.path.relative_to(REPO_ROOT))
            if profile.path.is_absolute() and profile.path.is_relative_to(REPO_ROOT)
            else str(profile.path),
            "hypothesis_seed": profile.hypothesis_seed,
            "hypothesis_profile": options.hypothesis_profile or profile.hypothesis_profile,
            "started_at": runs.now_iso(),
            "harness_commit": runs.git_commit(REPO_ROOT),
        }
    meta.update(
        {
            "configs": configs,
            "draws": how,
            "reduction": reduction.as_json(),
            "resolved_axes": resolved_axes,
            # Which scenario code produced the records: a later run that disagrees under changed code is a
            # scenario change, not flakiness (see report.select_runs).
            "scenario_digests": {s.id: _source_digest(s) for s in scenarios},
            "pruned": pruned,
            "shard": list(options.shard) if options.shard else None,
            "status": "running",
            "hardware": machine,
            "cells": {
                c.cell_id: {"pins": c.pins, "requirements": c.requirements(), "excluded": c.excluded_reason}
                for c in cells
            },
        }
    )
    meta.setdefault("attempts", []).append({"started_at": runs.now_iso(), "host": machine["host"]})
    runs.write_meta(run_dir, meta)

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
        shrink_settings, pruned,
    )  # fmt: skip
    try:
        for cell in cells:
            work = [(s, variants[s.id], wanted_configs(s.id)) for s in scenarios if _selected(profile, s, cell)]
            _run_cell(cell, work, context)
            progress.cell_done()
        meta["status"] = "complete"
    except KeyboardInterrupt:
        summary.interrupted = True
        meta["status"] = "interrupted"
        progress.message("interrupted: records written so far are kept; run again to resume")
    finally:
        writer.close()
        meta["finished_at"] = runs.now_iso()
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
    cache = options.install.envs_dir.parent / "torch_extensions" / _env_name(env_result)
    env = {
        "TORCH_EXTENSIONS_DIR": str(cache),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    if device == "cpu":
        env |= {"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    else:
        env |= {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    if env_result.pythonpath:
        env["PYTHONPATH"] = env_result.pythonpath
    env |= {k: v for k, v in os.environ.items() if k.startswith("COMPAT_MATRIX_SCENARIO_")}
    return env


def _env_name(env_result: envs.EnvResult) -> str:
    """A per-environment folder name for caches (JIT builds differ per deepspeed and torch release)."""
    if env_result.pythonpath:
        return Path(env_result.pythonpath).parent.name
    return env_result.python.parent.parent.name if env_result.python else "unknown"
