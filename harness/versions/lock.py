"""Era locks: what each install day's stack resolves to over a GPU node's own torch, decided on a connected
machine and committed, so the air-gapped node installs exactly that.

A node holds one torch build (2.11.0+cu130) and cannot reach the index. For a dated cell over it, every
package but torch is resolved as the index had it that day (uv's --exclude-newer), with torch stood in by a
stub wheel of the node's version that requires nothing: the node's torch brings its own CUDA libraries and
dependencies, and they stay. Of that resolution the node gets, as a `pip --target` overlay:
- every *era package* (the profile's `era_packages`: the stack under test and the libraries whose versions
  move with it) at its day's version, unless the node has exactly that version;
- any other resolved package the node lacks, or whose node version does not meet the requirements of what
  is overlaid (found from each wheel's metadata on the index, repeated until nothing is missing).
Everything else (numpy, scipy, ... when they meet the era's requirements) is the node's own, and the record
says so (`install.overlaid`, `versions`). A day that does not resolve over the node's torch is kept in the
lock with uv's reason, and its cell is recorded as failing to install, not dropped.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import shutil
import subprocess
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from email.parser import Parser
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from harness.errors import UsageError
from harness.versions.lock_file import LOCK_VERSION

#: Platform of the nodes the locks are for (the device tool's GPU machines).
NODE_PLATFORM = "x86_64-manylinux_2_28"

Metadata = Callable[[str, str], list[str]]


def stub_wheel(directory: Path, name: str, version: str) -> Path:
    """A wheel of `name` at `version` that requires nothing: the node's own build, as the resolver sees it."""
    public = Version(version).public
    dist_info = f"{name}-{public}.dist-info"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {public}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: compat-matrix\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    path = directory / f"{name}-{public}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        record = []
        for member, data in files.items():
            archive.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}")
        archive.writestr(f"{dist_info}/RECORD", "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")
    return path


def resolve_day(
    uv: str,
    requirements: list[str],
    day: str,
    python: str,
    held: dict[str, str],
    moved: dict[str, str] | None = None,
) -> dict[str, str]:
    """Exact versions of everything `requirements` need as the index had it at the start of `day`, with the
    `held` packages (name -> the node's version) fixed and contributing no dependencies, and the `moved` ones
    (name -> day) as the index had them on their own day."""
    with tempfile.TemporaryDirectory(prefix="era-lock-") as tmp:
        folder = Path(tmp)
        overrides = folder / "overrides.txt"
        overrides.write_text("".join(f"{n} @ {stub_wheel(folder, n, v).as_uri()}\n" for n, v in held.items()))
        wanted = folder / "requirements.in"
        wanted.write_text("".join(f"{line}\n" for line in requirements))
        command = [uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate", str(wanted)]
        command += ["--python-version", python, "--python-platform", NODE_PLATFORM]
        command += ["--exclude-newer", f"{day}T00:00:00Z", "--override", str(overrides)]
        for name, until in (moved or {}).items():
            command += ["--exclude-newer-package", f"{name}={until}T00:00:00Z"]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise ResolutionFailed(" ".join(done.stderr.split())[-600:])
    pins: dict[str, str] = {}
    for line in done.stdout.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or " @ " in line:
            continue
        name, _, version = line.partition("==")
        pins[canonicalize_name(name)] = version.split(";")[0].strip()
    return pins


def resolve_probe(
    uv: str, pins: dict[str, str], older: str, newer: str, package: str, version: str, python: str,
    held: dict[str, str], extra: tuple[str, ...] = (),
) -> tuple[dict[str, str], str]:  # fmt: skip
    """A probe of a flip: the older day's axis packages (`pins`) with `package` moved to `version` (and `extra`
    requirement lines, a user script's own dependencies). First every dependency as of the older day (only the
    moved package may be newer); where that has no solution (a newer release needs newer dependencies), as of the
    newer day. Returns (the resolution, which way)."""
    lines = [f"{name}=={pinned}" for name, pinned in pins.items() if name != package] + [f"{package}=={version}"]
    lines += list(extra)
    try:
        return resolve_day(uv, lines, older, python, held, moved={package: newer}), "older-dependencies"
    except ResolutionFailed:
        return resolve_day(uv, lines, newer, python, held), "newer-dependencies"


class ResolutionFailed(Exception):
    """uv found no stack for the day over the held packages."""


def overlay_for(
    resolved: dict[str, str], era_packages: list[str], node: dict[str, str], requires: Metadata, python: str
) -> tuple[dict[str, str], list[str]]:
    """(what the node must get on top of its own packages, why each non-era package is there). `python` is the
    node's full version (3.12.3): markers are judged for it, not for the machine making the lock."""
    short = ".".join(python.split(".")[:2])
    environment = default_environment() | {"python_version": short, "python_full_version": python, "extra": ""}
    environment |= {"implementation_version": python, "sys_platform": "linux"}
    environment |= {"platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}
    era = map(canonicalize_name, era_packages)
    overlay = {n: resolved[n] for n in era if n in resolved and node.get(n) != resolved[n]}
    reasons: list[str] = []
    pending = list(overlay)
    while pending:
        name = pending.pop()
        for line in requires(name, overlay[name]):
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(environment):
                continue
            dependency = canonicalize_name(requirement.name)
            have = overlay.get(dependency) or node.get(dependency)
            if have is not None and requirement.specifier.contains(have, prereleases=True):
                continue
            if dependency not in resolved:
                continue  # held (torch) or not part of this day's stack: the resolver already answered for it
            overlay[dependency] = resolved[dependency]
            pending.append(dependency)
            found = "absent on the node" if have is None else f"node has {have}"
            pin = f"{dependency}=={resolved[dependency]}"
            reasons.append(f"{pin}: {name} {overlay[name]} needs {requirement} ({found})")
    return dict(sorted(overlay.items())), reasons


def index_requires(index: str) -> Metadata:
    """Requires-Dist of a release, read from the index's per-wheel metadata (PEP 658), cached per run."""
    cache: dict[tuple[str, str], list[str]] = {}

    def requires(name: str, version: str) -> list[str]:
        key = (name, version)
        if key not in cache:
            cache[key] = _fetch_requires(index, name, version)
        return cache[key]

    return requires


def _sdist_requires(name: str, version: str, files: list[dict[str, Any]]) -> list[str]:
    """A release served only as an sdist (deepspeed): its requirements from the egg-info's requires.txt (its
    PKG-INFO declares them dynamic); the lines before the first [extra] section."""
    import tarfile

    sdists = [
        item
        for item in files
        if item.get("filename", "").endswith(".tar.gz") and f"-{version}.tar.gz" in item.get("filename", "")
    ]
    if not sdists:
        raise UsageError(f"{name}=={version}: the index has no wheel or sdist of it")
    with urllib.request.urlopen(sdists[0]["url"], timeout=300) as response, tempfile.TemporaryFile() as tmp:
        shutil.copyfileobj(response, tmp)
        tmp.seek(0)
        with tarfile.open(fileobj=tmp, mode="r:gz") as archive:
            member = next((m for m in archive.getmembers() if m.name.endswith(".egg-info/requires.txt")), None)
            if member is None:
                return []
            text = (archive.extractfile(member) or tempfile.TemporaryFile()).read().decode("utf-8", "replace")
    lines = []
    for line in text.splitlines():
        if line.startswith("["):
            break
        if line.strip():
            lines.append(line.strip())
    return lines


def _wheel_version(filename: str) -> Version | None:
    """The version of a wheel's file name; None for other files and for names no tool accepts today (an
    old 'pydantic-0.18-py36+-none-any.whl' on the index must not stop a lock)."""
    if not filename.endswith(".whl"):
        return None
    try:
        return parse_wheel_filename(filename)[1]
    except ValueError:  # InvalidWheelFilename and InvalidVersion are ValueErrors
        return None


def _fetch_requires(index: str, name: str, version: str) -> list[str]:
    """From the wheel's metadata file where the index serves one (PEP 658), else from the smallest wheel."""
    from harness.versions.releases import ACCEPT

    request = urllib.request.Request(f"{index}/{canonicalize_name(name)}/", headers={"Accept": ACCEPT})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response).get("files", [])
    wheels = [item for item in files if _wheel_version(item.get("filename", "")) == Version(version)]
    if not wheels:
        return _sdist_requires(name, version, files)
    served = [item for item in wheels if item.get("core-metadata") or item.get("data-dist-info-metadata")]
    if served:
        with urllib.request.urlopen(served[0]["url"] + ".metadata", timeout=60) as response:
            text = response.read().decode("utf-8", "replace")
    else:
        smallest = min(wheels, key=lambda item: item.get("size") or 0)
        with urllib.request.urlopen(smallest["url"], timeout=300) as response, tempfile.TemporaryFile() as tmp:
            shutil.copyfileobj(response, tmp)
            with zipfile.ZipFile(tmp) as archive:
                member = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
                text = archive.read(member).decode("utf-8", "replace")
    return Parser().parsestr(text).get_all("Requires-Dist") or []


def lock_entry(
    resolved: dict[str, str], era_packages: list[str], image: dict[str, Any], requires: Metadata
) -> dict[str, Any]:
    """One day's (or probe day's) entry: its resolution, and what the node of `image` must get on top."""
    node = {canonicalize_name(k): v for k, v in image["packages"].items()}
    overlay, reasons = overlay_for(resolved, era_packages, node, requires, image["python"])
    return {"resolved": resolved, "overlay": overlay, "overlay_reasons": reasons}


def unresolved_entry(day: str, image: dict[str, Any], why: Exception) -> dict[str, Any]:
    """The entry of a day with no stack over the node's torch: the node records its cells as failing to
    install, with uv's reason."""
    return {"error": f"no stack of {day} resolves over the node's torch {image['torch']}: {why}"}


def build_lock(
    days: list[str],
    requirements: list[str],
    era_packages: list[str],
    image: dict[str, Any],
    resolve: Callable[[str], dict[str, str]],
    requires: Metadata,
) -> dict[str, Any]:
    """The lock for every day: its resolution and overlay, or the reason it has none."""
    entries: dict[str, Any] = {}
    for day in days:
        try:
            entries[day] = lock_entry(resolve(day), era_packages, image, requires)
        except ResolutionFailed as exc:
            entries[day] = unresolved_entry(day, image, exc)
    return {
        "lock_version": LOCK_VERSION,
        "made": dt.date.today().isoformat(),
        "requirements": requirements,
        "era_packages": era_packages,
        "held": {"torch": image["torch"]},
        "node": {"python": image["python"], "torch": image["torch"], "cuda": image.get("cuda")},
        "days": entries,
    }
