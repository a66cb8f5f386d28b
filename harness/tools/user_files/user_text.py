"""A user's file as bytes, text and data, so that nothing in it can hang or crash the gate: regular files only (a FIFO,
a device or a socket is refused from its type, before it is opened, and opened without blocking in case it changed),
a size limit, decoded as pip decodes a requirements file, and parsed with limits on depth (JSON, TOML, YAML) and on
what YAML's aliases expand to (a "billion laughs" file is refused while its events are counted, before anything is
built). Every refusal is a `UsageError`: one line naming the file, exit 2.
"""

from __future__ import annotations

import json
import os
import reprlib
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.textsafe import one_line

#: The largest requirements file or lockfile read (a real uv.lock of a large workspace is a few MiB).
MOST_BYTES = 8 * 1024 * 1024
#: The largest config (accelerate, DeepSpeed, Trainer, conda): real ones are a few KiB.
MOST_CONFIG_BYTES = 1024 * 1024
#: How deeply a JSON, TOML or YAML document may nest (real configs and locks nest fewer than 10 levels).
MOST_DEPTH = 64
#: How many nodes a YAML document may expand to, aliases counted at the size of what they name.
MOST_YAML_NODES = 200_000
#: Where an error line quotes the user's text, at most this many characters of it.
QUOTED = 80


def shown(value: object, limit: int = QUOTED) -> str:
    """The user's value for an error line: its repr, cut to a readable length (a huge value is never printed whole,
    nor built whole: only its first characters are formatted where it is a long string)."""
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]
    return one_line(_REPR.repr(value), limit)


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = QUOTED, QUOTED, 3, 6, 6


def read_bytes(path: Path, limit: int = MOST_BYTES) -> bytes:
    """The file's bytes: a regular file of at most `limit` bytes, else bad input. The type is checked before the file
    is opened (a FIFO would block the open), and again on the open descriptor (opened with O_NONBLOCK)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    _regular(path, info.st_mode)
    if info.st_size > limit:
        raise UsageError(f"{path}: {_size(info.st_size)}: larger than the {_size(limit)} a file read here may be")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    try:
        _regular(path, os.fstat(descriptor).st_mode)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(descriptor, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    finally:
        os.close(descriptor)
    if size > limit:
        raise UsageError(f"{path}: larger than the {_size(limit)} a file read here may be")
    return b"".join(chunks)


def _regular(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file")  # fmt: skip
    raise UsageError(f"{path}: {kind}, not a regular file: give the file itself")


def _size(count: int) -> str:
    return f"{count / (1024 * 1024):.1f} MiB" if count >= 1024 * 1024 else f"{count:,} bytes"


def read_text(path: Path, limit: int = MOST_BYTES) -> str:
    """The file's text: UTF-8, or UTF-8 / UTF-16 with a byte-order mark (as pip decodes a requirements file);
    anything else is bad input."""
    data = read_bytes(path, limit)
    try:
        if data.startswith(b"\xef\xbb\xbf"):
            text = data.decode("utf-8-sig")
        elif data.startswith((b"\xff\xfe", b"\xfe\xff")):
            text = data.decode("utf-16")
        else:
            text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (neither UTF-8 nor UTF-16 with a byte-order mark)") from None
    if "\x00" in text:
        raise UsageError(f"{path}: not a text file (it holds NUL bytes)")
    return text


# --- data ----------------------------------------------------------------------------------------------------------


def load_json(path: Path, text: str, kinds: str) -> Any:
    """JSON, nested at most MOST_DEPTH deep."""
    return _parsed(path, text, kinds, json.loads)


def load_toml(path: Path, text: str, kinds: str) -> Any:
    """TOML, nested at most MOST_DEPTH deep (tomllib recurses into arrays: a deeper one is refused, not a crash)."""
    return _parsed(path, text, kinds, tomllib.loads)


def _parsed(path: Path, text: str, kinds: str, parse: Callable[[str], Any]) -> Any:
    """`parse(text)`, its errors one line each: too deep (a RecursionError, or past MOST_DEPTH), or not readable (a
    ValueError: JSONDecodeError, TOMLDecodeError, an integer longer than Python converts)."""
    try:
        data = parse(text)
    except RecursionError:
        raise UsageError(f"{path}: not {kinds}: nested deeper than {MOST_DEPTH} levels") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not {kinds}: {_first_line(exc)}") from None
    _depth(path, data, kinds)
    return data


def load_yaml(path: Path, text: str, kinds: str) -> Any:
    """YAML as PyYAML's safe_load reads it, after its events are counted: nested at most MOST_DEPTH deep, at most
    MOST_YAML_NODES nodes with every alias expanded, no alias to a node that holds it, one document."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _yaml_events(path, yaml.parse(text, Loader=loader), kinds)
        data = yaml.load(text, Loader=loader)
    except RecursionError:
        raise UsageError(f"{path}: not {kinds}: nested deeper than {MOST_DEPTH} levels") from None
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # TypeError: an unhashable key ({[1]: 2})
        if "flow level" in str(exc) or "nesting" in str(exc):  # libyaml's own limit on nesting
            raise UsageError(f"{path}: not {kinds}: nested deeper than {MOST_DEPTH} levels") from None
        raise UsageError(f"{path}: not {kinds}: {_first_line(exc)}") from None
    _depth(path, data, kinds)
    return data


def _yaml_events(path: Path, events: Any, kinds: str) -> None:
    """Count the nodes each anchor expands to and the depth, from the event stream (no node is built)."""
    import yaml

    sizes: dict[str, int] = {}
    stack: list[list[Any]] = []  # [anchor, nodes so far]
    total, documents = 0, 0
    for event in events:
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise UsageError(f"{path}: not {kinds}: more than one YAML document in it")
            continue
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MOST_DEPTH:
                raise UsageError(f"{path}: not {kinds}: nested deeper than {MOST_DEPTH} levels")
            stack.append([event.anchor, 1])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, size = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
        elif isinstance(event, yaml.ScalarEvent):
            size = 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in sizes:
                raise UsageError(f"{path}: not {kinds}: alias *{shown(event.anchor, 40)} names no complete node "
                                 "(undefined, or a node that holds it)")  # fmt: skip
            size = sizes[event.anchor]
        else:
            continue
        total += size
        if stack:
            stack[-1][1] += size
        if total > MOST_YAML_NODES:
            raise UsageError(f"{path}: not {kinds}: its aliases expand to more than {MOST_YAML_NODES:,} nodes "
                             "(an alias bomb?)")  # fmt: skip


def _depth(path: Path, data: Any, kinds: str) -> None:
    """Nested at most MOST_DEPTH deep (walked without recursion; what an alias shares is walked once)."""
    seen: set[int] = set()
    todo = [(data, 0)]
    while todo:
        value, depth = todo.pop()
        if not isinstance(value, dict | list) or id(value) in seen:
            continue
        if depth >= MOST_DEPTH:
            raise UsageError(f"{path}: not {kinds}: nested deeper than {MOST_DEPTH} levels")
        seen.add(id(value))
        todo += [(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)]


def _first_line(exc: BaseException) -> str:
    said = str(exc).strip().splitlines()
    return one_line(said[0], 160) if said else type(exc).__name__
