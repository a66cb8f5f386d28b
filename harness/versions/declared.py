"""What each release declares it needs of the other axis packages: its wheel's Requires-Dist, as pip and uv read it.

A way out must be a stack that installs and imports: transformers 5.15.0 declares `torch>=2.5` (under its `torch`
extra, and refuses to import torch 2.4.1 without it), so moving an old stack's transformers alone is no way out. The
index serves no PEP 658 metadata files here, so the METADATA member is read from the wheel itself by HTTP range
requests (a few hundred kilobytes of a 10 MB wheel: its zip directory and that one member), as pip's lazy wheel does.
What was read is kept in `matrix/declared.json` (committed, grown by `report` for releases not yet in it), and the
judge's tables carry it for the releases they name; the judge itself never reads the network.
"""

from __future__ import annotations

import io
import json
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from harness.define.packages import AXIS_PACKAGES

#: The packages whose wheels declare something of the others (torch and deepspeed declare no bound on them; most
#: deepspeed releases are sdists only).
DECLARING = ("transformers", "peft", "accelerate", "bitsandbytes")
#: The extras a user of these packages installs with them (transformers' own floor on torch is under `torch`).
EXTRAS = ("", "torch")
#: The environment markers are judged for (the atlas's Python).
PYTHON = "3.11"


def read_declared(path: Path) -> dict[str, dict[str, dict[str, str]]]:
    """package -> release -> {axis package it needs: the specifier} ({} for a release that declares nothing)."""
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def axis_requirements(metadata: str) -> dict[str, str]:
    """The Requires-Dist lines of a METADATA text that name an axis package, for the atlas's Python with no extra or
    the `torch` extra: {package: specifier}."""
    environment = default_environment() | {"python_version": PYTHON, "python_full_version": f"{PYTHON}.0"}
    found: dict[str, str] = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            requirement = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        name = str(canonicalize_name(requirement.name))
        if name not in AXIS_PACKAGES or not str(requirement.specifier):
            continue
        marker = requirement.marker
        if marker is None or any(marker.evaluate(environment | {"extra": extra}) for extra in EXTRAS):
            specifier = str(requirement.specifier)
            found[name] = ",".join(sorted(filter(None, [found.get(name, ""), specifier])))
    return found


class _RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests, in blocks (what zipfile needs: its end, its directory, a member)."""

    BLOCK = 256 * 1024

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.position, self.blocks = url, size, 0, {}

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = {0: offset, 1: self.position + offset, 2: self.size + offset}[whence]
        return self.position

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.position + n)
        out = bytearray()
        while self.position < end:
            index, offset = divmod(self.position, self.BLOCK)
            block = self._block(index)
            piece = block[offset : offset + end - self.position]
            out += piece
            self.position += len(piece)
        return bytes(out)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _block(self, index: int) -> bytes:
        if index not in self.blocks:
            start = index * self.BLOCK
            stop = min(self.size, start + self.BLOCK) - 1
            request = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{stop}"})
            with urllib.request.urlopen(request, timeout=60) as response:
                self.blocks[index] = response.read()
        return self.blocks[index]


def wheel_metadata(package: str, version: str) -> str | None:
    """The METADATA of one wheel of the release (any: they declare alike), or None where the release has no wheel."""
    from harness.versions.releases import index_files, version_of

    wheels = [
        f for f in index_files(package)
        if f.get("filename", "").endswith(".whl") and version_of(f["filename"]) == Version(version) and f.get("size")
    ]  # fmt: skip
    if not wheels:
        return None
    wheel = min(wheels, key=lambda f: f["size"])
    with zipfile.ZipFile(_RangeFile(wheel["url"], int(wheel["size"]))) as archive:
        member = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(member).decode("utf-8", "replace")


def grow(releases: dict[str, list[str]], path: Path, say: Any = print) -> int:
    """Read what the releases not yet in the file declare and add them; returns how many were added. A release the
    index cannot serve now is left for the next run (said, never guessed)."""
    known = read_declared(path)
    added = 0
    for package in DECLARING:
        for version in releases.get(package, []):
            if version in known.get(package, {}):
                continue
            try:
                metadata = wheel_metadata(package, version)
            except (OSError, zipfile.BadZipFile, StopIteration) as exc:
                say(f"declared requirements: {package} {version} not read ({type(exc).__name__}: {exc})")
                continue
            known.setdefault(package, {})[version] = axis_requirements(metadata) if metadata else {}
            added += 1
    if added:
        ordered = {p: dict(sorted(v.items(), key=lambda kv: Version(kv[0]))) for p, v in sorted(known.items())}
        path.write_text(json.dumps(ordered, indent=1, sort_keys=False) + "\n")
    return added
