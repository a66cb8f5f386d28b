"""Whether a way out's stack installs as its releases declare: a moved release whose Requires-Dist refuses a release
of the stack (transformers 5.15.0 needs torch>=2.5 and accelerate>=1.1.0) brings the nearest measured release that it
admits along, or is no way out. The declarations come with the judge's tables (`versions/declared.py` read them from
the wheels); a release whose declaration was not read constrains nothing. Release numbers only, as `judge.key`
compares them: the page's port (`site_judge.js`) reads specifiers the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.knowledge.broken import measured_broken
from harness.knowledge.judge import key, prefix_bounds

#: How many releases one way out may bring along for what the moved ones declare.
MOST_BROUGHT = 4


def admits(specifier: str, version: str) -> bool:
    """Whether a PEP 440 specifier ('<3,>=2.3', '~=1.1', '==2.4.*') admits the release, by its release numbers."""
    have = key(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        op = next(o for o in ("===", "~=", "==", "!=", "<=", ">=", "<", ">") if clause.startswith(o))
        want = clause[len(op) :].strip()
        if not _clause(op, want, version, have):
            return False
    return True


def _clause(op: str, want: str, version: str, have: tuple[int, ...]) -> bool:
    if op == "===":
        return version == want
    if op in ("==", "!=") and want.endswith(".*"):
        low, high = prefix_bounds(want[:-2])
        inside = low <= have < high
        return inside if op == "==" else not inside
    at = key(want)
    if op == "~=":
        low, high = prefix_bounds(want.rsplit(".", 1)[0])
        return have >= at and low <= have < high
    return {"==": have == at, "!=": have != at, "<=": have <= at, ">=": have >= at, "<": have < at, ">": have > at}[op]


def refusal(
    declared: Mapping[str, Any], stack: Mapping[str, str], moved: Mapping[str, str]
) -> tuple[str, str, str] | None:
    """(package, the package it refuses, its specifier): the first declaration of the stack that refuses a release
    of it, where one side was moved (the user's own releases refusing each other is not the way out's doing)."""
    for needer in sorted(stack):
        for dep, specifier in sorted((declared.get(needer) or {}).get(stack[needer], {}).items()):
            if dep in stack and (needer in moved or dep in moved) and not admits(specifier, stack[dep]):
                return needer, dep, specifier
    return None


def complete(tables: Mapping[str, Any], versions: Mapping[str, str], moved: Mapping[str, str]) -> dict[str, str] | None:
    """The moves with the releases they bring along so that every declaration of the stack is met (each the nearest
    measured release that does, upgrades first), or None where no measured release does."""
    declared = tables.get("declared") or {}
    moves = dict(moved)
    for _ in range(MOST_BROUGHT + 1):
        stack = dict(versions) | moves
        found = refusal(declared, stack, moves)
        if found is None:
            return moves
        needer, dep, specifier = found
        if dep not in moves:  # the moved release needs another release of `dep`
            choices = [v for v in tables["releases"].get(dep, []) if admits(specifier, v)]
            target = dep
        elif needer not in moves:  # the user's release of `needer` refuses the moved `dep`: move it to one that admits
            mine = declared.get(needer) or {}
            choices = [
                v for v in tables["releases"].get(needer, []) if v in mine and admits(mine[v].get(dep, ""), stack[dep])
            ]
            target = needer
        else:
            return None  # two moved releases refuse each other
        choices = [v for v in choices if not measured_broken(tables, versions, moves | {target: v}, involving=target)]
        if not choices:
            return None
        have = key(versions[target]) if target in versions else None
        moves[target] = min(choices, key=lambda v: (distance(v, have), key(v)))
    return None


def distance(version: str, have: tuple[int, ...] | None) -> tuple[int, tuple[int, ...]]:
    """Upgrades first (the nearest first), then downgrades (the nearest first): how the way out orders its moves."""
    if have is None:
        return (0, key(version))
    at = key(version)
    if at > have:
        return (0, tuple(a - b for a, b in zip(at, have, strict=True)))
    return (1, tuple(b - a for a, b in zip(at, have, strict=True)))
