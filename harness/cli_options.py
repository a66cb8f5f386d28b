"""The commands and their options, declared once as data (as nox declares its options): each command is a
record of its help, its handler in `harness/cli_commands.py` and its options in the order `--help` shows them;
options that several commands share are one record each, given another help line where a command needs it.
`harness/cli.py` builds the parser from this table and dispatches through it."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.paths import RESULTS_DIR

#: How a parsed value becomes the field it fills (the value, and every parsed option for those that need more).
Convert = Callable[[Any, argparse.Namespace], Any]


class Option:
    """One argparse option: its flags, its help line, the rest of `add_argument`'s keywords, and the field of the
    command's options object it fills (`fills`, through `convert`), so that object is built from this table."""

    __slots__ = ("convert", "fills", "flags", "help", "settings")

    def __init__(
        self,
        flags: tuple[str, ...],
        help: str | None = None,
        *,
        fills: str | None = None,
        convert: Convert | None = None,
        **settings: Any,
    ) -> None:
        self.flags, self.help, self.settings, self.fills, self.convert = flags, help, settings, fills, convert

    @property
    def dest(self) -> str:
        return self.settings.get("dest", self.flags[0].lstrip("-").replace("-", "_"))

    def but(self, **changes: Any) -> Option:
        """The same option with another help line (or other settings) for one command."""
        help_line = changes.pop("help", self.help)
        fills, convert = changes.pop("fills", self.fills), changes.pop("convert", self.convert)
        return Option(self.flags, help_line, fills=fills, convert=convert, **(self.settings | changes))


@dataclass(frozen=True)
class Check:
    """A finalizer (as nox's options have): a check of one or several parsed options, run in the table's order
    before the command; the first that finds a problem is the one-line error (exit 2)."""

    problem: Callable[[argparse.Namespace], str | None]


@dataclass(frozen=True)
class Command:
    name: str
    #: The function of `harness/cli_commands.py` that runs it (args -> exit code).
    handler: str
    help: str
    description: str | None = None
    options: tuple[Option, ...] = ()
    checks: tuple[Check, ...] = ()


def built_from(command: Command, args: argparse.Namespace, **given: Any) -> dict[str, Any]:
    """The keyword arguments of the command's options object: each option that `fills` a field, converted; plus
    what the caller `given`s (fields no option fills alone)."""
    filled = {}
    for option in command.options:
        if option.fills:
            value = getattr(args, option.dest)
            filled[option.fills] = option.convert(value, args) if option.convert else value
    return filled | given


def first_problem(command: Command, args: argparse.Namespace) -> str | None:
    return next((problem for check in command.checks if (problem := check.problem(args))), None)


def _tuple_or_none(value: Any, args: argparse.Namespace) -> tuple[Any, ...] | None:
    return tuple(value) if value else None


def _as_tuple(value: Any, args: argparse.Namespace) -> tuple[Any, ...]:
    return tuple(value)


def _shard_numbers(text: str) -> tuple[int, int] | None:
    """`--shard` text as (I, N), or None where it is not two integers around a slash."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        return None
    return index, count


def shard_problem(text: str | None) -> str | None:
    """Why `--shard` text is not I/N with 1 <= I <= N (None when it is, or when none was given)."""
    if not text:
        return None
    numbers = _shard_numbers(text)
    if numbers is None:
        return f"--shard {text!r}: expected I/N, e.g. 2/4"
    return None if 1 <= numbers[0] <= numbers[1] else f"--shard {text!r}: I must be between 1 and N"


def _shard(text: str | None, args: argparse.Namespace) -> tuple[int, int] | None:
    return _shard_numbers(text) if text else None


def _example_db(value: Path | None, args: argparse.Namespace) -> Path | None:
    return None if args.no_example_db else (value or args.results_dir / "hypothesis-db")


def _bad_day(days: list[str]) -> str | None:
    for day in days:
        try:
            dt.date.fromisoformat(day)
        except ValueError:
            return f"--date {day!r}: expected YYYY-MM-DD"
    return None


MATRIX_CHECKS = (
    Check(lambda a: "--examples must be 0 or more" if a.examples is not None and a.examples < 0 else None),
    Check(lambda a: shard_problem(a.shard)),
    Check(lambda a: "--slots must be 1 or more" if a.slots is not None and a.slots < 1 else None),
    Check(lambda a: "--nnodes must be 1 or more" if a.nnodes < 1 else None),
    Check(lambda a: "--offline needs --wheelhouse DIR" if a.offline and a.wheelhouse is None else None),
    Check(
        lambda a: (
            f"--wheelhouse {a.wheelhouse}: no such directory"
            if a.wheelhouse is not None and not a.wheelhouse.is_dir()
            else None
        )
    ),
    Check(lambda a: "--fresh and --resume exclude each other" if a.fresh and a.resume_run else None),
    Check(lambda a: "--add-date needs --grow" if a.add_dates and not a.grow else None),
    Check(lambda a: "--grow chooses its own days: no --date with it" if a.grow and a.dates else None),
    Check(lambda a: "--grow makes new runs of the days it adds: no --fresh with it" if a.grow and a.fresh else None),
    Check(
        lambda a: (
            "--date chooses the days of a new run; a resumed run keeps its days (--grow --add-date adds)"
            if a.dates and a.resume_run
            else None
        )
    ),
    Check(lambda a: _bad_day(a.dates)),
)


# Shared options.
RESULTS_OPTION = Option(("--results-dir",), type=Path, default=RESULTS_DIR)
MAX_ENV_OPTION = Option(
    ("--max-env-gb",),
    type=float,
    metavar="GB",
    help=(
        "the cap on what the cell environments hold of their own (files not shared with uv's cache): before a build, "
        "the least recently used environments not in use are removed until it fits (default: "
        "$COMPAT_MATRIX_MAX_ENV_GB, else 10; 0: no cap)"
    ),
)
TORCH_INDEX_OPTION = Option(
    ("--torch-index",),
    metavar="pypi|cpu|URL|DIR",
    help=(
        "where torch comes from: pypi (default, $COMPAT_MATRIX_TORCH_INDEX: PyPI's CUDA build, about 4.3 GB a "
        "release, what the committed atlas ran), cpu (https://download.pytorch.org/whl/cpu: a CPU build, about 0.9 "
        "GB), or an index URL or a folder of wheels; the release is the one the cell resolves either way, and each "
        "record says which build ran (install.torch_build)"
    ),
)
ENV_CHECKS = (
    Check(
        lambda a: (
            f"--max-env-gb {a.max_env_gb}: expected a number of GB, 0 or more (0: no cap)"
            if a.max_env_gb is not None and not a.max_env_gb >= 0
            else None
        )
    ),
)
OFFLINE_OPTION = Option(("--offline",), action="store_true")
WHEELHOUSE_OPTION = Option(("--wheelhouse",), type=Path, metavar="DIR")
TORCHRUN_OPTION = Option(("--torchrun",), action="store_true", help="start it under torchrun even with one rank")

COMMANDS: tuple[Command, ...] = (
    Command(
        "matrix",
        "matrix",
        help="run (or resume) a profile's matrix",
        description=(
            "Run a profile's matrix. A run that did not finish (interrupted by Ctrl-C, SIGTERM or "
            "SIGKILL) is resumed: what is recorded is kept and only the rest runs. A complete run is "
            "never resumed: the next invocation starts a new run and resolves 'latest' afresh (--resume "
            "RUN_ID continues a chosen run). One process writes a run at a time. Exit 0 when the run "
            "completed (failures of the stack are data, not errors), 1 if any record is a "
            "harness/scenario error, 2 on bad input or a run held by another process, 130 on Ctrl-C, "
            "143 on SIGTERM."
        ),
        checks=MATRIX_CHECKS + ENV_CHECKS,
        options=(
            Option(
                ("--profile",),
                help=(
                    "profile name in matrix/ or a path to a .toml (default: gpu when a GPU is visible and "
                    "matrix/gpu.toml exists, else default: every scenario's seed configs in a coffee break; cpu "
                    "and history hold the full draws)"
                ),
            ),
            Option(
                ("--fresh",),
                fills="fresh",
                action="store_true",
                help="start a new run even if an unfinished one exists",
            ),
            Option(
                ("--resume",),
                fills="resume_run",
                metavar="RUN_ID",
                dest="resume_run",
                help=("continue this run (an interrupted one, or a complete one to add scenarios or cells to it)"),
            ),
            Option(
                ("--scenario",),
                fills="scenario_patterns",
                convert=_tuple_or_none,
                action="append",
                dest="scenarios",
                metavar="ID_OR_GLOB",
                help="only these scenarios (repeatable; 'S3' or 'S3-*' or a full id)",
            ),
            Option(
                ("--cell",),
                fills="cell_patterns",
                convert=_tuple_or_none,
                action="append",
                dest="cells",
                metavar="GLOB",
                help="only cells whose id matches (repeatable), e.g. 'old_*'",
            ),
            Option(
                ("--examples",),
                fills="examples",
                type=int,
                metavar="N",
                help=("Hypothesis-drawn configs per scenario (overrides the profile; explicit examples always run)"),
            ),
            Option(
                ("--config",),
                fills="config_ids",
                convert=_tuple_or_none,
                action="append",
                dest="config_ids",
                metavar="CONFIG_ID",
                help=("only this config id (repeatable), e.g. to re-run one config after fixing a scenario"),
            ),
            Option(
                ("--hypothesis-profile",),
                fills="hypothesis_profile",
                choices=["ci", "explore"],
                help=(
                    "ci: the profile's example count and a short shrink budget; explore: 10x the draws and a "
                    "long shrink budget (default: the profile's hypothesis_profile)"
                ),
            ),
            Option(
                ("--example-db",),
                fills="example_db",
                convert=_example_db,
                type=Path,
                metavar="DIR",
                help=(
                    "Hypothesis example database: failures shrunk in earlier runs are tried first, new ones are "
                    "saved (default: <results-dir>/hypothesis-db)"
                ),
            ),
            Option(("--no-example-db",), action="store_true", help="neither read nor save failure memory"),
            RESULTS_OPTION.but(help="where runs and tables go", fills="results_dir"),
            Option(
                ("--envs-dir",),
                type=Path,
                help=("where cell environments are kept (default: $COMPAT_MATRIX_ENVS or ~/.cache/compat-matrix/envs)"),
            ),
            Option(("--rebuild-envs",), action="store_true", help="rebuild cell environments even if present"),
            MAX_ENV_OPTION,
            TORCH_INDEX_OPTION,
            OFFLINE_OPTION.but(help="install only from --wheelhouse, never an index"),
            WHEELHOUSE_OPTION.but(help="a directory of wheels (see `nox -s wheelhouse`)"),
            Option(
                ("--system-torch",),
                nargs="?",
                const="python3",
                metavar="PYTHON",
                help=(
                    "keep the node's preinstalled python/torch and layer each cell's other packages over it (a "
                    "pip --target overlay first on PYTHONPATH); PYTHON defaults to python3"
                ),
            ),
            Option(("--no-report",), action="store_true", help="do not regenerate COMPATIBILITY.md afterwards"),
            Option(
                ("--shard",),
                fills="shard",
                convert=_shard,
                metavar="I/N",
                help=(
                    "run only shard I of N (1-based): every N-th cell, so N machines can split a profile; "
                    "`report` merges the shards (newest evidence per cell and scenario)"
                ),
            ),
            Option(
                ("--grow",),
                fills="grow",
                action="store_true",
                help=(
                    "a dated profile (history): run, for every scenario, the install days the date rule gives now "
                    "(a new peft minor, today) that the table has no record of, as new runs (what the table shows "
                    "decides, never one run: a second growth the same day runs nothing); prints and writes to "
                    "results/growth-summary.md each scenario's newest day against its previous one. With --resume "
                    "RUN_ID: add the rule's days to that run instead (COMPAT_MATRIX_TODAY=YYYY-MM-DD sets today)"
                ),
            ),
            Option(
                ("--add-date",),
                fills="add_dates",
                convert=_as_tuple,
                action="append",
                default=[],
                dest="add_dates",
                metavar="YYYY-MM-DD",
                help="with --grow: also add this install day (repeatable)",
            ),
            Option(
                ("--date",),
                fills="dates",
                convert=_as_tuple,
                action="append",
                default=[],
                dest="dates",
                metavar="YYYY-MM-DD",
                help=(
                    "a new run of a dated profile (history) on these install days instead of the ones its date "
                    "rule gives (repeatable), e.g. to re-check the atlas days a scenario change affects; the "
                    "report shows the newest evidence per cell and scenario, so such a run replaces only what "
                    "it re-ran"
                ),
            ),
            Option(
                ("--world-size",),
                fills="world_sizes",
                convert=_tuple_or_none,
                action="append",
                type=int,
                dest="world_sizes",
                metavar="N",
                help=(
                    "only the cells of the profile's world_size axis that run at N ranks (repeatable): a runner "
                    "with N GPUs takes the cells that need N"
                ),
            ),
            Option(
                ("--no-shrink",),
                fills="no_shrink",
                action="store_true",
                help="record drawn failures without shrinking them (faster, less to learn)",
            ),
            Option(
                ("--no-prune",),
                fills="no_prune",
                action="store_true",
                help=("do not read package metadata (Requires-Dist) to skip cells whose pins cannot work together"),
            ),
            Option(
                ("--reduce",),
                fills="reduce",
                choices=["none", "pairwise"],
                help=(
                    "pairwise: run only cells that together hold every pair of values of any two dimensions "
                    "(stack and axes); the coverage goes into meta.json (default: the profile's `reduce`, else "
                    "none)"
                ),
            ),
            Option(
                ("--slots",),
                fills="slots",
                type=int,
                metavar="N",
                help=(
                    "run single-process scenarios in N concurrent workers (default: one per visible GPU on "
                    "CUDA, one one-thread worker per core on CPU, at most 4)"
                ),
            ),
            Option(
                ("--no-early-start",),
                fills="no_early_start",
                action="store_true",
                help=(
                    "start a scenario's workers when its turn comes, not while the previous scenario of the "
                    "cell runs (for comparing the two in a benchmark)"
                ),
            ),
            Option(
                ("--nnodes",),
                fills="nnodes",
                type=int,
                default=1,
                help=(
                    "multi-node, inside a Slurm allocation (`sbatch -N N` / `salloc -N N`): each distributed "
                    "launch is `srun --nodes N` + torchrun with c10d rendezvous, one agent per node; the world "
                    "size then counts ranks per node. The checkout, --results-dir and --envs-dir must be on a "
                    "filesystem every node shares"
                ),
            ),
            Option(
                ("--rdzv-endpoint",),
                fills="rdzv_endpoint",
                metavar="HOST:PORT",
                help="multi-node: where the c10d store listens (default: this host on a free port)",
            ),
        ),
    ),
    Command(
        "report",
        "report",
        help="regenerate results/COMPATIBILITY.md from records",
        options=(
            Option(
                ("--run",),
                action="append",
                dest="runs",
                metavar="RUN_ID",
                help="runs to include (repeatable; default: the newest evidence of each profile, per GPU count)",
            ),
            RESULTS_OPTION,
            Option(("--output",), type=Path, help="default: <results-dir>/COMPATIBILITY.md"),
        ),
    ),
    Command(
        "watch",
        "watch",
        help="try each release published after the newest atlas day alone on that day's stack: what it changes",
        description=(
            "Lists every release of torch, transformers, peft, accelerate, deepspeed and bitsandbytes first "
            "uploaded after the newest install day the table shows for the dated profile (up to today, "
            "COMPAT_MATRIX_TODAY=YYYY-MM-DD to set it), and runs each one moved alone onto that day's stack (every "
            "other axis package held at the day's release, what the day does not pin resolved as of the day) with "
            "the day's seed configs. Prints one line per release: 'breaks S7 (target now shows on 3/5)', "
            "'fixes S1 (1/7 was 5/7)', 'no change' or 'cannot install'; the runs and watch.json go under "
            "results/watch/<today>/. With no new release it says so and runs nothing. With an era-locked GPU "
            "profile (--profile gpu-history-ws2) the node has no index: the first call writes each release as a "
            "probe day of <profile>-probes (resolved over the node's torch) and prints the pack, node and import "
            "commands; once the node's records are imported under results/watch/<today>/<profile>/, the same "
            "call judges them."
        ),
        options=(
            Option(
                ("--profile",),
                default="history",
                help="the dated profile whose newest day is moved (history), or an era-locked GPU profile",
            ),
            RESULTS_OPTION,
            Option(("--envs-dir",), type=Path, help="where cell environments are kept"),
            MAX_ENV_OPTION,
            TORCH_INDEX_OPTION,
        ),
        checks=ENV_CHECKS,
    ),
    Command(
        "grow",
        "grow",
        help="keep the atlas current: grow, watch, name the new flips, report (what the weekly workflows do)",
        description=(
            "The session habit: run it at the start of any work when a release of the six packages is newer than "
            "the newest atlas day. First resumes the growth runs an earlier growth left unfinished, then runs, for "
            "every scenario, the install days the date rule gives that the table lacks (today only where a release "
            "first uploaded after the newest day is in today's stack), then the release watch (each release since "
            "the newest day alone on its stack; one already moved onto that day is not run again), then the flips "
            "of each scenario whose newest day changed (one already named is not probed again), then the report; "
            "the phases after the growth in fresh processes. Prints each phase's progress, then what changed and "
            "each phase's time. Incremental and resumable: run again, it does only what is left. Exit 0 when every "
            "phase ended, 1 when one failed or was interrupted, 2 on bad input (COMPAT_MATRIX_TODAY=YYYY-MM-DD "
            "sets today)."
        ),
        options=(
            Option(("--profile",), default="history", help="the dated profile to grow (default history)"),
            Option(("--plan",), action="store_true", help="say what it would run, run nothing"),
            Option(("--no-watch",), action="store_true", help="leave out the release watch"),
            Option(("--no-flips",), action="store_true", help="leave out the flips of the new day pairs"),
            Option(("--no-report",), action="store_true", help="do not regenerate the table afterwards"),
            RESULTS_OPTION,
            Option(("--envs-dir",), type=Path, help="where cell environments are kept"),
            MAX_ENV_OPTION,
            TORCH_INDEX_OPTION,
        ),
        checks=ENV_CHECKS,
    ),
    Command(
        "import-run",
        "import_runs",
        help="file runs brought back from another machine under results/runs/",
        options=(
            Option(("records",), nargs="+", type=Path, help="<run-id>.records.jsonl files (meta.json beside)"),
            RESULTS_OPTION,
        ),
    ),
    Command(
        "pack",
        "pack",
        help=("compress runs' records for committing (records.jsonl -> records.jsonl.xz, about 100x smaller)"),
        description=(
            "Packs each run's records.jsonl (and any discarded-*.jsonl) with xz, byte-exact, and "
            "removes the plain file; every reader takes either form and a resumed or imported run is "
            "unpacked first. Pack before committing a run: everything tracked travels with each GPU "
            "device call (64 MiB in all). A run that a process is writing is refused (exit 2)."
        ),
        options=(
            Option(("runs",), nargs="*", help="run ids (default: every run under RESULTS_DIR, probe runs included)"),
            RESULTS_OPTION,
        ),
    ),
    Command(
        "lookup",
        "lookup",
        help="what the atlas knows about your releases: per scenario and known failure, how sure, and the way out",
        description=(
            "Asks the one judge about PACKAGE==VERSION (a version like 2.4 names every 2.4.x): per scenario, the "
            "records at exactly these releases of every package it depends on (the install days and the probes of "
            "flips, sweeps and bisects), and per known failure whether it APPLIES, APPLIES IF a condition on your "
            "model holds, is UNDECIDED (not measured here: never clean), a PITFALL of your setup, or CLEARED by it, "
            "each with how sure: exact, bracketed by the releases measured around them, or unmeasured. The way out "
            "is judged over every known failure: the release moves that end it and what each brings."
        ),
        options=(
            Option(("versions",), nargs="+", metavar="PACKAGE==VERSION"),
            Option(("--scenario",), action="append", metavar="ID", help="only these scenarios (e.g. S1)"),
            Option(
                ("--device",),
                choices=["cpu", "cuda"],
                help="where you train (default: CPU for scenarios that run on CPU)",
            ),
            Option(
                ("--gpus",),
                type=int,
                metavar="N",
                help="how many GPUs you train on (0: a CPU run): a GPU failure measured at other world sizes is "
                "UNDECIDED",
            ),
            Option(
                ("--setup",),
                action="append",
                metavar="WORDS",
                help=(
                    "your setup, in the setup vocabulary: engine (single, ddp, fsdp1, fsdp2, zero2, zero3), adapter "
                    "(lora, dora, qlora, qdora, none), loop (trainer, hand, accelerate), state_dict; e.g. --setup "
                    "fsdp2,lora"
                ),
            ),
            Option(
                ("--measure",),
                action="store_true",
                help=(
                    "where no record holds these releases: build them here on CPU over the nearest older atlas day's "
                    "stack, run the --scenario seed configs with their fixes (minutes; recorded under "
                    "results/measured/), and answer from that row"
                ),
            ),
            RESULTS_OPTION,
        ),
    ),
    Command(
        "audit",
        "audit",
        help="the known failures that apply to a lockfile and a setup (a CI gate: exit 1 when one applies)",
        description=(
            "Reads exact releases from a requirements file or pip freeze, uv.lock, pylock.toml (PEP 751), "
            "poetry.lock, a conda environment.yml, or an environment (--env: this one; --python: another), read for "
            "one machine (--platform, --python-version; default: this one), and a setup from an accelerate "
            "config YAML, a DeepSpeed JSON or --setup; asks the one judge (the tables beside results/advisories/, made "
            "with the table) about every known failure and prints each that concerns you: APPLIES, APPLIES IF (a "
            "condition on your model), RANGE, UNDECIDED (your releases were not measured: never clean; with the "
            "command that measures them), PITFALL (your setup fails on every release measured), CLEARED (your setup "
            "has the measured fix), each with how sure it is; then the one recommended set of pins, judged again over "
            "every known failure. Exit 1 when a failure applies, 0 when none does, 2 on bad input."
        ),
        options=(
            Option(
                ("files",),
                nargs="*",
                type=Path,
                metavar="FILE",
                help=(
                    "requirements.txt / pip freeze output, uv.lock, pylock.toml, poetry.lock or a conda "
                    "environment.yml (several: read together, as a pre-commit hook passes them; two releases of one "
                    "package across them is an error naming both)"
                ),
            ),
            Option(("--env",), action="store_true", help="read this interpreter's installed packages"),
            Option(("--python",), metavar="PATH", help="read another environment's packages (its interpreter)"),
            Option(
                ("--platform",),
                metavar="SYSTEM[-MACHINE]",
                help=(
                    "the machine the files are read for: linux, windows or macos, optionally with its CPU "
                    "(linux-aarch64, macos-x86_64); environment markers and a forked uv.lock or pylock.toml are "
                    "evaluated there (default: this machine)"
                ),
            ),
            Option(
                ("--python-version",),
                metavar="X.Y",
                help="the Python the files are read for (markers such as python_version < '3.12'; default: this one)",
            ),
            Option(("--accelerate-config",), type=Path, metavar="YAML", help="the file `accelerate config` wrote"),
            Option(
                ("--deepspeed-config",),
                type=Path,
                metavar="JSON",
                help="a DeepSpeed config (its ZeRO stage, stage3_gather_16bit_weights_on_model_save)",
            ),
            Option(
                ("--trainer-config",),
                type=Path,
                metavar="YAML",
                help=(
                    "the Trainer's arguments as your YAML or JSON config holds them (axolotl, LLaMA-Factory, TRL): "
                    "fsdp and fsdp_config, deepspeed (followed), gradient_checkpointing_kwargs, "
                    "gradient_accumulation_steps, average_tokens_across_devices, the adapter"
                ),
            ),
            Option(
                ("--setup",),
                action="append",
                metavar="WORDS",
                help=(
                    "how you train, in the setup vocabulary: engine (single, ddp, fsdp1, fsdp2, zero2, zero3), adapter "
                    "(lora, dora, qlora, qdora, none), loop (trainer, hand, accelerate), state_dict (full_state_dict, "
                    "sharded_state_dict), order (ckpt_then_peft, ...)"
                ),
            ),
            Option(("--device",), choices=["cpu", "cuda"], help="only advisories measured on this device"),
            Option(
                ("--gpus",),
                type=int,
                metavar="N",
                help=(
                    "how many GPUs you train on: 0 for a CPU run (what was measured on GPUs does not apply to it); "
                    "N: an advisory measured on GPUs at other world sizes only is UNDECIDED"
                ),
            ),
            Option(("--ignore-id",), action="append", metavar="ID", help="an advisory to leave out (repeatable)"),
            Option(
                ("--unrelated-ok",),
                action="store_true",
                help=(
                    "files that name none of the judged packages: one line on stderr and exit 0, not 2 (the "
                    "pre-commit hook passes it: a commit of requirements-dev.txt is no stack to judge)"
                ),
            ),
            Option(
                ("--strict",),
                action="store_true",
                help=(
                    "exit 1 also where a failure APPLIES IF a condition on your model holds (a modules_to_save head "
                    "named like peft's keys, label smoothing): a lockfile cannot show it"
                ),
            ),
            Option(
                ("--fix",),
                action="store_true",
                help=(
                    "print the one recommended set of pins as a requirements diff (of the requirements file read) "
                    "and as `uv add` / `pip install` lines"
                ),
            ),
            Option(
                ("--write",),
                action="store_true",
                help=(
                    "with --fix: write the requirements file read with the recommended pins in place (its extras, "
                    "markers, hashes, continuations, comments, local version labels, encoding and line ends kept; "
                    "what cannot be moved in place is said)"
                ),
            ),
            Option(
                ("--measure",),
                action="store_true",
                help=(
                    "with --fix: build the recommended stack here on CPU, run the seed configs (with their fixes) of "
                    "every scenario whose failure applied, record the run under results/measured/, and judge each "
                    "failure again: measured clean at these exact releases, or what still fails (minutes; a failure "
                    "that shows only on GPUs gets the command that measures it on a GPU node). Exit 0 only when "
                    "every failure that applied is measured clean or ended by the setup"
                ),
            ),
            Option(("--format",), choices=["columns", "json", "markdown"], default="columns"),
            RESULTS_OPTION,
        ),
    ),
    Command(
        "doc-outputs",
        "doc_outputs",
        help="the example outputs README and docs show, made by their commands (--write) or checked against them",
        description=(
            "Each fenced block under an `<!-- output: compat-matrix ... -->` comment in README.md and docs/ is what "
            "that command prints. Without --write: run each and say which block differs from what it prints (exit 1 "
            "where one does). With --write: write each command's output into its block."
        ),
        options=(Option(("--write",), action="store_true", help="write the outputs into the documents"),),
    ),
    Command(
        "adapters-grid",
        "adapters_grid",
        help="adapters carried across releases: S10's seed adapters saved on each atlas day, loaded on every later day",
        description=(
            "Saves S10's seed adapters (LoRA, DoRA, heads, embeddings, trainable tokens, related adapter names, "
            "module names with peft's words) in each CPU atlas day's environment, then loads every adapter saved on "
            "that day or earlier, and the day after's, in each day's own environment, judged there against the "
            "formula model of the saved file (float64). Writes results/adapter-grid/<run>/ (saves.jsonl, "
            "pairs.jsonl, meta.json); the report draws a grid per feature (saved on x loaded on) and names its "
            "flips. Builds missing environments."
        ),
        options=(
            Option(("--profile",), default="history", help="the atlas whose days are the grid's (default: history)"),
            Option(("--from",), dest="start", metavar="DAY", help="first day (YYYY-MM-DD)"),
            Option(("--to",), dest="end", metavar="DAY", help="last day (YYYY-MM-DD)"),
            Option(("--feature",), action="append", metavar="CONFIG_ID", help="only this config (repeatable)"),
            Option(
                ("--drawn",),
                action="append",
                metavar="RUN",
                help=(
                    "a dated S10 run (repeatable: read together as the table reads them): its drawn configs that "
                    "fail on some day join the seed configs"
                ),
            ),
            Option(("--resume",), metavar="RUN", help="continue a run: every save and load it holds is kept"),
            Option(
                ("--sweep",),
                metavar="RUN",
                help=(
                    "name each flip of RUN at release resolution: move each package that differs between the flip's "
                    "two days alone, then sweep the releases of the one that reproduces it (writes sweep.json; its "
                    "probes are kept and reused)"
                ),
            ),
            RESULTS_OPTION,
        ),
    ),
    Command(
        "lock",
        "lock",
        help=("write a dated GPU profile's era lock (matrix/locks/NAME.json) for an air-gapped node"),
        description=(
            "For each day of the profile's date axis: resolve the stack as the index had it that day "
            "over the node's own torch (a stub of its version that requires nothing), and plan what the "
            "node must get on top of its own packages (matrix/nodes/<node_image>.json): the era "
            "packages at their day's versions, and any other resolved package the node lacks or holds "
            "in a version that does not meet their requirements. A day that does not resolve is kept "
            "with uv's reason. Needs the index; the node reads the lock."
        ),
        options=(
            Option(("--profile",), required=True),
            Option(("--day",), action="append", metavar="YYYY-MM-DD", help="only these days (repeatable)"),
        ),
    ),
    Command(
        "bisect",
        "bisect",
        help="find the first release of a package where a scenario's outcome flips",
        description=(
            "Holds every other pin of a base cell fixed and bisects one package's releases (from the "
            "index pip is configured for, or the wheelhouse with --offline). Each probe is a real "
            "one-cell run of the scenario's explicit configs under one variant; n releases take at most "
            "ceil(log2 n) + 1 cell runs. Writes results/bisect/<id>/verdict.json with every probe's "
            "evidence."
        ),
        options=(
            Option(("--package",), required=True, help="the package to bisect, e.g. deepspeed"),
            Option(("--scenario",), required=True, help="scenario id or prefix, e.g. S4"),
            Option(("--variant",), default="baseline"),
            Option(("--profile",), default="cpu", help="profile whose base cell holds the other pins (default cpu)"),
            Option(("--cell",), metavar="GLOB", help="base cell of that profile (default: its first cell)"),
            Option(("--good",), metavar="VERSION", help="one end of the range (default: the newest release)"),
            Option(("--bad",), metavar="VERSION", help="the other end (default: the oldest the profile pins)"),
            Option(("--signature",), help="count only failures with this signature as failing"),
            RESULTS_OPTION,
            OFFLINE_OPTION,
            WHEELHOUSE_OPTION,
        ),
    ),
    Command(
        "bisect-script",
        "bisect_script",
        help=("run your own script across the atlas's dated stacks and name the release where it breaks or heals"),
        description=(
            "Runs SCRIPT (a plain Python file or a PEP 723 script; it fails by a non-zero exit or an "
            "exception, exit 77 means 'not applicable here') in every install day of the atlas (the "
            "history profile's dated stacks: the same environments the atlas ran in), or between two "
            "ends of your own. Each run is the failure asked about (the bad end's signature, or "
            "--match), a pass, a different failure (reported, never taken for it) or unusable. Between "
            "neighbouring days whose outcome differs, it moves one package at a time from the older "
            "day's release to the newer one's (the failing traceback's packages first), then bisects "
            "that package's releases. Writes results/script-bisect/<name>/verdict.json, runs.jsonl "
            "(every run, reused by the next invocation) and issue.md (an upstream issue body). With --device "
            "cuda the stacks are the GPU atlas's days over a node's own torch, and the runs happen on the node in "
            "rounds: each invocation imports the last round (--node-runs), then writes the verdict or plans the "
            "next round and prints the node's command (scripts/gpu-script-bisect.sh). Exit 0 with a verdict or a "
            "planned round, 2 on bad input."
        ),
        options=(
            Option(("script",), type=Path, help="the script to run"),
            Option(("--nproc",), type=int, default=1, help="ranks: >1 starts it under torchrun (default 1)"),
            TORCHRUN_OPTION,
            Option(("--from",), dest="from_day", metavar="YYYY-MM-DD", help="scan only atlas days from this one"),
            Option(("--to",), dest="to_day", metavar="YYYY-MM-DD", help="scan only atlas days up to this one"),
            Option(
                ("--good",),
                metavar="SPEC",
                help="an end where it passes: a day, or exact pins 'peft==0.13.2,torch==2.4.1'",
            ),
            Option(("--bad",), metavar="SPEC", help="an end where it fails with the failure asked about (as --good)"),
            Option(("--match",), metavar="REGEX", help="the failure asked about: runs whose error text matches"),
            Option(("--timeout",), type=float, default=600.0, help="seconds per run; then every rank's stack (600)"),
            Option(("--name",), help="the verdict's folder under results/script-bisect/ (default: the script's stem)"),
            Option(
                ("--all-moves",),
                action="store_true",
                help=("move every changed package (not only until one flips, and past the bound of 10 moves)"),
            ),
            Option(("--fresh",), action="store_true", help="ignore the runs an earlier invocation recorded"),
            Option(
                ("--blame",),
                action="store_true",
                help=(
                    "then blame the named release (CPU, a pure Python package): run the script traced at it and at "
                    "the release before, put the changed functions both ran back until the smallest set that gives "
                    "the other outcome is left (blame.json, changed.json; the issue body shows it)"
                ),
            ),
            Option(
                ("--bisect",),
                action="store_true",
                help=(
                    "name a flip's release by a binary search (one change assumed) instead of the default sweep "
                    "(every release where 8 or fewer, else the first and last patch of each minor, then each gap "
                    "whose ends differ: every change between the two stacks, in order)"
                ),
            ),
            Option(
                ("--device",),
                choices=("cpu", "cuda"),
                default="cpu",
                help=(
                    "cpu: run here (default). cuda: plan the runs for a GPU node over the GPU atlas's days "
                    "(--profile), in rounds: each invocation imports the last call's runs (--node-runs), then "
                    "writes the verdict or the next round's plan and wheel pack, and prints the node's command"
                ),
            ),
            Option(
                ("--profile",),
                default="gpu-history-ws2",
                help="--device cuda: the era-locked GPU profile whose days are scanned (default gpu-history-ws2)",
            ),
            Option(
                ("--node-runs",),
                type=Path,
                metavar="DIR",
                help="--device cuda: the folder a node call wrote ($OUT/<name>: runs.jsonl, call.json) to import",
            ),
            Option(
                ("--pack",),
                type=Path,
                metavar="FILE.tar.xz",
                help="--device cuda: where the round's wheels go (default .gpu-pack/<name>-round<N>.tar.xz)",
            ),
            RESULTS_OPTION,
            OFFLINE_OPTION.but(help="install only from --wheelhouse (air-gapped nodes)"),
            WHEELHOUSE_OPTION,
            MAX_ENV_OPTION,
            TORCH_INDEX_OPTION,
        ),
        checks=ENV_CHECKS,
    ),
    Command(
        "blame-script",
        "blame_script",
        help="put back the changed code of a bisect-script verdict's named release, to name the function",
        description=(
            "For a CPU verdict folder (results/script-bisect/<name>) whose flip names a release of a pure Python "
            "package: runs the script traced at that release and at the last one before it (each over the flip's "
            "older stack, as its moves ran), takes the functions both runs executed whose source differs, and "
            "puts them back at the named release (delta debugging) down to the smallest set that gives the "
            "release before's outcome; then the other way. Writes blame.json and changed.json beside the "
            "verdict and issue.md again. Where the runs do not flip here or the package holds native code, it "
            "says so and blames nothing. Exit 0 with a blame (or its reason for none), 2 on bad input."
        ),
        options=(
            Option(("folder",), type=Path, metavar="FOLDER", help="the verdict folder (results/script-bisect/<name>)"),
        ),
    ),
    Command(
        "bisect-script-pack",
        "bisect_script_pack",
        help="pack the planned rounds of several bisect-script --device cuda folders for one device call",
        description=(
            "Writes one solid wheel pack holding the wheels of the round each FOLDER planned last "
            "(results/script-bisect/<name>, planned by bisect-script --device cuda): one device call then runs "
            "them all, scripts/gpu-script-bisect.sh once per folder with the same pack. Refused (exit 2) if the "
            "pack and the tree do not fit the 64 MiB a call carries."
        ),
        options=(
            Option(("pack",), type=Path, metavar="FILE.tar.xz", help="the pack to write"),
            Option(("folders",), type=Path, nargs="+", metavar="FOLDER", help="verdict folders with a planned round"),
        ),
    ),
    Command(
        "bisect-script-node",
        "bisect_script_node",
        help="on a GPU node: run a bisect-script round that `bisect-script --device cuda` planned",
        description=(
            "Reads FOLDER/node-plan.json (results/script-bisect/<name>, planned on a connected machine), installs "
            "each planned stack's wheels from --wheels (the round's pack) as an overlay over this python, and runs "
            "the same search as the planner: scan, moves, bisect, as far as the plan and --time-limit allow. "
            "Writes OUT/<name>/runs.jsonl and call.json; bring that folder back and pass it to "
            "`bisect-script --device cuda --node-runs`. scripts/gpu-script-bisect.sh wraps it."
        ),
        options=(
            Option(("folder",), type=Path, help="the verdict folder holding node-plan.json"),
            Option(("--wheels",), type=Path, required=True, metavar="PACK", help="the round's pack or wheel folder"),
            Option(("--out",), type=Path, required=True, metavar="DIR", help="where the runs go ($OUT)"),
            Option(("--python",), help="the node's interpreter, whose torch the runs use (default python3)"),
            Option(("--time-limit",), type=float, default=540.0, help="seconds this call may run (540)"),
        ),
    ),
    Command(
        "run-script",
        "run_script",
        help=("run a script once, here, the way bisect-script does, and write what happened as JSON"),
        description=(
            "Runs SCRIPT once with this python (or --python), under torchrun for --nproc > 1 or "
            "--torchrun, with a timeout after which every rank's Python stacks are taken. Prints the "
            "outcome and signature; --json FILE writes the run (outcome, signature, error, traceback, "
            "rank stacks, versions). How a GPU node runs a user's script at several world sizes in one "
            "call: scripts/gpu-script-run.sh."
        ),
        options=(
            Option(("script",), type=Path),
            Option(("--nproc",), type=int, default=1),
            TORCHRUN_OPTION,
            Option(("--timeout",), type=float, default=600.0),
            Option(("--python",), type=Path, default=Path(sys.executable), help="the interpreter (default: this one)"),
            Option(("--pythonpath",), help="an overlay directory to put first on PYTHONPATH"),
            Option(("--json",), type=Path, metavar="FILE", help="write the run here"),
        ),
    ),
    Command(
        "flips",
        "flips",
        help=("name every flip of a dated run: which package, then which release, changed a target outcome"),
        description=(
            "For each scenario and each pair of neighbouring dates of a dated run (the history profile) "
            "where the target outcome changes, moves each changed package alone from the older date's "
            "release to the newer one's (the rest held) in a real one-cell run, then bisects the "
            "package whose move reproduces the change. Writes results/flips/<run-id>/flips.json and "
            "every probe's records."
        ),
        options=(
            Option(
                ("--run",),
                action="append",
                dest="runs",
                required=True,
                metavar="RUN_ID",
                help=(
                    "a dated run under results/runs/; repeatable: runs of one profile read together, the newest "
                    "record per key as in the table (a GPU profile's days measured in several device calls, or a "
                    "later CPU run that measured some configs again), the flips filed under the first run named"
                ),
            ),
            Option(("--profile",), default="history", help="the runs' profile (default history)"),
            Option(("--scenario",), action="append", metavar="ID", help="only these scenarios (repeatable)"),
            Option(
                ("--again",),
                action="store_true",
                help=("probe flips an earlier invocation named too (default: those are kept from flips.json)"),
            ),
            Option(("--from",), dest="from_day", metavar="YYYY-MM-DD", help="only day pairs from this day on"),
            Option(("--to",), dest="to_day", metavar="YYYY-MM-DD", help="only day pairs up to this day"),
            Option(
                ("--windows",),
                action="store_true",
                help=(
                    "also sweep day pairs whose outcome agrees, over the packages the scenario's upstream record or "
                    "its earlier flips name: a fix and the break after it inside one interval (each sweep prints its "
                    "bound in runs before it starts)"
                ),
            ),
            Option(
                ("--bisect",),
                action="store_true",
                help=(
                    "name a flip's release by a binary search (one change assumed) instead of the default sweep of "
                    "every release that can change it (all where 8 or fewer, else the first and last patch of each "
                    "minor, then each gap whose ends differ)"
                ),
            ),
            RESULTS_OPTION,
            MAX_ENV_OPTION,
            TORCH_INDEX_OPTION,
        ),
        checks=ENV_CHECKS,
    ),
    Command(
        "check-repros",
        "check_repros",
        help=("run reproducers with `uv run` and check they still reproduce (and their fixes still pass)"),
        description=(
            "Runs results/repros/<id>.py files listed in index.json, each in a fresh uv environment "
            "built from its PEP 723 pins, and compares the signature with the recorded one; with "
            "--fixes also runs one passing fix variant per reproducer and expects it to pass. Exit 1 if "
            "any check disagrees."
        ),
        options=(
            RESULTS_OPTION,
            Option(("--match",), action="append", metavar="GLOB", help="only reproducer files matching (repeatable)"),
            Option(("--limit",), type=int, default=0, help="at most this many reproducers (0: all)"),
            Option(("--fixes",), action="store_true", help="also run the first passing fix variant of each"),
        ),
    ),
    Command(
        "slurm",
        "slurm",
        help=("run a profile as a Slurm job array (one shard per task) plus a merge-and-report job"),
        description=(
            "Submits `sbatch --array=1-N`: array task I runs `matrix --shard I/N --no-report` (every "
            "N-th cell), and a report job that starts when the whole array has ended "
            "(`--dependency=afterany`) merges the shards' runs into one table (`report`). The checkout, "
            "this Python, --results-dir and the environments directory must be on a filesystem every "
            "node shares. Job scripts and logs go to <results-dir>/slurm/<time>/."
        ),
        options=(
            Option(("--profile",), required=True, help="profile name in matrix/ or a path to a .toml"),
            Option(("--tasks",), type=int, required=True, help="array size: the profile's cells split this many ways"),
            RESULTS_OPTION,
            Option(
                ("--sbatch-arg",),
                action="append",
                default=[],
                metavar="ARG",
                help=("passed to both sbatch calls, e.g. --sbatch-arg=--partition=gpu --sbatch-arg=--gres=gpu:4"),
            ),
            Option(("--wait",), action="store_true", help="block until the report job has ended; exit with its status"),
            Option(("matrix_args",), nargs="*", metavar="-- MATRIX_ARGS", help="more `matrix` options for every task"),
        ),
    ),
    Command(
        "check",
        "check",
        help=("check the environment you are in: which failure modes it has and which fixes work here"),
        description=(
            "Runs inside your own training environment (no new environment, your torch and GPUs): the "
            "seed configs of every scenario this environment can run (the baseline of each, then every "
            "variant where the target failure showed), through the same workers as the matrix. Prints, "
            "per scenario, whether its target failure reproduces, which fixes remove it here, other "
            "failures, and the nearest rows of the published table. Exit 1 when a target failure "
            "reproduces (to gate a CI job), 0 when none does, 2 on bad input. Needs hypothesis and "
            "packaging in the environment."
        ),
        options=(
            Option(("--scenario",), action="append", dest="scenarios", metavar="ID_OR_GLOB", help="only these"),
            RESULTS_OPTION.but(help="the published runs to compare with"),
        ),
    ),
    Command(
        "findings",
        "findings",
        help="findings for maintainers: list them, print one's issue body, or verify its reproducer",
        description=(
            "Failures the atlas found that no upstream record names, each in results/findings/<id>/: a "
            "standalone reproducer (PEP 723 pins, no harness import), the first bad and last good release, the "
            "code that changed, and an issue body. Without ID: one line per finding (verified or not, still seen "
            "by the atlas or not). With ID: its issue body. With --verify: run the reproducer with `uv run` at the "
            "bad release and, moving only that package's pin, at the good one, each traced for the package's "
            "functions; record both runs (runs.jsonl) and the functions both executed whose source differs "
            "between the releases (changed.json). `nox -s report` writes results/FINDINGS.md from them."
        ),
        options=(
            Option(("finding",), nargs="?", default=None, metavar="ID", help="a finding's folder name"),
            Option(("--verify",), action="store_true", help="run and trace the reproducer at both releases"),
            Option(
                ("--blame",),
                action="store_true",
                help=(
                    "with --verify: put the changed functions back to the good release's source at the bad release "
                    "and shrink them (ddmin) to the smallest set that gives the good outcome; blame.json"
                ),
            ),
            Option(
                ("--node-wheels",),
                type=Path,
                metavar="DIR",
                help=(
                    "on an air-gapped GPU node (a finding whose reproducer needs GPUs): run the reproducer with this "
                    "interpreter, the package moved to each release from the wheels in DIR (a --target overlay over "
                    "the node's own stack, no uv, no network), instead of `uv run`"
                ),
            ),
            RESULTS_OPTION,
        ),
    ),
    Command(
        "upstream-report",
        "upstream_report",
        help="print a ready-to-file upstream issue body for a reproducer",
        description=(
            "Prints, for one reproducer of results/repros/, an issue body in the shape the upstream bug "
            "templates ask for: the environment (versions, hardware), the PEP 723 reproducer, expected "
            "and actual behaviour, the traceback, the fixes that passed, and the first flipping release "
            "where a bisect found one."
        ),
        options=(
            Option(
                ("reproducer",),
                help=(
                    "a file name from results/repros/index.json (or its path or id), or a bisect-script verdict "
                    "folder (results/script-bisect/<name>)"
                ),
            ),
            RESULTS_OPTION,
        ),
    ),
    Command(
        "list",
        "list_things",
        help="show profiles, scenarios, or a profile's cells",
        options=(
            Option(("what",), choices=["profiles", "scenarios", "cells"]),
            Option(("--profile",), default=None),
            Option(("--json",), action="store_true", help="machine-readable output"),
            Option(("--reduce",), choices=["none", "pairwise"], help="cells after this reduction"),
        ),
    ),
)

BY_NAME = {c.name: c for c in COMMANDS}


def flag_of(dest: str) -> str | None:
    """The flag that sets a setting (an option's dest), as lower floors' `OptionError`s name it."""
    for command in COMMANDS:
        for option in command.options:
            if option.dest == dest:
                return option.flags[0]
    return None
