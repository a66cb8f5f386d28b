"""Benchmarks, measured side by side in one run: `nox -s bench` (or `compat-matrix bench`).

1. Building a cell environment: uv with a cold cache, uv with a warm cache, and pip, as ratios.
2. Marginal cost of one more S3 config: inside a persistent worker vs one process per config.

Prints a table and writes results/bench/<date>.json. Timings are wall clock on a shared machine; the
ratios are what to read, since both sides of each ratio ran in the same session.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.define.profile import load_profile
from harness.define.registry import select
from harness.environments import envs
from harness.execution import hardware
from harness.execution.launcher import Job, LaunchSpec, run_jobs
from harness.paths import (
    BISECT_FOLDER,
    MEASURED_FOLDER,
    REPO_ROOT,
    RESULTS_DIR,
    meta_file,
    records_file,
    run_path,
    runs_folder,
)
from harness.planning.plan import build_plan, plan_scenarios

BENCH_REQUIREMENTS = ["torch==2.13.0", "transformers", "peft", "accelerate"]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_env_build(workdir: Path) -> dict[str, float]:
    """Same requirements three ways; each builds into a new empty venv."""
    uv = envs.uv_binary()
    flags = envs.index_flags()

    def uv_build(cache: Path, name: str) -> None:
        target = workdir / name
        env = dict(os.environ, UV_CACHE_DIR=str(cache))
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(target)], check=True, env=env)
        subprocess.run(
            [uv, "pip", "install", "-q", "--python", str(target / "bin/python"), *flags, *BENCH_REQUIREMENTS],
            check=True,
            env=env,
        )

    def pip_build() -> None:
        target = workdir / "pip"
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
        subprocess.run([str(target / "bin/python"), "-m", "pip", "install", "-q", *BENCH_REQUIREMENTS], check=True)

    cold_cache = workdir / "uv-cache-cold"
    results = {"uv_cold_s": timed(lambda: uv_build(cold_cache, "uv-cold"))}
    results["uv_warm_s"] = timed(lambda: uv_build(cold_cache, "uv-warm"))  # the cache the cold build filled
    results["pip_s"] = timed(pip_build)
    results["pip_over_uv_warm"] = results["pip_s"] / results["uv_warm_s"]
    results["pip_over_uv_cold"] = results["pip_s"] / results["uv_cold_s"]
    return results


def bench_worker(
    configs: int, workdir: Path, scenario_id: str = "S3", profile_name: str = "ci", cell_glob: str = "current_*"
) -> dict[str, float]:
    """One scenario's baseline jobs: one worker for all configs vs a fresh process per config, same configs,
    same cell (S3: single process; S4: torchrun with 2 ranks and deepspeed, where start-up costs most)."""
    profile = load_profile(profile_name, REPO_ROOT / "matrix")
    plan = build_plan(profile, plan_scenarios(profile, (scenario_id,)), cell_patterns=(cell_glob,), prune=False)
    profile, cell = plan.profile, plan.cells[0]
    env = envs.ensure_env(cell, profile, envs.InstallOptions(envs_dir=envs.default_envs_dir()))
    if env.failure:
        raise SystemExit(f"cannot build the benchmark cell: {env.failure}")
    scenario = select([scenario_id])[0]
    from harness.planning.draws import DrawPlan, plan_configs

    planned = plan_configs([], [], scenario.strategy(), DrawPlan(99, configs * 4, configs))
    jobs = [Job(i, p["config"], "baseline") for i, p in enumerate(planned)]
    world_size = 2 if scenario.distributed else 1
    extra = {"DS_ACCELERATOR": "cpu"} if scenario.distributed else {}

    def spec(tag: str) -> LaunchSpec:
        return LaunchSpec(
            python=env.python,
            module=scenario.module_name,
            preload=scenario.preload,
            device="cpu",
            world_size=world_size,
            env={"CUDA_VISIBLE_DEVICES": ""} | extra,
            workdir=workdir / scenario_id / tag,
            job_timeout_s=300,
            start_timeout_s=300,
            stop_after_failure=bool(scenario.spec.get("restart_after_failure", True)),
            in_step_failures=tuple(scenario.spec.get("in_step_failures", ())),
        )

    def check(results) -> None:
        bad = [r for r in results if r.status != "pass"]
        if bad:
            raise SystemExit(f"benchmark job did not pass: {bad[0].detail.get('message')}")

    # Untimed warm-up: first-time costs (bytecode, DeepSpeed's op builders, page cache) are not per config.
    check(list(run_jobs(spec("warmup"), jobs[:1])))
    one = timed(lambda: check(list(run_jobs(spec("one"), jobs[:1]))))
    persistent = timed(lambda: check(list(run_jobs(spec("persistent"), jobs))))
    per_process = timed(lambda: [check(list(run_jobs(spec(f"p{j.index}"), [j]))) for j in jobs])
    marginal_persistent = (persistent - one) / (len(jobs) - 1)
    marginal_process = per_process / len(jobs)
    return {
        "scenario": scenario.id,
        "cell": cell.cell_id,
        "configs": len(jobs),
        "one_config_one_worker_s": one,
        "persistent_total_s": persistent,
        "process_per_config_total_s": per_process,
        "marginal_persistent_s": marginal_persistent,
        "marginal_process_per_config_s": marginal_process,
        "process_over_persistent": marginal_process / marginal_persistent,
    }


#: Cells for the growth benchmark: recent accelerate releases (small wheels, so env builds stay cheap).
GROWTH_ACCELERATE = ["1.8.1", "1.9.0", "1.10.1", "1.11.0", "1.12.0", "1.13.0", "1.14.0", "1.15.0"]
GROWTH_PROFILE = """
[profile]
description = "bench: matrix wall time as cells grow"
device = "cpu"
scenarios = ["S3-*"]
examples_per_scenario = 2
hypothesis_seed = 1
[axes]
torch = ["2.13.0"]
transformers = ["latest"]
peft = ["latest"]
accelerate = {accelerate}
[install]
extra = ["hypothesis"]
"""


def bench_growth(workdir: Path, sizes: tuple[int, ...] = (1, 2, 4, 8)) -> dict[str, object]:
    """`python -m harness matrix` over 1, 2, 4, 8 cells (S3, warm environments): wall = fixed + n x per-cell."""

    def run(n: int) -> float:
        profile = workdir / f"growth{n}.toml"
        profile.write_text(GROWTH_PROFILE.format(accelerate=json.dumps(GROWTH_ACCELERATE[:n])))
        flags = ["--fresh", "--no-report", "--no-example-db", "--results-dir", str(workdir / f"results{n}")]
        command = [sys.executable, "-m", "harness", "matrix", "--profile", str(profile), *flags]
        started = time.perf_counter()
        subprocess.run(command, check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - started

    warmup = run(max(sizes))  # builds (or finds) every cell's environment, so the timed runs compare like with like
    walls = {n: run(n) for n in sizes}
    xs, ys = list(walls), list(walls.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)
    fixed = mean_y - slope * mean_x
    worst = max(abs(y - (fixed + slope * x)) / y for x, y in zip(xs, ys, strict=True))
    return {
        "warmup_s": warmup,
        "wall_s": {str(n): w for n, w in walls.items()},
        "fixed_s": fixed,
        "per_cell_s": slope,
        "worst_fit_error": worst,
    }


def bench_reduction(results_dir: Path) -> dict[str, object]:
    """Cells each method needs for the same question: the full product and pairwise on a 4x4x4 matrix, and
    the newest recorded bisect (real cell runs) against the full sweep of its releases."""
    dims = {
        "torch": ["2.10.0", "2.11.0", "2.12.0", "2.13.0"],
        "deepspeed": ["0.19.2", "0.19.4", "0.19.6", "0.19.8"],
        "bitsandbytes": ["0.47.0", "0.48.0", "0.49.0", "0.50.2"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        text = '[profile]\ndevice = "cpu"\n[axes]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in dims.items())
        path = Path(tmp) / "wide.toml"
        path.write_text(text)
        pairwise = build_plan(load_profile(str(path), Path(tmp)), reduce="pairwise", prune=False).reduction
    report: dict[str, object] = {
        "full_product_cells": pairwise.cells_full,
        "pairwise": pairwise.as_json(),
        "dimensions": {k: len(v) for k, v in dims.items()},
    }
    verdicts = sorted((results_dir / BISECT_FOLDER).glob("*/verdict.json"))
    if verdicts:
        verdict = json.loads(verdicts[-1].read_text())
        report["bisect"] = {
            "file": str(verdicts[-1].relative_to(REPO_ROOT))
            if verdicts[-1].is_relative_to(REPO_ROOT)
            else str(verdicts[-1]),
            "releases": len(verdict["candidates"]),
            "cell_runs": verdict["cell_runs"],
            "full_sweep_cell_runs": len(verdict["candidates"]),
            "first_flip": verdict["first_flip"],
        }
    return report


def _run_cli(args: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one `python -m harness ...` (it must succeed: a benchmark of a failed run means nothing)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"benchmark run failed ({proc.returncode}): {' '.join(args)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return wall


def _last_attempt(results: Path) -> tuple[dict[str, object], int]:
    """The newest run's last attempt (its phases) and its record count."""
    run_dir = max(runs_folder(results).iterdir(), key=lambda d: d.stat().st_mtime)
    meta = json.loads(meta_file(run_dir).read_text())
    return meta["attempts"][-1], len(records_file(run_dir).read_text().splitlines())


def bench_first_run(workdir: Path, profile: str, vs: str | None = None) -> dict[str, object]:
    """The README's main command on `profile` twice: cold (new results, environments, JIT and uv caches; the package
    index is the only thing not local) and warm (the same caches, a new run). With `vs`, that profile too, in turn
    (A cold, B cold, A warm, B warm: paired, so a machine that slows down slows both), each with caches of its own.
    Each run's time by phase comes from its meta.json (`phases_s`); the rest is planning, meta and the report."""
    out: dict[str, object] = {"profile": profile}
    sides = [("", profile)] + ([("vs_", vs)] if vs else [])
    if vs:
        out["vs"] = vs
    for kind in ("cold", "warm"):
        for prefix, name in sides:
            own = workdir / (prefix + "a")
            env = dict(os.environ, UV_CACHE_DIR=str(own / "uv-cache"), COMPAT_MATRIX_ENVS=str(own / "envs"))
            results = own / f"results-{kind}"
            wall = _run_cli(["matrix", "--profile", name, "--results-dir", str(results)], env)
            attempt, records = _last_attempt(results)
            phases = dict(attempt.get("phases_s") or {})
            execute = float(phases.get("execute_wall", wall))
            phases["outside execute (plan, meta, report)"] = round(wall - execute, 2)
            out[prefix + kind] = {"wall_s": round(wall, 1), "records": records, "phases_s": phases}
            print(f"  {name} {kind}: {wall:.0f} s, {records} records", flush=True)
    return out


def bench_history_cell(workdir: Path, run_id: str, day: str) -> dict[str, object]:
    """Marginal cost of one more history cell: a copy of a finished history run grows by one install day
    (`matrix --resume RUN --grow --add-date DAY`, warm uv cache); only that day's cell may run."""
    results = workdir / "history"
    shutil.copytree(run_path(RESULTS_DIR, run_id), run_path(results, run_id), ignore=shutil.ignore_patterns("worker"))
    before = records_file(run_path(results, run_id)).read_text().splitlines()
    args = ["matrix", "--profile", "history", "--no-example-db", "--no-report", "--results-dir", str(results)]
    wall = _run_cli([*args, "--resume", run_id, "--grow", "--add-date", day])
    after = records_file(run_path(results, run_id)).read_text().splitlines()
    assert after[: len(before)] == before, "growing a run must keep every record byte for byte"
    new = [json.loads(line) for line in after[len(before) :]]
    attempt, _ = _last_attempt(results)
    return {
        "run": run_id,
        "day": day,
        "wall_s": round(wall, 1),
        "new_records": len(new),
        "cells_run": sorted({r["cell"] for r in new}),
        "scenarios": len({r["scenario"] for r in new}),
        "phases_s": attempt.get("phases_s"),
    }


def bench_fix_measure(workdir: Path, requirements: str, setup: str) -> dict[str, object]:
    """`audit FILE --setup SETUP --fix --measure` from nothing: an empty HOME (no uv cache, no environments, no torch
    extensions), on a copy of the committed results without the earlier `--measure` runs (what it measures is recorded
    in the copy). Proven (exit 0) or not (exit 1): both are answers; anything else fails the benchmark."""
    home = workdir / "home"
    home.mkdir()
    results = workdir / "results"
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    for name in tracked.stdout.splitlines():  # what a clone holds, without earlier --measure runs (they would answer)
        if not name.startswith(f"results/{MEASURED_FOLDER}/"):
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO_ROOT / name, workdir / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_CACHE", "COMPAT_MATRIX_ENVS", "TORCH_EXT"))}
    env |= {"HOME": str(home)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "audit", str(Path(requirements).resolve()), "--setup", setup, "--fix",
         "--measure", "--results-dir", str(results)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(
            f"audit --fix --measure failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    lines = proc.stdout.splitlines()
    return {
        "requirements": requirements, "setup": setup, "wall_s": round(wall, 1), "exit": proc.returncode,
        "stacks_measured": sum(line.startswith("the way out measured") for line in lines),
        "verdict": next((line for line in lines if line.startswith(("every failure", "not proven"))), ""),
        "home_mb": round(sum(f.stat().st_size for f in home.rglob("*") if f.is_file()) / 1e6),
    }  # fmt: skip


#: A script every atlas day runs in seconds (one LoRA step), so the cold bisect-script's cost is its environments.
COLD_SCRIPT = REPO_ROOT / "examples" / "own-failures" / "peft_int8_import.py"
#: The CPU atlas: install days and distinct torch releases (2026-12-05: 17 days, 12 releases of torch 2.2.1 to 2.15.0).
ATLAS_DAYS, ATLAS_TORCHES = 17, 12


def bench_cold_bisect_script(workdir: Path, days: list[str], torch_index: str | None) -> dict[str, object]:
    """A cold `bisect-script` scan over `days` (new environments folder, empty uv cache: every wheel downloaded), once
    with PyPI's torch (what every environment held before), and with `torch_index` where given (a CPU-only index or
    wheel folder): its wall time, what uv's cache and the environments hold afterwards, and those figures scaled to
    the whole CPU atlas (each day's own files per day, each torch's stack per distinct torch; said as an estimate)."""
    from harness.environments import disk

    out: dict[str, object] = {"days": days, "script": COLD_SCRIPT.name}
    sides = [("pypi", None)] + ([("index", torch_index)] if torch_index else [])
    for name, source in sides:
        own = workdir / name
        env = dict(os.environ, UV_CACHE_DIR=str(own / "uv-cache"), COMPAT_MATRIX_ENVS=str(own / "envs"))
        env |= {envs.TORCH_INDEX_VAR: source or "pypi", disk.CAP_VAR: "0"}
        args = ["bisect-script", str(COLD_SCRIPT), "--from", min(days), "--to", max(days), "--name", f"bench-{name}",
                "--results-dir", str(own / "results")]  # fmt: skip
        wall = _run_cli(args, env)
        torches = {disk.torch_of(p)[0] for p in disk.environments(own / "envs")} - {None}
        cache, folder = _bytes(own / "uv-cache"), disk.folder_bytes(own / "envs")
        per_torch, per_day = cache / max(len(torches), 1), folder / len(days)
        out[name] = {
            "source": source or "pypi", "wall_s": round(wall, 1), "uv_cache_bytes": cache, "envs_own_bytes": folder,
            "envs_apparent_bytes": _bytes(own / "envs", apparent=True), "torches": sorted(torches),
            "atlas_estimate_bytes": int(per_torch * ATLAS_TORCHES + per_day * ATLAS_DAYS),
            "atlas_estimate_s": round(wall / len(days) * ATLAS_DAYS),
        }  # fmt: skip
        print(f"  {name}: {wall:.0f} s, uv cache {cache / 1e9:.1f} GB, environments {folder / 1e9:.2f} GB", flush=True)
        shutil.rmtree(own, ignore_errors=True)
    return out


#: Runs `compat-matrix report` on the results folder given, counting each record file it opens; prints the counts.
_COUNTED_REPORT = """
import collections, json, sys
import harness.recording.records as records
opened = collections.Counter()
real = records.open_records
def counting(path):
    opened[str(path)] += 1
    return real(path)
records.open_records = counting
from harness.cli import main
code = main(["report", "--results-dir", sys.argv[1]])
print(json.dumps({"exit": code, "opens": sum(opened.values()), "files": len(opened), "most": max(opened.values())}))
"""


def bench_report(workdir: Path, before: str, pairs: int) -> dict[str, object]:
    """`compat-matrix report` over the committed results as HEAD and as `before` hold them (each in a git worktree
    of its own, so the same records are read by each version of the code), in turn (A B A B: a machine that slows
    down slows both): wall seconds, the ratio pair by pair, and how many record files each opened how often."""
    sides = {"today": "HEAD", "before": before}
    trees = {name: workdir / name for name in sides}
    for name, ref in sides.items():
        subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "-q", "--detach", str(trees[name]), ref],
                       check=True, capture_output=True, text=True)  # fmt: skip
    out: dict[str, object] = {"refs": {n: _commit(r) for n, r in sides.items()}, "pairs": pairs}
    walls: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for pair in range(pairs):
            for name, tree in trees.items():
                start = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-c", _COUNTED_REPORT, str(tree / "results")], cwd=tree, capture_output=True,
                    text=True, env=dict(os.environ, PYTHONPATH=str(tree)),
                )  # fmt: skip
                walls[name].append(time.perf_counter() - start)
                if proc.returncode != 0:
                    raise SystemExit(f"report at {sides[name]} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
                out[f"{name}_reads"] = json.loads(proc.stdout.strip().splitlines()[-1])
                print(f"  pair {pair + 1}/{pairs}, {name}: {walls[name][-1]:.1f} s", flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                           capture_output=True)  # fmt: skip
    ratios = sorted(b / t for b, t in zip(walls["before"], walls["today"], strict=True))
    out |= {f"{n}_wall_s": sorted(round(w, 2) for w in ws) for n, ws in walls.items()}
    out["before_over_today"] = round(ratios[len(ratios) // 2], 2)
    return out


def _commit(ref: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", ref], capture_output=True, text=True)
    return done.stdout.strip() or ref


def _bytes(root: Path, apparent: bool = False) -> int:
    """Disk of a folder, each file once (its allocated blocks, or its length where `apparent`)."""
    seen, total = set(), 0
    for folder, _, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size if apparent else st.st_blocks * 512
    return total


def build_parser() -> argparse.ArgumentParser:
    """The command's options (also read by the test that runs every documented command as written)."""
    parser = argparse.ArgumentParser(prog="compat-matrix bench", description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=8, help="S3 configs for the worker benchmark (>= 2)")
    parser.add_argument("--skip-env", action="store_true", help="skip the environment-build benchmark")
    parser.add_argument("--skip-growth", action="store_true", help="skip the cells-growth benchmark")
    parser.add_argument("--only-reduction", action="store_true", help="only count cells per reduction method")
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "results" / "bench")
    parser.add_argument(
        "--first-run",
        metavar="PROFILE",
        nargs="?",
        const="cpu",
        help="only: the main command on PROFILE (default cpu) cold, then warm, with each run's time by phase",
    )
    parser.add_argument(
        "--vs",
        metavar="PROFILE",
        help="with --first-run: the same for PROFILE, in turn with it (paired), and the ratios",
    )
    parser.add_argument(
        "--history-cell",
        nargs=2,
        metavar=("RUN_ID", "DAY"),
        help="only: the marginal cost of one more history cell (a copy of RUN_ID grown by DAY)",
    )
    parser.add_argument(
        "--fix-measure",
        nargs=2,
        metavar=("REQUIREMENTS", "SETUP"),
        help="only: `audit REQUIREMENTS --setup SETUP --fix --measure` from an empty HOME (cold caches)",
    )
    parser.add_argument(
        "--cold-bisect-script",
        nargs="+",
        metavar="DAY",
        help=(
            "only: a cold bisect-script scan over these atlas days (empty uv cache and environments), with PyPI's "
            "torch and with --torch-index: time, disk, and both scaled to the 17-day CPU atlas"
        ),
    )
    parser.add_argument("--torch-index", metavar="URL|DIR", help="with --cold-bisect-script: the CPU-only torch source")
    parser.add_argument(
        "--report",
        metavar="REF",
        help=(
            "only: `compat-matrix report` on the committed results at HEAD and at git REF in turn (--pairs of them), "
            "each in a worktree of its own: seconds, the ratio, and the record files each opened"
        ),
    )
    parser.add_argument("--pairs", type=int, default=3, help="with --report: how many A/B pairs (default 3)")
    parser.add_argument(
        "--site",
        metavar="LOADS",
        nargs="?",
        const=5,
        type=int,
        help="only: the site's first render in headless Chromium, today's split layout vs one inline page (5 loads)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.first_run or args.history_cell or args.site or args.fix_measure or args.cold_bisect_script or args.report:
        return _only(args)
    if args.configs < 2:
        parser.error("--configs must be at least 2")
    report = _new_report()
    report["reduction"] = bench_reduction(REPO_ROOT / "results")
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        if args.only_reduction:
            pass
        elif not args.skip_env:
            print("benchmark 1/3: environment build (uv cold, uv warm, pip) ...", flush=True)
            report["env_build"] = bench_env_build(work)
            shutil.rmtree(work / "uv-cache-cold", ignore_errors=True)
        if not args.only_reduction:
            print(f"benchmark 2/3: persistent worker vs process per config ({args.configs} S3 configs) ...", flush=True)
            report["worker"] = bench_worker(args.configs, work)
        if not args.only_reduction:
            print("benchmark 2b/3: the same for S4 (torchrun, 2 ranks, deepspeed ZeRO-3; 4 configs) ...", flush=True)
            report["worker_s4"] = bench_worker(4, work, "S4", "cpu", "current_*ds-latest*")
        if not args.skip_growth and not args.only_reduction:
            print("benchmark 3/3: matrix wall time over 1, 2, 4, 8 cells (S3, warm environments) ...", flush=True)
            report["growth"] = bench_growth(work)
    print_table(report)
    _save(report, args.output_dir)
    return 0


def _new_report() -> dict[str, object]:
    return {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "hardware": hardware.describe("cpu")}


def _save(report: dict[str, object], output_dir: Path) -> None:
    """Today's file; a partial run (--skip-*, --only-reduction, --first-run) updates it instead of erasing it."""
    output_dir.mkdir(parents=True, exist_ok=True)
    out = output_dir / f"{dt.date.today().isoformat()}.json"
    if out.is_file():
        report = json.loads(out.read_text()) | report
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


def _only(args: argparse.Namespace) -> int:
    """The long benchmarks, each on its own (minutes to tens of minutes): printed and added to today's file."""
    report = _new_report()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        if args.first_run:
            against = f" against {args.vs}, in turn" if args.vs else ""
            print(f"first run: the {args.first_run} profile cold, then warm{against} ...", flush=True)
            report["first_run"] = bench_first_run(Path(tmp), args.first_run, args.vs)
        if args.site:
            from harness.tools.upkeep.site_bench import bench_site

            print(f"site: first render in headless Chromium, {args.site} loads of each layout ...", flush=True)
            report["site"] = bench_site(REPO_ROOT / "results", Path(tmp), args.site)
        if args.fix_measure:
            print(f"audit --fix --measure from an empty HOME: {' '.join(args.fix_measure)} ...", flush=True)
            report["fix_measure"] = bench_fix_measure(Path(tmp), *args.fix_measure)
        if args.cold_bisect_script:
            days = args.cold_bisect_script
            print(f"cold bisect-script over {', '.join(days)}: PyPI's torch, then {args.torch_index} ...", flush=True)
            # One entry per set of days: a later run over other days is kept beside it in today's file.
            report[f"cold_bisect_script {' '.join(days)}"] = bench_cold_bisect_script(Path(tmp), days, args.torch_index)
        if args.report:
            print(f"report: HEAD and {args.report} in turn, {args.pairs} pairs ...", flush=True)
            report["report"] = bench_report(Path(tmp), args.report, args.pairs)
        if args.history_cell:
            print(f"history: one more day ({args.history_cell[1]}) on a copy of {args.history_cell[0]} ...", flush=True)
            report["history_cell"] = bench_history_cell(Path(tmp), *args.history_cell)
    print_table(report)
    _save(report, args.output_dir)
    return 0


Row = tuple[str, str, str]


def _site_rows(site: dict) -> list[Row]:
    rows = []
    for name in ("split (today)", "inline (before)"):
        for kind, what in (("glance_ms", "answer grid"), ("records_ms", "every record")):
            m = site[name][kind]
            rows.append(
                (f"site {name}: {what}", f"{m['median']:.0f} ms median", f"min {m['min']:.0f}, max {m['max']:.0f}")
            )
    rows.append(("site: answer grid, before / today", f"{site['glance_before_over_today']:.1f}x", "goal: < 1000 ms"))
    grid, records = site["glance_bytes"] / 1e3, site["records_bytes"] / 1e6
    rows.append(
        ("site: bytes", f"page {site['page_bytes'] / 1e3:.0f} kB", f"grid {grid:.0f} kB, records {records:.1f} MB")
    )
    return rows


def _first_run_rows(f: dict) -> list[Row]:
    rows = [
        (f"first run ({f['profile']}): wall", f"{f['cold']['wall_s']:.0f} s cold", f"{f['warm']['wall_s']:.0f} s warm")
    ]
    for phase in sorted(set(f["cold"]["phases_s"]) | set(f["warm"]["phases_s"])):
        cold, warm = f["cold"]["phases_s"].get(phase, 0.0), f["warm"]["phases_s"].get(phase, 0.0)
        rows.append((f"  phase: {phase}", f"{cold:.0f} s cold", f"{warm:.0f} s warm"))
    rows.append(("  records", f"{f['cold']['records']} cold", f"{f['warm']['records']} warm"))
    if f.get("vs"):
        vs_cold, vs_warm = f["vs_cold"], f["vs_warm"]
        rows += [
            (f"first run ({f['vs']}): wall", f"{vs_cold['wall_s']:.0f} s cold", f"{vs_warm['wall_s']:.0f} s warm"),
            ("  records", f"{vs_cold['records']} cold", f"{vs_warm['records']} warm"),
            (
                f"{f['profile']} / {f['vs']}",
                f"{f['cold']['wall_s'] / vs_cold['wall_s']:.2f}x cold",
                f"{f['warm']['wall_s'] / vs_warm['wall_s']:.2f}x warm",
            ),
        ]
    return rows


def _history_cell_rows(h: dict) -> list[Row]:
    return [
        (
            f"history: one more day ({h['day']})",
            f"{h['wall_s']:.0f} s",
            f"{h['new_records']} records, cells {h['cells_run']}",
        )
    ]


def _cold_bisect_rows(c: dict) -> list[Row]:
    days = f"{len(c['days'])} day(s)"
    rows = []
    for name in ("pypi", "index"):
        if name not in c:
            continue
        side = c[name]
        label = "PyPI torch" if name == "pypi" else f"torch from {side['source']}"
        disk_gb = (side["uv_cache_bytes"] + side["envs_own_bytes"]) / 1e9
        rows += [
            (f"cold bisect-script, {label}: wall", f"{side['wall_s']:.0f} s", f"{days}: {', '.join(c['days'])}"),
            ("  disk (uv cache + environments' own)", f"{disk_gb:.1f} GB",
             f"uv cache {side['uv_cache_bytes'] / 1e9:.1f} GB, environments {side['envs_own_bytes'] / 1e9:.2f} GB "
             f"({side['envs_apparent_bytes'] / 1e9:.1f} GB apparent); torch {', '.join(side['torches'])}"),
            ("  scaled to the atlas (estimate)", f"{side['atlas_estimate_bytes'] / 1e9:.0f} GB",
             f"{ATLAS_DAYS} days, {ATLAS_TORCHES} torch releases; about {side['atlas_estimate_s'] / 60:.0f} min"),
        ]  # fmt: skip
    if "pypi" in c and "index" in c:
        ratio = c["pypi"]["atlas_estimate_bytes"] / max(c["index"]["atlas_estimate_bytes"], 1)
        rows.append(("  disk, PyPI torch / CPU torch", f"{ratio:.1f}x", "measured side by side, same days"))
    return rows


def _env_build_rows(e: dict) -> list[Row]:
    return [
        ("env build: uv, cold cache", f"{e['uv_cold_s']:.1f} s", ""),
        ("env build: uv, warm cache", f"{e['uv_warm_s']:.1f} s", ""),
        ("env build: pip", f"{e['pip_s']:.1f} s", ""),
        ("pip / uv warm", f"{e['pip_over_uv_warm']:.1f}x", "target >= 10x"),
        ("pip / uv cold", f"{e['pip_over_uv_cold']:.1f}x", ""),
    ]


def _worker_rows(w: dict) -> list[Row]:
    name = w.get("scenario", "S3")[:2]
    return [
        (f"{name}: one config, one worker", f"{w['one_config_one_worker_s']:.2f} s", ""),
        (f"{name}: {w['configs']} configs, persistent worker", f"{w['persistent_total_s']:.2f} s", ""),
        (f"{name}: {w['configs']} configs, one process each", f"{w['process_per_config_total_s']:.2f} s", ""),
        (f"{name}: marginal config, persistent", f"{w['marginal_persistent_s']:.3f} s", ""),
        (f"{name}: marginal config, process per config", f"{w['marginal_process_per_config_s']:.3f} s", ""),
        (f"{name}: process per config / persistent", f"{w['process_over_persistent']:.1f}x", "target >= 5x"),
    ]


def _reduction_rows(r: dict) -> list[Row]:
    coverage = f"pair coverage {100 * r['pairwise']['pair_coverage']:.0f} %"
    rows = [
        ("reduction: full product 4x4x4", f"{r['full_product_cells']} cells", ""),
        ("reduction: pairwise", f"{r['pairwise']['cells']} cells", coverage),
    ]
    if "bisect" in r:
        b = r["bisect"]
        note = f"full sweep {b['full_sweep_cell_runs']}; first flip {b['first_flip']}"
        rows.append((f"bisect over {b['releases']} releases", f"{b['cell_runs']} runs", note))
    return rows


def _growth_rows(g: dict) -> list[Row]:
    fit = [
        ("fit: fixed overhead", f"{g['fixed_s']:.1f} s", "wall = fixed + n x per-cell"),
        ("fit: per cell", f"{g['per_cell_s']:.1f} s", ""),
        ("fit: worst relative error", f"{100 * g['worst_fit_error']:.0f} %", "small: linear"),
    ]
    return [(f"matrix, {n} cell(s), S3", f"{w:.1f} s", "") for n, w in g["wall_s"].items()] + fit


#: Each section of a report, in the order the table prints them, and how it becomes rows.
def _fix_measure_rows(m: dict) -> list[Row]:
    verdict = "proven" if m["exit"] == 0 else "not proven"
    return [
        ("audit --fix --measure, cold (empty HOME)", f"{m['wall_s']:.0f} s",
         f"{verdict}; {m['stacks_measured']} stack(s) built; HOME grew to {m['home_mb']} MB; goal: < 300 s"),
    ]  # fmt: skip


def _report_rows(r: dict) -> list[Row]:
    rows = []
    for name in ("today", "before"):
        walls, reads = r[f"{name}_wall_s"], r[f"{name}_reads"]
        rows.append((
            f"report, {name} ({r['refs'][name]})", f"{walls[len(walls) // 2]:.1f} s",
            f"min {walls[0]:.1f}, max {walls[-1]:.1f}; {reads['opens']} record-file opens of {reads['files']} files "
            f"(at most {reads['most']} of one)",
        ))  # fmt: skip
    rows.append(("report, before / today", f"{r['before_over_today']:.2f}x", f"median of {r['pairs']} pairs"))
    return rows


_SECTIONS = (
    ("report", _report_rows),
    ("fix_measure", _fix_measure_rows),
    ("site", _site_rows),
    ("first_run", _first_run_rows),
    ("history_cell", _history_cell_rows),
    ("cold_bisect_script", _cold_bisect_rows),
    ("env_build", _env_build_rows),
    ("worker", _worker_rows),
    ("worker_s4", _worker_rows),
    ("reduction", _reduction_rows),
    ("growth", _growth_rows),
)


def print_table(report: dict) -> None:
    """Every measured section of `report` as one table: measure | value | note."""
    rows = [
        row
        for section, to_rows in _SECTIONS
        for key in sorted(k for k in report if k == section or k.startswith(f"{section} "))
        for row in to_rows(report[key])
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure'.ljust(width)} | value      | note")
    print(f"{'-' * width}-|------------|------------")
    for name, value, note in rows:
        print(f"{name.ljust(width)} | {value.ljust(10)} | {note}")


if __name__ == "__main__":
    sys.exit(main())
