"""Command line of the harness: `compat-matrix COMMAND` (installed) or `python -m harness COMMAND`.

nox sessions call this; nodes without nox, uv or an install of the project (an air-gapped GPU node) call
`python -m harness` from the checkout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from harness.errors import Terminated, UsageError
from harness.execution import hardware
from harness.paths import MATRIX_DIR, RESULTS_DIR
from harness.publishing.stage import NothingToReport, write_report


class _Parser(argparse.ArgumentParser):
    """argparse, but bad arguments exit 2 with one line, like every other usage error here."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="compat-matrix",
        description=(
            "Compatibility test matrix for LoRA / DoRA / QLoRA under FSDP and DeepSpeed. Builds one uv environment "
            "per version cell, runs the failure-mode scenarios in it, appends one JSON record per "
            "scenario x variant x config x cell, and writes results/COMPATIBILITY.md."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (_, text) in DELEGATED.items():
        # Their own parsers take the rest of the line: `compat-matrix bench --help`.
        sub.add_parser(name, help=text, add_help=False)

    matrix = sub.add_parser(
        "matrix",
        help="run (or resume) a profile's matrix",
        description=(
            "Run a profile's matrix. A run that did not finish (interrupted by Ctrl-C, SIGTERM or SIGKILL) is "
            "resumed: what is recorded is kept and only the rest runs. A complete run is never resumed: the next "
            "invocation starts a new run and resolves 'latest' afresh (--resume RUN_ID continues a chosen run). "
            "One process writes a run at a time. Exit 0 when the run completed (failures of the stack are data, "
            "not errors), 1 if any record is a harness/scenario error, 2 on bad input or a run held by another "
            "process, 130 on Ctrl-C, 143 on SIGTERM."
        ),
    )
    matrix.add_argument(
        "--profile",
        help="profile name in matrix/ or a path to a .toml "
        "(default: gpu when a GPU is visible and matrix/gpu.toml exists, else cpu)",
    )
    matrix.add_argument("--fresh", action="store_true", help="start a new run even if an unfinished one exists")
    matrix.add_argument(
        "--resume",
        metavar="RUN_ID",
        dest="resume_run",
        help="continue this run (an interrupted one, or a complete one to add scenarios or cells to it)",
    )
    matrix.add_argument(
        "--scenario",
        action="append",
        dest="scenarios",
        metavar="ID_OR_GLOB",
        help="only these scenarios (repeatable; 'S3' or 'S3-*' or a full id)",
    )
    matrix.add_argument(
        "--cell",
        action="append",
        dest="cells",
        metavar="GLOB",
        help="only cells whose id matches (repeatable), e.g. 'old_*'",
    )
    matrix.add_argument(
        "--examples",
        type=int,
        metavar="N",
        help="Hypothesis-drawn configs per scenario (overrides the profile; explicit examples always run)",
    )
    matrix.add_argument(
        "--config",
        action="append",
        dest="config_ids",
        metavar="CONFIG_ID",
        help="only this config id (repeatable), e.g. to re-run one config after fixing a scenario",
    )
    matrix.add_argument(
        "--hypothesis-profile",
        choices=["ci", "explore"],
        help="ci: the profile's example count and a short shrink budget; explore: 10x the draws and a long "
        "shrink budget (default: the profile's hypothesis_profile)",
    )
    matrix.add_argument(
        "--example-db",
        type=Path,
        metavar="DIR",
        help="Hypothesis example database: failures shrunk in earlier runs are tried first, new ones are saved "
        "(default: <results-dir>/hypothesis-db)",
    )
    matrix.add_argument("--no-example-db", action="store_true", help="neither read nor save failure memory")
    matrix.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where runs and tables go")
    matrix.add_argument(
        "--envs-dir",
        type=Path,
        help="where cell environments are kept (default: $COMPAT_MATRIX_ENVS or ~/.cache/compat-matrix/envs)",
    )
    matrix.add_argument("--rebuild-envs", action="store_true", help="rebuild cell environments even if present")
    matrix.add_argument("--offline", action="store_true", help="install only from --wheelhouse, never an index")
    matrix.add_argument(
        "--wheelhouse", type=Path, metavar="DIR", help="a directory of wheels (see `nox -s wheelhouse`)"
    )
    matrix.add_argument(
        "--system-torch",
        nargs="?",
        const="python3",
        metavar="PYTHON",
        help="keep the node's preinstalled python/torch and layer each cell's other packages over it "
        "(a pip --target overlay first on PYTHONPATH); PYTHON defaults to python3",
    )
    matrix.add_argument("--no-report", action="store_true", help="do not regenerate COMPATIBILITY.md afterwards")
    matrix.add_argument(
        "--shard",
        metavar="I/N",
        help="run only shard I of N (1-based): every N-th cell, so N machines can split a profile; "
        "`report` merges the shards (newest evidence per cell and scenario)",
    )
    matrix.add_argument(
        "--grow",
        action="store_true",
        help="with --resume on a dated run (history): add the days its date rule gives now (a new peft minor, "
        "today) to the run and run only the new days' cells; prints whether the newest stack's outcomes differ "
        "from the previous newest day's",
    )
    matrix.add_argument(
        "--add-date",
        action="append",
        default=[],
        dest="add_dates",
        metavar="YYYY-MM-DD",
        help="with --grow: also add this install day (repeatable)",
    )
    matrix.add_argument(
        "--date",
        action="append",
        default=[],
        dest="dates",
        metavar="YYYY-MM-DD",
        help="a new run of a dated profile (history) on these install days instead of the ones its date rule "
        "gives (repeatable), e.g. to re-check the atlas days a scenario change affects; the report shows the newest "
        "evidence per cell and scenario, so such a run replaces only what it re-ran",
    )
    matrix.add_argument(
        "--world-size",
        action="append",
        type=int,
        dest="world_sizes",
        metavar="N",
        help="only the cells of the profile's world_size axis that run at N ranks (repeatable): a runner with N "
        "GPUs takes the cells that need N",
    )
    matrix.add_argument(
        "--no-shrink", action="store_true", help="record drawn failures without shrinking them (faster, less to learn)"
    )
    matrix.add_argument(
        "--no-prune",
        action="store_true",
        help="do not read package metadata (Requires-Dist) to skip cells whose pins cannot work together",
    )
    matrix.add_argument(
        "--reduce",
        choices=["none", "pairwise"],
        help="pairwise: run only cells that together hold every pair of values of any two dimensions "
        "(stack and axes); the coverage goes into meta.json (default: the profile's `reduce`, else none)",
    )
    matrix.add_argument(
        "--slots",
        type=int,
        metavar="N",
        help="run single-process scenarios in N concurrent workers (default: one per visible GPU on CUDA, one "
        "one-thread worker per core on CPU, at most 4)",
    )
    matrix.add_argument(
        "--no-early-start",
        action="store_true",
        help="start a scenario's workers when its turn comes, not while the previous scenario of the cell runs "
        "(for comparing the two in a benchmark)",
    )
    matrix.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="multi-node, inside a Slurm allocation (`sbatch -N N` / `salloc -N N`): each distributed launch is "
        "`srun --nodes N` + torchrun with c10d rendezvous, one agent per node; the world size then counts ranks "
        "per node. The checkout, --results-dir and --envs-dir must be on a filesystem every node shares",
    )
    matrix.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="multi-node: where the c10d store listens (default: this host on a free port)",
    )

    report = sub.add_parser("report", help="regenerate results/COMPATIBILITY.md from records")
    report.add_argument(
        "--run",
        action="append",
        dest="runs",
        metavar="RUN_ID",
        help="runs to include (repeatable; default: the newest run of each profile)",
    )
    report.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    report.add_argument("--output", type=Path, help="default: <results-dir>/COMPATIBILITY.md")

    imports = sub.add_parser("import-run", help="file runs brought back from another machine under results/runs/")
    imports.add_argument("records", nargs="+", type=Path, help="<run-id>.records.jsonl files (meta.json beside)")
    imports.add_argument("--results-dir", type=Path, default=RESULTS_DIR)

    pack = sub.add_parser(
        "pack",
        help="compress runs' records for committing (records.jsonl -> records.jsonl.xz, about 100x smaller)",
        description="Packs each run's records.jsonl (and any discarded-*.jsonl) with xz, byte-exact, and removes "
        "the plain file; every reader takes either form and a resumed or imported run is unpacked first. Pack "
        "before committing a run: everything tracked travels with each GPU device call (64 MiB in all). A run "
        "that a process is writing is refused (exit 2).",
    )
    pack.add_argument("runs", nargs="*", help="run ids (default: every run under RESULTS_DIR, probe runs included)")
    pack.add_argument("--results-dir", type=Path, default=RESULTS_DIR)

    look = sub.add_parser(
        "lookup",
        help="the measured rows nearest your versions, the verdict per scenario there and the fix to try",
        description="Finds the table's rows whose versions match PACKAGE==VERSION (a version like 2.4 matches every "
        "2.4.x); without one, the two atlas dates whose stacks bracket your versions; without those, the nearest "
        "rows, saying plainly that it is extrapolating. Prints each row's versions and, per scenario, the verdict "
        "and the fixes that remove the failure.",
    )
    look.add_argument("versions", nargs="+", metavar="PACKAGE==VERSION")
    look.add_argument("--scenario", action="append", metavar="ID", help="only these scenarios (e.g. S1)")
    look.add_argument("--device", choices=["cpu", "cuda"], help="only rows measured on this device")
    look.add_argument("--results-dir", type=Path, default=RESULTS_DIR)

    locks = sub.add_parser(
        "lock",
        help="write a dated GPU profile's era lock (matrix/locks/NAME.json) for an air-gapped node",
        description="For each day of the profile's date axis: resolve the stack as the index had it that day over "
        "the node's own torch (a stub of its version that requires nothing), and plan what the node must get on top "
        "of its own packages (matrix/nodes/<node_image>.json): the era packages at their day's versions, and any "
        "other resolved package the node lacks or holds in a version that does not meet their requirements. A day "
        "that does not resolve is kept with uv's reason. Needs the index; the node reads the lock.",
    )
    locks.add_argument("--profile", required=True)
    locks.add_argument("--day", action="append", metavar="YYYY-MM-DD", help="only these days (repeatable)")

    bis = sub.add_parser(
        "bisect",
        help="find the first release of a package where a scenario's outcome flips",
        description="Holds every other pin of a base cell fixed and bisects one package's releases (from the "
        "index pip is configured for, or the wheelhouse with --offline). Each probe is a real one-cell run of the "
        "scenario's explicit configs under one variant; n releases take at most ceil(log2 n) + 1 cell runs. "
        "Writes results/bisect/<id>/verdict.json with every probe's evidence.",
    )
    bis.add_argument("--package", required=True, help="the package to bisect, e.g. deepspeed")
    bis.add_argument("--scenario", required=True, help="scenario id or prefix, e.g. S4")
    bis.add_argument("--variant", default="baseline")
    bis.add_argument("--profile", default="cpu", help="profile whose base cell holds the other pins (default cpu)")
    bis.add_argument("--cell", metavar="GLOB", help="base cell of that profile (default: its first cell)")
    bis.add_argument("--good", metavar="VERSION", help="one end of the range (default: the newest release)")
    bis.add_argument("--bad", metavar="VERSION", help="the other end (default: the oldest the profile pins)")
    bis.add_argument("--signature", help="count only failures with this signature as failing")
    bis.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    bis.add_argument("--offline", action="store_true")
    bis.add_argument("--wheelhouse", type=Path, metavar="DIR")

    bs = sub.add_parser(
        "bisect-script",
        help="run your own script across the atlas's dated stacks and name the release where it breaks or heals",
        description="Runs SCRIPT (a plain Python file or a PEP 723 script; it fails by a non-zero exit or an "
        "exception, exit 77 means 'not applicable here') in every install day of the atlas (the history profile's "
        "dated stacks: the same environments the atlas ran in), or between two ends of your own. Each run is "
        "the failure asked about (the bad end's signature, or --match), a pass, a different failure (reported, "
        "never taken for it) or unusable. Between neighbouring days whose outcome differs, it moves one package "
        "at a time from the older day's release to the newer one's (the failing traceback's packages first), "
        "then bisects that package's releases. Writes results/script-bisect/<name>/verdict.json, runs.jsonl "
        "(every run, reused by the next invocation) and issue.md (an upstream issue body). Exit 0 with a verdict, "
        "2 on bad input.",
    )
    bs.add_argument("script", type=Path, help="the script to run")
    bs.add_argument("--nproc", type=int, default=1, help="ranks: >1 starts it under torchrun (default 1)")
    bs.add_argument("--torchrun", action="store_true", help="start it under torchrun even with one rank")
    bs.add_argument("--from", dest="from_day", metavar="YYYY-MM-DD", help="scan only atlas days from this one")
    bs.add_argument("--to", dest="to_day", metavar="YYYY-MM-DD", help="scan only atlas days up to this one")
    bs.add_argument(
        "--good", metavar="SPEC", help="an end where it passes: a day, or exact pins 'peft==0.13.2,torch==2.4.1'"
    )
    bs.add_argument("--bad", metavar="SPEC", help="an end where it fails with the failure asked about (as --good)")
    bs.add_argument("--match", metavar="REGEX", help="the failure asked about: runs whose error text matches")
    bs.add_argument("--timeout", type=float, default=600.0, help="seconds per run; then every rank's stack (600)")
    bs.add_argument("--name", help="the verdict's folder under results/script-bisect/ (default: the script's stem)")
    bs.add_argument(
        "--all-moves",
        action="store_true",
        help="move every changed package (not only until one flips, and past the bound of 10 moves)",
    )
    bs.add_argument("--fresh", action="store_true", help="ignore the runs an earlier invocation recorded")
    bs.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    bs.add_argument("--offline", action="store_true", help="install only from --wheelhouse (air-gapped nodes)")
    bs.add_argument("--wheelhouse", type=Path, metavar="DIR")

    rs = sub.add_parser(
        "run-script",
        help="run a script once, here, the way bisect-script does, and write what happened as JSON",
        description="Runs SCRIPT once with this python (or --python), under torchrun for --nproc > 1 or "
        "--torchrun, with a timeout after which every rank's Python stacks are taken. Prints the outcome and "
        "signature; --json FILE writes the run (outcome, signature, error, traceback, rank stacks, versions). "
        "How a GPU node runs a user's script at several world sizes in one call: scripts/gpu-script-run.sh.",
    )
    rs.add_argument("script", type=Path)
    rs.add_argument("--nproc", type=int, default=1)
    rs.add_argument("--torchrun", action="store_true", help="start it under torchrun even with one rank")
    rs.add_argument("--timeout", type=float, default=600.0)
    rs.add_argument("--python", type=Path, default=Path(sys.executable), help="the interpreter (default: this one)")
    rs.add_argument("--pythonpath", help="an overlay directory to put first on PYTHONPATH")
    rs.add_argument("--json", type=Path, metavar="FILE", help="write the run here")

    fl = sub.add_parser(
        "flips",
        help="name every flip of a dated run: which package, then which release, changed a target outcome",
        description="For each scenario and each pair of neighbouring dates of a dated run (the history profile) "
        "where the target outcome changes, moves each changed package alone from the older date's release to "
        "the newer one's (the rest held) in a real one-cell run, then bisects the package whose move "
        "reproduces the change. Writes results/flips/<run-id>/flips.json and every probe's records.",
    )
    fl.add_argument("--run", required=True, metavar="RUN_ID", help="a dated run under results/runs/")
    fl.add_argument("--profile", default="history", help="the run's profile (default history)")
    fl.add_argument("--scenario", action="append", metavar="ID", help="only these scenarios (repeatable)")
    fl.add_argument(
        "--again",
        action="store_true",
        help="probe flips an earlier invocation named too (default: those are kept from flips.json)",
    )
    fl.add_argument("--results-dir", type=Path, default=RESULTS_DIR)

    check = sub.add_parser(
        "check-repros",
        help="run reproducers with `uv run` and check they still reproduce (and their fixes still pass)",
        description="Runs results/repros/<id>.py files listed in index.json, each in a fresh uv environment "
        "built from its PEP 723 pins, and compares the signature with the recorded one; with --fixes also runs one "
        "passing fix variant per reproducer and expects it to pass. Exit 1 if any check disagrees.",
    )
    check.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    check.add_argument("--match", action="append", metavar="GLOB", help="only reproducer files matching (repeatable)")
    check.add_argument("--limit", type=int, default=0, help="at most this many reproducers (0: all)")
    check.add_argument("--fixes", action="store_true", help="also run the first passing fix variant of each")

    sl = sub.add_parser(
        "slurm",
        help="run a profile as a Slurm job array (one shard per task) plus a merge-and-report job",
        description="Submits `sbatch --array=1-N`: array task I runs `matrix --shard I/N --no-report` (every N-th "
        "cell), and a report job that starts when the whole array has ended (`--dependency=afterany`) merges the "
        "shards' runs into one table (`report`). The checkout, this Python, --results-dir and the environments "
        "directory must be on a filesystem every node shares. Job scripts and logs go to <results-dir>/slurm/<time>/.",
    )
    sl.add_argument("--profile", required=True, help="profile name in matrix/ or a path to a .toml")
    sl.add_argument("--tasks", type=int, required=True, help="array size: the profile's cells split this many ways")
    sl.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    sl.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="passed to both sbatch calls, e.g. --sbatch-arg=--partition=gpu --sbatch-arg=--gres=gpu:4",
    )
    sl.add_argument("--wait", action="store_true", help="block until the report job has ended; exit with its status")
    sl.add_argument("matrix_args", nargs="*", metavar="-- MATRIX_ARGS", help="more `matrix` options for every task")

    chk = sub.add_parser(
        "check",
        help="check the environment you are in: which failure modes it has and which fixes work here",
        description="Runs inside your own training environment (no new environment, your torch and GPUs): the "
        "seed configs of every scenario this environment can run (the baseline of each, then every variant where "
        "the target failure showed), through the same workers as the matrix. Prints, per scenario, whether its "
        "target failure reproduces, which fixes remove it here, other failures, and the nearest rows of the "
        "published table. Exit 1 when a target failure reproduces (to gate a CI job), 0 when none does, 2 on bad "
        "input. Needs hypothesis and packaging in the environment.",
    )
    chk.add_argument("--scenario", action="append", dest="scenarios", metavar="ID_OR_GLOB", help="only these")
    chk.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="the published runs to compare with")

    up = sub.add_parser(
        "upstream-report",
        help="print a ready-to-file upstream issue body for a reproducer",
        description="Prints, for one reproducer of results/repros/, an issue body in the shape the upstream bug "
        "templates ask for: the environment (versions, hardware), the PEP 723 reproducer, expected and actual "
        "behaviour, the traceback, the fixes that passed, and the first flipping release where a bisect found one.",
    )
    up.add_argument(
        "reproducer",
        help="a file name from results/repros/index.json (or its path or id), or a bisect-script verdict folder "
        "(results/script-bisect/<name>)",
    )
    up.add_argument("--results-dir", type=Path, default=RESULTS_DIR)

    listing = sub.add_parser("list", help="show profiles, scenarios, or a profile's cells")
    listing.add_argument("what", choices=["profiles", "scenarios", "cells"])
    listing.add_argument("--profile", default=None)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.add_argument("--reduce", choices=["none", "pairwise"], help="cells after this reduction")
    return parser


def default_profile() -> str:
    if hardware.visible_gpus() and (MATRIX_DIR / "gpu.toml").is_file():
        return "gpu"
    return "cpu"


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


#: Commands with parsers of their own: name -> (module with main(argv), help line).
DELEGATED = {
    "bench": ("harness.tools.bench", "benchmarks, side by side in one run, printed as a table"),
    "wheelhouse": (
        "harness.environments.wheelhouse",
        "download/build every wheel a profile needs, for an air-gapped node",
    ),
}


def main(argv: list[str] | None = None) -> int:
    import importlib
    import signal

    argv = sys.argv[1:] if argv is None else argv
    # Ctrl-C and SIGINT stop every command cleanly, whatever disposition it inherited: a shell without job control
    # starts background jobs (`nohup ... &`, job scripts) with SIGINT ignored, and Python then installs no handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if argv and argv[0] in DELEGATED:
        try:
            return int(importlib.import_module(DELEGATED[argv[0]][0]).main(argv[1:]))
        except KeyboardInterrupt as exc:
            print("interrupted", file=sys.stderr)
            return 143 if isinstance(exc, Terminated) else 130
    args = build_parser().parse_args(argv)
    try:
        if args.command == "matrix":
            return _matrix(args)
        if args.command == "report":
            path = write_report(args.results_dir, args.runs, args.output)
            print(f"wrote {path}")
            return 0
        if args.command == "import-run":
            return _import_runs(args)
        if args.command == "lookup":
            from harness.tools.lookup import lookup

            print(lookup(args.results_dir, args.versions, args.scenario, args.device))
            return 0
        if args.command == "lock":
            from harness.tools.locking import write_lock

            print(f"wrote {write_lock(args.profile, MATRIX_DIR, args.day)}")
            return 0
        if args.command == "pack":
            return _pack(args)
        if args.command == "flips":
            return _flips(args)
        if args.command == "bisect":
            return _bisect(args)
        if args.command == "run-script":
            from harness.tools.user_script import command as run_script_command

            return run_script_command(args)
        if args.command == "bisect-script":
            from harness.tools.script_bisect import command

            return command(args)
        if args.command == "upstream-report":
            from harness.publishing.upstream import find_entry, report_body, script_report

            folder = Path(args.reproducer)
            if (folder / "verdict.json").is_file():
                print(script_report(folder))
            else:
                print(report_body(args.results_dir, find_entry(args.results_dir, args.reproducer)))
            return 0
        if args.command == "check":
            from harness.tools.check import run_check

            return run_check(args.scenarios, args.results_dir)
        if args.command == "check-repros":
            return _check_repros(args)
        if args.command == "slurm":
            return _slurm(args)
        return _list(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130


def _matrix(args: argparse.Namespace) -> int:
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.execution.matrix import run_matrix
    from harness.execution.options import MatrixOptions

    if args.examples is not None and args.examples < 0:
        raise UsageError("--examples must be 0 or more")
    shard = _shard(args.shard) if args.shard else None
    if args.slots is not None and args.slots < 1:
        raise UsageError("--slots must be 1 or more")
    if args.nnodes < 1:
        raise UsageError("--nnodes must be 1 or more")
    if args.nnodes > 1:
        from harness.execution import slurm

        slurm.require("srun")
        args.rdzv_endpoint = args.rdzv_endpoint or slurm.default_rdzv_endpoint()
    if args.offline and args.wheelhouse is None:
        raise UsageError("--offline needs --wheelhouse DIR")
    if args.wheelhouse is not None and not args.wheelhouse.is_dir():
        raise UsageError(f"--wheelhouse {args.wheelhouse}: no such directory")
    if args.fresh and args.resume_run:
        raise UsageError("--fresh and --resume exclude each other")
    if (args.grow or args.add_dates) and not args.resume_run:
        raise UsageError("--grow and --add-date add days to a dated run: pass --resume RUN_ID")
    if args.add_dates and not args.grow:
        raise UsageError("--add-date needs --grow")
    if args.dates and args.resume_run:
        raise UsageError("--date chooses the days of a new run; a resumed run keeps its days (--grow --add-date adds)")
    for day in args.dates:
        try:
            dt.date.fromisoformat(day)
        except ValueError:
            raise UsageError(f"--date {day!r}: expected YYYY-MM-DD") from None
    profile = load_profile(args.profile or default_profile(), MATRIX_DIR)
    install = InstallOptions(
        envs_dir=args.envs_dir or default_envs_dir(),
        offline=args.offline,
        wheelhouse=args.wheelhouse.resolve() if args.wheelhouse else None,
        system_python=args.system_torch,
        rebuild=args.rebuild_envs,
    )
    options = MatrixOptions(
        results_dir=args.results_dir,
        install=install,
        fresh=args.fresh,
        resume_run=args.resume_run,
        scenario_patterns=tuple(args.scenarios) if args.scenarios else None,
        cell_patterns=tuple(args.cells) if args.cells else None,
        examples=args.examples,
        config_ids=tuple(args.config_ids) if args.config_ids else None,
        example_db=None if args.no_example_db else (args.example_db or args.results_dir / "hypothesis-db"),
        hypothesis_profile=args.hypothesis_profile,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
        slots=args.slots,
        no_early_start=args.no_early_start,
        reduce=args.reduce,
        no_prune=args.no_prune,
        shard=shard,
        world_sizes=tuple(args.world_sizes) if args.world_sizes else None,
        grow=args.grow,
        add_dates=tuple(args.add_dates),
        dates=tuple(args.dates),
        no_shrink=args.no_shrink,
    )
    summary = run_matrix(profile, options)
    print(
        f"run {summary.run_id}: {summary.written} new records, {summary.resumed} already recorded; "
        f"outcomes {json.dumps(summary.outcomes, sort_keys=True)}"
    )
    print(f"records: {summary.run_dir / 'records.jsonl'}")
    if args.grow:
        from harness.publishing.growth import newest_change_text

        text = newest_change_text(summary.run_dir)
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


def _slurm(args: argparse.Namespace) -> int:
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


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected I/N, e.g. 2/4") from None
    if not 1 <= index <= count:
        raise UsageError(f"--shard {text!r}: I must be between 1 and N")
    return index, count


def _bisect(args: argparse.Namespace) -> int:
    from packaging.version import InvalidVersion, Version

    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.execution.options import MatrixOptions
    from harness.tools.bisection import bisect

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
        out_root=args.results_dir / "bisect",
    )
    print(f"\n{verdict.package} on {verdict.scenario} / {verdict.variant}, base cell {verdict.base_cell}")
    print(f"releases in range: {', '.join(verdict.candidates)}")
    for probe in verdict.probes:
        print(f"  {probe.version:<12} {probe.state:<9} {' '.join(probe.signatures)}  (run {probe.run_id})")
    if verdict.stepped_over:
        print(f"stepped over (could not install or import): {', '.join(verdict.stepped_over)}")
    flip = verdict.first_flip or "none in range"
    print(f"outcome at {verdict.candidates[0]}: {verdict.old_state}; first release where it flips: {flip}")
    print(f"cell runs: {verdict.cell_runs} (bound ceil(log2 {len(verdict.candidates)}) + 1 = {verdict.bound})")
    return 0


def _flips(args: argparse.Namespace) -> int:
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.execution.options import MatrixOptions
    from harness.recording.packing import records_exist
    from harness.tools.flips import describe, find_flips

    run_dir = args.results_dir / "runs" / args.run
    if not records_exist(run_dir / "records.jsonl"):
        raise UsageError(f"--run {args.run}: no {run_dir / 'records.jsonl'}")
    profile = load_profile(args.profile, MATRIX_DIR)
    if profile.era_packages:
        return _node_flips(args, profile, run_dir)
    options = MatrixOptions(results_dir=args.results_dir, install=InstallOptions(envs_dir=default_envs_dir()))
    for flip in find_flips(
        run_dir, profile, options, args.results_dir / "flips", scenarios=args.scenario, again=args.again
    ):
        print(describe(flip), flush=True)
    return 0


def _check_repros(args: argparse.Namespace) -> int:
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


def _node_flips(args: argparse.Namespace, profile: Any, run_dir: Path) -> int:
    """Flips of a GPU history run: one planning round (harness/tools/node_flips.py)."""
    from harness.tools.flips import describe
    from harness.tools.node_flips import plan_round, write_probe_profile

    flips, by_scenario = plan_round(run_dir, profile, args.results_dir / "flips")
    for flip in flips:
        masked = " (masked: another failure or configs that could not run hide it; not probed)"
        print(describe(flip).split(", by ")[0] + masked if not flip.probes else describe(flip), flush=True)
    if not by_scenario:
        print(f"every flip of {run_dir.name} is as named as its probes allow")
        return 0
    needed = sorted({day for days in by_scenario.values() for day in days})
    path = write_probe_profile(profile, needed, sorted(by_scenario), MATRIX_DIR)
    probes = args.results_dir / "flips" / run_dir.name / "probes"
    print(f"{len(needed)} probe day(s) needed: {' '.join(needed)}")
    print(f"next: python -m harness wheelhouse --profile {path.stem} " + " ".join(f"--day {d}" for d in needed))
    print(
        f"      on the node: scripts/gpu-node-run.sh {path.stem} WHEELS OUT "
        + " ".join(f"--cell '*{d}'" for d in needed)
    )
    print(f"      python -m harness import-run --results-dir {probes} OUT/<run-id>.records.jsonl; then flips again")
    return 0


def _import_runs(args: argparse.Namespace) -> int:
    from harness.recording.imports import import_run

    for path in args.records:
        run_dir, added, total = import_run(path, args.results_dir)
        print(f"{run_dir.name}: {added} new records ({total} in all) -> {run_dir}")
    return 0


def _pack(args: argparse.Namespace) -> int:
    from harness.recording.packing import pack_runs

    packed = pack_runs(args.results_dir, args.runs)
    for item in packed:
        print(f"{item.path}: {item.plain_bytes / 1e6:.2f} MB -> {item.packed_bytes / 1e6:.3f} MB")
    plain, small = sum(p.plain_bytes for p in packed), sum(p.packed_bytes for p in packed)
    print(f"packed {len(packed)} file(s): {plain / 1e6:.2f} MB -> {small / 1e6:.2f} MB")
    return 0


def _list(args: argparse.Namespace) -> int:
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
