"""Wheels for an era-locked GPU profile, a few days at a time: each device call carries at most 64 MiB, the
whole working tree included, so a call takes the days whose wheels fit and the next call takes the rest.

bitsandbytes wheels ship one CUDA library per toolkit (40 to 120 MB); a node's torch loads the one for its
own CUDA (libbitsandbytes_cuda130.so for cu130) and never another, unless BNB_CUDA_VERSION says otherwise,
which the harness never sets. Those for other toolkits are left out (`trim_cuda_libraries`); a release with
none for the node's CUDA keeps only its CPU library, which is what it would load there anyway.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from harness.environments.wheel_fetch import build_sdists, download

#: Packages whose wheels carry one native library per CUDA toolkit: the node needs only its own.
PER_TOOLKIT_LIBRARIES = {"bitsandbytes": re.compile(r"libbitsandbytes_cuda(\d+)\w*\.(so|dll|dylib)$")}


def day_pins(lock: dict, days: list[str]) -> dict[str, list[str]]:
    """Each chosen day's overlay as requirement lines (days with no stack have none)."""
    unknown = [d for d in days if d not in lock["days"]]
    if unknown:
        raise ValueError(f"the era lock has no day {', '.join(unknown)} (its days: {', '.join(lock['days'])})")
    return {d: [f"{n}=={v}" for n, v in lock["days"][d].get("overlay", {}).items()] for d in days}


def without(lock: dict, names: set[str]) -> dict:
    """The lock with these packages taken out of every day's overlay (optional packages a call leaves out)."""
    days = {
        day: entry | {"overlay": {n: v for n, v in entry.get("overlay", {}).items() if n.lower() not in names}}
        for day, entry in lock["days"].items()
    }
    return lock | {"days": days}


def cached_wheel(pin: str, cache: Path, python: str, platforms: list[str]) -> Path:
    """The wheel of an exact pin, downloaded once into `cache` and kept there between wheelhouses."""
    name, _, version = pin.partition("==")
    found = _find(cache, name, version)
    if found is None:
        download([pin], cache, python, platforms)
        found = _find(cache, name, version)
    if found is None:
        raise FileNotFoundError(f"pip downloaded no wheel for {pin} into {cache}")
    return found


def _find(folder: Path, name: str, version: str) -> Path | None:
    for path in sorted(folder.glob("*.whl")):
        wheel_name, wheel_version, _, _ = parse_wheel_filename(path.name)
        if wheel_name == canonicalize_name(name) and str(wheel_version) == version:
            return path
    return None


def trim_cuda_libraries(wheel: Path, cuda: str, dest: Path) -> tuple[Path, list[str]]:
    """Copy a wheel into `dest`, leaving out native libraries built for a CUDA toolkit other than `cuda`
    (e.g. "13.0": keeps libbitsandbytes_cuda130*.so, and any cuda13x). Returns (the copy, what was left out)."""
    name = parse_wheel_filename(wheel.name)[0]
    pattern = PER_TOOLKIT_LIBRARIES.get(name)
    target = dest / wheel.name
    if pattern is None:
        shutil.copy2(wheel, target)
        return target, []
    major = cuda.split(".")[0]
    dropped: list[str] = []
    with zipfile.ZipFile(wheel) as source, tempfile.NamedTemporaryFile(dir=dest, delete=False) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as copy:
            dropped = [
                item.filename
                for item in source.infolist()
                if (match := pattern.search(item.filename)) and not match.group(1).startswith(major)
            ]
            for item in source.infolist():
                if item.filename in dropped:
                    continue
                data = source.read(item)
                if item.filename.endswith(".dist-info/RECORD"):
                    kept = [line for line in data.decode().splitlines() if line.split(",")[0] not in dropped]
                    data = ("\n".join(kept) + "\n").encode()
                copy.writestr(item, data)
    Path(tmp.name).replace(target)
    return target, dropped


@dataclass
class CallPlan:
    """Days that one device call takes, and the wheels it carries for them."""

    days: list[str]
    wheels: dict[str, int]  # file name -> bytes

    @property
    def size(self) -> int:
        return sum(self.wheels.values())


def plan_calls(day_wheels: dict[str, dict[str, int]], budget: int) -> list[CallPlan]:
    """Days packed into as few calls as first-fit finds: the largest day first, each into the first call whose
    wheels (shared ones counted once) still fit `budget` bytes with it. A day too large on its own still gets a
    call of its own (the plan flags it). Each call lists its days in date order; calls are in order of their
    first day."""
    calls: list[CallPlan] = []
    for day in sorted(day_wheels, key=lambda d: (-sum(day_wheels[d].values()), d)):
        wheels = day_wheels[day]
        for call in calls:
            merged = call.wheels | wheels
            if sum(merged.values()) <= budget:
                call.days.append(day)
                call.wheels = merged
                break
        else:
            calls.append(CallPlan([day], dict(wheels)))
    for call in calls:
        call.days.sort()
    return sorted(calls, key=lambda call: call.days[0])


#: What one device call may carry in all (the device tool's limit), and room kept for files made meanwhile.
CALL_LIMIT_BYTES = 64 * 2**20
MARGIN_BYTES = 2 * 2**20


def travelling_bytes(repo: Path, leave_out: Path | None = None) -> int:
    """Bytes of the working tree that travel with a call besides the wheels: tracked files and untracked
    files git does not ignore (the wheel folder itself, if not ignored, left out)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo, capture_output=True
    )
    if listed.returncode != 0:
        return 0
    total = 0
    for name in filter(None, listed.stdout.decode().split("\0")):
        path = repo / name
        if leave_out is not None and leave_out.resolve() in path.resolve().parents:
            continue
        if path.is_file():
            total += path.stat().st_size
    return total


def build(lock: dict, days: list[str], python: str, platforms: list[str], cache: Path) -> dict[str, dict[str, Path]]:
    """Each day's wheels, trimmed for the node's CUDA, in `cache`/cuda-<version>/ (made once, kept)."""
    cuda = str(lock["node"].get("cuda") or "")
    trimmed_dir = cache / f"cuda-{cuda or 'none'}"
    trimmed_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, dict[str, Path]] = {}
    per_day = day_pins(lock, days)
    _build_sdist_only(sorted({p for pins in per_day.values() for p in pins}), cache)
    for day, pins in per_day.items():
        result[day] = {}
        for pin in pins:
            wheel = cached_wheel(pin, cache, python, platforms)
            target = trimmed_dir / wheel.name
            if not target.is_file() and not cuda:
                shutil.copy2(wheel, target)
            elif not target.is_file():
                _, dropped = trim_cuda_libraries(wheel, cuda, trimmed_dir)
                if dropped:
                    print(f"  {wheel.name}: left out {len(dropped)} libraries for CUDA other than {cuda}", flush=True)
            result[day][wheel.name] = target
    return result


#: The torch sdist-only packages are built over (they import it at build time; the wheels are pure Python).
BUILD_TORCH = "torch==2.13.0"


def _build_sdist_only(pins: list[str], cache: Path) -> None:
    """Pins of packages the index serves only as sdists (deepspeed), built once into pure-Python wheels in
    `cache` (wheel_fetch.build_sdists: the package table's build variables, DS_BUILD_OPS=0)."""
    from harness.define.packages import BY_NAME

    missing = []
    for pin in pins:
        name, _, version = pin.partition("==")
        package = BY_NAME.get(canonicalize_name(name))
        if package is not None and package.no_build_isolation and _find(cache, name, version) is None:
            missing.append(pin)
    build_sdists(missing, cache, BUILD_TORCH)


def print_plan(calls: list[CallPlan], budget: int, travelling: int) -> None:
    shown = f"{budget / 2**20:.1f} MiB for wheels ({travelling / 2**20:.1f} MiB of the tree travels too)"
    print(f"\nper-call plan: {shown}")
    print("| call | days | wheels | MiB |")
    print("|---|---|---|---|")
    for number, call in enumerate(calls, 1):
        over = " (over: a day too large on its own)" if call.size > budget else ""
        print(f"| {number} | {' '.join(call.days)} | {len(call.wheels)} | {call.size / 2**20:.1f}{over} |")
