"""Every command the README, docs/, the scripts' headers and the profiles' comments show is taken as written: its
flags parsed by the real parser of the command it names (the harness, a delegated command, the nox session it
forwards to), its profile and files looked up. A renamed flag then fails here, not for a user (the documented
`--cells` of gpu-node-run.sh once made the harness exit 2, and the script went on to copy files that did not exist).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from harness.cli import DELEGATED, build_parser
from harness.paths import REPO_ROOT

#: Where commands are documented: markdown code (fenced or inline), and the comment lines of scripts and profiles.
SOURCES = ("README.md", "docs/*.md", "scripts/*.sh", "matrix/*.toml")
_START = re.compile(
    r"((?:[A-Z_]+=\S+\s+)*(?:python3? -m harness|compat-matrix|scripts/gpu-[a-z-]+\.sh|(?:python3 -m )?nox -s)\s[^`|]*)"
)
#: Placeholders documented commands use, as a value the parser takes.
_PLACEHOLDERS = {r"<[^>]+>": "PLACEHOLDER", r'"\$OUT"': "OUT", r"\$OUT": "OUT"}


def documented() -> list[tuple[str, str]]:
    """(where, command) for every command line shown in a code span, a fenced block or a script/profile comment."""
    found: list[tuple[str, str]] = []
    for pattern in SOURCES:
        for path in sorted(REPO_ROOT.glob(pattern)):
            text = path.read_text()
            spans = _code_of(text) if path.suffix == ".md" else _comments_of(text)
            for number, span in spans:
                for match in _START.finditer(span):
                    for command in match.group(1).split("&&"):
                        command = _clean(command)
                        if command:
                            found.append((f"{path.relative_to(REPO_ROOT)}:{number}", command))
    return found


def _code_of(text: str) -> list[tuple[int, str]]:
    spans, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            spans.append((number, line))
        else:
            spans += [(number, code) for code in re.findall(r"`([^`]+)`", line)]
    return spans


def _comments_of(text: str) -> list[tuple[int, str]]:
    return [(n, line.lstrip("# ")) for n, line in enumerate(text.splitlines(), 1) if line.lstrip().startswith("#")]


def _clean(command: str) -> str | None:
    """The command as a user would type it: no trailing comment or continuation; None for usage lines and prose."""
    command = command.split("  #")[0].split(" # ")[0].split("; ")[0].strip().rstrip("\\").strip().rstrip(";,.)")
    if "[" in command.split(" -- ")[0] and ("PROFILE" in command or "SCRIPT" in command or "..." in command):
        return None  # a usage synopsis (`script PROFILE WHEELS OUTDIR [extra ...]`)
    for pattern, value in _PLACEHOLDERS.items():
        command = re.sub(pattern, value, command)
    # An elided value ("--date 2024-02-29 --date ... --scenario S3") stands for one more value; elided arguments
    # ("gpu-node-run.sh ...") for none.
    command = re.sub(r"(--[\w-]+)\s+\.\.\.(?=\s|$)", r"\1 PLACEHOLDER", command)
    command = re.sub(r"\s\.\.\.(?=\s|$)", "", command)
    command = re.sub(r"\[(--[^\]]+)\]", r"\1", command)  # optional flags shown in brackets
    words = command.split()
    if len(words) < 2 or words[-1] in ("command", "commands") or "(" in command:
        return None  # prose that names the command ("the compat-matrix command and its ...")
    return command


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    return words


def _parse(parser, argv: list[str], command: str) -> None:
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code not in (0, None):
                pytest.fail(f"{command!r}: the parser refuses it: {err.getvalue().strip().splitlines()[-1:]}")


def _subcommands() -> set[str]:
    import argparse

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {name for action in actions for name in action.choices} | set(DELEGATED)


def _harness(argv: list[str], command: str) -> None:
    if len(argv) == 1 and not argv[0].startswith(
        "-"
    ):  # named in prose ("`compat-matrix lookup` answers ..."): it exists
        assert argv[0] in _subcommands(), f"{command!r}: no subcommand {argv[0]}"
        return
    if argv and argv[0] in DELEGATED:
        import importlib

        module = importlib.import_module(DELEGATED[argv[0]][0])
        _parse(module.build_parser(), argv[1:], command)
        return
    _parse(build_parser(), argv, command)
    if "--profile" in argv:
        profile = argv[argv.index("--profile") + 1]
        placeholder = profile == "PLACEHOLDER" or profile.isupper()  # "--profile P", "--profile NAME"
        assert placeholder or (REPO_ROOT / "matrix" / f"{profile}.toml").is_file(), command


NOX_TO_HARNESS = {"matrix": ["matrix"], "report": ["report"], "list": ["list"], "bisect": ["bisect"]}


def _check(command: str) -> None:
    argv = _argv(command)
    if argv[:3] in (["python", "-m", "harness"], ["python3", "-m", "harness"]):
        _harness(argv[3:], command)
    elif argv[0] == "compat-matrix":
        _harness(argv[1:], command)
    elif "nox" in argv:
        nox_args = argv[argv.index("-s") + 1 :]
        sessions, _, posargs = " ".join(nox_args).partition(" -- ")
        noxfile = (REPO_ROOT / "noxfile.py").read_text()
        for session in sessions.split():
            assert f"def {session}(" in noxfile or f'name="{session}"' in noxfile, f"{command!r}: no session {session}"
        session = sessions.split()[0]
        if posargs:
            forwarded = NOX_TO_HARNESS.get(session, [session])
            _harness([*forwarded, *shlex.split(posargs)], command)
    elif argv[0].endswith("gpu-node-run.sh"):
        if len(argv) < 4:
            return  # named, its arguments elided ("COMPAT_MATRIX_RUN=<run-id> scripts/gpu-node-run.sh ...")
        profile, extra = argv[1], argv[4:]
        assert (REPO_ROOT / "matrix" / f"{profile}.toml").is_file(), f"{command!r}: no profile {profile}"
        node = ["matrix", "--profile", profile, "--offline", "--wheelhouse", "W", "--system-torch", "python3"]
        _harness([*node, "--results-dir", "R", "--envs-dir", "E", "--no-report", *extra], command)
    elif argv[0].endswith("gpu-script-run.sh"):
        assert (REPO_ROOT / argv[1]).is_file(), f"{command!r}: no script {argv[1]}"
        assert all(n.isdigit() for n in argv[4:]) and argv[4:], f"{command!r}: world sizes must be numbers"
    elif argv[0].endswith("gpu-node-slots.sh"):
        assert "--" in argv, f"{command!r}: DEADLINE OUT NAME=PACK... -- SLOTFILE..."
        packs, slots = argv[3 : argv.index("--")], argv[argv.index("--") + 1 :]
        assert packs and all("=" in pack for pack in packs), f"{command!r}: each pack as NAME=PACK"
        assert slots, f"{command!r}: no slot file"
    elif argv[0].endswith("gpu-script-bisect.sh"):
        assert len(argv) == 4, f"{command!r}: FOLDER PACK OUT"
        _harness(["bisect-script-node", argv[1], "--wheels", argv[2], "--out", argv[3]], command)
    else:
        pytest.fail(f"{command!r}: no rule for this command")


def test_the_extractor_finds_the_documented_commands() -> None:
    commands = [c for _, c in documented()]
    assert len(commands) > 40
    assert any(c.startswith("python3 -m nox -s lint tests") for c in commands)
    assert any("gpu-node-run.sh gpu-history " in c for c in commands)


@pytest.mark.parametrize(("where", "command"), documented(), ids=lambda value: value[:60])
def test_documented_command_parses_as_written(where: str, command: str) -> None:
    _check(command)


def test_the_node_scripts_stop_at_their_first_error_with_one_line(tmp_path: Path) -> None:
    import subprocess

    for script, args in (
        ("scripts/gpu-node-run.sh", ["no-such-profile", str(tmp_path), str(tmp_path / "out")]),
        ("scripts/gpu-node-run.sh", ["gpu-history", str(tmp_path / "no-wheels"), str(tmp_path / "out")]),
        ("scripts/gpu-script-run.sh", ["no-such-script.py", str(tmp_path), str(tmp_path / "out"), "1"]),
        ("scripts/gpu-script-bisect.sh", [str(tmp_path), str(tmp_path / "pack.tar.xz"), str(tmp_path / "out")]),
    ):
        done = subprocess.run(["bash", script, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (script, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(Path(script).name + ":"), (script, done.stderr)


#: Documented commands that need no GPU and take seconds: run for real, as written (`python -m harness` for
#: `compat-matrix`), each with what its output must say.
QUICK = {
    "compat-matrix findings": "peft-0.21.0-fsdp1-full-state-dict-empty-adapter",
    "compat-matrix findings peft-0.21.0-fsdp1-full-state-dict-empty-adapter": "### The code that changed",
    "compat-matrix upstream-report results/script-bisect/peft-1583-prepare-int8": "since peft 0.10.0",
    "compat-matrix --help": "bisect-script",
}


@pytest.mark.parametrize("command", sorted(QUICK))
def test_quick_documented_commands_run_as_written(command: str) -> None:
    import subprocess
    import sys

    shown = {c for _, c in documented()}
    assert command in shown, f"{command!r} is no longer documented: update QUICK"
    argv = [sys.executable, "-m", "harness", *shlex.split(command)[1:]]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert QUICK[command] in proc.stdout


def test_the_documented_torch_window_scans_both_days_on_a_fresh_clone() -> None:
    """`bisect-script ... --from 2024-09-26 --to 2024-12-07` (docs/bring-your-own-failure.md) scans those two atlas
    days: the atlas is every day the committed history runs resolved, not the newest run's re-check of two days."""
    from harness.define.profile import load_profile
    from harness.paths import MATRIX_DIR, RESULTS_DIR
    from harness.tools.script_verdicts.script_bisect import atlas_days

    command = next(c for _, c in documented() if "zero3_lora_checkpoint.py" in c and "--from 2024-09-26" in c)
    assert "--to 2024-12-07" in command
    days = atlas_days(RESULTS_DIR, load_profile("history", MATRIX_DIR))
    assert [d for d in days if "2024-09-26" <= d <= "2024-12-07"] == ["2024-09-26", "2024-12-07"]
    # Every day of the atlas, the grown ones too (2026-11-27 for every scenario), never the re-checks' few.
    assert days[0] == "2024-02-29" and {"2026-11-24", "2026-11-27"} <= set(days) and len(days) >= 15


@pytest.mark.matrix
def test_the_documented_scenario_slice_runs_as_written(tmp_path: Path) -> None:
    """`compat-matrix matrix --profile ci --scenario S6` (docs/scenario-contract.md's worked example), for real, into
    a results folder of its own: the seed config shows the target and its fix passes, in the CI profile's cells."""
    import json
    import subprocess
    import sys

    command = "compat-matrix matrix --profile ci --scenario S6"
    assert command in {c for _, c in documented()}
    argv = [sys.executable, "-m", "harness", *shlex.split(command)[1:], "--results-dir", str(tmp_path), "--no-report"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [records] = list(tmp_path.glob("runs/*/records.jsonl"))
    found = [json.loads(line) for line in records.read_text().splitlines()]
    assert {(r["variant"], r["outcome"]) for r in found} >= {("baseline", "fail"), ("strip_orig_mod_prefix", "pass")}
