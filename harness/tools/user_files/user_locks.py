"""Lockfiles read for one target, as their installers read them: `uv.lock` (a package locked once per fork carries
its `resolution-markers`: the entry whose markers hold on the target is the one `uv sync` installs there),
`pylock.toml` (PEP 751: each entry's `marker`, in the lock-file context) and `poetry.lock` (one release per package;
a package locked twice for different markers is said, not guessed). A lock names a complete environment: a package it
does not hold, or holds only for other targets, is not installed there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.utils import canonicalize_name
from packaging.version import Version

from harness.define.packages import AXIS_PACKAGES
from harness.errors import UsageError
from harness.tools.user_files.user_text import load_toml, shown


@dataclass
class LockRead:
    """The releases a lock installs on the target, which lock it is, and what its forks left out there."""

    kind: str
    pins: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: package -> every release the lock holds for it, where it holds more than one (a forked lock).
    forks: dict[str, list[str]] = field(default_factory=dict)


def lock_kind(text: str, data: dict[str, Any]) -> str:
    if "packages" in data and "package" not in data:
        return "pylock.toml"
    if (isinstance(data.get("metadata"), dict) and "content-hash" in data["metadata"]) or "by Poetry" in text[:200]:
        return "poetry.lock"
    return "uv.lock"


def read_lock(path: Path, text: str, environment: dict[str, str], words: str) -> LockRead:
    """The releases the lock installs where `environment` holds (`words` names that target in messages)."""
    data = load_toml(path, text, "a lockfile")
    entries = data.get("package") if "package" in data else data.get("packages")
    if not isinstance(entries, list):
        raise UsageError(f"{path}: no [[package]] or [[packages]] table: not a uv, poetry or PEP 751 lock")
    kind = lock_kind(text, data)
    found = LockRead(kind)
    chosen: dict[str, dict[str, list[str]]] = {}  # package -> release -> the markers that chose it
    held: dict[str, list[str]] = {}
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise UsageError(f"{path}: package entry {number} has no name")
        version = entry.get("version")
        if version is None:
            continue  # a workspace member or a path dependency: no release
        name = str(canonicalize_name(entry["name"]))
        if not isinstance(version, str) or not _is_version(version):
            raise UsageError(f"{path}: package entry {number} ({shown(entry['name'], 40)}): version {shown(version)} "
                             "is not a version")  # fmt: skip
        held.setdefault(name, []).append(version)
        markers = _markers(path, number, entry, kind)
        if markers is None or any(_holds(path, number, m, environment, kind) for m in markers):
            chosen.setdefault(name, {}).setdefault(version, []).extend(markers or [])
    for name, releases in held.items():
        if len(set(releases)) > 1:
            found.forks[name] = sorted(set(releases), key=Version)
        picked = chosen.get(name, {})
        if len(picked) > 1:
            said = " and ".join(sorted(picked, key=Version))
            why = ("one release per package; its dependents' markers choose" if kind == "poetry.lock"
                   else "their markers overlap")  # fmt: skip
            raise UsageError(f"{path}: {name} is locked at {said} for {words} ({why}): give --platform and "
                             f"--python-version, or audit an export of the lock for your machine")  # fmt: skip
        if picked:
            found.pins[name] = next(iter(picked))
        elif name in AXIS_PACKAGES:
            found.notes.append(f"{name} {'/'.join(sorted(set(releases), key=Version))} is locked for other machines "
                               f"or extras only: not installed on {words}")  # fmt: skip
    for name, releases in found.forks.items():
        if name in found.pins and name in AXIS_PACKAGES:
            found.notes.append(f"{name}: locked per platform ({', '.join(releases)}); {found.pins[name]} on {words}")
    others = [n for n in found.forks if n not in AXIS_PACKAGES]
    if others:
        found.notes.append(f"{len(others)} other package(s) locked per platform, read for {words}")
    return found


def _markers(path: Path, number: int, entry: dict[str, Any], kind: str) -> list[str] | None:
    """The markers an entry holds under (None: everywhere): uv's resolution-markers (any of them), PEP 751's marker."""
    said = entry.get("resolution-markers") if kind == "uv.lock" else entry.get("marker")
    if said is None:
        return None
    if isinstance(said, str):
        said = [said]
    if not isinstance(said, list) or not all(isinstance(m, str) for m in said):
        raise UsageError(f"{path}: package entry {number} ({entry['name']}): markers {shown(said)} are not strings")
    return said


def _holds(path: Path, number: int, said: str, environment: dict[str, str], kind: str) -> bool:
    try:
        if kind == "pylock.toml":
            return Marker(said).evaluate(dict(environment), context="lock_file")
        return Marker(said).evaluate(dict(environment) | {"extra": ""})
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName) as exc:
        raise UsageError(f"{path}: package entry {number}: the marker {shown(said)} cannot be read "
                         f"({str(exc).splitlines()[0][:120]})") from None  # fmt: skip


def _is_version(value: str) -> bool:
    try:
        Version(value)
    except ValueError:  # InvalidVersion, or a number of more digits than int() converts
        return False
    return True
