"""Record text is data. Hypothesis feeds arbitrary text (newlines, quotes, backslashes, `|`, HTML, control
characters, lone surrogates) into every record field that the reproducer and Markdown writers use. Every
reproducer must parse, keep exactly the template's top-level statements and a PEP 723 block of plain pins;
every Markdown table row must keep its number of cells and carry no raw HTML from a record.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.define.registry import discover
from harness.knowledge.selection import Selection
from harness.publishing.report import render_markdown
from harness.publishing.repro import render, repro_id, sync_repros

TEXT = st.text(max_size=40)
PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.!+_-]*$")
SCENARIO = next(s for s in discover() if s.id.startswith("S3-"))


def record(text: dict[str, str]) -> dict[str, Any]:
    return {
        "run_id": text["run_id"],
        "cell": text["cell"],
        "scenario": SCENARIO.id,
        "variant": text["variant"],
        "config": {text["key"]: text["value"], "r": 8},
        "config_id": "0123456789",
        "outcome": "fail",
        "signature": text["signature"],
        "message": text["message"],
        "versions": {text["key"]: text["value"], "torch": text["version"], "python": text["python"]},
        "hardware": {"device": text["device"], "gpu_name": None, "gpu_count": 0, "world_size": 1},
        "install": {"mode": text["mode"]},
        "metrics": {},
        "known_issue": [],
        "duration_s": 0.0,
        "started_at": "2026-11-24T00:00:00+00:00",
    }


FIELDS = ("run_id", "cell", "variant", "key", "value", "signature", "message", "version", "python", "device", "mode")
RECORD_TEXT = st.fixed_dictionaries({name: TEXT for name in FIELDS})
BENIGN = record({name: "x" for name in FIELDS} | {"python": "3.11", "version": "2.13.0", "device": "cpu"})


def top_level(source: str) -> list[str]:
    """The shape of a module: each top-level statement's kind and the names it binds."""
    shape = []
    for node in ast.parse(source).body:
        names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        names += [node.name] if hasattr(node, "name") else []
        shape.append(f"{type(node).__name__}:{','.join(names)}")
    return shape


REFERENCE_SHAPE = top_level(render(BENIGN, SCENARIO, ["fix"], "3.11"))


@settings(max_examples=150, deadline=None)
@given(RECORD_TEXT, st.lists(TEXT, max_size=3))
def test_reproducer_parses_and_record_text_never_becomes_code(text: dict[str, str], fixes: list[str]) -> None:
    failure = record(text)
    source = render(failure, SCENARIO, fixes, "3.11")
    source.encode("utf-8")  # writable as a file
    assert top_level(source) == REFERENCE_SHAPE
    header = source.split("# /// script\n", 1)[1].split("# ///\n", 1)[0]
    metadata = tomllib.loads("\n".join(line.removeprefix("#").removeprefix(" ") for line in header.splitlines()))
    assert all(PIN.match(dep) or dep == "hypothesis" for dep in metadata["dependencies"]), metadata
    assert re.fullmatch(r"==[0-9]+\.[0-9]+\.\*", metadata["requires-python"])
    # The recorded facts are one string constant handed to json.loads, and they come back exactly.
    [literal] = [
        n.value
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "RECORDED"
    ]
    assert isinstance(literal, ast.Call) and isinstance(literal.args[0], ast.Constant)
    recorded = json.loads(literal.args[0].value)
    assert recorded["config"] == failure["config"] and recorded["signature"] == failure["signature"]
    name = repro_id(failure)
    assert "/" not in name and name not in (".", "..") and re.fullmatch(r"[A-Za-z0-9_.-]+", name)


def test_reproducers_of_hostile_records_stay_in_their_folder(tmp_path: Path) -> None:
    hostile = record({name: "../../x/y|<img src=x onerror=alert(1)>\n" for name in FIELDS})
    out = tmp_path / "results" / "repros"
    written, _ = sync_repros([hostile], {SCENARIO.id: SCENARIO}, out)
    assert written and all(path.parent == out for path in written)
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == sorted([*(p.name for p in written), "index.json"])


def cells_of(row: str) -> int:
    """Cells in a Markdown table row: pipes that are not escaped, minus the outer two."""
    return len(re.findall(r"(?<!\\)\|", row)) - 1


@settings(max_examples=150, deadline=None)
@given(st.lists(RECORD_TEXT, min_size=1, max_size=3))
def test_markdown_rows_keep_their_cells(texts: list[dict[str, str]]) -> None:
    records = []
    for i, text in enumerate(texts):
        base = record(text) | {"config_id": f"{i:010d}", "metrics": {"c": 1.0}}
        records += [base, base | {"variant": "baseline", "outcome": "skip", "message": text["message"]}]
    meta = {"run_id": texts[0]["run_id"], "profile": texts[0]["cell"], "hardware": {"host": texts[0]["message"]}}
    markdown = render_markdown(Selection([meta["run_id"]], records, [meta]), {SCENARIO.id: SCENARIO.spec})
    table: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            widths = {cells_of(row) for row in table}
            assert len(widths) == 1, table
            table = []
    for line in markdown.splitlines():
        if line.startswith("|") or line.startswith("- "):
            # Code spans show their text as text (no HTML inside them); outside them, no raw < or > from a record.
            outside = re.sub(r"`[^`]*`", "", line).replace("<br>", "")
            assert "<" not in outside and ">" not in outside, line


@pytest.mark.parametrize("scenario", discover(), ids=lambda s: s.id.split("-")[0])
def test_every_scenarios_reproducer_finds_its_embedded_modules(tmp_path: Path, scenario) -> None:
    """A reproducer embeds the kit modules, compat and runtime.job its scenario needs, transitively: its
    `--help` (which imports all of them, then stops before any torch code) works outside the checkout."""
    failure = BENIGN | {"scenario": scenario.id, "variant": "baseline"}
    path = tmp_path / "repro.py"
    path.write_text(render(failure, scenario, [], "3.11"))
    # Outside the checkout, as on a user's machine: -S skips the .pth files (the editable install's path to the
    # checkout among them); the venv's packages (hypothesis) stay importable through PYTHONPATH.
    env = {"PYTHONPATH": sysconfig.get_paths()["purelib"], "PATH": os.environ.get("PATH", "")}
    command = [sys.executable, "-S", str(path), "--help"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--variant" in proc.stdout
