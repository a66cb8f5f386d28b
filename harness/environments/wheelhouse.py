"""Download (and build) every wheel a profile's cells need, for an air-gapped node.

`nox -s wheelhouse -- --profile gpu --python 3.12 --platform manylinux_2_28_x86_64 --dest DIR`

Packages pinned 'system' and torch are skipped: the node brings its own. Packages that ship only as an
sdist (deepspeed) are built here into pure-Python wheels, with the build requirements and variables of the
package table (harness/define/packages.py), in a scratch venv that has torch (they import it at build time): the
profile's torch when it pins one, else the newest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.environments.wheel_fetch import build_sdists, download
from harness.paths import REPO_ROOT

#: pip matches manylinux tags exactly, so name the common ones besides the one asked for.
DEFAULT_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)]
DEFAULT_PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64"]


def requirements_for(profile_name: str) -> tuple[list[str], list[str], list[str], str]:
    """(binary wheels to download, sdist-only packages to build, support wheels, the torch to build them
    against) for a profile."""
    profile = load_profile(profile_name, REPO_ROOT / "matrix")
    lines: list[str] = []
    torches: list[str] = []
    for cell in expand(profile):
        for line in cell.requirements():
            if Requirement(line).name.lower() == "torch":
                torches.append(line)
            elif line not in lines:
                lines.append(line)
    build = [line for line in lines if Requirement(line).name.lower() in profile.no_build_isolation]
    download = [line for line in lines if line not in build]
    return download, build, list(profile.overlay_support), _newest(torches)


def _newest(torch_lines: list[str]) -> str:
    """The newest exact torch pin among a profile's cells; plain 'torch' where one is unpinned or none is."""
    versions = [next(iter(Requirement(line).specifier)).version for line in torch_lines if "==" in line]
    if not versions or len(versions) < len(torch_lines):
        return "torch"
    return f"torch=={max(versions, key=Version)}"


def build_parser() -> argparse.ArgumentParser:
    """The command's options (also read by the test that runs every documented command as written)."""
    parser = argparse.ArgumentParser(prog="compat-matrix wheelhouse", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="gpu")
    parser.add_argument("--python", default="3.12", help="target python version of the node")
    parser.add_argument("--platform", action="append", default=[], help="extra platform tags (repeatable)")
    parser.add_argument("--dest", type=Path, help="directory to fill with wheels (not needed with --plan)")
    parser.add_argument("--only", action="append", metavar="NAME", help="only these distributions (repeatable)")
    parser.add_argument(
        "--day", action="append", metavar="YYYY-MM-DD", help="era-locked profiles: only these days (repeatable)"
    )
    parser.add_argument(
        "--plan", action="store_true", help="era-locked profiles: print which days fit one device call, fetch no more"
    )
    parser.add_argument("--budget-mib", type=float, help="wheels per call (default: 64 MiB less the travelling tree)")
    parser.add_argument(
        "--pack",
        type=Path,
        metavar="FILE.tar.xz",
        help="era-locked profiles: write the chosen days' wheels as one solid xz pack (releases of a package compress "
        "against each other: many days fit one device call) instead of a folder",
    )
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="NAME",
        help="era-locked profiles: leave this optional package ([install] optional) out of the wheels; its cells "
        "install without it and their records say so (repeatable)",
    )
    parser.add_argument(
        "--unpack",
        type=Path,
        metavar="FILE.tar.xz",
        help="on the node: write a pack's wheels into --dest, byte for byte the files that were packed",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.unpack is not None:
        if args.dest is None:
            parser.error("--unpack needs --dest DIR")
        from harness.environments.wheel_pack import unpack

        written = unpack(args.unpack, args.dest)
        print(f"unpacked {len(written)} wheels into {args.dest}")
        return 0
    profile = load_profile(args.profile, REPO_ROOT / "matrix")
    if profile.era_packages:
        return _era_main(profile, args)
    if args.dest is None:
        parser.error("--dest is required")
    args.dest.mkdir(parents=True, exist_ok=True)
    wheels, sdists, support, build_torch = requirements_for(args.profile)
    if args.only:
        keep = {n.lower() for n in args.only}
        wheels, sdists, support = (
            [r for r in group if Requirement(r).name.lower() in keep] for group in (wheels, sdists, support)
        )
    platforms = list(dict.fromkeys([*args.platform, *DEFAULT_PLATFORMS]))
    print(
        f"wheelhouse for profile {args.profile}: {len(wheels)} downloads, {len(sdists)} builds, "
        f"{len(support)} support wheels -> {args.dest}",
        flush=True,
    )
    download(wheels + support, args.dest, args.python, platforms)
    build_sdists(sdists, args.dest, build_torch)
    total = sum(p.stat().st_size for p in args.dest.glob("*.whl"))
    print(f"done: {len(list(args.dest.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB in {args.dest}")
    return 0


def _era_main(profile, args: argparse.Namespace) -> int:
    """Wheels of an era lock's days, trimmed for the node's CUDA, planned into device calls."""
    from harness.environments import era_wheels
    from harness.versions.lock_file import lock_path, read_lock

    lock = read_lock(lock_path(REPO_ROOT / "matrix", profile.name))
    days = args.day or list(lock["days"])
    cache = Path(os.environ.get("COMPAT_MATRIX_WHEEL_CACHE", Path.home() / ".cache" / "compat-matrix" / "wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    platforms = list(dict.fromkeys([*args.platform, *DEFAULT_PLATFORMS]))
    not_optional = sorted({n.lower() for n in args.without} - set(profile.optional))
    if not_optional:
        raise SystemExit(f"--without {', '.join(not_optional)}: not in {profile.name}'s [install] optional")
    if args.without:
        lock = era_wheels.without(lock, {n.lower() for n in args.without})
    wheels = era_wheels.build(lock, days, args.python, platforms, cache)
    travelling = era_wheels.travelling_bytes(REPO_ROOT, leave_out=args.dest)
    free = era_wheels.CALL_LIMIT_BYTES - travelling - era_wheels.MARGIN_BYTES
    budget = int(args.budget_mib * 2**20) if args.budget_mib else free
    sizes = {day: {name: path.stat().st_size for name, path in found.items()} for day, found in wheels.items()}
    calls = era_wheels.plan_calls(sizes, budget)
    if args.pack is not None:
        from harness.environments.wheel_pack import pack

        chosen = sorted({path for found in wheels.values() for path in found.values()})
        raw = sum(p.stat().st_size for p in chosen)
        pack(chosen, args.pack)
        size = args.pack.stat().st_size
        print(f"packed {len(chosen)} wheels of {len(wheels)} day(s), {raw / 2**20:.1f} MiB, into {args.pack}: "
              f"{size / 2**20:.1f} MiB ({free / 2**20:.1f} MiB may travel beside the tree)")  # fmt: skip
        if size > free:
            raise SystemExit(f"{args.pack} does not fit one device call: pass fewer --day")
        return 0
    era_wheels.print_plan(calls, budget, travelling)
    if args.plan:
        return 0
    if args.dest is None:
        raise SystemExit("--dest is required unless --plan")
    if len(calls) > 1:
        raise SystemExit(f"these days need {len(calls)} calls: pass one call's days with --day (see the plan above)")
    args.dest.mkdir(parents=True, exist_ok=True)
    for found in wheels.values():
        for name, path in found.items():
            shutil.copy2(path, args.dest / name)
    total = sum(p.stat().st_size for p in args.dest.glob("*.whl"))
    print(f"done: {len(list(args.dest.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
