"""From the release to the function: which of the changed functions a failure runs is its cause, by putting them back.

The candidates are the functions and methods both runs of a finding executed whose source differs between the two
releases (`changed_code.py`). In the newer release's environment, a set of them is reverted to the older release's
source (`runtime/revert/sitecustomize.py`) and the reproducer runs again: where the revert brings back the older
release's outcome, the set holds the cause. This one direction serves a break (the revert passes) and a fix (the
revert fails again).

A run that crashes (a put-back function calls a helper the newer release no longer has) is no evidence either way, so
the search never concludes from one. Every candidate is put back at once first: where that gives the older outcome,
delta debugging (Zeller's ddmin) shrinks the set to a smallest one that still does. Where it cannot run, the candidates
are put back one at a time, in the order the failing run reaches them (those its traceback passes through, innermost
first, then the last called first); one that cannot run alone is widened with the helpers it calls (the calls the
trace saw, the names its source uses, the name its error gives) that the newer release lacks or wrote otherwise, and
then with its whole module, before it is given up. The first that gives the older outcome alone is the cause; where
none does, ddmin goes over the ones that ran. "No changed function explains it" is said only where every candidate
ran and none brought the older outcome back; otherwise the verdict is "not decided", naming those that could not run.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.paths import REPO_ROOT

#: The folder whose sitecustomize puts functions back (first on PYTHONPATH of a blame run).
REVERT_DIR = REPO_ROOT / "runtime" / "revert"
#: The outcomes a run can give: the older release's, the newer release's, or neither (it could not run).
OLDER, NEWER, NEITHER = "older", "newer", "neither"
#: How many reproducer runs one blame may make besides two per candidate (each takes the reproducer's seconds).
MOST_RUNS = 40
#: How deep the helpers of a helper are followed when a function is widened.
HELPER_DEPTH = 3


@dataclass(frozen=True)
class Candidate:
    """A changed function: the file inside the package ('peft/utils/save_and_load.py') and its qualified name."""

    file: str
    qualname: str

    @property
    def module(self) -> str:
        return module_of(self.file)

    @property
    def revertible(self) -> str:
        """The def that can be put back alone: a nested function's outermost enclosing one ('f.<locals>.g' -> 'f')."""
        return self.qualname.split(".<locals>.", 1)[0]

    def __str__(self) -> str:
        return f"{self.file}::{self.qualname}"


def module_of(file: str) -> str:
    """'peft/utils/save_and_load.py' -> 'peft.utils.save_and_load' (a package's __init__ is the package)."""
    parts = file.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass(frozen=True)
class Unit:
    """What the search puts back as one: a candidate with the helpers it was widened with, or a file whole."""

    main: Candidate | None = None
    helpers: tuple[Candidate, ...] = ()
    whole: str | None = None

    @property
    def functions(self) -> list[Candidate]:
        return [self.main, *self.helpers] if self.main is not None else []

    @property
    def reverted(self) -> list[str]:
        """Every function and whole file this unit puts back."""
        return [str(c) for c in self.functions] + ([f"{self.whole} (whole module)"] if self.whole else [])

    def __str__(self) -> str:
        return f"{self.whole} (whole module)" if self.whole else str(self.main)


#: A call refused before its body ran (no trace of it in the failing run): the callee's name, as Python words it.
_REFUSED = re.compile(
    r"([\w.]+)\(\) (?:got an unexpected keyword argument|got multiple values for|missing \d+ required|takes \d+)"
)


def refused_calls(changed: Any, error_text: str, older_sources: dict[str, str]) -> list[Candidate]:
    """Functions one run executed and the failing run's call never entered, that its error names as refusing the
    call's arguments ('Accelerator.__init__() got an unexpected keyword argument'): a changed signature is a
    changed function neither trace shows in both runs. Only those whose older source is at hand can be put back."""
    named = set(_REFUSED.findall(error_text or ""))
    found = []
    for name in [*changed.only_older, *changed.only_newer]:
        file, qualname = name.split("::", 1)
        if qualname in named and file in older_sources:
            found.append(Candidate(file, qualname))
    return found


def _def_node(tree: ast.AST, qualname: str) -> Any:
    nodes: list[Any] = [tree]
    for part in qualname.split("."):
        found = None
        for node in nodes:
            for child in ast.iter_child_nodes(node):
                named = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                if named and child.name == part:
                    found = child
        if found is None:
            return None
        nodes = [found]
    return nodes[0] if isinstance(nodes[0], ast.FunctionDef | ast.AsyncFunctionDef) else None


def _parsed(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def source_with_decorators(text: str, qualname: str) -> str | None:
    """The source of a def by its qualified name ('Class.method'), its decorators included, or None."""
    tree = _parsed(text)
    node = _def_node(tree, qualname) if tree is not None else None
    if node is None:
        return None
    lines = text.splitlines(keepends=True)
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    return "".join(lines[start - 1 : node.end_lineno])


def module_bindings(text: str) -> dict[str, str]:
    """name -> the module-level statement of `text` that binds it (an import, one per name; a def, a class, a plain
    assignment), so that a function put back can have the names it uses where its new module lacks them."""
    tree = _parsed(text)
    if tree is None:
        return {}
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                found.setdefault(bound, f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else ""))
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            origin = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    continue
                statement = f"from {origin} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                found.setdefault(alias.asname or alias.name, statement)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.setdefault(node.name, ast.get_source_segment(text, node, padded=False) or "")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                found.setdefault(targets[0].id, ast.get_source_segment(text, node) or "")
    return {name: statement for name, statement in found.items() if statement}


def names_used(source: str) -> set[str]:
    """The global names a function's source reads (its own parameters and locals left out where plainly assigned)."""
    tree = _parsed(textwrap.dedent(source))
    if tree is None:
        return set()
    loaded, stored = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
    return loaded - stored


def revert_plan(chosen: Sequence[Candidate], older_sources: dict[str, str], whole: Sequence[str] = ()) -> dict:
    """The plan `runtime/revert` applies: each chosen function's older source (nested ones as their enclosing def),
    with the module-level statements of its older module that bind the names it uses (`bindings`: an import, a
    constant; applied only where the module it goes into lacks that name), and the modules (`whole`, files) reverted
    entirely."""
    functions, seen = [], set()
    bindings: dict[str, dict[str, str]] = {}
    for candidate in chosen:
        if candidate.file in whole or (candidate.file, candidate.revertible) in seen:
            continue
        seen.add((candidate.file, candidate.revertible))
        text = older_sources.get(candidate.file, "")
        source = source_with_decorators(text, candidate.revertible)
        if source is None:
            continue
        if candidate.file not in bindings:
            bindings[candidate.file] = module_bindings(text)
        needed = sorted(n for n in names_used(source) if n in bindings[candidate.file])
        functions.append({
            "module": candidate.module, "qualname": candidate.revertible, "source": source,
            "bindings": [{"name": n, "statement": bindings[candidate.file][n]} for n in needed],
        })  # fmt: skip
    modules = [{"module": module_of(f), "source": older_sources[f]} for f in sorted(set(whole)) if f in older_sources]
    return {"functions": functions, "modules": modules}


def helpers_of(
    candidate: Candidate, sources: dict[str, str], other_sources: dict[str, str],
    calls: dict[tuple[str, str], set[tuple[str, str]]], error: str = "",
) -> list[Candidate]:  # fmt: skip
    """The helpers `candidate` calls as `sources`' release wrote it (the calls its traced run made, `calls`; the names
    its source uses; the name its failed run's `error` gives) that the release it goes into (`other_sources`) lacks
    or wrote otherwise: what it must take along to run there. Their own helpers too, HELPER_DEPTH deep."""
    from harness.tools.code_blame.changed_code import function_sources

    parsed: dict[tuple[int, str], dict[str, str]] = {}

    def defs(texts: dict[str, str], file: str) -> dict[str, str]:
        if (id(texts), file) not in parsed:
            parsed[(id(texts), file)] = function_sources(texts.get(file, ""))
        return parsed[(id(texts), file)]

    def differs(file: str, qualname: str) -> bool:
        if file not in other_sources:
            return True  # the other run never loaded that file: it cannot be told the same
        return defs(other_sources, file).get(qualname) != defs(sources, file).get(qualname)

    def resolve(file: str, owner: str, name: str) -> list[tuple[str, str]]:
        """Where `name`, read in a function of `file` (a method of `owner`), is defined in `sources`."""
        here = defs(sources, file)
        found = [(file, q) for q in (f"{owner}.{name}" if owner else "", name) if q and q in here]
        if found:
            return found[:1]
        imported = re.match(r"from (\.*)([\w.]*) import (\w+)", module_bindings(sources.get(file, "")).get(name, ""))
        target = _imported_file(file, imported.group(1), imported.group(2), sources) if imported else None
        return (
            [(target, imported.group(3))] if target and imported and imported.group(3) in defs(sources, target) else []
        )

    def named_by_error(file: str, owner: str) -> set[tuple[str, str]]:
        """What the failed run's error says is missing: a name, a module's or a class's attribute, an import."""
        found: set[tuple[str, str]] = set()
        for name in re.findall(r"name '(\w+)' is not defined", error or ""):
            found |= set(resolve(file, owner, name))
        for where, name in re.findall(r"(?:type object )?'(\w+)'(?: object)? has no attribute '(\w+)'", error or ""):
            found |= {(f, q) for f in sources for q in defs(sources, f) if q == f"{where}.{name}"}
        for name, module in re.findall(r"cannot import name '(\w+)' from '([\w.]+)'", error or ""):
            found |= {(f, name) for f in sources if module_of(f) == module and name in defs(sources, f)}
        for module, name in re.findall(r"module '([\w.]+)' has no attribute '(\w+)'", error or ""):
            found |= {(f, name) for f in sources if module_of(f) == module and name in defs(sources, f)}
        return found

    start = (candidate.file, candidate.revertible)
    found: list[tuple[str, str]] = []
    frontier = [start]
    for depth in range(HELPER_DEPTH):
        following = []
        for file, qualname in frontier:
            source = defs(sources, file).get(qualname) or ""
            owner = qualname.rsplit(".", 1)[0] if "." in qualname else ""
            reached = set(calls.get((file, qualname), set()))
            for name in names_used(source) | _attributes_of_self(source):
                reached |= set(resolve(file, owner, name))
            if depth == 0:
                reached |= named_by_error(file, owner)
            for key in sorted(reached):
                if key != start and key not in found and key[1] in defs(sources, key[0]) and differs(*key):
                    found.append(key)
                    following.append(key)
        frontier = following
    return [Candidate(f, q) for f, q in found]


def _imported_file(file: str, dots: str, module: str, sources: dict[str, str]) -> str | None:
    """The package file a `from <dots><module> import x` in `file` names, where `sources` holds it."""
    if dots:
        package = file.split("/")[:-1]
        parts = [*package[: len(package) - (len(dots) - 1)], *filter(None, module.split("."))]
    else:
        parts = module.split(".")
    for path in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
        if path in sources:
            return path
    return None


def _attributes_of_self(source: str) -> set[str]:
    """The attributes a method reads of `self` or `cls` ('self._check_target' -> '_check_target')."""
    return set(re.findall(r"\b(?:self|cls)\.(\w+)", source))


def ddmin(items: Sequence[Any], test: Callable[[list[Any]], str]) -> list[Any]:
    """A smallest subset of `items` for which `test` gives OLDER (given that all of them do), by Zeller's ddmin: try
    each of n parts and each complement, keep the first that still gives OLDER, else split finer. A test that gives
    NEITHER (the revert could not run) counts as not OLDER."""
    current, parts = list(items), 2
    while len(current) >= 2:
        size = -(-len(current) // parts)
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        reduced = False
        for chunk in chunks:
            if test(chunk) == OLDER:
                current, parts, reduced = chunk, 2, True
                break
        if not reduced:
            for index in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != index for x in c]
                if len(chunks) > 2 and test(rest) == OLDER:
                    current, parts, reduced = rest, max(parts - 1, 2), True
                    break
        if not reduced:
            if parts >= len(current):
                break
            parts = min(len(current), parts * 2)
    return current


def in_failing_order(
    candidates: Sequence[Candidate], lateness: dict[tuple[str, str], float], traceback: str = "", package: str = ""
) -> list[Candidate]:
    """The candidates in the order the failing run reaches them: those its traceback passes through first (innermost
    first), then the last called first (`lateness`: 1 is the run's last call; the latest over its processes)."""
    frames = re.findall(r'File "[^"]*?/((?:' + re.escape(package or r"\w+") + r')/[^"]+\.py)", line \d+, in (\w+)',
                        traceback or "")[::-1]  # fmt: skip
    ranked = {}
    for rank, (file, name) in enumerate(frames):
        for c in candidates:
            if c.file == file and c.revertible.split(".")[-1] == name:
                ranked.setdefault(c, rank)
    return sorted(candidates, key=lambda c: (ranked.get(c, len(frames)), -lateness.get((c.file, c.revertible), 0.0)))


@dataclass
class Blame:
    """What putting code back showed: the smallest set whose revert gives the older outcome (empty where none
    does), every run made (what it put back, what it gave, the run's last line, its seconds), and what could not
    run."""

    package: str
    older: str
    newer: str
    candidates: list[str]
    blamed: list[str] = field(default_factory=list)
    #: Files put back whole for a function that could not run alone or with its helpers.
    widened: list[str] = field(default_factory=list)
    #: Candidates that could not run, alone, with their helpers or in their whole module: no evidence either way.
    unrunnable: list[str] = field(default_factory=list)
    #: Candidates never put back alone (the run bound was reached first).
    untried: list[str] = field(default_factory=list)
    #: A candidate -> the helpers it ran with (it could not run alone: it calls what the newer release lacks).
    helpers: dict[str, list[str]] = field(default_factory=dict)
    #: How the blamed set was found: "all at once, shrunk", "alone" (one at a time) or "the runnable ones, shrunk".
    how: str = ""
    #: Whether the verdict is decided: a cause named, or every candidate ran and none brought the older outcome.
    decided: bool = False
    #: The other way: the blamed functions as the newer release wrote them, put into the older release's run
    #: (each blamed one under `each` where several are).
    converse: dict[str, Any] = field(default_factory=dict)
    #: The machine the runs were made on (`hardware.describe`): a cause may show on some CPUs only.
    machine: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def seconds(self) -> float:
        return round(sum(r.get("seconds") or 0.0 for r in self.runs), 1)


#: What a blame that cannot name a function says of where the cause may be instead.
ELSEWHERE = "native code, module-level code such as an import, a function neither run executed, another package"


def blame(
    package: str,
    older: str,
    newer: str,
    candidates: Sequence[Candidate],
    older_sources: dict[str, str],
    run: Callable[[dict], dict[str, Any]],
    widen: Callable[[Candidate, str], list[Candidate]] | None = None,
    most_runs: int | None = None,
) -> Blame:
    """Name the smallest set of candidates whose revert gives the older release's outcome. `run(plan)` runs the
    reproducer in the newer release's environment with the plan reverted and returns {"outcome": OLDER | NEWER |
    NEITHER, "line", "seconds", "failed": reverts that could not be applied, "error"}. `candidates` come in the order
    the failing run reaches them (`in_failing_order`); `widen(candidate, error)` gives the helpers a candidate that
    could not run alone takes along (`helpers_of`)."""
    result = Blame(package, older, newer, [str(c) for c in candidates])
    bound = most_runs if most_runs is not None else MOST_RUNS + 2 * len(candidates)
    memo: dict[tuple[str, ...], str] = {}

    def test(units: list[Unit]) -> str:
        return _run_units(units, older_sources, run, memo, result, bound)

    every = [Unit(c) for c in candidates]
    outcome = test(every)
    if outcome == OLDER:
        return _named(result, ddmin(every, test), "all at once, shrunk")
    if outcome == NEWER:
        result.decided = True
        ran = (
            "the runs executed no changed function, so nothing was put back"
            if not candidates
            else f"the one changed function the runs executed ran put back at {package} {newer}"
            if len(candidates) == 1
            else f"every one of the {len(candidates)} changed functions the runs executed ran put back together at "
            f"{package} {newer}"
        )
        result.verdict = (
            f"no changed function explains it: {ran} and the {newer} outcome stayed; the cause is elsewhere "
            f"({ELSEWHERE})"
        )
        return result
    together = result.runs[-1] if result.runs else {}
    runnable: list[Unit] = []
    stuck: list[Candidate] = []
    for index, candidate in enumerate(candidates):
        if len(result.runs) >= bound:
            result.untried = [str(c) for c in candidates[index:]]
            break
        unit, outcome = _alone(candidate, test, result, widen)
        if outcome == OLDER:
            return _named(result, [unit], "alone", together)
        if outcome == NEWER:
            runnable.append(unit)
        else:
            stuck.append(candidate)
    # A candidate that cannot run alone or with its helpers: its whole module, after every other was tried alone
    # (a module put back whole names less than a function does).
    for file in dict.fromkeys(c.file for c in stuck):
        whole = Unit(whole=file)
        outcome = test([whole])
        if outcome == OLDER:
            result.widened.append(file)
            result.unrunnable = [str(c) for c in stuck if c.file != file]
            return _named(result, [whole], "alone", together)
        if outcome == NEWER:
            result.widened.append(file)
            runnable.append(whole)
            stuck = [c for c in stuck if c.file != file]
    result.unrunnable = [str(c) for c in stuck]
    if len(runnable) >= 2 and test(runnable) == OLDER:
        return _named(result, ddmin(runnable, test), "the runnable ones, shrunk", together)
    if result.unrunnable or result.untried:
        missing = result.unrunnable + result.untried
        parts = [f"{len(result.unrunnable)} could not run"] if result.unrunnable else []
        parts += [f"{len(result.untried)} were not tried (the bound of {bound} runs)"] if result.untried else []
        result.verdict = (
            f"not decided: {len(missing)} of the {len(candidates)} candidates: {' and '.join(parts)} (alone, with the "
            f"helpers they call, or in their whole module): {', '.join(missing)}; putting every one back at once could "
            f"not run ({_said(together)}); the {len(runnable)} that ran did not bring back the {older} outcome"
            + (" alone or together" if len(runnable) >= 2 else "")
        )
        return result
    result.decided = True
    result.verdict = (
        f"no changed function explains it: every one of the {len(candidates)} candidates ran put back at {package} "
        f"{newer} (one at a time, since all at once could not run: {_said(together)}), and none brought back the "
        f"{older} outcome, alone or together; the cause is elsewhere ({ELSEWHERE})"
    )
    return result


def _alone(
    candidate: Candidate, test: Callable[[list[Unit]], str], result: Blame,
    widen: Callable[[Candidate, str], list[Candidate]] | None,
) -> tuple[Unit, str]:  # fmt: skip
    """One candidate put back alone; where that cannot run, with the helpers it calls."""
    unit = Unit(candidate)
    outcome = test([unit])
    if outcome != NEITHER or widen is None:
        return unit, outcome
    helpers = [h for h in widen(candidate, _said(_last_run_of(result, unit))) if h != candidate]
    if not helpers:
        return unit, outcome
    wide = Unit(candidate, tuple(helpers))
    outcome = test([wide])
    if outcome != NEITHER:
        result.helpers[str(candidate)] = [str(h) for h in helpers]
        return wide, outcome
    return unit, NEITHER


def _last_run_of(result: Blame, unit: Unit) -> dict[str, Any]:
    return next((r for r in reversed(result.runs) if r.get("units") == [str(unit)]), {})


def _said(found: dict[str, Any]) -> str:
    """A run's error in a few words: the line it ended on, or the reverts it could not apply."""
    failed = found.get("failed") or []
    if failed:
        return f"could not put back {failed[0].get('what')}: {failed[0].get('error')}"
    return str(found.get("error") or found.get("line") or "no outcome line")[:300]


def _named(result: Blame, chosen: list[Unit], how: str, together: dict[str, Any] | None = None) -> Blame:
    result.blamed, result.how, result.decided = [str(u) for u in chosen], how, True
    notes = []
    if together:
        notes.append(f"putting every changed function back at once could not run ({_said(together)}), so each was "
                     "put back alone, in the order the failing run reaches them")  # fmt: skip
    for unit in chosen:
        if unit.helpers:
            notes.append(f"{unit.main} runs there only with the helpers it calls: "
                         f"{', '.join(str(h) for h in unit.helpers)}")  # fmt: skip
        if unit.whole:
            notes.append(f"{unit.whole} put back whole: its functions alone cannot run")
    if result.unrunnable:
        notes.append(f"could not run, no evidence either way: {', '.join(result.unrunnable)}")
    result.verdict = f"reverting {', '.join(result.blamed)} at {result.package} {result.newer} gives the " + (
        f"{result.older} outcome" + "".join(f"; {n}" for n in notes)
    )
    return result


def _run_units(
    units: list[Unit], older_sources: dict[str, str], run: Callable[[dict], dict[str, Any]],
    memo: dict[tuple[str, ...], str], result: Blame, bound: int,
) -> str:  # fmt: skip
    """The outcome of one run with these units put back; each set is run once."""
    reverted = sorted({name for u in units for name in u.reverted})
    key = tuple(reverted)
    if key in memo:
        return memo[key]
    if len(result.runs) >= bound:
        return NEITHER
    functions = [c for u in units for c in u.functions]
    whole = sorted({u.whole for u in units if u.whole})
    found = run(revert_plan(functions, older_sources, whole))
    outcome = NEITHER if found.get("failed") else found["outcome"]
    result.runs.append({"units": [str(u) for u in units], "reverted": reverted, "outcome": outcome,
                        "line": found.get("line"), "seconds": found.get("seconds"),
                        "failed": found.get("failed") or [], "error": found.get("error")})  # fmt: skip
    memo[key] = outcome
    return outcome


def converse(
    result: Blame, newer_sources: dict[str, str], run_older: Callable[[dict], dict[str, Any]],
    widen: Callable[[Candidate, str], list[Candidate]] | None = None,
) -> None:  # fmt: skip
    """Apply the blamed functions the other way (the newer release's source into the older release's run): a cause
    should bring the newer outcome there too. Where they cannot run there alone, with the newer helpers they call
    (`widen`). Every blamed function together, then each alone where several are blamed."""
    chosen = [Candidate(*name.split("::", 1)) for name in result.blamed if "::" in name]
    if not chosen or len(chosen) != len(result.blamed):
        return
    result.converse = _converse_run(chosen, newer_sources, run_older, widen, chosen)
    if len(chosen) > 1:  # each alone: never with another blamed function as its helper
        result.converse["each"] = [_converse_run([c], newer_sources, run_older, widen, chosen) for c in chosen]
    result.verdict += "; " + converse_words(result)


def _converse_run(
    chosen: list[Candidate], newer_sources: dict[str, str], run_older: Callable[[dict], dict[str, Any]],
    widen: Callable[[Candidate, str], list[Candidate]] | None, blamed: list[Candidate],
) -> dict[str, Any]:  # fmt: skip
    found = run_older(revert_plan(chosen, newer_sources))
    outcome = NEITHER if found.get("failed") else found["outcome"]
    entry = {"applied": [str(c) for c in chosen], "outcome": outcome, "line": found.get("line"),
             "seconds": found.get("seconds"), "error": found.get("error")}  # fmt: skip
    if outcome == NEITHER and widen is not None:
        error = _said(entry | {"failed": found.get("failed") or []})
        helpers = list(dict.fromkeys(h for c in chosen for h in widen(c, error) if h not in blamed))
        if helpers:
            again = run_older(revert_plan([*chosen, *helpers], newer_sources))
            outcome = NEITHER if again.get("failed") else again["outcome"]
            entry = {"applied": [str(c) for c in chosen], "helpers": [str(h) for h in helpers], "outcome": outcome,
                     "line": again.get("line"), "seconds": round((found.get("seconds") or 0) +
                                                                 (again.get("seconds") or 0), 2),
                     "error": again.get("error"), "alone": entry}  # fmt: skip
    return entry


def converse_words(result: Blame) -> str:
    """What the run the other way shows, in words: a run that could not run is no evidence either way, and one that
    kept the older outcome says the blamed code alone does not bring the failure there."""
    other = result.converse or {}
    where = f"the other way (the {result.newer} source at {result.package} {result.older})"
    helped = f" with the helpers it calls ({', '.join(other['helpers'])})" if other.get("helpers") else ""
    if other.get("outcome") == NEWER:
        alone = "with the helpers it calls, and nothing else changed" if helped else "alone"
        return f"{where}{helped} gives the {result.newer} outcome: the blamed code brings it {alone}"
    if other.get("outcome") == OLDER:
        return (
            f"{where}{helped} keeps the {result.older} outcome: the blamed code is needed but not enough alone there "
            "(what it works with changed too)"
        )
    error = other.get("error") or other.get("line") or "no outcome line"
    return f"{where} could not run{helped and ', even' + helped} ({error}): no evidence either way"


def outcome_of(exit_code: int | None, line: str | None, older: dict[str, Any], newer: dict[str, Any]) -> str:
    """Which release's outcome a run gave: its exit code and the first word of its last line ('ok:', 'FAIL:') as
    one side's run gave them; anything else (a traceback, a timeout) is neither."""

    def said(code: int | None, text: str | None) -> tuple[int | None, str]:
        return code, (text or "").split(":", 1)[0].strip()

    mine = said(exit_code, line)
    if mine == said(older.get("exit_code"), older.get("line")):
        return OLDER
    if mine == said(newer.get("exit_code"), newer.get("line")):
        return NEWER
    return NEITHER


@contextmanager
def reverting(plan: dict) -> Iterator[tuple[dict[str, str], Callable[[], list[dict[str, str]]]]]:
    """The variables a run needs for `runtime/revert` to put `plan` back (its plan file and report folder, alive for
    the block), and a reader of the reverts the run's processes could not apply (no evidence either way)."""
    with tempfile.TemporaryDirectory(prefix="blame-") as scratch:
        plan_file, report = Path(scratch) / "plan.json", Path(scratch) / "report"
        plan_file.write_text(json.dumps(plan))
        report.mkdir()

        def failed() -> list[dict[str, str]]:
            return [f for path in sorted(report.glob("revert-*.json")) for f in json.loads(path.read_text())["failed"]]

        yield {"COMPAT_MATRIX_REVERT": str(plan_file), "COMPAT_MATRIX_REVERT_REPORT": str(report)}, failed


def run_reverted(
    command: list[str], env: dict[str, str], plan: dict, sides: tuple[dict[str, Any], dict[str, Any]],
    cwd: Path | None = None, timeout_s: float = 1800.0,
) -> dict[str, Any]:  # fmt: skip
    """One run of the reproducer's command with the plan put back (`runtime/revert` first on PYTHONPATH), judged
    against the two sides' runs (older, newer): what `blame` asks of `run`."""
    with reverting(plan) as (revert_env, read_failed):
        paths = [str(REVERT_DIR), *filter(None, [env.get("PYTHONPATH")])]
        env = env | revert_env | {"PYTHONPATH": os.pathsep.join(paths)}
        started = time.monotonic()
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = None, str(exc.stdout or ""), str(exc.stderr or "")
        failed = read_failed()
    lines = [line for line in out.splitlines() if line.strip()]
    line = lines[-1] if lines else None
    outcome = outcome_of(code, line, *sides)
    errors = [e for e in err.strip().splitlines() if e.strip()]
    return {"outcome": outcome, "line": line, "seconds": round(time.monotonic() - started, 1), "failed": failed,
            "error": errors[-1] if errors and outcome == NEITHER else None}  # fmt: skip


def write(blame_result: Blame, folder: Path) -> Path:
    path = folder / "blame.json"
    path.write_text(json.dumps(blame_result.as_json() | {"seconds": blame_result.seconds}, indent=1) + "\n")
    return path
