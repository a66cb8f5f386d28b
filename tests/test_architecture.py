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


def is_package(module: str) -> bool:
    """Whether the dotted name is a folder of the checkout (`harness.tools.answers`), not a module."""
    return (REPO_ROOT / module.replace(".", "/")).is_dir()


def imported_modules(path: Path) -> set[str]:
    """Every module the file imports, at any depth (`from harness import errors` -> harness.errors; from a package,
    `from harness.tools.answers import lookup` -> harness.tools.answers.lookup)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in ("harness", "scenarios", "runtime") or is_package(node.module):
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


TOOLS = HARNESS / "tools"


def family_rules() -> dict[str, set[str]]:
    """tools/ family -> the families its row in "tools/ in families" lets it import."""
    rules: dict[str, set[str]] = {}
    for line in MAP.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"`tools/(\w+)/`", cells[0]) if len(cells) == 3 else None
        if found:
            rules[found.group(1)] = set(re.findall(r"`(\w+)`", cells[2]))
    return rules


def family_imports(path: Path) -> set[str]:
    """The other tools/ families a module of one imports (`harness.tools.<family>...`)."""
    here = path.relative_to(TOOLS).parts[0]
    return {m.split(".")[2] for m in imported_modules(path) if m.startswith("harness.tools.")} - {here}


def test_each_tools_family_imports_only_the_families_its_row_names() -> None:
    """The families of tools/ are floors too: every family has a row, and one imports another only where its row
    says so (so no two families import each other)."""
    rules = family_rules()
    families = {p.name for p in TOOLS.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert families == set(rules), "tools/ families without a row, or rows without a family"
    assert [p.name for p in TOOLS.glob("*.py")] == ["__init__.py"], "a module of tools/ outside every family"
    wrong = []
    for path in sorted(TOOLS.rglob("*.py")):
        if path.parent == TOOLS:
            continue
        family = path.relative_to(TOOLS).parts[0]
        wrong += [
            f"{path.relative_to(REPO_ROOT)} imports tools/{f}" for f in sorted(family_imports(path) - rules[family])
        ]
    assert wrong == [], "\n".join(wrong)
    circles = sorted({tuple(sorted((a, b))) for a in rules for b in rules[a] if a in rules.get(b, set())})
    assert circles == [], circles


def long_functions(path: Path, limit: int = 100) -> list[str]:
    """The functions (methods, nested ones) of a file longer than `limit` lines, from `def` to their last line."""
    return [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_under_harness_is_over_100_lines() -> None:
    """A function of more than a screenful does several jobs: split it where its parts have names."""
    found = [line for path in sorted(HARNESS.rglob("*.py")) for line in long_functions(path)]
    assert found == [], "\n".join(found)


def test_the_function_length_check_can_fail(tmp_path: Path) -> None:
    path = REPO_ROOT / "tests" / "test_architecture.py"
    assert long_functions(path, limit=5), "this file has functions longer than 5 lines"


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


#: Files and folders of the results that only `knowledge/store.py` reads (a path part, or a glob pattern's).
RESULT_FILES = (
    "records.jsonl", "flips.json", "meta.json", "runs", "runs.jsonl", "verdict.json", "watch.json", "blame.json",
    "changed.json", "finding.toml", "pairs.jsonl", "saves.jsonl", "sweep.json",
)  # fmt: skip
#: The readers of those files: only the store calls them.
RESULT_READERS = {"read_records", "open_records", "read_meta", "load_all", "load_finding", "run_dirs"}


def results_reads(path: Path) -> list[str]:
    """Where a module reads the results folders itself: a path joined or globbed with a results file's name, a
    reader of records, meta, flips or findings called, or a folder named `results_dir` globbed or listed."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            names = [
                n.value for n in (node.left, node.right) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("glob", "rglob", "iterdir"):
                receiver = ast.unparse(node.func.value)
                if "results_dir" in receiver:
                    found.append(f"line {node.lineno}: {receiver}.{node.func.attr}()")
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in RESULT_READERS:
                found.append(f"line {node.lineno}: calls {called}")
        for name in names:
            if any(part in RESULT_FILES for part in name.split("/")):
                found.append(f"line {node.lineno}: {name!r}")
    return found


#: The answer commands (the tools that answer from the records, not the ones that make them).
ANSWER_MODULES = ("lookup", "check", "audit", "audit_prove", "target")


def test_no_publisher_or_answer_reads_the_results_folders() -> None:
    """Every publisher and answer command asks the atlas, whose store reads each results file once
    (`knowledge/store.py`): one that opened runs/ or flips.json itself would read a second, maybe different, set of
    records (a superseded run's flip in an issue body; a report reading each record file twice)."""
    answers = [p for p in HARNESS.rglob("*.py") if "tools" in p.parts and p.stem in ANSWER_MODULES]
    assert len(answers) == len(ANSWER_MODULES), answers
    offenders = {
        str(path.relative_to(REPO_ROOT)): found
        for path in sorted([*(HARNESS / "publishing").rglob("*.py"), *answers])
        if (found := results_reads(path))
    }
    assert offenders == {}, offenders


def test_the_results_check_can_fail(tmp_path: Path) -> None:
    """The check sees each way a publisher used to read the results."""
    path = tmp_path / "x.py"
    path.write_text(
        "def f(results_dir, run):\n"
        "    a = read_records(results_dir / 'runs' / run / 'records.jsonl')\n"
        "    b = sorted((results_dir / 'flips').glob('*/flips.json'))\n"
        "    return a, b, [p for p in results_dir.iterdir()]\n"
    )
    found = results_reads(path)
    assert [f.split(":", 1)[0] for f in found].count("line 2") == 3, found  # the reader, 'runs', 'records.jsonl'
    assert any("flips.json" in f for f in found) and any("iterdir" in f for f in found), found
