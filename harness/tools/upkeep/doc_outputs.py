"""The example outputs the README and docs show, made by the commands themselves.

A fenced block right under an `<!-- output: COMMAND -->` comment is what COMMAND prints (run from the checkout's root
as `python3 -m harness ...`, its exit code said in the comment where it is not 0). `python3 -m harness doc-outputs
--write` runs each and writes its output in; `tests/test_doc_outputs.py` runs each and compares, so an example never
drifts from what the command prints (the README's `lookup` once showed one scenario where the command printed two).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.paths import REPO_ROOT

#: Where example outputs are kept.
DOCUMENTS = ("README.md", "docs/*.md")
_BLOCK = re.compile(r"<!-- output: (?P<command>.+?)(?: \(exit (?P<code>\d+)\))? -->\n```text\n(?P<body>.*?)```\n", re.S)
#: How long one documented command may take (they read the committed tables; none builds anything).
TIMEOUT_S = 300


@dataclass(frozen=True)
class Example:
    """One documented output: where it is, the command, the exit code it shows and the text it shows."""

    path: Path
    command: str
    code: int
    shown: str


def examples(paths: list[Path] | None = None) -> list[Example]:
    found = []
    for path in paths or [p for pattern in DOCUMENTS for p in sorted(REPO_ROOT.glob(pattern))]:
        for match in _BLOCK.finditer(path.read_text()):
            found.append(Example(path, match["command"], int(match["code"] or 0), match["body"]))
    return found


def run(command: str) -> tuple[int, str]:
    """(exit code, stdout) of a documented `compat-matrix ...` command, run from the checkout's root; a trailing
    `| head -n N` or `| tail -n N` keeps its first or last N lines (the exit code stays the command's)."""
    pipe = re.search(r" \| (head|tail) -n (\d+)$", command)
    code, out = _run(command[: pipe.start()] if pipe else command)
    if pipe:
        lines, n = out.splitlines(keepends=True), int(pipe[2])
        out = "".join(lines[:n] if pipe[1] == "head" else lines[-n:])
    return code, out


def _run(command: str) -> tuple[int, str]:
    words = shlex.split(command)
    if not words or words[0] != "compat-matrix":
        raise UsageError(f"{command!r}: a documented output must come from a `compat-matrix ...` command")
    done = subprocess.run([sys.executable, "-m", "harness", *words[1:]], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=TIMEOUT_S)  # fmt: skip
    return done.returncode, done.stdout


def write(paths: list[Path] | None = None, say: object = print) -> int:
    """Run every documented command and write its output (and exit code) into its block; returns how many changed."""
    changed = 0
    for path in paths or [p for pattern in DOCUMENTS for p in sorted(REPO_ROOT.glob(pattern))]:
        text = path.read_text()

        def fresh(match: re.Match[str]) -> str:
            code, out = run(match["command"])
            exit_words = f" (exit {code})" if code else ""
            return f"<!-- output: {match['command']}{exit_words} -->\n```text\n{out}```\n"

        new = _BLOCK.sub(fresh, text)
        if new != text:
            path.write_text(new)
            changed += 1
            say(f"wrote {path.relative_to(REPO_ROOT)}")  # type: ignore[operator]
    return changed
