"""Which releases of a package exist: from the index pip is configured for, or from a wheelhouse offline.

Uses the simple repository API's JSON form (PEP 691, with PEP 700's `versions`), so yanked files and
Requires-Python are seen without downloading anything. Pre-releases are left out.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.define.profile import DATE_AXIS, RULE_PREFIX, DateRule, Profile, ReleaseRule, parse_date_rule, parse_rule
from harness.errors import OptionError, UsageError

DEFAULT_INDEX = "https://pypi.org/simple"
ACCEPT = "application/vnd.pypi.simple.v1+json"


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def index_files(package: str) -> list[dict]:
    """The package's file entries from the simple API's JSON form (filename, url, yanked, requires-python, ...)."""
    request = urllib.request.Request(f"{index_url()}/{canonicalize_name(package)}/", headers={"Accept": ACCEPT})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response).get("files", [])


def releases(package: str, python: str | None = None, wheelhouse: Path | None = None) -> list[Version]:
    """Final releases, oldest first, that have at least one file that is not yanked and (if `python` is given)
    whose Requires-Python admits it."""
    if wheelhouse is not None:
        return _from_wheelhouse(package, wheelhouse)
    usable: set[Version] = set()
    for item in index_files(package):
        if item.get("yanked"):
            continue
        version = version_of(item.get("filename", ""))
        if version is None or version.is_prerelease or version.is_devrelease:
            continue
        if python and not _admits(item.get("requires-python"), python):
            continue
        usable.add(version)
    return sorted(usable)


def yanked(package: str) -> list[Version]:
    """Final releases every file of which is yanked: not installable by a range, so a bisect cannot try them."""
    files: dict[Version, list[bool]] = {}
    for item in index_files(package):
        version = version_of(item.get("filename", ""))
        if version is not None and not version.is_prerelease and not version.is_devrelease:
            files.setdefault(version, []).append(bool(item.get("yanked")))
    return sorted(v for v, flags in files.items() if all(flags))


def between(versions: list[Version], low: str, high: str) -> list[Version]:
    """The releases from `low` to `high`, both included."""
    lo, hi = Version(low), Version(high)
    return [v for v in versions if lo <= v <= hi]


def _admits(requires_python: str | None, python: str) -> bool:
    if not requires_python:
        return True
    try:
        return SpecifierSet(requires_python).contains(Version(f"{python}.99") if python.count(".") == 1 else python)
    except (InvalidSpecifier, InvalidVersion):
        return True  # a malformed field should not hide a release


def version_of(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        if re.search(r"\.(tar\.gz|zip)$", filename):
            return parse_sdist_filename(filename)[1]
    except (ValueError, InvalidVersion):
        return None
    return None


def _from_wheelhouse(package: str, wheelhouse: Path) -> list[Version]:
    wanted = canonicalize_name(package)
    found: set[Version] = set()
    for path in wheelhouse.iterdir():
        try:
            if path.name.endswith(".whl"):
                name, version, _, _ = parse_wheel_filename(path.name)
            elif re.search(r"\.(tar\.gz|zip)$", path.name):
                name, version = parse_sdist_filename(path.name)
            else:
                continue
        except (ValueError, InvalidVersion):
            continue
        if name == wanted and not version.is_prerelease:
            found.add(version)
    return sorted(found)


def apply_rule(versions: list[Version], rule: ReleaseRule) -> list[Version]:
    """The releases a rule selects, oldest first."""
    chosen = [v for v in versions if rule.specifier is None or rule.specifier.contains(v)]
    if rule.newest_patch:
        newest: dict[tuple[int, int], Version] = {}
        for version in chosen:
            minor = (version.major, version.minor)
            newest[minor] = max(newest.get(minor, version), version)
        chosen = sorted(newest.values())
    if rule.latest is not None:
        chosen = chosen[-rule.latest :]
    return chosen


def release_day(package: str, version: str) -> str | None:
    """The day after the release's first file appeared on the index (a stack resolved as of it can install the
    release with the dependencies it needs), or None where the index gives no upload time."""
    uploaded = [
        dt.datetime.fromisoformat(item["upload-time"].replace("Z", "+00:00"))
        for item in index_files(package)
        if item.get("upload-time") and version_of(item.get("filename", "")) == Version(version)
    ]
    return (min(uploaded) + dt.timedelta(days=1)).date().isoformat() if uploaded else None


def minor_release_days(rule: DateRule, today: dt.date | None = None) -> list[str]:
    """The day after each minor release of the rule's package first appeared on the index (so that minor is the
    newest one can install that day), plus today: one era-consistent stack per minor."""
    first_upload: dict[tuple[int, int], dt.datetime] = {}
    for item in index_files(rule.package):
        version = version_of(item.get("filename", ""))
        uploaded = item.get("upload-time")
        if version is None or version.is_prerelease or version.is_devrelease or not uploaded:
            continue
        if rule.specifier and not rule.specifier.contains(version):
            continue
        when = dt.datetime.fromisoformat(uploaded.replace("Z", "+00:00"))
        minor = (version.major, version.minor)
        first_upload[minor] = min(first_upload.get(minor, when), when)
    days = {(when + dt.timedelta(days=1)).date().isoformat() for when in first_upload.values()}
    days.add((today or dt.datetime.now(dt.UTC).date()).isoformat())
    return sorted(days)


def resolve_axes(
    profile: Profile, wheelhouse: Path | None = None, recorded: dict[str, list[str]] | None = None
) -> tuple[Profile, dict[str, list[str]]]:
    """Replace rule axes with concrete versions. `recorded` (a resumed run's meta) wins, so a run is
    reproduced exactly even after new releases appear."""
    resolved: dict[str, list[str]] = {}
    axes = dict(profile.axes)
    for package, values in profile.axes.items():
        if len(values) == 1 and values[0].startswith(RULE_PREFIX):
            text = values[0][len(RULE_PREFIX) :]
            if recorded and package in recorded:
                chosen = recorded[package]
            elif package == DATE_AXIS and profile.era_packages:
                chosen = sorted(locked_days(profile))
            elif package == DATE_AXIS:
                if wheelhouse is not None:
                    raise UsageError(f"axes.date = {text!r}: release dates need the index, not a wheelhouse")
                chosen = minor_release_days(parse_date_rule(str(profile.path), "axes.date", text))
            else:
                rule = parse_rule(str(profile.path), f"axes.{package}", text)
                chosen = [str(v) for v in apply_rule(releases(package, profile.python, wheelhouse), rule)]
            if not chosen:
                raise UsageError(f"axes.{package} = {text!r} selects no release of {package}")
            resolved[package] = chosen
            axes[package] = tuple(chosen)
    return (replace(profile, axes=axes) if resolved else profile), resolved


def locked_days(profile: Profile) -> dict[str, Any]:
    """The days of a profile's era lock (an air-gapped node reads its dates from there, not the index)."""
    from harness.versions.lock_file import lock_path, read_lock

    return read_lock(lock_path(profile.path.parent, profile.name))["days"]


def grown_dates(
    profile: Profile, recorded: dict[str, list[str]] | None, added: tuple[str, ...]
) -> dict[str, list[str]]:
    """A dated run's resolved axes with its date axis grown: the days it has, plus the days its rule gives now
    (a new peft minor, today) and any `added`. Only the date axis moves; every other resolved axis stays, so
    the cells already recorded are the same cells and only the new days' cells run."""
    if DATE_AXIS not in profile.axes:
        raise OptionError(f"{{grow}}: profile {profile.name} has no date axis")
    values = profile.axes[DATE_AXIS]
    if not (len(values) == 1 and values[0].startswith(RULE_PREFIX)):
        raise OptionError(
            f"{{grow}}: {profile.path} lists its days (axes.date); add the day there and {{resume_run}} the run instead"
        )
    text = values[0][len(RULE_PREFIX) :]
    now = minor_release_days(parse_date_rule(str(profile.path), "axes.date", text))
    for day in added:
        try:
            dt.date.fromisoformat(day)
        except ValueError:
            raise OptionError(f"{{add_dates}} {day!r}: expected YYYY-MM-DD") from None
    had = list((recorded or {}).get(DATE_AXIS, []))
    return dict(recorded or {}) | {DATE_AXIS: sorted({*had, *now, *added})}
