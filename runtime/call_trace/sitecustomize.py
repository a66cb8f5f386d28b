"""Which functions of one package a run executed, recorded in every process of the run (spawned ranks included):
loaded by Python at start-up when this folder is first on PYTHONPATH (`compat-matrix findings verify`), it only
watches.

With `COMPAT_MATRIX_TRACE_PACKAGE` (an import name, 'peft') and `COMPAT_MATRIX_TRACE_DIR` set, a profile hook notes
each code object of that package that is called, and which of them called it; at exit each process writes
`trace-<pid>.json`: the functions (file inside the package, qualified name, first line, the number of the package's
last call into it) in the order first called, the calls between them (`edges`: caller and callee by their index,
what a blame widens a put-back function with), the source of every file they live in (so the two runs of a finding
can be compared function by function without the environments they ran in), and the versions of the packages that
matter, as this process imported them. Another `sitecustomize` later on the path is still run.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import sys
import threading
from typing import Any

_PACKAGE = os.environ.get("COMPAT_MATRIX_TRACE_PACKAGE")
_OUT = os.environ.get("COMPAT_MATRIX_TRACE_DIR")
_MATTER = ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "safetensors", "numpy")
#: code -> the number of the package's last call into it (its place in the dict: the first call).
_seen: dict[Any, int] = {}
_edges: dict[tuple[Any, Any], None] = {}
_count = [0]


def _profile(frame: Any, event: str, arg: Any) -> None:
    if event == "call":
        code = frame.f_code
        if _MARKER in code.co_filename:
            _count[0] += 1
            _seen[code] = _count[0]
            caller = frame.f_back
            if caller is not None and _MARKER in caller.f_code.co_filename:
                _edges[(caller.f_code, code)] = None


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for name in _MATTER:
        if name in sys.modules:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
    return found


def _dump() -> None:
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    try:
        calls, paths = [], {}
        codes = list(_seen)
        index = {code: i for i, code in enumerate(codes)}
        for code in codes:
            start = code.co_filename.rfind(_MARKER)
            relative = code.co_filename[start + 1 :]
            qualname = getattr(code, "co_qualname", code.co_name)
            calls.append({"file": relative, "qualname": qualname, "line": code.co_firstlineno, "last": _seen[code]})
            paths.setdefault(relative, code.co_filename)
        sources = {}
        for relative, path in paths.items():
            try:
                with open(path, encoding="utf-8") as handle:
                    sources[relative] = handle.read()
            except OSError:
                continue
        edges = [[index[a], index[b]] for a, b in list(_edges) if a in index and b in index]
        facts = {"pid": os.getpid(), "versions": _versions(), "calls": calls, "edges": edges, "sources": sources}
        path = os.path.join(_OUT or ".", f"trace-{os.getpid()}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(facts, handle)
        os.replace(path + ".tmp", path)
    except Exception:  # a tracer never breaks the run it watches
        pass


def _chain_next_sitecustomize() -> None:
    # Only the entries after this one's: two of ours that each ran the first other one would run each other forever.
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(entry or ".") for entry in sys.path]
    for entry in entries[entries.index(here) + 1 :] if here in entries else entries:
        candidate = os.path.join(entry, "sitecustomize.py")
        if entry == here or not os.path.isfile(candidate):
            continue
        spec = importlib.util.spec_from_file_location("_compat_matrix_next_sitecustomize", candidate)
        if spec and spec.loader:
            try:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except Exception:
                pass
        return


_MARKER = f"{os.sep}{_PACKAGE}{os.sep}" if _PACKAGE else ""
if _PACKAGE and _OUT:
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    atexit.register(_dump)
_chain_next_sitecustomize()
