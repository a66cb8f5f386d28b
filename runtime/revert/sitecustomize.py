"""Some functions of one package put back as another release wrote them, in every process of a run: how `findings
--blame` asks "is this changed function the cause?" (the newer release with its source reverted, run again).

With `COMPAT_MATRIX_REVERT` naming a JSON plan ({"functions": [{"module", "qualname", "source", "bindings"}],
"modules": [{"module", "source"}]}) and this folder first on PYTHONPATH, each listed module is patched as it is
imported: a listed function or method (`Class.method`, decorators included) is compiled again from the plan's source in
the module's own namespace, `super()` bound to its class, and set in place of the newer one (or beside the newer ones,
where the newer release removed it: a helper it needs); then each of its `bindings` (a module-level statement of the
other release that binds a name it uses: an import, a constant) is executed in the module where the module lacks
that name, so a function that imports what its new module no longer does still finds it. A binding that cannot be
made is noted (`unbound`), not a failure: the function runs as far as it gets without it. A listed module is executed
from the other release's source whole. Each process writes what it applied and what it could not
(`revert-<pid>.json` in `COMPAT_MATRIX_REVERT_REPORT`): a revert that could not be applied is no evidence either way.
Another `sitecustomize` later on the path is still run (the call tracer's, for one).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import textwrap
from typing import Any

_PLAN_FILE = os.environ.get("COMPAT_MATRIX_REVERT")
_REPORT_DIR = os.environ.get("COMPAT_MATRIX_REVERT_REPORT")
_applied: list[str] = []
_failed: list[dict[str, str]] = []
_unbound: list[dict[str, str]] = []


def _compiled(module: Any, qualname: str, source: str) -> tuple[Any, str, Any]:
    """(the object that holds it, its name, the function compiled from `source` in the module's namespace)."""
    *path, name = qualname.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    body = textwrap.indent(textwrap.dedent(source), "    ")
    maker = f"def __compat_matrix_make(__class__):\n{body}\n    return {name}\n"
    scope: dict[str, Any] = {}
    exec(compile(maker, f"<reverted {module.__name__}.{qualname}>", "exec"), module.__dict__, scope)
    function = scope["__compat_matrix_make"](owner if isinstance(owner, type) else None)
    # Its own name in what it raises ("Accelerator.__init__() got an unexpected keyword argument"), not the maker's:
    # a failure the put-back code gives is then the failure the release gives.
    target = getattr(function, "__func__", function)
    if hasattr(target, "__code__"):
        target.__qualname__ = qualname
        if hasattr(target.__code__, "co_qualname"):
            target.__code__ = target.__code__.replace(co_qualname=qualname)
    return owner, name, function


def _patch(module: Any, functions: list[dict[str, Any]]) -> None:
    for item in functions:
        # The names it uses first: a decorator or a default value reads them as the def is compiled.
        for binding in item.get("bindings") or []:
            if binding["name"] not in module.__dict__:
                _bind(module, binding)
        where = f"{item['module']}.{item['qualname']}"
        try:
            owner, name, function = _compiled(module, item["qualname"], item["source"])
            setattr(owner, name, function)
            _applied.append(where)
        except Exception as exc:  # not applied: said, never silent
            _failed.append({"what": where, "error": f"{type(exc).__name__}: {exc}"})


def _bind(module: Any, binding: dict[str, str]) -> None:
    try:
        code = compile(binding["statement"], f"<binding {module.__name__}.{binding['name']}>", "exec")
        exec(code, module.__dict__)
    except Exception as exc:  # left unbound: the function runs as far as it gets without it
        _unbound.append({"name": f"{module.__name__}.{binding['name']}", "error": f"{type(exc).__name__}: {exc}"})


class _Loader(importlib.abc.Loader):
    def __init__(self, real: Any, functions: list[dict[str, Any]], whole: str | None) -> None:
        self.real, self.functions, self.whole = real, functions, whole

    def create_module(self, spec: Any) -> Any:
        return self.real.create_module(spec) if hasattr(self.real, "create_module") else None

    def exec_module(self, module: Any) -> None:
        if self.whole is not None:
            exec(compile(self.whole, module.__spec__.origin or module.__name__, "exec"), module.__dict__)
            _applied.append(f"{module.__name__} (whole module)")
        else:
            self.real.exec_module(module)
        _patch(module, self.functions)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, plan: dict[str, Any]) -> None:
        self.functions: dict[str, list[dict[str, Any]]] = {}
        for item in plan.get("functions", []):
            self.functions.setdefault(item["module"], []).append(item)
        self.modules = {item["module"]: item["source"] for item in plan.get("modules", [])}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        # Another finder that asks every other finder (the script probe's) asks this one back while it is asking:
        # the second ask is left to the others, or the two would ask each other without end.
        if fullname in _BUSY or (fullname not in self.functions and fullname not in self.modules):
            return None
        _BUSY.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self.functions.get(fullname, []), self.modules.get(fullname))
                    return spec
            return None
        finally:
            _BUSY.discard(fullname)


#: The modules this finder is looking up now (see `_Finder.find_spec`).
_BUSY: set[str] = set()


def _report() -> None:
    if not _REPORT_DIR:
        return
    try:
        path = os.path.join(_REPORT_DIR, f"revert-{os.getpid()}.json")
        with open(path, "w") as handle:
            json.dump({"pid": os.getpid(), "applied": _applied, "failed": _failed, "unbound": _unbound}, handle)
    except OSError:
        pass


def _chain_next_sitecustomize() -> None:
    # Only the entries after this one's: two of ours that each ran the first other one would run each other forever.
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(entry or ".") for entry in sys.path]
    for entry in entries[entries.index(here) + 1 :] if here in entries else entries:
        candidate = os.path.join(entry, "sitecustomize.py")
        if entry == here or not os.path.isfile(candidate):
            continue
        spec = importlib.util.spec_from_file_location("_compat_matrix_next_sitecustomize_after_revert", candidate)
        if spec and spec.loader:
            try:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except Exception:
                pass
        return


if _PLAN_FILE:
    import atexit

    with open(_PLAN_FILE) as _handle:
        sys.meta_path.insert(0, _Finder(json.load(_handle)))
    atexit.register(_report)
_chain_next_sitecustomize()
