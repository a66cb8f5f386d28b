"""Execute a plan: every cell of an attempt, each scenario in warm workers, every result into a record.

`matrix.run_matrix` decides which run this is and what it covers (a `RunPlan`); this module only runs it and
always leaves meta.json saying how the attempt ended.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from harness.define.cells import Cell
from harness.define.profile import Profile
from harness.define.registry import Scenario
from harness.environments import envs
from harness.execution.launcher import LaunchSpec, WorkerSession, stack_env
from harness.execution.options import MatrixOptions, MatrixSummary
from harness.execution.phases import CLOCK
from harness.execution.progress import Progress
from harness.execution.scenario_run import Emit, RunContext, baseline_first, run_scenario
from harness.paths import records_file
from harness.planning.plan import RunPlan
from harness.recording import runs
from harness.recording.record import Outcome, make_record, not_run
from harness.recording.records import RecordWriter


def execute(
    plan: RunPlan,
    options: MatrixOptions,
    meta: dict[str, Any],
    previous_status: str | None,
    run_dir: Path,
    machine: dict[str, Any],
    stream: TextIO | None,
) -> MatrixSummary:
    """Run the attempt's cells; always leave meta.json saying how the attempt ended."""
    configs = meta["configs"]
    attempt = meta["attempts"][-1]
    variants = plan.scenario_plan.variants

    def wanted_configs(sid: str) -> list[dict[str, Any]]:
        return [c for c in configs[sid] if not options.config_ids or c["config_id"] in options.config_ids]

    # Drawn configs count once (their baseline) until it fails; fix variants are added to the total then.
    jobs_total = sum(
        sum(1 if baseline_first(s, c, plan.profile) else len(variants[s.id]) for c in wanted_configs(s.id))
        for cell in plan.cells
        for s in plan.scenarios
        if plan.selected(s, cell)
    )
    progress = Progress(len(plan.cells), jobs_total, stream)
    CLOCK.reset()
    started = time.monotonic()
    summary = MatrixSummary(meta["run_id"], run_dir, 0, 0, {})
    writer = RecordWriter(records_file(run_dir))
    context = RunContext(plan, options, machine, meta["run_id"], run_dir, writer, progress, summary, meta["draws"])
    status = "interrupted"
    prefetch = EnvPrefetch(plan.profile, options.install)
    context.prefetch = prefetch

    def work_of(cell: Cell) -> Work:
        return [(s, variants[s.id], wanted_configs(s.id)) for s in plan.scenarios if plan.selected(s, cell)]

    try:
        for position, cell in enumerate(plan.cells):
            # The next cell that will need an environment builds it while this one's jobs run.
            upcoming = (c for c in plan.cells[position + 1 :] if _builds_env(c, work_of(c), context))
            following = next(upcoming, None)
            if following is not None:
                prefetch.start(following)
            _run_cell(cell, work_of(cell), context)
            envs.done_with(cell, plan.profile, options.install)  # the cap may take it back when it needs the room
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
        phases = CLOCK.sums() | {"execute_wall": round(time.monotonic() - started, 2)}
        attempt |= {"status": status, "finished_at": now, "records_written": summary.written, "phases_s": phases}
        if status != previous_status or summary.written:
            meta["finished_at"] = now
        meta["status"] = status
        runs.write_meta(run_dir, meta)
        progress.close()
    return summary


Work = list[tuple[Scenario, tuple[str, ...], list[dict[str, Any]]]]


class EnvPrefetch:
    """Builds the next cell's environment in a background thread while the current cell's jobs run (on a
    cold machine a build is mostly downloading and unpacking, the jobs mostly compute). Daemon threads: an
    interrupted run does not wait for a build nobody will use."""

    def __init__(self, profile: Profile, install: envs.InstallOptions) -> None:
        self._profile, self._install = profile, install
        self._builds: dict[Path, tuple[threading.Thread, list[envs.EnvResult]]] = {}

    def start(self, cell: Cell) -> None:
        target = envs.env_dir_for(cell, self._profile, self._install)
        if target in self._builds:
            return
        box: list[envs.EnvResult] = []

        def build() -> None:
            box.append(envs.ensure_env(cell, self._profile, self._install))

        thread = threading.Thread(target=build, name=f"prefetch-{cell.cell_id}", daemon=True)
        thread.start()
        self._builds[target] = (thread, box)

    def get(self, cell: Cell) -> envs.EnvResult:
        """The prefetched result, or a build now (none started, or it raised: the error then shows here)."""
        found = self._builds.pop(envs.env_dir_for(cell, self._profile, self._install), None)
        if found:
            thread, box = found
            thread.join()
            if box:
                return box[0]
        return envs.ensure_env(cell, self._profile, self._install)


def _builds_env(cell: Cell, work: Work, ctx: RunContext) -> bool:
    """Whether running this cell will need its environment: it is neither excluded nor pruned, and some
    first-pass job of it is not recorded yet (a resumed run does not rebuild environments it no longer needs)."""
    if cell.excluded_reason or cell.cell_id in ctx.plan.pruned:
        return False
    return any(
        (cell.cell_id, s.id, v, c["config_id"]) not in ctx.writer for s, v, c in _first_pass(work, ctx.plan.profile)
    )


def _first_pass(work: Work, profile: Profile) -> list[tuple[Scenario, str, dict[str, Any]]]:
    """Everything a cell runs up front, if nothing fails (drawn configs: the baseline only)."""
    return [
        (s, v, c)
        for s, variants, planned in work
        for c in planned
        for v in (variants[:1] if baseline_first(s, c, profile) else variants)
    ]


_JobKey = tuple[Scenario, str, dict[str, Any]]
_FixDue = tuple[Scenario, tuple[str, ...], dict[str, Any]]


@dataclass
class _CellRun:
    """One cell's records as they are written: what they share (the cell, its install facts) and what each
    written record adds to the run (the summary's counts, a progress step). The phases of `_run_cell` share it."""

    cell: Cell
    ctx: RunContext
    install_info: dict[str, Any]

    def recorded(self, scenario: Scenario, variant: str, planned: dict[str, Any]) -> bool:
        return (self.cell.cell_id, scenario.id, variant, planned["config_id"]) in self.ctx.writer

    def baseline_failed(self, scenario: Scenario, variants: tuple[str, ...], planned: dict[str, Any]) -> bool:
        return self.ctx.writer.outcome_of((self.cell.cell_id, scenario.id, variants[0], planned["config_id"])) == "fail"

    def write(
        self,
        scenario: Scenario,
        variant: str,
        planned: dict[str, Any],
        outcome: Outcome,
        versions: dict[str, str],
        world_size: int,
    ) -> None:
        """Append one job's record; a record already there (a resumed run) counts as nothing new."""
        ctx = self.ctx
        record = make_record(
            run_id=ctx.run_id,
            cell_id=self.cell.cell_id,
            pins=self.cell.pins,
            scenario_id=scenario.id,
            variant=variant,
            planned=planned,
            versions=versions,
            hardware=ctx.machine | {"world_size": world_size},
            install=self.install_info,
            scenario_digest=ctx.plan.scenario_plan.digests.get(scenario.id),
            outcome=outcome,
        )
        if ctx.writer.append(record):
            ctx.summary.written += 1
            ctx.summary.outcomes[record["outcome"]] = ctx.summary.outcomes.get(record["outcome"], 0) + 1
        ctx.progress.job_done(note=f"{self.cell.cell_id} {scenario.id} {variant}: {record['outcome']}")

    def write_not_run(self, jobs: list[_JobKey], why: tuple[str, str, str]) -> None:
        """The same not-run outcome (`not_run`'s arguments) for every job, none of them started."""
        for scenario, variant, planned in jobs:
            self.write(scenario, variant, planned, not_run(*why), {}, 1)

    def emitter(self, scenario: Scenario, versions: dict[str, str], world_size: int) -> Emit:
        """How `run_scenario` writes this scenario's records."""

        def emit(variant: str, planned: dict[str, Any], fields: Outcome) -> None:
            self.write(scenario, variant, planned, fields, versions, world_size)

        return emit


def _run_cell(cell: Cell, work: Work, ctx: RunContext) -> None:
    """A cell's jobs, phase by phase: what resume leaves to do, the cell-wide skips, its environment, its
    scenarios' launches. Each phase may end the cell (nothing left, or every job recorded as not run)."""
    install_info: dict[str, Any] = {
        "mode": ctx.options.install.mode(ctx.plan.profile),
        "offline": ctx.options.install.offline,
    }
    run = _CellRun(cell, ctx, install_info)
    due = _resume(run, work)
    if due is None:
        return
    missing, fixes_due = due
    why = _cell_not_run(cell, ctx.plan)
    if why is not None:
        run.write_not_run(missing, why)
        return
    env = _environment(run)
    if env.failure:
        ctx.progress.message(f"{cell.cell_id}: install-failed: {env.failure.splitlines()[0][:200]}")
        run.write_not_run(missing, ("install-failed", "install-failed", env.failure))
        return
    _run_launches(run, _plan_launches(run, work, missing, fixes_due, env), env.versions)


def _resume(run: _CellRun, work: Work) -> tuple[list[_JobKey], list[_FixDue]] | None:
    """Count the first-pass jobs already recorded as resumed; the jobs still missing and the drawn configs
    whose failed baseline is due its fixes, or None when everything of the cell is recorded."""
    profile = run.ctx.plan.profile
    first_pass = _first_pass(work, profile)
    missing = [(s, v, c) for s, v, c in first_pass if not run.recorded(s, v, c)]
    fixes_due = [
        (s, variants, c)
        for s, variants, planned in work
        for c in planned
        if baseline_first(s, c, profile) and run.baseline_failed(s, variants, c)
    ]
    for _ in range(len(first_pass) - len(missing)):
        run.ctx.summary.resumed += 1
        run.ctx.progress.job_done(already_recorded=True)
    if not missing and not any(not run.recorded(s, v, c) for s, variants, c in fixes_due for v in variants[1:]):
        return None
    return missing, fixes_due


def _cell_not_run(cell: Cell, plan: RunPlan) -> tuple[str, str, str] | None:
    """Why none of a cell's jobs runs (`not_run`'s arguments): the profile excludes it, or its pins were pruned."""
    if cell.excluded_reason:
        return ("skip", "excluded-by-profile", f"excluded: {cell.excluded_reason}")
    if cell.cell_id in plan.pruned:
        return ("skip", "pruned-incompatible-pins", f"pruned: {plan.pruned[cell.cell_id]}")
    return None


def _environment(run: _CellRun) -> envs.EnvResult:
    """The cell's environment (prefetched, or built now); what it installed goes into every later record."""
    ctx = run.ctx
    ctx.progress.start_cell(run.cell.cell_id, "building environment")
    with CLOCK.measure("environments"):
        env = (
            ctx.prefetch.get(run.cell)
            if ctx.prefetch
            else envs.ensure_env(run.cell, ctx.plan.profile, ctx.options.install)
        )
    run.install_info |= {"mode": env.mode, "overlaid": env.overlaid}
    if env.torch_build:  # which build of torch ran: PyPI's CUDA wheel ("cu132") or a CPU one ("cpu")
        run.install_info |= {"torch_build": env.torch_build, "torch_index": env.torch_index}
    if env.left_out:
        run.install_info["left_out"] = env.left_out
    return env


def _plan_launches(
    run: _CellRun, work: Work, missing: list[_JobKey], fixes_due: list[_FixDue], env: envs.EnvResult
) -> list[_ScenarioLaunch]:
    """Each scenario with jobs due, in order: its launch, or, where it cannot run here, its skip records."""
    ctx, cell = run.ctx, run.cell
    device = ctx.machine["device"]
    due: list[_ScenarioLaunch] = []
    for scenario, variants, _ in work:
        pending = [(v, c) for s, v, c in missing if s is scenario]
        resumed_fixes = [(variants, c) for s, variants, c in fixes_due if s is scenario]
        if not pending and not resumed_fixes:
            continue
        per_node = _world_size(scenario, cell, ctx.machine)
        world_size = per_node * (ctx.options.nnodes if scenario.distributed else 1)  # what records report
        single_rank = ctx.plan.profile.settings_for(scenario.id).single_rank
        skip = _skip_reason(scenario, env.versions, device, world_size, single_rank, env.left_out) or _gpu_shortfall(
            scenario, device, per_node, ctx.machine
        )
        if skip:
            for variant, planned in pending:
                run.write(scenario, variant, planned, not_run("skip", "not-applicable", skip), env.versions, world_size)
            continue
        specs = _packed_specs(_launch_spec(scenario, cell, env, per_node, ctx), scenario, ctx, len(pending))
        due.append(_ScenarioLaunch(scenario, variants, pending, resumed_fixes, specs, world_size))
    return due


def _launch_spec(scenario: Scenario, cell: Cell, env: envs.EnvResult, per_node: int, ctx: RunContext) -> LaunchSpec:
    """How one scenario's workers start in this cell (before packing over slots)."""
    profile, options = ctx.plan.profile, ctx.options
    device = ctx.machine["device"]
    return LaunchSpec(
        python=env.python,
        module=scenario.module_name,
        preload=scenario.preload,
        device=device,
        world_size=per_node,
        env=_worker_env(device, options, env),
        workdir=ctx.run_dir / "worker" / cell.cell_id / scenario.id,
        job_timeout_s=profile.settings_for(scenario.id).job_timeout_s or profile.job_timeout_s,
        start_timeout_s=profile.worker_start_timeout_s,
        stop_after_failure=bool(scenario.spec.get("restart_after_failure", True)),
        in_step_failures=tuple(scenario.spec.get("in_step_failures", ())),
        memory_limit_mb=profile.worker_memory_mb,
        nnodes=options.nnodes if scenario.distributed else 1,
        rdzv_endpoint=options.rdzv_endpoint,
        distributed=scenario.distributed,
    )


def _run_launches(run: _CellRun, due: list[_ScenarioLaunch], versions: dict[str, str]) -> None:
    """Run each scenario's launch in order, closing every worker whatever happens.

    Each scenario's workers start while the one before it runs (early start: they import the stack, then
    wait for their jobs), so a cell pays one worker start instead of one per scenario. Early workers only
    import: no job of theirs runs beside another scenario's, so timings and outcomes are as before."""
    ctx = run.ctx
    started: list[WorkerSession] = []
    try:
        for position, launch in enumerate(due):
            sessions = started or [WorkerSession(s) for s in launch.specs]
            started = []
            if position + 1 < len(due) and not ctx.options.no_early_start:
                started = [WorkerSession(s) for s in due[position + 1].specs]
            try:
                ctx.progress.start_cell(run.cell.cell_id, launch.scenario.id)
                for session in sessions:
                    session.start_early()
                for session in started:
                    session.start_early()
                emit = run.emitter(launch.scenario, versions, launch.world_size)
                run_scenario(
                    launch.scenario,
                    launch.variants,
                    launch.pending,
                    launch.resumed_fixes,
                    sessions,
                    emit,
                    ctx,
                    run.cell,
                    versions,
                )
            finally:
                for session in sessions:
                    session.close()
    finally:
        for session in started:
            session.close()


@dataclass
class _ScenarioLaunch:
    """One scenario's work in a cell, ready to launch: its jobs and its workers' specs."""

    scenario: Scenario
    variants: tuple[str, ...]
    pending: list[tuple[str, dict[str, Any]]]
    resumed_fixes: list[tuple[tuple[str, ...], dict[str, Any]]]
    specs: list[LaunchSpec]
    world_size: int


def _packed_specs(spec: LaunchSpec, scenario: Scenario, ctx: RunContext, jobs: int) -> list[LaunchSpec]:
    """One worker per GPU for a single-process scenario, or one per core on CPU (at most CPU_SLOTS_MAX;
    `--slots N` overrides); otherwise just `spec`. Tiny models gain almost nothing from a second intra-op
    thread (S5: 6.2 s per job with 2 threads, 6.6 s with 1), so on CPU two one-thread workers side by side do
    nearly twice the work of one two-thread worker. Each CPU slot gets its share of the cores as threads."""
    if scenario.distributed:
        return [spec]
    cores = int(ctx.machine.get("cpu_count") or os.cpu_count() or 1)
    if ctx.options.slots is not None:
        count = ctx.options.slots
    elif spec.device == "cuda":
        count = int(ctx.machine["gpu_count"])
    else:
        count = min(cores, CPU_SLOTS_MAX)
    count = max(1, min(count, jobs))
    if count == 1:
        return [spec]
    gpus = _gpu_ids(int(ctx.machine["gpu_count"])) if spec.device == "cuda" else []
    packed = []
    for slot in range(count):
        env = dict(spec.env)
        described: dict[str, str] = {}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
            described["cuda_visible_devices"] = env["CUDA_VISIBLE_DEVICES"]
        else:
            threads = str(max(1, cores // count))
            env |= {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
            described["threads"] = threads
        packed.append(replace(spec, env=env, workdir=spec.workdir / f"slot-{slot}", slot=described))
    return packed


#: Concurrent single-process workers on CPU by default: each holds its own torch and stack in memory.
CPU_SLOTS_MAX = 4


def _gpu_ids(count: int) -> list[str]:
    """The GPU ids this process may use, in order (respecting an existing CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [i.strip() for i in visible.split(",") if i.strip()]
    return [str(i) for i in range(count)]


def _world_size(scenario: Scenario, cell: Cell, machine: dict[str, Any]) -> int:
    """Ranks per node: the cell's world size for a distributed scenario, one rank otherwise."""
    if not scenario.distributed:
        return 1
    if cell.world_size == "all-gpus":
        return max(int(machine["gpu_count"]), 1)
    return int(cell.world_size)


def _gpu_shortfall(scenario: Scenario, device: str, ranks: int, machine: dict[str, Any]) -> str | None:
    """A cell whose world size needs more GPUs than this node has is skipped, saying so (one rank per GPU)."""
    gpus = int(machine.get("gpu_count") or 0)
    if device == "cuda" and scenario.distributed and ranks > gpus:
        return f"needs {ranks} GPUs (world size {ranks}), this node has {gpus}"
    return None


def _skip_reason(
    scenario: Scenario,
    versions: dict[str, str],
    device: str,
    world_size: int,
    single_rank: bool = False,
    left_out: dict[str, str] | None = None,
) -> str | None:
    missing = [p for p in scenario.requires if p.lower() not in versions]
    dropped = [f"{p} ({(left_out or {})[p.lower()]})" for p in missing if p.lower() in (left_out or {})]
    if dropped:
        return f"needs {', '.join(dropped)}: the cell left it out"
    if missing:
        return f"needs {', '.join(missing)}, which this cell does not install"
    wanted = scenario.spec.get("device", "any")
    if wanted != "any" and wanted != device:
        return f"needs device {wanted}, this run is on {device}"
    if scenario.distributed and world_size < 2 and not single_rank:
        return f"needs at least 2 ranks, this run has {world_size} (a profile may allow one: single_rank = true)"
    return None


def _worker_env(device: str, options: MatrixOptions, env_result: envs.EnvResult) -> dict[str, str]:
    extensions = options.install.envs_dir.parent / "torch_extensions" / _jit_cache_name(env_result)
    # A JIT build (DeepSpeed's ops) killed with its job leaves torch's build lock behind, and every later job
    # would wait on it until its timeout. A build takes well under STALE_BUILD_LOCK_S; an older lock is stale
    # (a younger one may be another process's build in progress: array tasks share this cache).
    for stale in extensions.glob("*/lock"):
        try:
            if time.time() - stale.stat().st_mtime > STALE_BUILD_LOCK_S:
                stale.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
    env = stack_env(device, extensions)
    if env_result.pythonpath:
        env["PYTHONPATH"] = env_result.pythonpath
    env |= {k: v for k, v in os.environ.items() if k.startswith("COMPAT_MATRIX_SCENARIO_")}
    return env


#: Older than this, a torch extension build lock is a killed build's leftover.
STALE_BUILD_LOCK_S = 120


def _jit_cache_name(env_result: envs.EnvResult) -> str:
    """The environment's own JIT cache folder. Not shared between environments even with the same python,
    torch and deepspeed: torch writes each environment's include paths into the op's build.ninja, so two
    environments sharing a folder rebuild the op (about 45 s on 2 cores) every time they alternate."""
    if env_result.pythonpath:
        return Path(env_result.pythonpath).parent.name
    return env_result.python.parent.parent.name if env_result.python else "unknown"
