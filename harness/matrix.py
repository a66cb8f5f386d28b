"""Run a profile's matrix: every cell, every selected scenario x variant x config, into records."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from harness import draws, envs, hardware, runs
from harness.cells import Cell, expand
from harness.launcher import Job, JobResult, LaunchSpec, run_jobs
from harness.profile import Profile
from harness.progress import Progress
from harness.records import RecordWriter
from harness.registry import Scenario, select
from harness.signatures import classify

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


@dataclass
class MatrixSummary:
    run_id: str
    run_dir: Path
    written: int
    resumed: int
    outcomes: dict[str, int]
    interrupted: bool = False


def plan(profile: Profile, scenarios: list[Scenario], examples: int | None) -> dict[str, list[dict[str, Any]]]:
    """The configs each scenario runs in every cell of this run (drawn once, from the profile's seed)."""
    planned = {}
    for index, scenario in enumerate(scenarios):
        settings = profile.settings_for(scenario.id)
        count = (
            examples
            if examples is not None
            else (settings.examples if settings.examples is not None else profile.examples_per_scenario)
        )
        planned[scenario.id] = draws.plan_configs(
            scenario.examples(), list(settings.configs), scenario.strategy(), count, profile.hypothesis_seed + index
        )
    return planned


def run_matrix(profile: Profile, options: MatrixOptions, stream: TextIO | None = None) -> MatrixSummary:
    scenarios = select(options.scenario_patterns or profile.scenarios)
    cells = [c for c in expand(profile) if _wanted(c, options.cell_patterns)]
    device = hardware.resolve_device(profile.device)
    machine = hardware.describe(device)
    runs.check_writable(options.results_dir)

    digest = runs.profile_digest(profile.path)
    run_dir = None if options.fresh else runs.find_resumable(options.results_dir, profile.name, digest)
    if run_dir is not None:
        meta = runs.read_meta(run_dir)
        configs = meta["configs"]
        if set(s.id for s in scenarios) - set(configs):
            # A resumed run gains scenarios the earlier attempt did not select: plan just those.
            configs |= plan(profile, [s for s in scenarios if s.id not in configs], options.examples)
    else:
        run_id = runs.new_run_id(profile.name)
        run_dir = options.results_dir / "runs" / run_id
        configs = plan(profile, scenarios, options.examples)
        meta = {
            "run_id": run_id,
            "profile": profile.name,
            "profile_digest": digest,
            "profile_file": str(profile.path.relative_to(REPO_ROOT))
            if profile.path.is_absolute() and profile.path.is_relative_to(REPO_ROOT)
            else str(profile.path),
            "hypothesis_seed": profile.hypothesis_seed,
            "started_at": runs.now_iso(),
            "harness_commit": runs.git_commit(REPO_ROOT),
        }
    meta.update(
        {
            "configs": configs,
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

    jobs_total = sum(
        len(s.variants)
        * sum(1 for c in configs[s.id] if not options.config_ids or c["config_id"] in options.config_ids)
        for cell in cells
        for s in scenarios
        if _selected(profile, s, cell)
    )
    progress = Progress(len(cells), jobs_total, stream)
    summary = MatrixSummary(meta["run_id"], run_dir, 0, 0, {})
    writer = RecordWriter(run_dir / "records.jsonl")
    try:
        for cell in cells:
            _run_cell(
                cell, profile, scenarios, configs, options, machine, meta["run_id"], run_dir, writer, progress, summary
            )
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


def _selected(profile: Profile, scenario: Scenario, cell: Cell) -> bool:
    cells = profile.settings_for(scenario.id).cells
    return cells is None or _wanted_id(cell.cell_id, cells)


def _wanted(cell: Cell, patterns: tuple[str, ...] | None) -> bool:
    return not patterns or _wanted_id(cell.cell_id, patterns)


def _wanted_id(cell_id: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(cell_id, p) for p in patterns)


def _run_cell(
    cell: Cell,
    profile: Profile,
    scenarios: list[Scenario],
    configs: dict[str, list[dict[str, Any]]],
    options: MatrixOptions,
    machine: dict[str, Any],
    run_id: str,
    run_dir: Path,
    writer: RecordWriter,
    progress: Progress,
    summary: MatrixSummary,
) -> None:
    base = {"run_id": run_id, "cell": cell.cell_id, "pins": cell.pins}
    # A scenario the profile scopes to other cells is not part of this cell at all (no record, no skip).
    todo = [
        (s, v, c)
        for s in scenarios
        if _selected(profile, s, cell)
        for v in s.variants
        for c in configs[s.id]
        if options.config_ids is None or c["config_id"] in options.config_ids
    ]
    missing = [(s, v, c) for s, v, c in todo if (cell.cell_id, s.id, v, c["config_id"]) not in writer]
    for _ in range(len(todo) - len(missing)):
        summary.resumed += 1
        progress.job_done(already_recorded=True)
    if not missing:
        return

    install_info: dict[str, Any] = {"mode": options.install.mode(profile), "offline": options.install.offline}

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
                "hardware": machine | {"world_size": world_size},
                "started_at": runs.now_iso(),
                "install": dict(install_info),
            }
            | outcome
        )
        if writer.append(record):
            summary.written += 1
            summary.outcomes[record["outcome"]] = summary.outcomes.get(record["outcome"], 0) + 1
        progress.job_done(note=f"{cell.cell_id} {scenario.id} {variant}: {record['outcome']}")

    if cell.excluded_reason:
        for scenario, variant, planned in missing:
            write(
                scenario,
                variant,
                planned,
                _plain("skip", "excluded-by-profile", f"excluded: {cell.excluded_reason}"),
                {},
                1,
            )
        return

    progress.start_cell(cell.cell_id, "building environment")
    env = envs.ensure_env(cell, profile, options.install)
    install_info |= {"mode": env.mode, "overlaid": env.overlaid}
    if env.failure:
        progress.message(f"{cell.cell_id}: install-failed: {env.failure.splitlines()[0][:200]}")
        for scenario, variant, planned in missing:
            write(scenario, variant, planned, _plain("install-failed", "install-failed", env.failure), {}, 1)
        return

    device = machine["device"]
    for scenario in scenarios:
        pending = [(v, c) for s, v, c in missing if s is scenario]
        if not pending:
            continue
        world_size = _world_size(scenario, profile, machine)
        skip = _skip_reason(scenario, env.versions, device, world_size)
        if skip:
            for variant, planned in pending:
                write(scenario, variant, planned, _plain("skip", "not-applicable", skip), env.versions, world_size)
            continue
        progress.start_cell(cell.cell_id, scenario.id)
        timeout = profile.settings_for(scenario.id).job_timeout_s or profile.job_timeout_s
        spec = LaunchSpec(
            python=env.python,
            module=scenario.module_name,
            preload=scenario.preload,
            device=device,
            world_size=world_size,
            env=_worker_env(device, options, env),
            workdir=run_dir / "worker" / cell.cell_id / scenario.id,
            job_timeout_s=timeout,
            start_timeout_s=profile.worker_start_timeout_s,
            stop_after_failure=bool(scenario.spec.get("restart_after_failure", True)),
        )
        jobs = [Job(i, planned["config"], variant) for i, (variant, planned) in enumerate(pending)]
        for result in run_jobs(spec, jobs):
            variant, planned = pending[result.index]
            write(scenario, variant, planned, _observed(result), env.versions, world_size)


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


def _plain(outcome: str, signature: str, message: str) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "signature": signature,
        "known_issue": [],
        "message": message[: MESSAGE_LIMIT * 3],
        "metrics": {},
        "duration_s": 0.0,
        "classified": True,
    }


def _observed(result: JobResult) -> dict[str, Any]:
    detail = result.detail
    verdict = classify(result.status, detail, repo_root=str(REPO_ROOT))
    message = (detail.get("message") or "").strip()
    fields = {
        "outcome": verdict.outcome,
        "signature": verdict.signature,
        "known_issue": verdict.known_issue,
        "classified": verdict.classified,
        "message": message[:MESSAGE_LIMIT],
        "metrics": detail.get("metrics") or {},
        "duration_s": round(result.duration_s, 4),
        "path": detail.get("path"),
        "exc_type": detail.get("exc_type"),
    }
    for optional in ("warnings", "stderr_tail", "traceback", "ranks_failed", "check"):
        if detail.get(optional):
            fields[optional] = detail[optional]
    return fields
