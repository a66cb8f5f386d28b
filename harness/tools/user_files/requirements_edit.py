"""A requirements file moved to the pins a way out names, every other byte kept: the specifier of each moved
requirement replaced in place (its extras, environment marker, `--hash` options, `\\` continuations and comments
stay; a local version label such as `+cu121` is carried over to the new release), a package the file does not name
appended, and the file's encoding (UTF-8, UTF-8 or UTF-16 with a byte-order mark) and line ends (LF, CRLF) kept.

`audit --fix` prints the change as a unified diff of the file's text; `--fix --write` writes the file itself in its
own encoding (a UTF-16 file cannot take a UTF-8 patch). What cannot be moved in place (a URL requirement, a pin split
over a continuation) is said, never dropped silently; a moved requirement with `--hash` keeps its hashes, which are of
the old release: pip refuses them until they are made again, and the note says so.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from harness.errors import UsageError
from harness.tools.user_files.pip_requirements import break_args_options, requirement_line, without_comment
from harness.tools.user_files.user_text import read_bytes

#: A byte-order mark and the codec of the text after it.
BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
#: A requirement's name, extras and specifier at the start of its line: what a move rewrites.
_OP = r"(?:===|==|~=|!=|<=|>=|<|>)"
HEAD = re.compile(
    r"^(?P<lead>\s*)(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<extras>\s*\[[^\]]*\])?"
    rf"(?P<spec>\s*{_OP}[^;#\\\s,]*(?:\s*,\s*{_OP}[^;#\\\s,]*)*)?"
)


@dataclass
class Moved:
    """The file before and after the move, how it is written (its byte-order mark and codec), and what could not be
    moved in place."""

    path: Path
    mark: bytes
    codec: str
    before: str
    after: str
    notes: list[str] = field(default_factory=list)

    def diff(self) -> list[str]:
        """The unified diff of the file's text; a CRLF line says so (the file's own line ends are kept by --write)."""
        before = self.before.splitlines(keepends=True)
        after = self.after.splitlines(keepends=True)
        lines = difflib.unified_diff(before, after, str(self.path), str(self.path), n=1)
        return [line.rstrip("\r\n") + (" (CRLF)" if line.endswith("\r\n") else "") for line in lines]

    def write(self) -> None:
        """The moved file, in the file's own encoding, byte-order mark and line ends."""
        self.path.write_bytes(self.mark + self.after.encode(self.codec))


def decoded(path: Path) -> tuple[str, bytes, str]:
    """(text, byte-order mark, codec), as pip decodes a requirements file."""
    data = read_bytes(path)
    mark, codec = next(((m, c) for m, c in BOMS if data.startswith(m)), (b"", "utf-8"))
    try:
        return data[len(mark) :].decode(codec), mark, codec
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (neither UTF-8 nor UTF-16 with a byte-order mark)") from None


def move(path: Path, pins: dict[str, str], environment: dict[str, str]) -> Moved:
    """The file with each pinned package's requirement (the ones whose markers hold in `environment`) moved to its
    pin, and the packages it does not name appended."""
    text, mark, codec = decoded(path)
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if any(line.endswith("\r\n") for line in lines) else "\n"
    notes: list[str] = []
    done: set[str] = set()
    for group in _groups(lines):
        logical = "".join(lines[i].rstrip("\r\n").rstrip("\\") for i in group)
        args, options = break_args_options(without_comment(logical))
        if not args:
            continue
        where = f"{path.name}:{group[0] + 1}"
        try:
            read = requirement_line(where, args, environment, False)
        except UsageError:
            continue  # what the reader refused it already said; nothing here moves it
        name = canonicalize_name(read.name) if read.name else None
        if name not in pins or not read.holds:
            continue
        done.add(name)
        if read.url or read.editable:
            notes.append(f"{where}: {name} is given by URL or as editable: move it to {pins[name]} by hand")
            continue
        if not _rewrite(lines, group[0], name, pins[name]):
            notes.append(f"{where}: {name}'s pin is not on its first line: set it to =={pins[name]} by hand")
            continue
        if "--hash" in options:
            notes.append(f"{where}: {name}'s --hash values are of the release it had: make them again with the tool "
                         "that wrote them (pip-compile or uv pip compile --generate-hashes)")  # fmt: skip
    missing = [p for p in pins if p not in done]
    if missing:
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += newline
        lines += [f"{p}=={pins[p]}{newline}" for p in missing]
    return Moved(path, mark, codec, text, "".join(lines), notes)


def _groups(lines: list[str]) -> list[list[int]]:
    """Physical line indexes of each logical line: a line ending in `\\` (not a comment) continues on the next."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for index, line in enumerate(lines):
        raw = line.rstrip("\r\n")
        pending.append(index)
        if not raw.endswith("\\") or raw.lstrip().startswith("#"):
            groups.append(pending)
            pending = []
    if pending:
        groups.append(pending)
    return groups


def _rewrite(lines: list[str], index: int, name: str, release: str) -> bool:
    """Replace the specifier of the requirement at the start of line `index` by `==release` (its local label kept);
    False where the line does not start with that requirement's pin."""
    line = lines[index]
    found = HEAD.match(line)
    if found is None or canonicalize_name(found.group("name")) != name or not found.group("spec"):
        return False
    spec = found.group("spec")
    local = re.search(r"==\s*[^\s,;+]+(\+[A-Za-z0-9.]+)", spec)
    space = spec[: len(spec) - len(spec.lstrip())]
    new = f"{space}=={release}{local.group(1) if local else ''}"
    lines[index] = line[: found.start("spec")] + new + line[found.end("spec") :]
    return True
