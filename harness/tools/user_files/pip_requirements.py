"""A requirements file read with pip's own grammar (pip's `req_file.py` and `req/constructors.py`, ported): lines
ending in `\\` joined to the next, comments cut where pip cuts them (`#` at the start or after whitespace), `${VAR}`
expanded, the line split into the requirement and its options where the first word starts with `-` (so `--hash` may
follow on the same line), the options read as pip's option parser reads them (an option pip does not know is bad
input), `-r`/`-c` followed relative to the including file, and each requirement read as pip reads it: PEP 508 with
its environment markers, `name @ URL`, a bare URL or archive path (a wheel named by its file name, an sdist by its file
name's version, as it installs), `-e`. Markers are evaluated for one target (`target.py`): a line whose markers do not
hold there is not installed there. tests/test_pip_requirements.py holds this to pip's own parser.
"""

from __future__ import annotations

import os
import re
import shlex
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from harness.errors import UsageError
from harness.tools.user_files.user_text import read_text, shown

#: How deep `-r other.txt` includes are followed (a loop of includes is bad input).
MOST_INCLUDES = 8
#: At most this many logical lines (a `pip freeze` has hundreds; more is no requirements file, and would be slow).
MOST_LINES = 20_000
#: A logical line (continuations joined) longer than this is no requirement (a line of hashes of a package with many
#: wheels runs to tens of thousands of characters).
LONGEST_LINE = 1024 * 1024

COMMENT = re.compile(r"(^|\s+)#.*$")
#: Where pip's COMMENT.sub cuts a line, found without its backtracking over a long run of spaces: the first `#` at the
#: start or after whitespace (what stands between is whitespace, which the strip after it drops too).
COMMENT_START = re.compile(r"(?:^|(?<=\s))#")
ENV_VAR = re.compile(r"(?P<var>\$\{(?P<name>[A-Z0-9_]+)\})")
#: pip's URL schemes (`is_url`): the web, files and the version control systems pip installs from.
VCS = ("git", "hg", "svn", "bzr")
URL_SCHEMES = {"http", "https", "file", "ftp", "git", "hg", "svn",
               *(f"{v}+{s}" for v in VCS for s in ("http", "https", "ssh", "file", "git", "svn", "sftp", "ftp", "lp",
                                                    "static-http"))}  # fmt: skip
ARCHIVES = (".whl", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tlz", ".tar.lz", ".tar.lzma", ".tar.gz", ".tgz", ".tar",
            ".zip")  # fmt: skip
#: pip's requirements-file options: the ones that take a value, and the flags.
VALUED = {"-i": "--index-url", "-c": "--constraint", "-r": "--requirement", "-e": "--editable", "-f": "--find-links",
          "--index-url": "", "--extra-index-url": "", "--constraint": "", "--requirement": "", "--editable": "",
          "--find-links": "", "--no-binary": "", "--only-binary": "", "--trusted-host": "", "--use-feature": "",
          "--global-option": "", "--hash": "", "--config-settings": "", "-C": "--config-settings"}  # fmt: skip
FLAGS = {"--no-index", "--prefer-binary", "--require-hashes", "--pre"}
LONG = sorted({*(k for k in VALUED if k.startswith("--")), *FLAGS})


@dataclass
class Line:
    """One requirement as pip reads it: the package (canonical; None where pip learns it only by building), its
    specifier, the release it installs where one is named (a `==` pin, a wheel's or an sdist's file name), its marker
    and whether it holds for the target, and where it stands."""

    where: str
    text: str
    name: str | None = None
    specifier: SpecifierSet = field(default_factory=SpecifierSet)
    release: str | None = None
    named_by: str = ""  # "" (a pin), "wheel file name", "sdist file name"
    marker: str | None = None
    holds: bool = True
    url: str | None = None
    editable: bool = False
    constraint: bool = False
    extras: bool = False


@dataclass
class ReadFile:
    """Every requirement of a file and the files it includes, in order."""

    lines: list[Line] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    options: set[str] = field(default_factory=set)


def read_requirements(path: Path, environment: dict[str, str]) -> ReadFile:
    """Every requirement line of the file and its includes, markers evaluated in `environment`."""
    found = ReadFile()
    _read(path, environment, found, depth=0, constraint=False)
    return found


def _read(path: Path, environment: dict[str, str], found: ReadFile, depth: int, constraint: bool) -> None:
    found.files.append(path)
    for number, line in logical_lines(path, read_text(path)):
        args, options = break_args_options(line)
        opts = parse_options(f"{path}:{number}", options)
        found.options |= set(opts)
        where = f"{path.name}:{number}"
        if args:
            found.lines.append(requirement_line(where, args, environment, constraint))
        elif opts.get("--editable"):
            found.lines.append(editable_line(where, opts["--editable"][0], constraint))
        elif opts.get("--requirement") or opts.get("--constraint"):
            nested = bool(not opts.get("--requirement"))
            name = (opts.get("--requirement") or opts["--constraint"])[0]
            if depth >= MOST_INCLUDES:
                raise UsageError(f"{where}: -r {shown(name)}: includes nested deeper than {MOST_INCLUDES} (a loop?)")
            if re.match(r"^(https?|file):", name, re.I):
                raise UsageError(f"{where}: -r {shown(name)}: an include over the network: not read (give that file)")
            included = path.parent / name
            if not included.exists():
                raise UsageError(f"{where}: -r {shown(name)}: no such file ({included})")
            _read(included, environment, found, depth + 1, nested)


def logical_lines(path: Path, text: str) -> list[tuple[int, str]]:
    """pip's preprocess: split (str.splitlines), join continuations, cut comments, drop empty lines, expand ${VAR}."""
    joined: list[tuple[int, str]] = []
    pending: list[str] = []
    first = 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.endswith("\\") or COMMENT.match(raw):
            if COMMENT.match(raw):
                raw = " " + raw
            if pending:
                pending.append(raw)
                joined.append((first, "".join(pending)))
                pending = []
            else:
                joined.append((number, raw))
        else:
            if not pending:
                first = number
            pending.append(raw.strip("\\"))
        if len(joined) > MOST_LINES:
            raise UsageError(f"{path}: more than {MOST_LINES:,} lines: not a requirements file this tool reads")
    if pending:
        joined.append((first, "".join(pending)))
    lines = []
    for number, raw in joined:
        if len(raw) > LONGEST_LINE:
            raise UsageError(f"{path}:{number}: a line of {len(raw):,} characters: not a requirement "
                             f"({shown(raw.strip(), 60)})")  # fmt: skip
        line = without_comment(raw)
        if not line:
            continue
        for var, name in ENV_VAR.findall(line):
            value = os.environ.get(name)
            if value:
                line = line.replace(var, value)
        lines.append((number, line))
    return lines


def without_comment(raw: str) -> str:
    """pip's `COMMENT.sub("", line).strip()`, in linear time."""
    found = COMMENT_START.search(raw)
    return (raw[: found.start()] if found else raw).strip()


def break_args_options(line: str) -> tuple[str, str]:
    """pip's split: the words before the first one that starts with `-` are the requirement, the rest options."""
    tokens = line.split(" ")
    args = []
    for token in tokens:
        if token.startswith("-"):
            break
        args.append(token)
    return " ".join(args), " ".join(tokens[len(args) :])


def parse_options(where: str, options: str) -> dict[str, list[str]]:
    """The options as pip's optparse reads them: `--opt=value`, `--opt value`, `-rfile`, `-r file`, a long option's
    unique prefix; an option pip does not know (or one without its value) is bad input."""
    try:
        words = shlex.split(options)
    except ValueError as exc:
        raise UsageError(f"{where}: could not split the options {shown(options)}: {exc}") from None
    found: dict[str, list[str]] = {}
    at = 0
    while at < len(words):
        word = words[at]
        at += 1
        if word == "--":
            break
        if not word.startswith("-") or word == "-":
            continue  # pip's option parser leaves other words aside
        value: str | None = None
        if word.startswith("--"):
            name, eq, rest = word.partition("=")
            if name not in VALUED and name not in FLAGS:
                matches = [o for o in LONG if o.startswith(name)]
                if len(matches) != 1:
                    said = "is ambiguous" if matches else "is no option pip reads in a requirements file"
                    raise UsageError(f"{where}: {shown(name, 40)} {said}")
                name = matches[0]
            value = rest if eq else None
            if name in FLAGS:
                if eq:
                    raise UsageError(f"{where}: {name} takes no value")
                found.setdefault(name, []).append("")
                continue
        else:
            name, rest = word[:2], word[2:]
            if name not in VALUED:
                raise UsageError(f"{where}: {shown(name, 40)} is no option pip reads in a requirements file")
            value = rest or None
            name = VALUED[name]
        if value is None:
            if at >= len(words):
                raise UsageError(f"{where}: {name} requires a value")
            value = words[at]
            at += 1
        found.setdefault(name, []).append(value)
    return found


def is_url(text: str) -> bool:
    return ":" in text and text.split(":", 1)[0].lower() in URL_SCHEMES


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.startswith(".")


def requirement_line(where: str, text: str, environment: dict[str, str], constraint: bool) -> Line:
    """One requirement, as pip's `parse_req_from_line` reads it."""
    line = Line(where, text, constraint=constraint)
    name = text
    separator = "; " if is_url(text) else ";"
    if separator in name:
        name, said = name.split(separator, 1)
        said = said.strip()
        if said:
            line.marker = said
            line.holds = _holds(where, said, environment)
    name = name.strip()
    link = None
    if is_url(name):
        link = name
    else:
        path, extras = _strip_extras(name)
        before = name.split("@", 1)
        if path.lower().endswith(ARCHIVES) and (len(before) < 2 or _looks_like_path(before[0])):
            link = path  # an archive's path (pip: a PEP 508 `name @ URL` when what stands before `@` is no path)
            line.extras = bool(extras)
        elif _looks_like_path(name) and not _is_requirement(name):
            line.url = name  # a local directory: what it installs is known only by building it
            return line
    if link is not None:
        line.url = link
        filename = _filename(link)
        wheel = _wheel(where, filename) if filename.lower().endswith(".whl") else None
        if wheel:
            line.name, line.release, line.named_by = wheel[0], wheel[1], "wheel file name"
            line.specifier = SpecifierSet(f"=={wheel[1]}")
        else:
            egg = re.search(r"[#&]egg=([^&]*)", link)
            line.name = str(canonicalize_name(egg.group(1))) if egg and egg.group(1) else None
            _by_sdist(line, filename)
        return line
    try:
        requirement = Requirement(name)
    except InvalidRequirement as exc:
        hint = " (= is no operator: ==?)" if "=" in name and not re.search(r"[<>!~=]=|[<>]", name) else ""
        raise UsageError(f"{where}: {shown(name)} is not a requirement{hint} "
                         f"({str(exc).splitlines()[0][:120]})") from None  # fmt: skip
    line.name = str(canonicalize_name(requirement.name))
    line.specifier = requirement.specifier
    for spec in requirement.specifier:  # each version as packaging reads it when it compares (a 5,000-digit number
        if spec.operator != "===":  # is no version it can read)
            try:
                Version(spec.version.removesuffix(".*"))
            except ValueError:
                raise UsageError(f"{where}: {shown(spec.version, 60)} is not a version packaging reads") from None
    line.extras = bool(requirement.extras)
    if requirement.url:
        line.url = requirement.url
        filename = _filename(requirement.url)
        wheel = _wheel(where, filename) if filename.lower().endswith(".whl") else None
        if wheel and wheel[0] == line.name:
            line.release, line.named_by = wheel[1], "wheel file name"
        else:
            _by_sdist(line, filename)
        return line
    exact = [s for s in requirement.specifier if s.operator in ("==", "===") and "*" not in s.version]
    if exact:
        line.release = exact[0].version
    return line


def _is_requirement(text: str) -> bool:
    try:
        Requirement(text)
    except InvalidRequirement:
        return False
    return True


def editable_line(where: str, target: str, constraint: bool) -> Line:
    """`-e URL#egg=name` or `-e path`: installed from source, its release known only by building it."""
    egg = re.search(r"[#&]egg=([^&]*)", target)
    name = str(canonicalize_name(egg.group(1))) if egg and egg.group(1) else None
    return Line(where, f"-e {target}", name=name, url=target, editable=True, constraint=constraint)


def _strip_extras(text: str) -> tuple[str, str | None]:
    found = re.match(r"^(.+)(\[[^\]]+\])$", text)
    return (found.group(1), found.group(2)) if found else (text, None)


def _filename(link: str) -> str:
    path = urllib.parse.unquote(urllib.parse.urlsplit(link).path) if is_url(link) else link
    return path.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]


def _wheel(where: str, filename: str) -> tuple[str, str] | None:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except (InvalidWheelFilename, ValueError):
        raise UsageError(f"{where}: {shown(filename)} is not a wheel's file name") from None
    return str(name), str(version)


def _by_sdist(line: Line, filename: str) -> None:
    """An sdist's release from its file name (`deepspeed-0.15.4.tar.gz`): what building it installs."""
    lower = filename.lower()
    extension = next((e for e in ARCHIVES if lower.endswith(e) and e != ".whl"), None)
    if extension is None:
        return
    stem = filename[: -len(extension)]
    name, dash, version = stem.rpartition("-")
    if not dash or not name:
        return
    try:
        release = str(Version(version))
    except ValueError:  # InvalidVersion, or a number of more digits than int() converts
        return
    said = str(canonicalize_name(name))
    if line.name is None or line.name == said:
        line.name, line.release, line.named_by = said, release, "sdist file name"


def _holds(where: str, said: str, environment: dict[str, str]) -> bool:
    try:
        return Marker(said).evaluate(dict(environment))
    except InvalidMarker as exc:
        raise UsageError(f"{where}: {shown(said)} is not an environment marker "
                         f"({str(exc).splitlines()[0][:120]})") from None  # fmt: skip
    except (UndefinedComparison, UndefinedEnvironmentName) as exc:
        raise UsageError(f"{where}: the marker {shown(said)} cannot be evaluated ({exc})") from None


def describe(line: Line) -> dict[str, Any]:
    """A line as data (tests compare it with pip's own reading)."""
    return {"name": line.name, "specifier": str(line.specifier), "release": line.release, "marker": line.marker,
            "holds": line.holds, "url": line.url, "editable": line.editable}  # fmt: skip
