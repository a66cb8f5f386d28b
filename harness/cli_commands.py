"""What each command does once its arguments are parsed (`harness/cli_options.py` names the handler of each):
checks on option combinations, worded as flags, then the floors below do the work."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.cli_options import BY_NAME, built_from
from harness.errors import NothingToJudge, UsageError
from harness.execution import hardware
from harness.paths import (
    BISECT_FOLDER,
    FLIPS_FOLDER,
    MATRIX_DIR,
    PROBES_FOLDER,
    SCRIPT_BISECT_FOLDER,
    WATCH_FOLDER,
    flips_folder,
    records_file,
    run_path,
)
from harness.publishing.stage import NothingToReport, write_report


def matrix(args: argparse.Namespace) -> int:
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.execution.matrix import run_matrix
    from harness.execution.options import MatrixOptions

    # The option checks ran before this (cli_options.MATRIX_CHECKS); the options object is built from the table.
    if args.nnodes > 1:
        from harness.execution import slurm

        slurm.require("srun")
        args.rdzv_endpoint = args.rdzv_endpoint or slurm.default_rdzv_endpoint()
    profile = load_profile(args.profile or default_profile(), MATRIX_DIR)
    install = InstallOptions(
        envs_dir=args.envs_dir or default_envs_dir(),
        offline=args.offline,
        wheelhouse=args.wheelhouse.resolve() if args.wheelhouse else None,
        system_python=args.system_torch,
        rebuild=args.rebuild_envs,
        max_env_gb=args.max_env_gb,
        torch_index=args.torch_index,
    )
    options = MatrixOptions(**built_from(BY_NAME["matrix"], args, install=install))
    if args.grow and not args.resume_run:
        return _grow_atlas(args, profile, options)
    summary = run_matrix(profile, options)
    print(
        f"run {summary.run_id}: {summary.written} new records, {summary.resumed} already recorded; "
        f"outcomes {json.dumps(summary.outcomes, sort_keys=True)}"
    )
    print(f"records: {summary.run_dir / 'records.jsonl'}")
    if args.grow:
        from harness.knowledge.store import Store
        from harness.publishing.growth import newest_change_text

        text = newest_change_text(Store(args.results_dir), summary.run_dir.name)
        print(text)
        (summary.run_dir / "newest-change.md").write_text(text + "\n")
    if not args.no_report:
        try:
            print(f"table: {write_report(args.results_dir, None, None)}")
        except NothingToReport as exc:
            print(f"table: not written ({exc})")
    if summary.interrupted:
        return 143 if summary.signal == "SIGTERM" else 130
    return 1 if summary.outcomes.get("error") else 0


def _grow_atlas(args: argparse.Namespace, profile: Any, options: Any) -> int:
    """`matrix --grow` without --resume: what the table lacks of the days the date rule gives now, as new runs."""
    from harness.tools.growth.atlas_growth import grow

    summaries, text = grow(profile, options)
    (args.results_dir / "growth-summary.md").write_text(text + "\n")
    for summary in summaries:
        print(f"run {summary.run_id}: {summary.written} new records; outcomes {json.dumps(summary.outcomes)}")
    if summaries and not args.no_report:
        try:
            print(f"table: {write_report(args.results_dir, None, None)}")
        except NothingToReport as exc:
            print(f"table: not written ({exc})")
    stopped = next((s for s in summaries if s.interrupted), None)
    if stopped is not None:
        return 143 if stopped.signal == "SIGTERM" else 130
    return 1 if any(s.outcomes.get("error") for s in summaries) else 0


def watch(args: argparse.Namespace) -> int:
    """`watch`: each release since the newest atlas day, moved alone onto that day's stack."""
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.execution.options import MatrixOptions
    from harness.tools.growth.atlas_growth import watch as watch_releases

    profile = load_profile(args.profile, MATRIX_DIR)
    if profile.era_packages:  # an era-locked GPU profile: planned here, run on a node, judged here
        from harness.tools.gpu_node.node_watch import watch as watch_on_node

        watched, text = watch_on_node(profile, args.results_dir)
        (args.results_dir / WATCH_FOLDER / f"latest-{profile.name}.md").write_text(text + "\n")
        return 0
    install = InstallOptions(
        envs_dir=args.envs_dir or default_envs_dir(), max_env_gb=args.max_env_gb, torch_index=args.torch_index
    )
    options = MatrixOptions(results_dir=args.results_dir, install=install)
    watched, text = watch_releases(profile, options, args.results_dir / WATCH_FOLDER)
    (args.results_dir / WATCH_FOLDER / "latest.md").write_text(text + "\n")
    if watched:
        try:
            print(f"table: {write_report(args.results_dir, None, None)}")
        except NothingToReport as exc:
            print(f"table: not written ({exc})")
    return 0


def grow(args: argparse.Namespace) -> int:
    """`grow`: the growth, the watch, the new flips and the report, as the weekly workflows run them."""
    from harness.tools.growth.grow import command

    return command(args)


def slurm(args: argparse.Namespace) -> int:
    from harness.define.profile import load_profile
    from harness.execution.slurm import submit_profile

    load_profile(args.profile, MATRIX_DIR)  # bad input is reported here, not in N job logs
    sub = submit_profile(args.profile, args.tasks, args.results_dir, args.matrix_args, args.sbatch_arg, args.wait)
    print(f"array job {sub.array_job} ({args.tasks} tasks), report job {sub.report_job}; logs in {sub.folder}")
    if sub.report_status is None:
        print(f"watch with: squeue -j {sub.array_job},{sub.report_job}")
        return 0
    print(f"report job ended with status {sub.report_status}: {sub.folder / 'report.out'}")
    return sub.report_status


def bisect(args: argparse.Namespace) -> int:
    from packaging.version import InvalidVersion, Version

    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.execution.options import MatrixOptions
    from harness.tools.release_search.bisection import bisect

    if args.offline and args.wheelhouse is None:
        raise UsageError("--offline needs --wheelhouse DIR")
    # Either end may be the good one (a fix or a regression): with both given, the older is where we start.
    old, new = args.bad, args.good
    try:
        if old and new and Version(new) < Version(old):
            old, new = new, old
    except InvalidVersion as exc:
        raise UsageError(f"--good/--bad: {exc}") from None
    profile = load_profile(args.profile, MATRIX_DIR)
    install = InstallOptions(
        envs_dir=default_envs_dir(),
        offline=args.offline,
        wheelhouse=args.wheelhouse.resolve() if args.wheelhouse else None,
    )
    options = MatrixOptions(results_dir=args.results_dir, install=install)
    verdict = bisect(
        profile,
        args.package,
        args.scenario,
        args.variant,
        options,
        old=old,
        new=new,
        cell_glob=args.cell,
        signature=args.signature,
        out_root=args.results_dir / BISECT_FOLDER,
    )
    print(f"\n{verdict.package} on {verdict.scenario} / {verdict.variant}, base cell {verdict.base_cell}")
    print(f"releases in range: {', '.join(verdict.candidates)}")
    for probe in verdict.bisect_runs:
        print(f"  {probe['version']:<12} {probe['state']:<9} {' '.join(probe['signatures'])}  (run {probe['run_id']})")
    if verdict.stepped_over:
        print(f"stepped over (could not install or import): {', '.join(verdict.stepped_over)}")
    flip = verdict.release or "none in range"
    print(f"outcome at {verdict.candidates[0]}: {verdict.older_state}; first release where it flips: {flip}")
    runs, bound = len(verdict.bisect_runs), verdict.search_bound
    print(f"cell runs: {runs} (bound ceil(log2 {len(verdict.candidates)}) + 1 = {bound})")
    return 0


def flips(args: argparse.Namespace) -> int:
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.execution.options import MatrixOptions
    from harness.recording.packing import records_exist
    from harness.tools.release_search.dated_runs import filed_elsewhere, usable_runs
    from harness.tools.release_search.flip_naming import describe, find_flips

    run_dirs = [run_path(args.results_dir, run) for run in args.runs]
    for run, run_dir in zip(args.runs, run_dirs, strict=True):
        if not records_exist(records_file(run_dir)):
            raise UsageError(f"--run {run}: no {records_file(run_dir)}")
    profile = load_profile(args.profile, MATRIX_DIR)
    usable_runs(run_dirs, profile.name)
    elsewhere = filed_elsewhere(run_dirs, args.results_dir / FLIPS_FOLDER)
    if elsewhere:
        raise UsageError(
            f"flips are filed under {', '.join(elsewhere)} already: name that run first (--run {elsewhere[0]}), so "
            "that its probes are read and the table shows each flip once"
        )
    if profile.era_packages:
        return _node_flips(args, profile, run_dirs)
    install = InstallOptions(envs_dir=default_envs_dir(), max_env_gb=args.max_env_gb, torch_index=args.torch_index)
    options = MatrixOptions(results_dir=args.results_dir, install=install)
    from harness.environments import disk

    print(disk.per_environment(install.envs_dir, install.cap(), install.torch_source() is not None).line(), flush=True)
    for flip in find_flips(
        run_dirs, profile, options, args.results_dir / FLIPS_FOLDER, scenarios=args.scenario, again=args.again,
        span=(args.from_day, args.to_day), windows=args.windows, sweep=not args.bisect,
    ):  # fmt: skip
        print(describe(flip), flush=True)
    return 0


def check_repros(args: argparse.Namespace) -> int:
    import fnmatch

    from harness.publishing.repro import check_repro

    folder = args.results_dir / "repros"
    if not (folder / "index.json").is_file():
        raise UsageError(f"no {folder / 'index.json'}; run `nox -s report` (or a matrix) first")
    entries = json.loads((folder / "index.json").read_text())
    if args.match:
        entries = [e for e in entries if any(fnmatch.fnmatchcase(e["file"], m) for m in args.match)]
    if args.limit:
        entries = entries[: args.limit]
    bad = skipped = 0
    gpus = bool(hardware.visible_gpus())
    for entry in entries:
        if entry.get("device") == "cuda" and not gpus:
            skipped += 1
            print(f"skip {entry['file']}: recorded on cuda, no GPU here", flush=True)
            continue
        runs = [None] + (entry["passing_fixes"][:1] if args.fixes else [])
        for variant in runs:
            result = check_repro(folder / entry["file"], entry, variant)
            bad += not result["ok"]
            mark = "ok " if result["ok"] else "BAD"
            shown = variant or entry["variant"]
            print(
                f"{mark} {entry['file']} --variant {shown}: expected {result['expected']}, "
                f"observed {result['observed']} ({result['seconds']} s)",
                flush=True,
            )
    print(f"{len(entries) - skipped} reproducers checked, {skipped} skipped, {bad} disagreements")
    return 1 if bad else 0


def _node_flips(args: argparse.Namespace, profile: Any, run_dirs: list[Path]) -> int:
    """Flips of a GPU history run (or of several runs of one GPU profile): one planning round
    (harness/tools/gpu_node/node_flips.py)."""
    from harness.recording.flip import changes_words
    from harness.tools.gpu_node.node_flips import plan_round, write_probe_profile
    from harness.tools.release_search.flip_naming import describe

    run_dir = run_dirs[0]
    if args.from_day or args.to_day:
        raise UsageError("--from and --to are not planned on a GPU node yet: name the CPU atlas's runs")
    if args.windows and args.bisect:
        raise UsageError("--windows sweeps: it cannot be planned with --bisect")
    search = "bisect" if args.bisect else "sweep"
    flips, by_scenario = plan_round(
        run_dirs, profile, args.results_dir / FLIPS_FOLDER, getattr(args, "scenario", None), search, args.windows
    )
    for flip in flips:
        if flip.older_state == flip.newer_state:
            state = (
                "window swept: " + (changes_words(flip.changes) or "no change inside")
                if flip.bisect
                else ("its sweep points are planned below" if flip.sweep is None and not flip.changes else "")
            )
            shown = ", ".join(f"{p} {o} .. {n}" for p, (o, n) in flip.changed.items())
            print(f"{flip.scenario} window {flip.older} .. {flip.newer} ({flip.older_state} on both; {shown}): "
                  f"{state}", flush=True)  # fmt: skip
        elif flip.note.startswith("masked"):
            print(f"{describe(flip).split(', by ')[0]} ({flip.note}; not probed)", flush=True)
        elif not flip.moves:
            print(f"{describe(flip).split(', by ')[0]} (its first probes are planned below)", flush=True)
        else:
            print(describe(flip), flush=True)
    if not by_scenario:
        print(f"every flip of {run_dir.name} is as named as its probes allow")
        return 0
    needed = sorted({day for days in by_scenario.values() for day in days})
    path = write_probe_profile(profile, needed, sorted(by_scenario), MATRIX_DIR)
    probes = flips_folder(args.results_dir, run_dir.name) / PROBES_FOLDER
    print(f"{len(needed)} probe day(s) needed: {' '.join(needed)}")
    print(f"next: python -m harness wheelhouse --profile {path.stem} " + " ".join(f"--day {d}" for d in needed))
    for scenario, days in sorted(by_scenario.items()):
        # Each scenario on its own probe days, and only on the configs that showed its failure: a probe is judged
        # on those (`bisection.probe_state`), so the node need run no others.
        shown = sorted({c for flip in flips if flip.scenario == scenario and not flip.note for c in flip.config_ids})
        print(
            f"      on the node: scripts/gpu-node-run.sh {path.stem} WHEELS OUT --scenario {scenario} "
            + " ".join([*(f"--cell '*{d}'" for d in sorted(set(days))), *(f"--config {c}" for c in shown)])
        )
    print(f"      python -m harness import-run --results-dir {probes} OUT/<run-id>.records.jsonl; then flips again")
    return 0


def import_runs(args: argparse.Namespace) -> int:
    from harness.recording.imports import import_run

    for path in args.records:
        run_dir, added, total = import_run(path, args.results_dir)
        print(f"{run_dir.name}: {added} new records ({total} in all) -> {run_dir}")
    return 0


def pack(args: argparse.Namespace) -> int:
    from harness.recording.packing import pack_runs

    packed = pack_runs(args.results_dir, args.runs)
    for item in packed:
        print(f"{item.path}: {item.plain_bytes / 1e6:.2f} MB -> {item.packed_bytes / 1e6:.3f} MB")
    plain, small = sum(p.plain_bytes for p in packed), sum(p.packed_bytes for p in packed)
    print(f"packed {len(packed)} file(s): {plain / 1e6:.2f} MB -> {small / 1e6:.2f} MB")
    return 0


def list_things(args: argparse.Namespace) -> int:
    from harness.define.profile import available_profiles, load_profile
    from harness.define.registry import discover

    if args.what == "profiles":
        items = available_profiles(MATRIX_DIR)
    elif args.what == "scenarios":
        items = [
            {
                "id": s.id,
                "title": s.spec.get("title", ""),
                "world_size": s.spec.get("world_size", 1),
                "variants": list(s.variants),
            }
            for s in discover()
        ]
    else:
        from harness.planning.plan import build_plan

        plan = build_plan(load_profile(args.profile or default_profile(), MATRIX_DIR), reduce=args.reduce, prune=False)
        cells, reduction, resolved = plan.cells, plan.reduction, plan.resolved_axes
        if resolved and not args.json:
            print("# release rules resolved: " + "; ".join(f"{k} = {', '.join(v)}" for k, v in resolved.items()))
        items = [
            {
                "cell": c.cell_id,
                "world_size": c.world_size,
                "requirements": c.requirements(),
                "excluded": c.excluded_reason,
            }
            for c in cells
        ]
        if not args.json:
            print(
                f"# {reduction.cells} of {reduction.cells_full} cells ({reduction.method}); pairs covered "
                f"{reduction.pairs_covered}/{reduction.pairs_total}"
            )
    if args.json:
        print(json.dumps(items, indent=1))
    else:
        for item in items:
            print(item if isinstance(item, str) else " ".join(f"{k}={v}" for k, v in item.items()))
    return 0


def default_profile() -> str:
    """`gpu` where a GPU is visible; else `default`, the coffee-break answer on CPU (`cpu` holds the full draws)."""
    if hardware.visible_gpus() and (MATRIX_DIR / "gpu.toml").is_file():
        return "gpu"
    return "default" if (MATRIX_DIR / "default.toml").is_file() else "cpu"


def doc_outputs(args: argparse.Namespace) -> int:
    from harness.tools.upkeep import doc_outputs as outputs

    if args.write:
        print(f"{outputs.write()} document(s) written")
        return 0
    stale = [e for e in outputs.examples() if outputs.run(e.command) != (e.code, e.shown)]
    for example in stale:
        print(f"{example.path.relative_to(outputs.REPO_ROOT)}: `{example.command}` prints something else")
    return 1 if stale else 0


def report(args: argparse.Namespace) -> int:
    print(f"wrote {write_report(args.results_dir, args.runs, args.output)}")
    return 0


def lookup(args: argparse.Namespace) -> int:
    from harness.tools.answers.lookup import lookup as nearest_rows

    print(
        nearest_rows(args.results_dir, args.versions, args.scenario, args.device, args.setup, args.measure, args.gpus)
    )
    return 0


def audit(args: argparse.Namespace) -> int:
    from harness.tools.answers.audit import command

    try:
        report = command(args)
    except NothingToJudge as exc:
        if not args.unrelated_ok:
            raise
        print(f"audit: {exc}", file=sys.stderr)  # a hook on a file unrelated to the stack: said, not failed
        return 0
    if not args.measure:
        return report.gate(args.strict)
    from harness.tools.answers.audit_prove import prove  # --fix --measure: the way out built here and judged again

    lines, code = prove(
        report, args.results_dir, say=lambda line: print(line, file=sys.stderr, flush=True), strict=args.strict
    )
    print("\n".join(lines))
    return code


def adapters_grid(args: argparse.Namespace) -> int:
    from harness.tools.adapter_grid.grid_run import run_grid

    if args.sweep:
        from harness.tools.adapter_grid.grid_sweep import sweep_grid

        if args.resume or args.feature or args.start or args.end:
            raise UsageError("--sweep names the flips of a finished run: it takes no --resume, --feature, --from, --to")
        print(f"wrote {sweep_grid(args.sweep, args.results_dir)}")
        return 0
    out = run_grid(args.profile, args.results_dir, args.start, args.end, args.feature, args.resume,
                   drawn=args.drawn)  # fmt: skip
    print(f"wrote {out}")
    return 0


def lock(args: argparse.Namespace) -> int:
    from harness.tools.gpu_node.locking import write_lock

    print(f"wrote {write_lock(args.profile, MATRIX_DIR, args.day)}")
    return 0


def run_script(args: argparse.Namespace) -> int:
    """`compat-matrix run-script`: one run, printed, and written as JSON with the versions it imported."""
    import os
    from dataclasses import asdict

    from harness.environments.envs import installed_versions
    from harness.execution.script_launch import run_script as launch
    from harness.publishing.upstream import setup_words

    if not args.script.is_file():
        raise UsageError(f"{args.script}: no such file")
    if args.nproc < 1 or args.timeout <= 0:
        raise UsageError("--nproc must be at least 1 and --timeout positive")
    # Here, in the environment it was started in: --pythonpath first, then the user's own PYTHONPATH.
    pythonpath = os.pathsep.join(filter(None, [args.pythonpath, os.environ.get("PYTHONPATH")])) or None
    found = launch(
        args.python, args.script, nproc=args.nproc, torchrun=args.torchrun or None, timeout_s=args.timeout,
        pythonpath=pythonpath,
    )  # fmt: skip
    print(f"{args.script.name} ({args.nproc} rank(s)): {found.outcome} {found.signature or ''} {found.error or ''}")
    print(f"  measured: {setup_words(found.setup)}")
    if args.json:
        data = asdict(found) | {
            "script": args.script.name,
            "nproc": args.nproc,
            "versions": installed_versions(args.python, pythonpath),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


def bisect_script(args: argparse.Namespace) -> int:
    if args.device == "cuda" and args.blame:
        raise UsageError("--blame runs here on a CPU verdict; a GPU finding is blamed on the node "
                         "(`findings ID --verify --blame --node-wheels DIR`)")  # fmt: skip
    if args.device == "cuda":  # planned here in rounds, run on a GPU node
        from harness.tools.gpu_node.node_script import gpu_command

        return gpu_command(args)
    from harness.tools.script_verdicts.script_bisect import command

    code = command(args)
    if code == 0 and args.blame:  # then its last step: the named release's changed code, put back
        from harness.tools.script_verdicts.script_blame import command as blame

        folder = args.results_dir / SCRIPT_BISECT_FOLDER / (args.name or args.script.stem)
        return blame(argparse.Namespace(folder=folder, named_only=True))
    return code


def blame_script(args: argparse.Namespace) -> int:
    from harness.tools.script_verdicts.script_blame import command

    return command(args)


def bisect_script_pack(args: argparse.Namespace) -> int:
    from harness.tools.gpu_node.node_script import pack_folders

    return pack_folders(args.folders, args.pack)


def bisect_script_node(args: argparse.Namespace) -> int:
    from harness.tools.gpu_node.node_round import node_command

    return node_command(args)


def findings(args: argparse.Namespace) -> int:
    from harness.tools.code_blame.finding_verification import command

    return command(args)


def upstream_report(args: argparse.Namespace) -> int:
    from harness.publishing.upstream import find_entry, report_body, script_report

    folder = Path(args.reproducer)
    if (folder / "verdict.json").is_file():
        print(script_report(folder))
    else:
        from harness.knowledge.atlas import Atlas

        atlas = Atlas(args.results_dir)
        print(report_body(atlas, find_entry(atlas.store, args.reproducer)))
    return 0


def check(args: argparse.Namespace) -> int:
    from harness.tools.answers.check import run_check

    return run_check(args.scenarios, args.results_dir)
