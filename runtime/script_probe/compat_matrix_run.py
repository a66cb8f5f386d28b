"""Run a user's script as `python script.py` would, and note what ended it: `python -m compat_matrix_run SCRIPT ARGS`.

`harness/execution/script_launch.py` starts a script through this module (under torchrun too: `-m compat_matrix_run`),
with this folder first on PYTHONPATH. It runs the script as `__main__` (`runpy.run_path`: its own `sys.argv`, its
folder first on `sys.path`), and records in `$COMPAT_MATRIX_SETUP_DIR/ended-<rank>.json` what ended it:
- an uncaught exception: its type and message as Python prints them, the whole traceback, and the frames of the
  script's own file (outermost first: the point of the script where it ended);
- `SystemExit` (`sys.exit(...)`, `exit()`, `raise SystemExit`): its code, or its message;
- the end of the script (it ran to its last line);
and, in every case, the last line the script itself printed (`said`: on stdout or stderr, written by a frame of the
script's own file, through `print`, `logging` or a stream's `write`): what a plain `sys.exit(1)` ends on. A warning or
a traceback a library prints (on import, or a child process writing to the inherited streams) is not the script's
own line and never becomes it. The streams keep their type; only their `write` is watched.
Then it lets the exception go on as it would have: Python prints the same message and exits with the same code. A
traceback that a library printed and went past is not what ended the script, and this record says so. Nothing here
may change what the script does: every note is guarded.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import sysconfig
import traceback
from typing import Any

#: The last complete line the script's own code wrote, and each stream's line it is still writing.
_said: dict[str, str] = {}
_STDLIB = tuple(
    os.path.abspath(p) + os.sep
    for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")}
    if p
)


def _own_frame(script: str) -> bool:
    """Whether the code writing now is the script's own: the first frame above the write that is not the standard
    library's (print is C; logging, warnings and traceback are the library's means, not its author) is in the
    script's file."""
    try:
        frame = sys._getframe(2)
    except ValueError:
        return False
    while frame is not None:
        name = frame.f_code.co_filename
        here = os.path.abspath(name) if not name.startswith("<") else name
        stdlib = here.startswith(_STDLIB) and "-packages" not in here
        if not (stdlib or name.startswith("<frozen") or here == _RUNNER):
            return here == script
        frame = frame.f_back
    return False


def _watch(stream: Any, which: str, script: str) -> None:
    """Note each line `stream` gets from the script's own code (its `write` only: the stream object is the same)."""
    real = stream.write

    def write(text: Any) -> Any:
        written = real(text)
        try:
            if isinstance(text, str) and text and _own_frame(script):
                *done, rest = (_said.get(which, "") + text).split("\n")
                said = [line for line in done if line.strip()]
                if said:
                    _said["last"] = said[-1][-6000:]
                _said[which] = rest[-6000:]
                # Which is newest: a line this stream leaves unfinished, or the last complete one.
                _said["newest"] = which if rest.strip() else "last"
        except Exception:
            pass
        return written

    try:
        stream.write = write
    except Exception:
        pass


def _said_last() -> str | None:
    """The last line the script itself printed (a line it left unfinished, where that is the newest)."""
    return _said.get(_said.get("newest", "last")) or _said.get("last")


_RUNNER = os.path.abspath(__file__)


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
        said = _said_last()
        entry["said"] = said.strip()[:6000] if said is not None else None  # None: it printed no line of its own
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
    for which in ("stdout", "stderr"):
        stream = getattr(sys, which, None)
        if stream is not None:
            _watch(stream, which, script)
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
