"""`python -m harness lock --profile NAME`: write a dated GPU profile's era lock (matrix/locks/NAME.json) on a
connected machine, for the air-gapped node to install from (see harness/versions/lock.py)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.define.cells import expand
from harness.define.profile import DATE_AXIS, RULE_PREFIX, Profile, load_profile, parse_date_rule
from harness.environments.envs import uv_binary
from harness.errors import UsageError
from harness.versions import lock as era_lock
from harness.versions import lock_file
from harness.versions.releases import index_url, minor_release_days


def lock_requirements(profile_name: str, matrix_dir: Path) -> tuple[list[str], list[str]]:
    """(the profile's dated stack as requirement lines, its days from the date rule, as of today)."""
    profile = load_profile(profile_name, matrix_dir)
    if not profile.era_packages:
        raise UsageError(f"profile {profile.name}: no [install] era_packages, nothing to lock")
    values = profile.axes[DATE_AXIS]
    if len(values) == 1 and values[0].startswith(RULE_PREFIX):
        text = values[0][len(RULE_PREFIX) :]
        days = minor_release_days(parse_date_rule(str(profile.path), "axes.date", text))
    else:
        days = list(values)
    lines: list[str] = []
    for cell in expand(profile):
        lines.extend(line for line in cell.requirements() if line not in lines)
    return lines, days


def node_image(matrix_dir: Path, profile: Profile) -> dict:
    """The node image an era-locked profile plans for (its python, torch, CUDA and pip list)."""
    image_path = matrix_dir / "nodes" / f"{profile.node_image}.json"
    if not image_path.is_file():
        raise UsageError(f"{image_path}: no node image (pip list --format=json of the node, with python and torch)")
    return json.loads(image_path.read_text())


def write_lock(profile_name: str, matrix_dir: Path, only_days: list[str] | None = None) -> Path:
    """Resolve every day (or the given ones, keeping the lock's other days) and write the lock."""
    profile = load_profile(profile_name, matrix_dir)
    requirements, days = lock_requirements(profile_name, matrix_dir)
    image = node_image(matrix_dir, profile)
    python = ".".join(image["python"].split(".")[:2])
    uv = uv_binary()
    target = lock_file.lock_path(matrix_dir, profile.name)
    chosen = only_days or days

    def resolve(day: str) -> dict[str, str]:
        print(f"  resolve {day} over torch {image['torch']}", flush=True)
        return era_lock.resolve_day(uv, requirements, day, python, {"torch": image["torch"]})

    lock = era_lock.build_lock(
        chosen, requirements, list(profile.era_packages), image, resolve, era_lock.index_requires(index_url())
    )
    if only_days and target.is_file():
        lock["days"] = lock_file.read_lock(target)["days"] | lock["days"]
    lock["days"] = dict(sorted(lock["days"].items()))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
    for day, entry in lock["days"].items():
        if entry.get("error"):
            print(f"{day}: {entry['error']}")
            continue
        stack = " ".join(f"{n} {entry['resolved'].get(n, '-')}" for n in profile.era_packages[:4])
        print(f"{day}: {stack}; overlay {len(entry['overlay'])} packages")
    return target
