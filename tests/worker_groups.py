"""Which tests share a pytest-xdist worker under `nox -s tests` (`-n 2 --dist loadgroup`).

A fixture of this suite that is shared (session or module scope: the `ci` run, a module's fault run, a Slurm
cluster) is made once per worker that needs it. So every module whose tests use a shared session fixture runs in one
worker, and every module whose tests use a shared module fixture runs whole in one worker; the other tests are dealt
out one by one, after the groups. Without the groups, both workers made the `ci` run and the fault run, at once.

xdist groups by a suffix on each test's node id (`<id>@<group>`). It sets that suffix itself for tests marked
`xdist_group`, but from pytest 9.2 a node id is read from `Node._id` and xdist's assignment (`_nodeid`) no longer
takes: the tests were dealt out as if unmarked, silently (pytest-dev/pytest-xdist#1386). The suffix is set here,
on whichever attribute the installed pytest reads, and checked.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: The group of every module that uses a shared session fixture of this suite.
SESSION_GROUP = "session-fixtures"


def assign(config: pytest.Config, items: list[pytest.Item], root: Path = TESTS) -> None:
    """Under `--dist loadgroup`, put each test in its group (see the module's docstring; shared fixtures are those
    defined under `root`); otherwise do nothing."""
    if not config.getoption("loadgroup", default=False):
        return
    groups: dict[str, str] = {}
    for item in items:
        for scope in _shared_scopes(item, root):
            module = _module(item)
            if scope == "session" or groups.get(module) != SESSION_GROUP:
                groups[module] = SESSION_GROUP if scope == "session" else module
    for item in items:
        group = groups.get(_module(item))
        if group is not None:
            _set_group(item, group)
    # xdist hands out work in collection order: the groups first (the session group is the longest), so no worker
    # is left starting the `ci` run while the other has nothing more to take.
    items.sort(key=lambda item: _order(groups.get(_module(item))))


def _order(group: str | None) -> int:
    return 0 if group == SESSION_GROUP else 1 if group else 2


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _shared_scopes(item: pytest.Item, root: Path) -> set[str]:
    """The scopes of the shared fixtures of this suite (not a plugin's, such as tmp_path_factory) the test uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {
        definitions[-1].scope
        for definitions in info.name2fixturedefs.values()
        if definitions and definitions[-1].scope in ("session", "module") and _defined_under(definitions[-1].func, root)
    }


def _defined_under(function: object, root: Path) -> bool:
    try:
        source = inspect.getsourcefile(function)  # type: ignore[arg-type]
    except TypeError:
        return False
    return source is not None and Path(source).resolve().is_relative_to(root)


def _set_group(item: pytest.Item, group: str) -> None:
    wanted = f"{item.nodeid}@{group}"
    if item.nodeid.endswith(f"@{group}"):
        return
    if hasattr(item, "_id"):  # pytest >= 9.2: the node id is str(item._id), a NodeId
        item._id = type(item._id).parse(wanted)
    else:
        item._nodeid = wanted
    if item.nodeid != wanted:
        raise pytest.UsageError(
            f"cannot put {item.nodeid} in the worker group {group!r} with this pytest: run with -n 0 (one process)"
        )
