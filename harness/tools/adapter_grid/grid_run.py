"""`adapters-grid`: adapters carried across releases (issue 60). S10's seed adapters are saved on each CPU atlas day and
loaded on every later day and on the day before, each load in the load day's own environment (its torch, transformers
and peft; its build of the base model from the saved base weights), judged there against the formula model of the
saved file (`runtime/adapter_grid.py` on the cell side, `scenarios/kit/roundtrip.py`).

The saved adapters and every load's outputs stay in a work store (`<envs dir>/../adapter-grid/<run id>/`): they are
large and regenerable. What is committed is `results/adapter-grid/<run id>/`: `saves.jsonl` and `pairs.jsonl` (one
line per save and per (saved on, loaded on) load, with both days' releases, the outcome, its signature and the
legs' numbers) and `meta.json`. A rerun with `--resume RUN` skips every save and load a line already holds.
"""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.paths import ADAPTER_GRID_FOLDER, REPO_ROOT, meta_file, profile_runs, run_path

SCENARIO = "S10-adapter-roundtrip"
#: A day's saves or loads (a process importing its stack once, then every adapter in turn).
PHASE_TIMEOUT_S = 3600


@dataclass(frozen=True)
class GridEnvironment:
    """Where the grid saves or loads: an atlas day's environment (or a sweep probe's), by its label."""

    cell_id: str
    python: Path
    versions: dict[str, str]


def pairs_for(days: list[str], saved: dict[str, set[str]]) -> dict[str, list[tuple[str, str]]]:
    """Load day -> the (saved on, config id) pairs it loads: every adapter saved on that day or an earlier one, and
    those saved on the day after it (an adapter from one release newer than the loader)."""
    plan: dict[str, list[tuple[str, str]]] = {}
    for index, loaded_on in enumerate(days):
        sources = days[: index + 1] + days[index + 1 : index + 2]
        plan[loaded_on] = [(s, c) for s in sources for c in sorted(saved.get(s, set()))]
    return plan


def seed_configs() -> dict[str, dict[str, Any]]:
    """S10's seed configs by config id (the features the grid follows)."""
    from harness.define.registry import select
    from harness.planning.draws import config_id

    (scenario,) = select([SCENARIO])
    return {config_id(c): c for c in scenario.module.EXAMPLES}


def drawn_configs(results_dir: Path, runs: list[str]) -> dict[str, dict[str, Any]]:
    """The configs S10's draws made (not its seed examples) that fail on some day of the dated runs, read as the
    table reads them (`dated_runs.run_records`: a later run that measured some configs again replaces them), by id."""
    from harness.define.profile import load_profile
    from harness.paths import MATRIX_DIR
    from harness.tools.release_search.dated_runs import run_records, usable_runs
    from harness.tools.release_search.flip_naming import drawn_configs as draws_of

    run_dirs = [run_path(results_dir, run) for run in runs]
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            raise UsageError(f"--drawn {run_dir.name}: no {run_dir}")
    profile = load_profile(json.loads(meta_file(run_dirs[0]).read_text()).get("profile", "history"), MATRIX_DIR)
    usable_runs(run_dirs, profile.name)
    records = run_records(run_dirs)
    failing = {r["config_id"] for r in records if r["scenario"] == SCENARIO and r["variant"] == "baseline"
               and r["outcome"] not in ("pass", "skip")}  # fmt: skip
    draws = draws_of(records, profile)  # the configs neither an explicit example nor a profile's: the draws
    return dict(sorted((c, config) for (s, c), config in draws.items() if s == SCENARIO and c in failing))


def run_grid(
    profile_name: str,
    results_dir: Path,
    start: str | None = None,
    end: str | None = None,
    features: list[str] | None = None,
    resume: str | None = None,
    stream: Any = sys.stdout,
    drawn: list[str] | None = None,
) -> Path:
    """Build (or reuse) each day's environment, save on every day, load on every day, and write the run's files.
    `drawn`: dated S10 runs whose drawn configs that fail somewhere join the seed configs."""
    from harness.define.cells import expand
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir, ensure_env
    from harness.paths import MATRIX_DIR
    from harness.recording.runs import new_run_id, now_iso
    from harness.versions.releases import resolve_axes

    profile, _ = resolve_axes(load_profile(profile_name, MATRIX_DIR), recorded=_atlas_days(results_dir, profile_name))
    cells = [c for c in expand(profile) if c.excluded_reason is None]
    chosen = [c for c in cells if (not start or _day(c.cell_id) >= start) and (not end or _day(c.cell_id) <= end)]
    if len(chosen) < 2:
        raise UsageError(f"profile {profile_name!r} gives {len(chosen)} day(s) between {start} and {end}: need 2")
    if resume and meta_file(results_dir / ADAPTER_GRID_FOLDER / resume).is_file():  # the same days as the run resumed
        kept = json.loads(meta_file(results_dir / ADAPTER_GRID_FOLDER / resume).read_text()).get("order") or []
        chosen = [c for c in chosen if c.cell_id in kept] or chosen
    configs = seed_configs() | (drawn_configs(results_dir, drawn) if drawn else {})
    if features:
        unknown = sorted(set(features) - set(configs))
        if unknown:
            raise UsageError(f"--feature {unknown[0]}: not one of the grid's config ids ({', '.join(configs)})")
        configs = {k: v for k, v in configs.items() if k in features}
    run_id = resume or new_run_id(f"{ADAPTER_GRID_FOLDER}-{profile_name}")
    store = default_envs_dir().parent / ADAPTER_GRID_FOLDER / run_id
    out = results_dir / ADAPTER_GRID_FOLDER / run_id
    if resume and not meta_file(out).is_file():
        raise UsageError(f"--resume {resume}: no {out / 'meta.json'}")
    store.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    started, timings = now_iso(), {}
    before = json.loads(meta_file(out).read_text()) if resume else {}
    if before:  # a resumed run keeps when it started and what each phase cost the first time
        started, timings = before.get("started_at", started), dict(before.get("seconds") or {})
    days: list[GridEnvironment] = []
    for number, cell in enumerate(chosen, 1):
        began = time.monotonic()
        env = ensure_env(cell, profile, InstallOptions(envs_dir=default_envs_dir()))
        if env.python is None:
            print(f"[{number}/{len(chosen)}] {cell.cell_id}: no environment ({env.failure}); left out", file=stream)
            continue
        days.append(GridEnvironment(cell.cell_id, env.python, dict(env.versions)))
        print(f"[{number}/{len(chosen)}] {cell.cell_id}: environment {'reused' if env.reused else 'built'} "
              f"({time.monotonic() - began:.0f} s)", file=stream, flush=True)  # fmt: skip
    _write_meta(out, run_id, profile_name, days, configs, started, timings, "running")
    for number, day in enumerate(days, 1):
        seconds = _phase(day, "save", {"day": day.cell_id, "store": str(store), "configs": configs}, store)
        timings[f"save {day.cell_id}"] = timings.get(f"save {day.cell_id}", 0.0) + seconds
        print(f"save [{number}/{len(days)}] {day.cell_id}: {seconds:.0f} s", file=stream, flush=True)
    saved = {d.cell_id: {e["config_id"] for e in _lines(store / "saved" / d.cell_id / "saves.jsonl")
                         if e.get("outcome") == "saved"} for d in days}  # fmt: skip
    plan = pairs_for([d.cell_id for d in days], saved)
    for number, day in enumerate(days, 1):
        seconds = load_phase(day, day.cell_id, plan[day.cell_id], configs, store)
        timings[f"load {day.cell_id}"] = timings.get(f"load {day.cell_id}", 0.0) + seconds
        print(f"load [{number}/{len(days)}] {day.cell_id}: {len(plan[day.cell_id])} adapters, {seconds:.0f} s",
              file=stream, flush=True)  # fmt: skip
    _collect(store, out, days)
    _write_meta(out, run_id, profile_name, days, configs, started, timings, "done")
    return out


def day_environment(meta: dict[str, Any], cell_id: str) -> GridEnvironment:
    """One of a grid run's days, in its own environment (reused where built; built again where it is gone)."""
    from harness.define.cells import expand
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir, ensure_env
    from harness.paths import MATRIX_DIR
    from harness.versions.releases import resolve_axes

    dates = [_day(c) for c in meta.get("order") or sorted(meta["days"])]
    profile, _ = resolve_axes(load_profile(meta.get("profile") or "history", MATRIX_DIR), recorded={"date": dates})
    cell = next((c for c in expand(profile) if c.cell_id == cell_id), None)
    if cell is None:
        raise UsageError(f"{cell_id} is not a day of profile {profile.name!r} as the grid run resolved it")
    env = ensure_env(cell, profile, InstallOptions(envs_dir=default_envs_dir()))
    if env.python is None:
        raise UsageError(f"{cell_id}: no environment ({env.failure})")
    return GridEnvironment(cell_id, env.python, dict(env.versions))


def _atlas_days(results_dir: Path, profile_name: str) -> dict[str, list[str]] | None:
    """The days the newest committed run of the profile resolved (the atlas's own days, not today's index)."""
    metas = [meta_file(r) for r in profile_runs(results_dir, profile_name) if meta_file(r).is_file()]
    for meta in reversed(metas):
        resolved = json.loads(meta.read_text()).get("resolved_axes") or {}
        if resolved.get("date"):
            return {"date": resolved["date"]}
    return None


def _day(cell_id: str) -> str:
    return cell_id.split("date-", 1)[-1][:10]


def load_phase(env: GridEnvironment, label: str, pairs: list[Any], configs: dict[str, Any], store: Path) -> float:
    """Load `pairs` ((saved on, config id)) in `env`'s environment, written under `label`: every adapter in one
    process under the first of S10's fixed hash seeds, one with several modules_to_save heads again under each other
    seed, in a process of its own (which saved head a load matches can depend on the process's string hash:
    peft#2289). Returns the seconds it took; `loaded(store, label)` reads the outcomes."""
    several = several_heads(configs)
    seeds = list(_scenario_module().HASH_SEEDS)
    seconds = 0.0
    for seed in seeds:
        mine = [p for p in pairs if seed == seeds[0] or p[1] in several]
        if mine:
            job = {"day": label, "store": str(store), "configs": configs, "pairs": mine}
            seconds += _phase(env, "load", job, store, {"PYTHONHASHSEED": seed})
    return seconds


def loaded(store: Path, label: str) -> list[dict[str, Any]]:
    """One entry per pair loaded under `label` (`combined_seeds` over its hash seeds' logs)."""
    folder = store / "loaded" / label
    logs = [folder / "loads.jsonl", *sorted(folder.glob("loads-hash-*.jsonl"))]
    return combined_seeds([e for log in logs for e in _lines(log)])


def several_heads(configs: dict[str, dict[str, Any]]) -> set[str]:
    """The configs with several modules_to_save heads: loaded under each of S10's fixed hash seeds."""
    several = _scenario_module().several_heads
    return {c for c, config in configs.items() if several(config)}


def _scenario_module() -> Any:
    from harness.define.registry import discover

    return next(s for s in discover() if s.id == SCENARIO).module


def _phase(
    day: GridEnvironment, phase: str, job: dict[str, Any], store: Path, more_env: dict[str, str] | None = None
) -> float:
    """One day's save or load phase, in that day's environment; its output kept in the store's logs."""
    from harness.execution.launcher import stack_env

    logs = store / "logs"
    logs.mkdir(exist_ok=True)
    seed = (more_env or {}).get("PYTHONHASHSEED")
    name = f"{day.cell_id}-{phase}" + (f"-hash{seed}" if seed else "")
    job_file = logs / f"{name}.json"
    job_file.write_text(json.dumps(job))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
           "PYTHONPATH": str(REPO_ROOT), **stack_env("cpu", store / "torch-extensions"),
           "TRANSFORMERS_VERBOSITY": "warning", **(more_env or {})}  # fmt: skip
    began = time.monotonic()
    with open(logs / f"{name}.log", "a") as log:
        try:
            command = [str(day.python), "-m", "runtime.adapter_grid", phase, str(job_file)]
            subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                           timeout=PHASE_TIMEOUT_S, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            log.write(f"\n{phase} of {day.cell_id} stopped after {PHASE_TIMEOUT_S} s: the lines written stand\n")
    return time.monotonic() - began


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _collect(store: Path, out: Path, days: list[GridEnvironment]) -> None:
    """The store's save and load lines, with both days' releases and each failure's signature, as the run's files."""
    from harness.recording.signatures import classify

    versions = {d.cell_id: d.versions for d in days}
    saves = [e for d in days for e in _lines(store / "saved" / d.cell_id / "saves.jsonl")]
    pairs = []
    for day in days:
        for entry in loaded(store, day.cell_id):
            entry = dict(entry)
            entry["signature"] = _signature(entry, classify)
            entry.pop("traceback", None)
            entry["saved_versions"] = versions.get(entry["saved_on"], {})
            entry["loaded_versions"] = versions.get(entry["loaded_on"], {})
            pairs.append(entry)
    for entry in saves:
        entry["signature"] = _signature(entry, classify) if entry.get("outcome") == "error" else None
        entry.pop("traceback", None)
    (out / "saves.jsonl").write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in saves))
    # Each load's legs and keys make a large file of repeated words: kept xz-compressed (a tenth of the size).
    text = "".join(json.dumps(e, sort_keys=True, default=str) + "\n" for e in pairs)
    (out / "pairs.jsonl.xz").write_bytes(lzma.compress(text.encode()))
    (out / "pairs.jsonl").unlink(missing_ok=True)


def combined_seeds(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per loaded pair: where a pair was loaded under several hash seeds, the first seed's failure (its
    entry) else the first pass, with `load_hash_seeds` (seed -> 'pass' or the failing check), as S10 judges it."""
    by_pair: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_pair.setdefault(entry["pair"], []).append(entry)
    found = []
    for group in by_pair.values():
        group.sort(key=lambda e: str(e.get("hash_seed") or ""))
        chosen = dict(next((e for e in group if e.get("outcome") != "pass"), group[0]))
        if len(group) > 1:
            chosen["load_hash_seeds"] = {str(e.get("hash_seed")): "pass" if e.get("outcome") == "pass"
                                         else e.get("check") or e.get("outcome") for e in group}  # fmt: skip
        found.append(chosen)
    return found


def _signature(entry: dict[str, Any], classify: Any) -> str | None:
    if entry.get("outcome") == "fail":
        return f"check-{entry['check']}"
    if entry.get("outcome") == "error":
        found = classify("exception", {"exc_type": entry.get("exc_type", ""), "message": entry.get("message", ""),
                                       "traceback": entry.get("traceback", "")})  # fmt: skip
        return found.signature
    return None


def _write_meta(out: Path, run_id: str, profile: str, days: list[GridEnvironment], configs: dict[str, Any],
                started: str, timings: dict[str, float], status: str) -> None:  # fmt: skip
    from harness.recording.runs import now_iso

    meta = {
        "run_id": run_id,
        "scenario": SCENARIO,
        "profile": profile,
        "status": status,
        "started_at": started,
        "finished_at": now_iso() if status == "done" else None,
        "days": {d.cell_id: d.versions for d in days},
        "order": [d.cell_id for d in days],  # the profile's order of its cells (an atlas's: by day)
        "configs": configs,
        # S10's seed configs in the scenario's order; the first is the seed the others are told apart from
        "features": list(configs),
        "seed": next(iter(seed_configs())),
        "seconds": {k: round(v, 1) for k, v in timings.items()},
        "harness_commit": _commit(),
    }
    meta_file(out).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"
