"""Prune cells that cannot work, from package metadata, before any environment is built.

For every pair of exact pins in a cell, the Requires-Dist of one (read from the index's PEP 658 metadata
file, or from the wheel itself when it is small, or from the wheel in an offline wheelhouse) may constrain
the other: peft 0.12.0 needs
accelerate>=0.21.0, so a cell pinning accelerate 0.20.0 is skipped with that reason instead of a wasted
install. Metadata that cannot be read (an sdist-only release such as deepspeed, no network) prunes nothing.
"""

from __future__ import annotations

import email.parser
import io
import json
import os
import sys
import urllib.request
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.define.cells import Cell
from harness.versions.releases import index_files


def metadata_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "compat-matrix" / "metadata"


def requires_dist(package: str, version: str, wheelhouse: Path | None = None) -> list[str] | None:
    """Requires-Dist lines of one release, or None when its metadata cannot be read."""
    cache = metadata_cache() / f"{canonicalize_name(package)}-{version}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    text = _from_wheelhouse(package, version, wheelhouse) if wheelhouse else _from_index(package, version)
    if text is None:
        return None
    lines = email.parser.Parser().parsestr(text).get_all("Requires-Dist") or []
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(lines))
    return lines


def conflict(cell: Cell, python: str, wheelhouse: Path | None = None) -> str | None:
    """Why the cell's exact pins cannot be installed together, or None."""
    pins = {}
    for package, value in cell.pins.items():
        try:
            pins[canonicalize_name(package)] = (package, Version(value))
        except InvalidVersion:
            continue  # latest / none / system: nothing exact to check
    environment = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
    for package, version in pins.values():
        lines = requires_dist(package, str(version), wheelhouse)
        for line in lines or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            other = pins.get(canonicalize_name(requirement.name))
            if other and other[0] != package and not requirement.specifier.contains(other[1], prereleases=True):
                return f"{package} {version} requires {requirement}; the cell pins {other[0]} {other[1]}"
    return None


#: A wheel smaller than this may be downloaded to read its METADATA when the index serves no metadata file.
SMALL_WHEEL = 20 * 1024 * 1024


def _from_index(package: str, version: str) -> str | None:
    """The PEP 658 metadata file if the index serves one; else a small wheel's METADATA; else None."""
    try:
        wheels = [
            item
            for item in index_files(package)
            if item.get("filename", "").endswith(".whl") and str(parse_wheel_filename(item["filename"])[1]) == version
        ]
        for item in wheels:
            if item.get("core-metadata") or item.get("dist-info-metadata"):
                with urllib.request.urlopen(item["url"] + ".metadata", timeout=60) as response:
                    return response.read().decode("utf-8", "replace")
        for item in wheels:
            if item.get("size", SMALL_WHEEL) < SMALL_WHEEL:
                with urllib.request.urlopen(item["url"], timeout=120) as response:
                    return _metadata_in(zipfile.ZipFile(io.BytesIO(response.read())))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        print(f"warning: no metadata for {package} {version} ({exc}); not pruning on it", file=sys.stderr)
    return None


def _metadata_in(archive: zipfile.ZipFile) -> str | None:
    member = next((m for m in archive.namelist() if m.endswith(".dist-info/METADATA")), None)
    return archive.read(member).decode("utf-8", "replace") if member else None


def _from_wheelhouse(package: str, version: str, wheelhouse: Path) -> str | None:
    wanted = canonicalize_name(package)
    for path in wheelhouse.glob("*.whl"):
        try:
            name, found, _, _ = parse_wheel_filename(path.name)
        except (ValueError, InvalidVersion):
            continue
        if name == wanted and str(found) == version:
            with zipfile.ZipFile(path) as archive:
                return _metadata_in(archive)
    return None
