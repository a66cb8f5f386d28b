"""The map in docs/architecture.md is the code's: every import under `harness/`, function-local ones included, is
one its room's "may import" cell lists, every room has a row, and no two rooms import each other.

A cell names rooms in backticks: a floor (`define`), a module of a floor (`recording/outcomes.py`: only that
module), a bottom module (`errors`), or a module of the cell side (`scenarios/failure_names.py`). Whatever is not in
backticks (stdlib, `packaging` ...) is outside the house and not checked here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO_ROOT

HARNESS = REPO_ROOT / "harness"
MAP = REPO_ROOT / "docs" / "architecture.md"
OUTSIDE = {"stdlib", "packaging", "hypothesis"}


def room_of_module(module: str) -> str | None:
    """`harness.recording.runs` -> 'recording'; `harness.errors` -> 'errors'; `scenarios.x` -> 'scenarios/x.py'."""
    parts = module.split(".")
    if parts[0] == "harness" and len(parts) > 1:
        return parts[1]
    if parts[0] in ("scenarios", "runtime"):
        return "/".join(parts[:2]) + ".py" if len(parts) > 1 else parts[0]
    return None


def room_of_file(path: Path) -> str:
    relative = path.relative_to(HARNESS).parts
    return relative[0] if len(relative) > 1 else path.stem


def imported_modules(path: Path) -> set[str]:
    """Every module the file imports, at any depth (`from harness import errors` -> harness.errors)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in ("harness", "scenarios", "runtime") or node.module.count(".") == 1:
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
    return found


def allowed_by_the_map() -> dict[str, set[str]]:
    """room -> what its "may import" cell names (floors, `floor/module.py`, bottom modules, cell-side modules)."""
    rules: dict[str, set[str]] = {}
    for line in MAP.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`harness/"):
            continue
        names = set(re.findall(r"`([^`]+)`", cells[2])) - OUTSIDE
        for room in re.findall(r"`harness/([\w.]+?)/?`", cells[0]):
            rules[room.removesuffix(".py")] = names
    return rules


def violations(room: str, modules: set[str], allowed: set[str]) -> list[str]:
    wrong = []
    for module in sorted(modules):
        target = room_of_module(module)
        if target is None or target == room:
            continue
        parts = module.split(".")
        as_file = f"{parts[1]}/{parts[2]}.py" if parts[0] == "harness" and len(parts) > 2 else None
        if target not in allowed and as_file not in allowed:
            wrong.append(f"{module} ({room} may not import {target})")
    return wrong


def test_every_import_under_harness_is_one_the_map_allows() -> None:
    rules = allowed_by_the_map()
    rooms = {room_of_file(p) for p in HARNESS.rglob("*.py")} - {"__init__", "__main__"}
    assert rooms - set(rules) == set(), "rooms without a row in docs/architecture.md's table"
    wrong = []
    for path in sorted(HARNESS.rglob("*.py")):
        room = room_of_file(path)
        if room not in ("__init__", "__main__"):
            wrong += [
                f"{path.relative_to(REPO_ROOT)} imports {w}"
                for w in violations(room, imported_modules(path), rules[room])
            ]
    assert wrong == [], "\n".join(wrong)


def test_no_two_rooms_import_each_other() -> None:
    """A circle between two rooms (or two modules of one room, which the map cannot see) is a floor that is not."""
    edges: set[tuple[str, str]] = set()
    for path in HARNESS.rglob("*.py"):
        here = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        for module in imported_modules(path):
            if module.startswith("harness.") and module != here:
                edges.add((here, module))
    # An import of a name from a module reads as module.name: count it against the module.
    modules = {".".join(p.relative_to(REPO_ROOT).with_suffix("").parts) for p in HARNESS.rglob("*.py")}
    resolved = {(a, b if b in modules else b.rsplit(".", 1)[0]) for a, b in edges}
    circles = sorted({tuple(sorted((a, b))) for a, b in resolved if (b, a) in resolved and a != b})
    assert circles == [], circles


def test_the_map_can_fail(tmp_path: Path) -> None:
    """The checker sees a function-local import (the kind a circle hid behind) and refuses one that climbs."""
    path = tmp_path / "x.py"
    path.write_text("def f():\n    from harness.execution.matrix import run_matrix\n    return run_matrix\n")
    modules = imported_modules(path)
    assert modules == {"harness.execution.matrix"}
    rules = allowed_by_the_map()
    assert violations("versions", modules, rules["versions"]) == [
        "harness.execution.matrix (versions may not import execution)"
    ]
    assert violations("tools", modules, rules["tools"]) == []


def test_floors_below_the_cli_word_no_error_as_a_flag() -> None:
    """Lower floors name a bad setting by its name (`OptionError("{world_sizes} ...")`); only the CLI words it as
    the flag that sets it. The commands' own bodies (`tools/`) stand right under the CLI and may name flags."""
    import re

    flagged = re.compile(r"(UsageError|OptionError|ProfileError)\(\s*f?[\"'][^\"']*(?<![\w-])--[a-z]", re.S)
    offenders = []
    for path in sorted(HARNESS.rglob("*.py")):
        room = path.relative_to(HARNESS).parts[0]
        if room in ("tools",) or path.name.startswith("cli"):
            continue
        found = [m.group(0) for m in flagged.finditer(path.read_text())]
        # A command to run ("make it with: python -m harness lock --profile NAME") is advice, not a setting.
        offenders += [f"{path.relative_to(HARNESS)}: {text[:60]}" for text in found if "python -m harness" not in text]
    assert not offenders, offenders
