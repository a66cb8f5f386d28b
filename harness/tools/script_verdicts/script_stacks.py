"""The stacks a user's script runs in: the atlas's dated stacks, a user's own pins, and cheap probes over them.

A dated stack is the history profile's cell for that day, built (or reused: the same environment the atlas
ran in) by `envs.ensure_env`. A probe moves one package of a built stack to another release: instead of a new
environment (5 GB with a CUDA torch), the moved package and whatever its move drags along are installed as a
`--target` overlay that goes first on PYTHONPATH, everything else stays the base's own. The overlay is
resolved by uv together with the base's exact versions (dependencies as of the older day): a held package's own
requirements count, so a move never installs a release a held package excludes (tokenizers 0.21 under
transformers 4.45 is refused with uv's reason, not built and run). Where that cannot resolve, only the atlas
packages stay held and the rest resolves as of the newer day (what moved with it is listed in `overlaid`).
A moved torch gets an environment of its own (`NATIVE_MOVES`), resolved like an atlas day, so its CUDA libraries and
triton are the build of the torch that loads them (an overlay would mix them with the base's). Overlays are cached by
what they contain, and environments by their pins, so a second invocation reuses every probe it has made.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from harness.define.cells import Cell, expand
from harness.define.packages import AXIS_PACKAGES, build_env, late_installed
from harness.define.profile import DATE_AXIS, Profile
from harness.environments import disk, envs
from harness.environments import overlay as target_overlay
from harness.environments.envs import InstallOptions
from harness.versions import releases

OVERLAY_MARKER = ".compat-matrix-overlay.json"
#: What a stack's versions exclude when two stacks are compared (the interpreter is not a release).
NOT_PACKAGES = ("python",)


@dataclass(frozen=True)
class Stack:
    """Where one run happens: a python, maybe an overlay first on its path, and the versions it imports."""

    label: str
    python: Path | None
    versions: dict[str, str]
    #: "dated", "pinned", "overlay", or "moved" (a torch move: an environment of its own).
    kind: str
    pythonpath: str | None = None
    #: Why it could not be built (the installer's reason); then nothing runs in it.
    failure: str | None = None
    reused: bool = False
    seconds: float = 0.0
    #: An overlay's dependency policy: "older-dependencies" (all else held) or "newer-dependencies".
    mode: str | None = None
    overlaid: dict[str, str] = field(default_factory=dict)
    #: Whether the environment under it (a dated or pinned one) was reused or built; None when none was.
    environment_reused: bool | None = None
    #: A planned stack's identity (a GPU node's: its label and the wheels it installs), which keys its run in place
    #: of the versions a node reads only once it has installed them; None for a stack built here.
    identity: str | None = None
    #: What a planned stack answers ({"day", "package", "version", "newer"}), for the next round's plan.
    request: dict[str, str] | None = None
    #: Optional packages that could not be imported over this interpreter and were left out (a GPU node's old
    #: bitsandbytes over CUDA 13), name -> why.
    left_out: dict[str, str] = field(default_factory=dict)

    def packages(self) -> dict[str, str]:
        return {k: v for k, v in self.versions.items() if k not in NOT_PACKAGES}


class LocalStacks:
    """The stacks of this machine: the atlas's environments, a user's pins, and uv overlays over them."""

    def __init__(
        self, history: Profile, extras: list[str], options: InstallOptions, day_torch: dict[str, str] | None = None
    ) -> None:
        self.history, self.extras, self.options = history, extras, options
        #: The torch each atlas day resolved, as its records show (`script_bisect.day_torches`): the disk estimate
        #: counts the days that share one torch release once.
        self.day_torch = day_torch or {}

    def scan(self, end: Any) -> Stack:
        if end.day:
            return dated_stack(self.history, end.day, self.extras, self.options)
        return pinned_stack(self.history, end.label, end.pins, self.extras, self.options)

    def to_build(self, ends: list[Any]) -> list[str]:
        """The labels of the ends whose environment is not built yet here (what the scan will build first)."""
        return [end.label for end, planned in zip(ends, self.planned(ends), strict=True) if not _built(planned)]

    def planned(self, ends: list[Any]) -> list[disk.Planned]:
        """The environment each end's scan uses, with its torch where known, for the disk estimate (`disk.estimate`)."""
        found = []
        for end in ends:
            if end.day:
                cell, profile = _day_cell(self.history, end.day), self.history
            else:
                cell, profile = _pinned_cell(self.history, end.pins, self.extras)
            found.append(envs.planned_env(cell, profile, self.options, self.day_torch.get(end.day or "")))
        return found

    def move(self, base: Stack, package: str, version: str, older: Any, newer: Any) -> Stack:
        label = f"{base.label} + {package}=={version}"
        if package in NATIVE_MOVES:
            return native_move(self.history, base, package, version, older, newer, self.options, label)
        return overlay(
            base, [f"{package}=={version}"], older_day=older.day, newer_day=newer.day, moving=(package,),
            options=self.options, label=label,
        )  # fmt: skip

    def releases(self, package: str, old: str, new: str) -> list[str]:
        """`package`'s releases after `old` up to `new` (the index's, or the wheelhouse's offline)."""
        wheelhouse = self.options.wheelhouse if self.options.offline else None
        return releases_after(package, self.history.python, old, new, wheelhouse)

    def yanked(self, package: str) -> list[str]:
        return [] if self.options.offline else [str(v) for v in releases.yanked(package)]


#: How long one atlas day's environment takes to build here, measured (docs/bring-your-own-failure.md, "What a cold
#: run costs"): 1.1 min with uv's cache empty (2024-09-26, downloads included) and up to about 2.5 min per day on a
#: loaded machine (the cold scan of issue 75: 40 minutes for 16 days). Its disk is `disk.estimate`'s.
ENV_BUILD_MINUTES = (1.0, 2.5)


def _built(planned: disk.Planned) -> bool:
    return (planned.path / envs.MARKER).is_file()


def build_cost_lines(to_build: list[str], scanned: int, need: disk.DiskNeed) -> list[str]:
    """The cost of the environments a scan will build, said before it builds them: which, the disk they add as
    `disk.estimate` reckons it for every command (each new torch's whole stack, a torch already held only the
    environment's own files; "up to" where a day's torch is not known before it resolves), the time, estimated from
    measured days (said so), and whether this machine's free disk holds them."""
    if not to_build:
        return [f"  every one of the {scanned} stacks to scan is built already: no environment to build"]
    shown = ", ".join(to_build[:8]) + (f" and {len(to_build) - 8} more" if len(to_build) > 8 else "")
    size = f"{'up to' if need.unknown_torch else 'about'} {need.new_bytes / disk.GB:.1f} GB"
    why = []
    if need.new_torches:
        named = ", ".join(need.new_torches[:4]) + (" ..." if len(need.new_torches) > 4 else "")
        why.append(f"{len(need.new_torches)} torch release(s) no environment holds, each a whole stack: {named}")
    if need.unknown_torch:
        why.append(f"{need.unknown_torch} whose torch resolves as of its day, each counted whole")
    warm, cold = (max(1, round(len(to_build) * m)) for m in ENV_BUILD_MINUTES)
    because = f" ({'; '.join(why)})" if why else ""
    lines = [
        f"  to build first: {len(to_build)} of the {scanned} stacks' environments ({shown}): an estimate of {size} of "
        f"disk{because} and {warm} to {cold} min of builds ({ENV_BUILD_MINUTES[0]:.0f} to {ENV_BUILD_MINUTES[1]} min "
        "a day); a torch move builds one more, other moves are overlays of a few MB"
    ]
    if need.free is not None:
        short = need.free < need.new_bytes
        lines.append(
            f"  free disk here: {need.free / disk.GB:.0f} GB"
            + (f", less than the {need.new_bytes / disk.GB:.1f} GB estimated: the scan may run out" if short else "")
            + (" (--from/--to bound the days)" if short else "")
        )
    return lines


#: Packages whose move gets an environment of its own, never an overlay: torch's native libraries and its triton must
#: be the same kind of build as the torch that loads them. A torch 2.6.0 (CUDA 12) layered over a day's torch 2.14.0
#: (CUDA 13) environment failed every run on triton's "0 active drivers" (measured 2026-11-27): the move said nothing.
NATIVE_MOVES = ("torch",)


def native_move(
    history: Profile, base: Stack, package: str, version: str, older: Any, newer: Any, options: InstallOptions,
    label: str,
) -> Stack:  # fmt: skip
    """`base`'s atlas packages with `package` moved to `version`, built as a whole environment the way the atlas builds
    a day (its own torch, CUDA libraries and triton from one resolution): every other axis package held at `base`'s
    release and the rest as of the older day, else, where that cannot install, as of the newer day. Whether the moved
    release is the one installed is read back: a resolver that kept another is a failure of the move, not a run."""
    from harness.tools.release_search.flip_naming import held_stack, moving

    pins = {p: str(v).split("+")[0] for p, v in base.packages().items() if p in AXIS_PACKAGES} | {package: version}
    if not older.day:  # a user's pinned end: the same pins, the script's dependencies resolved today
        moved = pinned_stack(history, label, pins, [], options)
        return _checked(replace(moved, kind="moved", mode="environment", overlaid={package: version}), package, version)
    built = None
    for mode, day in (("older-dependencies", older.day), ("newer-dependencies", newer.day or older.day)):
        profile = moving(held_stack(history, pins, day, f"script-move-{package}"), package, newer.day or older.day)
        cell = expand(profile)[0]
        built = _from_env(label, envs.ensure_env(cell, profile, options), "moved")
        if built.python is not None:
            built = replace(built, mode=mode, overlaid={package: version})
            break
    assert built is not None
    return _checked(built, package, version)


def _checked(stack: Stack, package: str, version: str) -> Stack:
    """The stack, or its failure where the release of `package` it installed is not the one asked for."""
    have = str(stack.versions.get(package) or "").split("+")[0]
    if stack.python is not None and have != version:
        return replace(stack, python=None, failure=f"{package} {version} asked, {have or 'none'} installed")
    return stack


def releases_after(package: str, python: str, old: str, new: str, wheelhouse: Path | None = None) -> list[str]:
    """`package`'s releases after `old` up to `new`, oldest first: the candidates a flip's bisect goes over."""
    available = releases.releases(package, python, wheelhouse)
    return [str(v) for v in releases.between(available, old, new) if str(v) != str(Version(old))]


def dated_stack(history: Profile, day: str, extras: list[str], options: InstallOptions) -> Stack:
    """The atlas's stack of `day` (its environment is shared with the history matrix), plus the script's own
    dependencies it lacks, resolved as of that day."""
    cell = _day_cell(history, day)
    built = envs.ensure_env(cell, history, options)
    base = _from_env(day, built, "dated")
    missing = [line for line in extras if not _satisfied(line, base.versions)]
    if base.failure or not missing:
        return base
    # The packages the script names move to what it asks for, as the index had them that day; a pin the day
    # cannot meet (a release from later) makes the day unusable for this script, with uv's reason.
    moving = tuple(str(canonicalize_name(Requirement(line).name)) for line in missing)
    return overlay(base, missing, older_day=day, newer_day=day, moving=moving, options=options, label=day)


def pinned_stack(
    history: Profile, label: str, pins: dict[str, str], extras: list[str], options: InstallOptions
) -> Stack:
    """A user's own end: the pinned packages (and the script's other dependencies, resolved today)."""
    cell, profile = _pinned_cell(history, pins, extras)
    return _from_env(label, envs.ensure_env(cell, profile, options), "pinned")


def _pinned_cell(history: Profile, pins: dict[str, str], extras: list[str]) -> tuple[Cell, Profile]:
    """The cell and profile of a user's pinned end (its environment is keyed by them)."""
    named = {canonicalize_name(p) for p in pins}
    lines = [f"{p}=={v}" for p, v in pins.items() if p not in AXIS_PACKAGES]
    lines += [line for line in extras if canonicalize_name(Requirement(line).name) not in named]
    choices = tuple((p, pins[p]) for p in AXIS_PACKAGES if p in pins)
    profile = replace(
        history, name="script", axes={p: (v,) for p, v in choices}, stacks={}, extra_requirements=tuple(lines)
    )
    return Cell(stack="script", choices=choices, implied=()), profile


def overlay(
    base: Stack,
    requirements: list[str],
    *,
    older_day: str | None,
    newer_day: str | None,
    moving: tuple[str, ...],
    options: InstallOptions,
    label: str,
) -> Stack:
    """`base` with `requirements` layered over it (see `plan_overlay`), installed or reused."""
    mode, wanted, reason = plan_overlay(
        base, requirements, older_day=older_day, newer_day=newer_day, moving=moving, options=options
    )
    if wanted is None:
        return Stack(label, None, {}, "overlay", failure=reason, mode="unresolved")
    return _install_overlay(base, wanted, mode, label, options)


def plan_overlay(
    base: Stack,
    requirements: list[str],
    *,
    older_day: str | None,
    newer_day: str | None,
    moving: tuple[str, ...],
    options: InstallOptions,
) -> tuple[str, dict[str, str] | None, str]:
    """(mode, what the overlay installs, why not): first every other package held at the base's version and the
    dependencies as of `older_day`; if that cannot resolve, only the atlas packages held and the rest as of
    `newer_day`, each other package kept where it can stay (uv's preferences): only what must move moves."""
    assert base.python is not None
    held_all = {n: v for n, v in base.packages().items() if n not in moving}
    held_axes = {n: v for n, v in held_all.items() if n in AXIS_PACKAGES}
    # The second attempt: only the atlas packages held, the rest as of the newer day (today without days).
    attempts = [("older-dependencies", held_all, older_day), ("newer-dependencies", held_axes, newer_day)]
    reason = ""
    for mode, held, day in attempts:
        resolved, reason = _resolve(base.python, requirements, held, day, moving, newer_day, options, held_all)
        if resolved is None:
            continue
        wanted = {n: v for n, v in resolved.items() if base.versions.get(n) != v}
        if "torch" in wanted:
            wanted |= {n: v for n, v in resolved.items() if is_torch_runtime(n)}
        return mode, wanted, ""
    return "unresolved", None, reason


def is_torch_runtime(name: str) -> bool:
    """torch's own native dependencies (CUDA libraries, triton): they move with torch, never alone."""
    return name.startswith("nvidia-") or name in ("triton", "pytorch-triton", "cuda-bindings", "cuda-pathfinder")


def _resolve(
    python: Path,
    requirements: list[str],
    held: dict[str, str],
    day: str | None,
    moving: tuple[str, ...],
    newer_day: str | None,
    options: InstallOptions,
    prefer: dict[str, str],
) -> tuple[dict[str, str] | None, str]:
    """uv's resolution of `requirements` together with `held` (exact pins, required too: their own requirements on
    a moving package must hold), as of `day` (the moving packages as of `newer_day`); `prefer`'s versions are
    kept wherever the resolution allows (uv reads an existing output file as preferences)."""
    with tempfile.TemporaryDirectory(prefix="overlay-resolve-") as scratch:
        wanted, constraints = Path(scratch, "wanted.in"), Path(scratch, "held.txt")
        output = Path(scratch, "resolved.txt")
        pins = [f"{n}=={v}" for n, v in sorted(held.items())]
        wanted.write_text("\n".join([*requirements, *pins]) + "\n")
        constraints.write_text("".join(f"{line}\n" for line in pins))
        output.write_text("".join(f"{n}=={v}\n" for n, v in sorted(prefer.items())))
        flags = envs.index_flags(options=options, dated=bool(day)) + _built_over_base(held, requirements)
        if day:
            flags += ["--exclude-newer", f"{day}T00:00:00Z"]
            for name in moving:
                flags += ["--exclude-newer-package", f"{name}={newer_day or day}T00:00:00Z"]
        proc = subprocess.run(
            [
                envs.uv_binary(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--python",
                str(python), *flags, str(wanted), "--constraint", str(constraints), "--output-file", str(output),
            ],
            capture_output=True, text=True, env=envs.uv_environ(bool(day), _build_env(held, requirements)),
        )  # fmt: skip
        if proc.returncode != 0:
            return None, envs.summarise_install_error(proc.stderr or proc.stdout)
        lines = output.read_text().splitlines()
    pins = {}
    for line in lines:
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split(";")[0].strip().split("==", 1)
            pins[str(canonicalize_name(name))] = version.strip()
    return pins, ""


def _install_overlay(base: Stack, wanted: dict[str, str], mode: str, label: str, options: InstallOptions) -> Stack:
    """Install `wanted` without dependencies into a cached `--target` directory for this base."""
    assert base.python is not None
    identity = json.dumps({"base": str(base.python), "base_path": base.pythonpath, "wanted": sorted(wanted.items())})
    target = options.envs_dir / "script-overlays" / hashlib.sha256(identity.encode()).hexdigest()[:16]
    marker = target / OVERLAY_MARKER
    path = ":".join(p for p in (str(target / "site"), base.pythonpath) if p)
    if marker.is_file() and not options.rebuild:
        data = json.loads(marker.read_text())
        disk.mark_used(target)  # the cap's pruner leaves it while this process runs over it
        return replace(
            base, label=label, kind="overlay", pythonpath=path, versions=data["versions"], reused=True, seconds=0.0,
            mode=mode, overlaid=wanted,
        )  # fmt: skip
    started = time.monotonic()
    target_overlay.discard(target)
    if wanted:
        # uv's pip interface, whose flags `index_flags` writes (an atlas environment has no pip of its own).
        uv_pip = [target_overlay.uv_binary(), "pip", "install", "--python", str(base.python)]
        requirements = [f"{n}=={v}" for n, v in sorted(wanted.items())]
        flags = envs.index_flags(options=options) + _built_over_base(wanted, requirements)
        argv = target_overlay.install_argv(uv_pip, target / "site", requirements, flags)
        proc = subprocess.run(argv, capture_output=True, text=True, env=_build_env(wanted, requirements))
        if proc.returncode != 0:
            target_overlay.discard(target)
            return Stack(label, None, {}, "overlay", failure=envs.summarise_install_error(proc.stderr), mode=mode)
    else:
        (target / "site").mkdir(parents=True)
    versions = envs.installed_versions(base.python, pythonpath=path)
    marker.write_text(json.dumps({"versions": versions, "wanted": wanted, "mode": mode}, indent=1))
    disk.mark_used(target)
    seconds = time.monotonic() - started
    return replace(
        base, label=label, kind="overlay", pythonpath=path, versions=versions, reused=False, seconds=seconds,
        mode=mode, overlaid=wanted,
    )  # fmt: skip


def _names(pins: dict[str, str], lines: list[str]) -> list[str]:
    return sorted({*pins, *(str(canonicalize_name(Requirement(line).name)) for line in lines)})


def _built_over_base(pins: dict[str, str], lines: list[str]) -> list[str]:
    """uv flags for the sdist-only packages that must build over the base's torch (DeepSpeed imports torch to build,
    and uv builds even its metadata to resolve): no build isolation for them, as the atlas's environments were built."""
    return [f for name in late_installed(_names(pins, lines)) for f in ("--no-build-isolation-package", name)]


def _build_env(pins: dict[str, str], lines: list[str]) -> dict[str, str]:
    """The environment their builds need (DS_BUILD_OPS=0: a pure-Python DeepSpeed wheel)."""
    return dict(os.environ) | build_env(_names(pins, lines))


def _day_cell(history: Profile, day: str) -> Cell:
    """The history profile's cell of one day: the same environment the atlas built for it."""
    return expand(replace(history, axes={**history.axes, DATE_AXIS: (day,)}))[0]


def _from_env(label: str, built: envs.EnvResult, kind: str) -> Stack:
    return Stack(
        label, built.python, built.versions, kind, built.pythonpath, built.failure, built.reused, built.seconds,
        environment_reused=built.reused if built.python else None,
    )  # fmt: skip


def _satisfied(line: str, versions: dict[str, str]) -> bool:
    requirement = Requirement(line)
    have = versions.get(str(canonicalize_name(requirement.name)))
    return have is not None and requirement.specifier.contains(have, prereleases=True)
