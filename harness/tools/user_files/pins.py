"""What a user has installed, read from the files their tools write, as those tools read them: requirements files and
`pip freeze` output with pip's grammar (`pip_requirements.py`), `uv.lock`, `pylock.toml` and `poetry.lock`
(`user_locks.py`), a conda `environment.yml` (`conda_env.py`), or an environment itself. Markers and forks are read for
one target (`target.py`; default: this machine). `audit` reads through here; the page's `site_read.js` reads pasted
files the same way, held to this on shared test vectors.

Each file says what it holds: exact releases, requirements that pin none (judged by the releases the atlas measured in
their range), lines that name no release (a URL of a branch, a directory, `-e`), and whether it names a complete
environment. A lock does; so does a `pip freeze` or a compiled requirements file, told by its form: every requirement
pins one release exactly, and beside each judged package it lists one of the packages that package always installs
(torch's filelock, transformers' huggingface-hub, ...), which a hand-written file does not. In a complete environment
a package it does not list is not installed; elsewhere it is "not given" (torch is often installed apart).

Bad input is one line naming the file and exit 2, never a traceback and never an exit 0 or 1: anything unreadable
(`user_text.py`), two releases of one package for the same target (in one file or in two), a file that names none of
the packages the atlas judges, an input read as nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from harness.define.packages import AXIS_PACKAGES
from harness.errors import NothingToJudge, UsageError
from harness.tools.user_files.conda_env import looks_like_conda, read_conda
from harness.tools.user_files.pip_requirements import (
    Line,
    break_args_options,
    is_url,
    read_requirements,
    requirement_line,
    without_comment,
)
from harness.tools.user_files.target import Target, here
from harness.tools.user_files.user_locks import read_lock
from harness.tools.user_files.user_text import read_text

#: Packages every release of a judged package installs with it: a requirements file that lists one beside each
#: judged package it pins is a `pip freeze` or a compiled file (a complete environment), not a hand-written list.
ALWAYS_WITH = {
    "torch": ("filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec"),
    "transformers": ("huggingface-hub", "tokenizers", "safetensors", "regex", "tqdm", "filelock", "pyyaml"),
    "peft": ("psutil", "safetensors", "huggingface-hub", "tqdm", "pyyaml", "accelerate"),
    "accelerate": ("psutil", "huggingface-hub", "safetensors", "pyyaml", "numpy"),
    "deepspeed": ("hjson", "ninja", "psutil", "py-cpuinfo", "pydantic", "tqdm"),
    "bitsandbytes": ("numpy",),
}


@dataclass
class FileRead:
    """One file: which kind it was read as, the releases it installs on the target, its loose requirements, the lines
    that name no release, whether it is a complete environment, and notes in words (markers, forks, file names)."""

    path: Path
    kind: str
    pins: dict[str, str] = field(default_factory=dict)
    loose: list[str] = field(default_factory=list)
    unnamed: list[str] = field(default_factory=list)
    complete: bool = False
    notes: list[str] = field(default_factory=list)
    #: package -> where its release was read (a line, a lock entry, a file name)
    where: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        judged = {p: v for p, v in self.pins.items()}
        return {
            "file": str(self.path), "kind": self.kind, "complete": self.complete,
            "packages": [{"name": p, "version": v, "judged": p in AXIS_PACKAGES} for p, v in sorted(judged.items())],
            "loose": list(self.loose), "not_judged": list(self.unnamed), "notes": list(self.notes),
            "not_installed": sorted(p for p in AXIS_PACKAGES if self.complete and p not in self.pins),
        }  # fmt: skip


@dataclass
class Pins:
    """Exact releases, the requirements that pin none, and whether the input need not name every package installed (a
    requirements file: torch is often installed apart); each file as it was read, and the target it was read for."""

    pins: dict[str, str] = field(default_factory=dict)
    loose: list[str] = field(default_factory=list)
    partial: bool = False
    #: The requirements files read (a way out is printed as a diff of them).
    requirements: list[Path] = field(default_factory=list)
    files: list[FileRead] = field(default_factory=list)
    target: Target | None = None
    unnamed: list[str] = field(default_factory=list)


# --- reading one file ----------------------------------------------------------------------------------------------


def read_file(path: Path, target: Target | None = None) -> FileRead:
    """One file, as the tool that wrote it reads it, for the target (default: this machine)."""
    target = target or here()
    text = read_text(path)
    if path.suffix in (".lock", ".toml") or re.search(r"^\s*\[\[(package|packages)\]\]\s*$", text, re.M):
        lock = read_lock(path, text, target.environment(), target.words())
        found = FileRead(path, lock.kind, dict(lock.pins), complete=True, notes=lock.notes)
        found.where = {p: f"{path.name}: [[package]] {p}" for p in found.pins}
    elif looks_like_conda(path, text):
        found = _conda(path, text, target)
    else:
        found = _requirements(path, target)
    if not found.pins and not found.loose and not found.unnamed:
        raise UsageError(f"{path}: read as nothing: no requirement and no locked package in it")
    return found


def _requirements(path: Path, target: Target) -> FileRead:
    read = read_requirements(path, target.environment())
    found = _fold(path, "requirements", read.lines, target)
    if _complete(found, read.lines):
        found.complete = True
        found.notes.append("as pip freeze or a compiled file writes it: every line pins one release, beside what the "
                           "judged packages install; a package it does not list is not installed")  # fmt: skip
    return found


def _conda(path: Path, text: str, target: Target) -> FileRead:
    conda = read_conda(path, text)
    environment = target.environment()
    lines = []
    for where, said in conda.pip_lines:
        args, _ = break_args_options(without_comment(said))
        if args:
            lines.append(requirement_line(where, args, environment, False))
    found = _fold(path, "conda environment", lines, target)
    for package, version in conda.pins.items():
        _add_pin(found, package, version, f"{path.name}: conda {package}")
    found.loose += conda.loose
    found.notes += [f"not read: {n}" for n in conda.not_read]
    return found


def _fold(path: Path, kind: str, lines: list[Line], target: Target) -> FileRead:
    """The lines that hold on the target, one release per package: two different ones, or a pin outside another
    line's range, is what pip refuses to install (the order of lines decides nothing)."""
    found = FileRead(path, kind)
    skipped = [line for line in lines if not line.holds]
    if skipped:
        found.notes.append(f"{len(skipped)} line(s) not for {target.words()} (their markers): "
                           + ", ".join(line.where for line in skipped[:5]))  # fmt: skip
    said: dict[str, list[Line]] = {}
    for line in (line for line in lines if line.holds):
        if line.name is None or (line.release is None and (line.url or line.editable)):
            found.unnamed.append(line.text[:120])
            continue
        said.setdefault(line.name, []).append(line)
        if line.release is not None:
            _add_pin(found, line.name, line.release, line.where)
            if line.named_by:
                found.notes.append(f"{line.name} {line.release}: from its {line.named_by} ({line.where})")
    for name, named in said.items():
        if name not in found.pins:
            found.loose.append(name + str(SpecifierSet(",".join(str(x.specifier) for x in named if x.specifier))))
            continue
        outside = next((x for x in named if not x.specifier.contains(found.pins[name], prereleases=True)), None)
        if outside:
            raise UsageError(f"{outside.where}: {name}{outside.specifier} excludes {name} {found.pins[name]} "
                             f"({found.where[name]}): pip installs neither")  # fmt: skip
    return found


def _add_pin(found: FileRead, name: str, version: str, where: str) -> None:
    if name in found.pins and found.pins[name] != version:
        raise UsageError(f"{where}: {name} {version}, and {name} {found.pins[name]} at {found.where[name]}: two "
                         "releases of one package for the same machine (pip installs neither; the order of lines "
                         "decides nothing)")  # fmt: skip
    found.pins[name] = version
    found.where.setdefault(name, where)


def _complete(found: FileRead, lines: list[Line]) -> bool:
    """A `pip freeze` or a compiled file: every line pins one release (or names one by URL, as freeze writes an
    install from a URL), and beside each judged package it pins one of what that package always installs."""
    if found.loose or not any(p in found.pins for p in AXIS_PACKAGES):
        return False
    if any(line.holds and line.release is None and not (line.url or line.editable) for line in lines):
        return False
    if any(line.holds and line.release is None and line.name in AXIS_PACKAGES for line in lines):
        return False  # a judged package installed from a URL or a folder (`torch @ file:///...`): release unknown
    listed = set(found.pins) | {line.name for line in lines if line.name}
    return all(any(d in listed for d in ALWAYS_WITH[p]) for p in AXIS_PACKAGES if p in found.pins)


# --- several files -------------------------------------------------------------------------------------------------


def read_pins(path: Path, target: Target | None = None) -> Pins:
    """One file's releases (see `read_all`)."""
    return read_all([path], target)


def read_all(paths: list[Path], target: Target | None = None) -> Pins:
    """Every file's releases together, for the target: one release per package across the files (two different ones
    is an error naming both files), complete where any file is, and at least one judged package named."""
    target = target or here()
    found = Pins(target=target)
    where: dict[str, str] = {}
    for path in paths:
        one = read_file(path, target)
        found.files.append(one)
        for package, version in one.pins.items():
            if package in found.pins and found.pins[package] != version:
                raise UsageError(f"{path}: {package} {version} there, and {package} {found.pins[package]} in "
                                 f"{where[package]}: the files disagree (pip installs one release)")  # fmt: skip
            found.pins[package] = version
            where.setdefault(package, str(one.path))
        found.loose += one.loose
        found.unnamed += one.unnamed
        if one.kind in ("requirements", "conda environment"):
            found.requirements.append(path)
    found.partial = not any(f.complete for f in found.files)
    _check_loose_against_pins(found)
    named = {p for p in found.pins} | {_loose_name(line) for line in found.loose}
    if not named & set(AXIS_PACKAGES):
        files = ", ".join(str(p) for p in paths)
        extra = f" ({len(found.unnamed)} line(s) name no release: {found.unnamed[0]}, ...)" if found.unnamed else ""
        raise NothingToJudge(f"{files}: names none of {', '.join(AXIS_PACKAGES)}{extra}: nothing to judge")
    return found


def _loose_name(line: str) -> str:
    try:
        return str(canonicalize_name(Requirement(line).name))
    except InvalidRequirement:
        return ""


def _check_loose_against_pins(found: Pins) -> None:
    for one in found.files:
        for line in one.loose:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            name = str(canonicalize_name(requirement.name))
            if name in found.pins and not requirement.specifier.contains(found.pins[name], prereleases=True):
                raise UsageError(f"{one.path}: {line} excludes {name} {found.pins[name]}, which another file "
                                 "installs: the files disagree")  # fmt: skip


def requirement_name(raw: str) -> str | None:
    """The package a requirements line names (canonical), or None for a comment, an option, an include or a direct
    reference: the lines a way out's diff rewrites."""
    args, _ = break_args_options(without_comment(raw).rstrip("\\").strip())
    name = args.split(";", 1)[0].strip()
    if not name or is_url(name) or "@" in name or "/" in name or name.startswith("."):
        return None
    try:
        return str(canonicalize_name(Requirement(name).name))
    except InvalidRequirement:
        return None


def loose_ranges(loose: list[str]) -> dict[str, Any]:
    """package -> the SpecifierSet the requirements that pin no release allow together ('transformers>=4.41,<4.46')."""
    found: dict[str, SpecifierSet] = {}
    for line in loose:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        name = str(canonicalize_name(requirement.name))
        found[name] = found[name] & requirement.specifier if name in found else requirement.specifier
    return found


def environment_pins(python: str | None = None) -> dict[str, str]:
    """What an environment has installed: this interpreter's (`--env`), or another's (`--python`); one that holds none
    of the packages the atlas measures is bad input."""
    if python:
        from harness.environments.envs import installed_versions

        installed = installed_versions(Path(python))
        pins = {str(canonicalize_name(k)): str(v) for k, v in installed.items() if k != "python"}
    else:
        from importlib import metadata

        pins = {
            str(canonicalize_name(d.metadata["Name"])): d.version
            for d in metadata.distributions()
            if d.metadata["Name"]
        }
    if not any(p in pins for p in AXIS_PACKAGES):
        where = python or "this environment"
        raise UsageError(f"{where}: none of {', '.join(AXIS_PACKAGES)} is installed there: nothing to judge")
    return pins
