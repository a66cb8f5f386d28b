"""Command line of the harness: `compat-matrix COMMAND` (installed) or `python -m harness COMMAND`.

nox sessions call this; nodes without nox, uv or an install of the project (an air-gapped GPU node) call
`python -m harness` from the checkout. The commands and their options are data (`harness/cli_options.py`), what
each does is `harness/cli_commands.py`; this file builds the parser, handles signals and words errors.
"""

from __future__ import annotations

import argparse
import sys

from harness import cli_commands
from harness.cli_options import BY_NAME, COMMANDS, first_problem, flag_of
from harness.errors import OptionError, Terminated, UsageError
from harness.textsafe import one_line

#: An error is one line of at most this many characters (a reader quotes less of the user's text than this).
ERROR_LINE = 1000

#: Commands with parsers of their own: name -> (module with main(argv), help line).
DELEGATED = {
    "bench": ("harness.tools.upkeep.bench", "benchmarks, side by side in one run, printed as a table"),
    "wheelhouse": (
        "harness.environments.wheelhouse",
        "download/build every wheel a profile needs, for an air-gapped node",
    ),
}


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
    for command in COMMANDS:
        described = {"description": command.description} if command.description is not None else {}
        one = sub.add_parser(command.name, help=command.help, **described)
        for option in command.options:
            one.add_argument(*option.flags, help=option.help, **option.settings)
    return parser


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    import importlib
    import signal

    argv = sys.argv[1:] if argv is None else argv
    # Ctrl-C and SIGINT stop every command cleanly, whatever disposition it inherited: a shell without job control
    # starts background jobs (`nohup ... &`, job scripts) with SIGINT ignored, and Python then installs no handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if argv and argv[0] in DELEGATED:
            return int(importlib.import_module(DELEGATED[argv[0]][0]).main(argv[1:]))
        args = build_parser().parse_args(argv)
        command = BY_NAME[args.command]
        problem = first_problem(command, args)
        if problem:
            raise UsageError(problem)
        return int(getattr(cli_commands, command.handler)(args))
    except OptionError as exc:  # raised below the CLI, naming settings: worded here as their flags
        print(f"error: {one_line(exc.worded(flag_of), ERROR_LINE)}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"error: {one_line(exc, ERROR_LINE)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `audit ... | head`: the reader went away; no traceback, the shell's own code for it
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt as exc:
        print("interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
