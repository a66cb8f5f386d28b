"""The code a failure runs that changed: of one package, the functions both runs of a finding executed (the failing
release's and the last good one's) whose source differs between the two releases, with a diff excerpt of each.

The runs are traced by `runtime/call_trace/sitecustomize.py`, which keeps the source of every file a traced function
lives in; here each function is found again in both sources by its qualified name (`ast`), so the comparison needs
neither environment. Pure Python releases are compared whole; for a compiled package (torch, bitsandbytes) these are
only the Python-level functions on the path, and what runs natively below them is not seen.
"""

from __future__ import annotations

import ast
import difflib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Lines of a diff excerpt kept per function (the rest is counted).
EXCERPT_LINES = 40
#: Packages whose releases hold native code: the trace sees their Python functions only.
COMPILED = ("torch", "bitsandbytes", "deepspeed")


@dataclass
class ChangedFunction:
    file: str
    qualname: str
    older_lines: int
    newer_lines: int
    diff: str
    #: How late the failing run first called it (1: last): the changed functions nearest the failure come first.
    when: float = 0.0


@dataclass
class ChangedCode:
    package: str
    older: str
    newer: str
    executed_both: int
    changed: list[ChangedFunction] = field(default_factory=list)
    #: Functions only the newer (or only the older) release's run executed: a new path, or one no longer taken.
    only_newer: list[str] = field(default_factory=list)
    only_older: list[str] = field(default_factory=list)
    native_below: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChangedCode:
        return cls(**{**data, "changed": [ChangedFunction(**c) for c in data.get("changed", [])]})


def read_traces(folder: Path) -> tuple[set[tuple[str, str]], dict[str, str], dict[str, str]]:
    """The functions every process of a run executed ({(file, qualname)}), the sources of their files, and the
    versions the processes imported (the first process that names one)."""
    calls, sources, versions, _ = read_traces_ordered(folder)
    return set(calls), sources, versions


def read_traces_ordered(
    folder: Path,
) -> tuple[dict[tuple[str, str], float], dict[str, str], dict[str, str], int]:
    """As `read_traces`, each function with how late in its process it was first called (0: first, 1: last; the
    latest over the processes), and how many processes reported: the functions called last are nearest the end
    of the run, where a reproducer's failure shows."""
    calls: dict[tuple[str, str], float] = {}
    sources: dict[str, str] = {}
    versions: dict[str, str] = {}
    processes = 0
    for path in sorted(folder.glob("trace-*.json")):
        data = json.loads(path.read_text())
        processes += 1
        total = max(len(data["calls"]) - 1, 1)
        for index, call in enumerate(data["calls"]):
            key = (call["file"], enclosing(call["qualname"]))
            if key[1]:
                calls[key] = max(calls.get(key, 0.0), index / total)
        sources |= {k: v for k, v in data["sources"].items() if k not in sources}
        versions |= {k: v for k, v in data["versions"].items() if k not in versions}
    return calls, sources, versions, processes


def read_lateness(folder: Path) -> dict[tuple[str, str], float]:
    """Each function of a traced run with how late it was last called (1: the package's last call in its process;
    the latest over the processes): the order a blame tries candidates in, nearest the failure first. A trace from
    before the tracer counted calls gives the first call's place instead."""
    late: dict[tuple[str, str], float] = {}
    for path in sorted(folder.glob("trace-*.json")):
        calls = json.loads(path.read_text())["calls"]
        most = max([c.get("last", i) for i, c in enumerate(calls)] + [1])
        for index, call in enumerate(calls):
            key = (call["file"], enclosing(call["qualname"]))
            if key[1]:
                late[key] = max(late.get(key, 0.0), call.get("last", index) / most)
    return late


def read_call_edges(folder: Path) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(file, qualname) -> the package's functions it called in a traced run (`edges`, every process): the helpers a
    put-back function takes along where it cannot run alone."""
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for path in sorted(folder.glob("trace-*.json")):
        data = json.loads(path.read_text())
        keys = [(c["file"], enclosing(c["qualname"])) for c in data["calls"]]
        for caller, callee in data.get("edges") or []:
            a, b = keys[caller], keys[callee]
            if a[1] and b[1] and a != b:
                edges.setdefault(a, set()).add(b)
    return edges


def enclosing(qualname: str) -> str:
    """The def a code object belongs to: a comprehension or lambda counts as its function ('f.<locals>.<listcomp>'
    -> 'f'); a nested def keeps its own name ('f.<locals>.g'); module-level code is none ('')."""
    parts = [p for p in qualname.split(".") if not p.startswith("<") or p == "<locals>"]
    while parts and parts[-1] == "<locals>":
        parts.pop()
    return ".".join(parts)


def function_sources(text: str) -> dict[str, str]:
    """qualname -> source of every def in a module's text (methods as 'Class.method', nested as 'f.<locals>.g')."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    found: dict[str, str] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                found[name] = ast.get_source_segment(text, child) or ""
                walk(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def compare(package: str, older: tuple[str, Path], newer: tuple[str, Path]) -> ChangedCode:
    """Compare the traced runs of the last good (`older`: release, trace folder) and first bad (`newer`) release."""
    old_calls, old_sources, _, _ = read_traces_ordered(older[1])
    new_calls, new_sources, _, _ = read_traces_ordered(newer[1])
    both = sorted(set(old_calls) & set(new_calls))
    result = ChangedCode(package, older[0], newer[0], len(both), native_below=package in COMPILED)
    parsed: dict[tuple[str, str], dict[str, str]] = {}

    def source(side: str, sources: dict[str, str], file: str, qualname: str) -> str | None:
        if (side, file) not in parsed:
            parsed[(side, file)] = function_sources(sources.get(file, ""))
        return parsed[(side, file)].get(qualname)

    for file, qualname in both:
        before, after = source("old", old_sources, file, qualname), source("new", new_sources, file, qualname)
        if before is None or after is None or before == after:
            continue
        lines = list(
            difflib.unified_diff(
                before.splitlines(), after.splitlines(), f"{package} {older[0]}", f"{package} {newer[0]}", lineterm=""
            )
        )
        excerpt = lines[:EXCERPT_LINES] + (
            [f"... {len(lines) - EXCERPT_LINES} more lines"] if len(lines) > EXCERPT_LINES else []
        )
        result.changed.append(
            ChangedFunction(
                file, qualname, len(before.splitlines()), len(after.splitlines()), "\n".join(excerpt),
                round(new_calls[(file, qualname)], 3),
            )
        )  # fmt: skip
    result.changed.sort(key=lambda c: -c.when)
    late = sorted(set(new_calls) - set(old_calls), key=lambda k: -new_calls[k])
    result.only_newer = [f"{f}::{q}" for f, q in late]
    result.only_older = [f"{f}::{q}" for f, q in sorted(set(old_calls) - set(new_calls))]
    return result
