"""Run a user's script as `python script.py` would, and note what ended it: `python -m compat_matrix_run SCRIPT ARGS`.

`harness/execution/script_launch.py` starts a script through this module (under torchrun too: `-m compat_matrix_run`),
with this folder first on PYTHONPATH. It runs the script as `__main__` (`runpy.run_path`: its own `sys.argv`, its
folder first on `sys.path`), and records in `$COMPAT_MATRIX_SETUP_DIR/ended-<rank>.json` what ended it:
- an uncaught exception: its type and message as Python prints them, the whole traceback, and the frames of the
  script's own file (outermost first: the point of the script where it ended);
- `SystemExit` (`sys.exit(...)`, `exit()`, `raise SystemExit`): its code, or its message;
- the end of the script (it ran to its last line).
Then it lets the exception go on as it would have: Python prints the same message and exits with the same code. A
traceback that a library printed and went past is not what ended the script, and this record says so. Nothing here
may change what the script does: every note is guarded.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from typing import Any


def _frames(exc: BaseException, script: str) -> list[dict[str, Any]]:
    """The traceback's frames in the script's own file, outermost first (a line, and the function it is in)."""
    found = []
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.abspath(frame.filename) == script:
            found.append({"line": frame.lineno, "function": frame.name, "text": (frame.line or "")[:200]})
    return found


def _record(kind: str, exc: BaseException | None, script: str) -> None:
    out = os.environ.get("COMPAT_MATRIX_SETUP_DIR")
    if not out:
        return
    try:
        entry: dict[str, Any] = {"kind": kind, "pid": os.getpid()}
        if exc is not None:
            entry["frames"] = _frames(exc, script)
        if kind == "exception" and exc is not None:
            entry["exception"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:6000]
            entry["type"] = _type_name(type(exc))
            entry["message"] = str(exc)[:6000]
            entry["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-12000:]
        elif kind == "exit" and isinstance(exc, SystemExit):
            code = exc.code
            entry["code"] = code if code is None or isinstance(code, int) else str(code)[:6000]
        path = os.path.join(out, f"ended-{os.environ.get('RANK', '0')}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(entry, handle, default=str)
        os.replace(path + ".tmp", path)
    except Exception:
        pass


def _type_name(kind: type) -> str:
    """The exception's type as Python prints it ('RuntimeError', 'torch.utils.checkpoint.CheckpointError')."""
    module = getattr(kind, "__module__", "") or ""
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m compat_matrix_run SCRIPT [ARGS...]")
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)  # as `python script.py` puts the script's folder first
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        _record("exit", exc, script)
        raise
    except BaseException as exc:
        _record("exception", exc, script)
        raise
    _record("end", None, script)


if __name__ == "__main__":
    main()
