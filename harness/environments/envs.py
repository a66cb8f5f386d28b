"""Build (or reuse) one environment per cell.

Two modes:
- **uv** (default): a uv virtual environment per cell. uv does not read pip.conf, so the pip variables
  that point at the local CPU torch wheel (`PIP_FIND_LINKS`) or a private index become uv flags here.
  `--offline --wheelhouse DIR` installs only from DIR.
- **system** (`--system-torch`, or `[install] mode = "system"`): the node's preinstalled python and torch
  stay; the cell's other packages are layered over it as a `pip --target` overlay directory that goes first
  on PYTHONPATH. This is how air-gapped GPU nodes without uv run the matrix.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from harness.define.cells import Cell
from harness.define.profile import DATE_AXIS, Profile
from harness.environments import disk
from harness.environments.overlay import discard, install_argv, installer, uv_binary
from harness.errors import UsageError
from harness.processes import guard
from harness.processes.proctree import ORCHESTRATOR_VAR

MARKER = disk.MARKERS[0]
#: Where torch comes from: PyPI (its default Linux wheel is a CUDA build, about 4.3 GB with its libraries, which runs
#: on CPU too; what the committed atlas ran), or a CPU-only index (`cpu`, about 0.9 GB) or any index URL or wheel
#: folder. The same for every command through the variable; `--torch-index` sets it for one.
TORCH_INDEX_VAR = "COMPAT_MATRIX_TORCH_INDEX"
TORCH_INDEXES = {"pypi": None, "cpu": "https://download.pytorch.org/whl/cpu"}
#: Prints {distribution: version} for the environment it runs in; the first one on sys.path wins.
LIST_VERSIONS = (
    "import importlib.metadata as m, json, platform\n"
    "seen = {}\n"
    "for d in m.distributions():\n"
    "    name = (d.metadata['Name'] or '').lower().replace('_', '-')\n"
    "    if name and name not in seen: seen[name] = d.version\n"
    "seen['python'] = platform.python_version()\n"
    "print(json.dumps(seen))\n"
)


@dataclass(frozen=True)
class InstallOptions:
    """How cell environments are built: from the index, offline from a wheelhouse, or over a system stack."""

    envs_dir: Path
    offline: bool = False
    wheelhouse: Path | None = None
    system_python: str | None = None  # set -> system mode, whatever the profile says
    rebuild: bool = False
    #: The cap on what the environments folder holds of its own, in GB (0: none; None: `disk.default_cap_gb()`).
    max_env_gb: float | None = None
    #: Where torch comes from (`TORCH_INDEXES`' names, an index URL or a wheel folder; None: the variable, else PyPI).
    torch_index: str | None = None

    def __post_init__(self) -> None:
        self.cap()  # a cap given by the variable that is no number: one line, before anything is built

    def mode(self, profile: Profile) -> str:
        return "system" if self.system_python or profile.install_mode == "system" else "uv"

    def cap(self) -> int | None:
        """The cap in bytes, None for none."""
        return disk.cap_bytes(disk.default_cap_gb() if self.max_env_gb is None else self.max_env_gb)

    def torch_source(self) -> str | None:
        """The index URL or wheel folder torch is installed from; None for PyPI (with the rest of the stack)."""
        given = self.torch_index if self.torch_index is not None else os.environ.get(TORCH_INDEX_VAR, "")
        given = given.strip()
        if not given or given == "pypi":
            return None
        return TORCH_INDEXES.get(given, given)


@dataclass(frozen=True)
class EnvResult:
    """A ready environment, or the reason it could not be built."""

    python: Path | None
    versions: dict[str, str]
    reused: bool
    seconds: float
    failure: str | None = None
    pythonpath: str | None = None  # the overlay, in system mode
    mode: str = "uv"
    overlaid: list[str] = field(default_factory=list)
    #: Optional packages left out of the overlay because they cannot be imported here: name -> why.
    left_out: dict[str, str] = field(default_factory=dict)
    #: The local label of the torch it holds ("cu132": PyPI's CUDA wheel, "cpu"), where it holds one.
    torch_build: str | None = None
    #: Where its torch came from: "pypi", or the CPU index's URL or wheel folder.
    torch_index: str = "pypi"


class InstallFailed(Exception):
    """The environment could not be built; the message is the resolver's or installer's reason."""


def index_flags(
    environ: dict[str, str] | None = None, options: InstallOptions | None = None, dated: bool = False
) -> list[str]:
    """uv flags equivalent to the pip settings in the environment, or offline flags for a wheelhouse. A dated
    cell gets no find-links: local wheels carry no upload date, so `--exclude-newer` cannot hold them to the
    cell's day (a local torch 2.13.0 would otherwise land in a 2025 stack)."""
    if options is not None and options.offline:
        if options.wheelhouse is None:
            raise InstallFailed("--offline needs --wheelhouse DIR")
        return ["--offline", "--no-index", "--find-links", str(options.wheelhouse)]
    environ = dict(os.environ if environ is None else environ)
    flags: list[str] = []
    for location in [] if dated else environ.get("PIP_FIND_LINKS", "").split():
        flags += ["--find-links", location]
    if options is not None and options.wheelhouse is not None:
        flags += ["--find-links", str(options.wheelhouse)]
    if environ.get("PIP_INDEX_URL"):
        flags += ["--index-url", environ["PIP_INDEX_URL"]]
    for url in environ.get("PIP_EXTRA_INDEX_URL", "").split():
        flags += ["--extra-index-url", url]
    return flags


def uv_environ(dated: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment uv runs in: for a dated cell without `UV_FIND_LINKS`, which uv reads by itself: a local wheel
    carries no upload date, so `--exclude-newer` cannot hold it to the day (with it set, a 2025-07-04 stack got the
    machine's torch 2.13.0+cpu instead of the day's 2.7.1, measured 2026-11-27)."""
    environ = dict(os.environ if base is None else base)
    if dated:
        environ.pop("UV_FIND_LINKS", None)
    return environ


def default_envs_dir() -> Path:
    """Outside the work tree, so fresh clones and CI on the same machine reuse built cells."""
    base = os.environ.get("COMPAT_MATRIX_ENVS")
    if base:
        return Path(base)
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "compat-matrix" / "envs"
    home = os.environ.get("HOME", "")
    if not home or not os.path.isabs(home):
        # Path.home() would give "/" or a relative path: a 1.3 GB environment in /.cache, silently.
        raise UsageError(
            f"HOME is {home!r}, so there is no cache directory for cell environments: set HOME, "
            "XDG_CACHE_HOME or COMPAT_MATRIX_ENVS, or pass --envs-dir"
        )
    return Path(home) / ".cache" / "compat-matrix" / "envs"


def env_dir_for(cell: Cell, profile: Profile, options: InstallOptions) -> Path:
    extra = (
        *profile.extra_requirements,
        *profile.build_requires,
        *sorted(profile.install_env.items()),
        options.mode(profile),
        *profile.overlay_support,
        "bytecode",
        *_era_facts(cell, profile),
        *((f"torch-from:{options.torch_source()}",) if options.torch_source() else ()),
    )
    return options.envs_dir / f"{cell.stack_id}-{cell.env_key(profile.python, tuple(map(str, extra)))}"


def ensure_env(cell: Cell, profile: Profile, options: InstallOptions) -> EnvResult:
    """Return a working environment for the cell, building it unless a matching one exists. One process builds
    an environment at a time (Slurm array tasks and shards share the environments directory, and cells that
    differ only in world size share an environment); the others wait and then reuse it.

    The installers inherit the lock and carry the harness's pid for the orphan guard: if the harness dies
    mid-build, the guard kills them, and a second invocation waits on the lock until the last of them is gone,
    so it never races a dying installer for the half-built directory (which it then discards, never reuses)."""
    target = env_dir_for(cell, profile, options)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_env(cell, profile, options, target, lock.fileno())


def _ensure_env(cell: Cell, profile: Profile, options: InstallOptions, target: Path, lock_fd: int) -> EnvResult:
    start = time.monotonic()
    marker = target / MARKER
    if marker.is_file() and not options.rebuild:
        data = json.loads(marker.read_text())
        disk.mark_used(target)  # under the build lock: no pruner can take it between the two
        return EnvResult(
            Path(data["python"]),
            data["versions"],
            True,
            time.monotonic() - start,
            pythonpath=data.get("pythonpath"),
            mode=data.get("mode", "uv"),
            overlaid=data.get("overlaid", []),
            left_out=data.get("left_out", {}),
            torch_build=data.get("torch_build") or disk.torch_build(target),
            torch_index=data.get("torch_index", "pypi"),
        )
    discard(target)  # half-built (no marker: its builder died) or --rebuild-envs
    target.parent.mkdir(parents=True, exist_ok=True)
    make_room(options, [disk.Planned(target, _torch_pin(cell), "cpu" if options.torch_source() else "cuda")], target)
    deadline = start + profile.install_timeout_s
    build = _Build(deadline, lock_fd)
    try:
        if options.mode(profile) == "system":
            result = _build_overlay(cell, profile, options, target, build)
        else:
            result = _build_uv(cell, profile, options, target, build)
    except InstallFailed as exc:
        discard(target)
        return EnvResult(None, {}, False, time.monotonic() - start, failure=str(exc), mode=options.mode(profile))
    built = disk.torch_build(target)
    # The marker is written last, atomically: an environment without it is never reused.
    _write_atomically(
        marker,
        json.dumps(
            {
                "requirements": cell.requirements(),
                "python": str(result.python),
                "versions": result.versions,
                "pythonpath": result.pythonpath,
                "mode": result.mode,
                "overlaid": result.overlaid,
                **({"left_out": result.left_out} if result.left_out else {}),
                **({"torch_build": built} if built else {}),
                "torch_index": result.torch_index,
            },
            indent=1,
        ),
    )
    disk.mark_used(target)
    disk.sizes(target)  # measured once now: the next command's estimate reads it
    return EnvResult(
        result.python,
        result.versions,
        False,
        time.monotonic() - start,
        pythonpath=result.pythonpath,
        mode=result.mode,
        overlaid=result.overlaid,
        left_out=result.left_out,
        torch_build=built,
        torch_index=result.torch_index,
    )


def make_room(options: InstallOptions, planned: list[disk.Planned], *keep: Path) -> list[disk.Pruned]:
    """Before environments are built: remove the least recently used ones not in use until what the folder holds,
    plus what these will add, fits under the cap (said in one line when any goes)."""
    cap = options.cap()
    if cap is None:
        return []
    room = disk.estimate(planned, options.envs_dir, cap, measure_folder=False).new_bytes
    gone = disk.prune(options.envs_dir, cap, room, keep=tuple(keep))
    if gone:
        print(disk.pruned_line(gone), flush=True)
    return gone


def planned_env(cell: Cell, profile: Profile, options: InstallOptions, torch: str | None = None) -> disk.Planned:
    """The environment a cell will use, for the disk estimate (`disk.estimate`): where it lies and its torch: `torch`
    where the caller knows it (an atlas day's records say which torch it resolved), else the cell's exact pin."""
    kind = "cpu" if options.torch_source() else "cuda"
    return disk.Planned(env_dir_for(cell, profile, options), torch or _torch_pin(cell), kind)


def done_with(cell: Cell, profile: Profile, options: InstallOptions) -> None:
    """The cell's runs are over: its environment may be pruned (it stays built until the cap needs its room)."""
    disk.release(env_dir_for(cell, profile, options))


def _torch_pin(cell: Cell) -> str | None:
    """The torch release a cell pins exactly, else None (resolved: as of its day, or the newest)."""
    for line in cell.requirements():
        requirement = Requirement(line)
        if requirement.name.lower() == "torch":
            exact = [s.version for s in requirement.specifier if s.operator == "=="]
            return exact[0].split("+")[0] if exact else None
    return None


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f"{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


@dataclass(frozen=True)
class _Build:
    """One build's deadline and the environment lock its installers inherit."""

    deadline: float
    lock_fd: int


def _build_uv(cell: Cell, profile: Profile, options: InstallOptions, target: Path, build: _Build) -> EnvResult:
    _run(["venv", "--quiet", "--python", profile.python, str(target)], build, uv=True)
    python = target / "bin" / "python"
    flags = index_flags(options=options, dated=bool(cell.date)) + era_flags(cell, profile)
    environ = uv_environ(bool(cell.date))
    wanted = cell.requirements()
    if cell.date:
        # Packages resolved against today's index: their own line replaces the cell's bare name.
        outside = {_name(line): line for line in profile.outside_era}
        named = {_name(r) for r in wanted}
        # A bare name in the cell ('latest') takes the profile's line; an exact pin stays exact.
        wanted = [outside.get(r, r) for r in wanted] + [x for n, x in outside.items() if n not in named]
    source = options.torch_source()
    torch_index = "pypi"
    if source and any(_name(r) == "torch" for r in wanted):
        wanted = _torch_first(python, wanted, source, flags, environ, build)
        torch_index = source
    late = [r for r in wanted if _name(r) in profile.no_build_isolation]
    early = [r for r in wanted if r not in late] + list(profile.extra_requirements)
    if late:
        early += list(profile.build_requires)
    # Precompiled bytecode: without it every worker pays 20-35 s extra on its first import of the stack
    # where PYTHONDONTWRITEBYTECODE is set.
    _run(["pip", "install", "--compile-bytecode", "--python", str(python), *flags, *early], build, environ, uv=True)
    if late:
        # Built against the torch installed by the first step (DeepSpeed needs torch at build time).
        env = environ | profile.install_env
        _run(
            [
                "pip",
                "install",
                "--compile-bytecode",
                "--python",
                str(python),
                "--no-build-isolation",
                *flags,
                *early,
                *late,
            ],
            build,
            env=env,
            uv=True,
        )
    return EnvResult(python, installed_versions(python), False, 0.0, mode="uv", torch_index=torch_index)


def torch_source_flags(source: str) -> list[str]:
    """uv flags that take torch from `source` alone: an index URL, or a folder of wheels."""
    if "://" in source and not source.startswith("file://"):
        return ["--index-url", source]
    return ["--no-index", "--find-links", source.removeprefix("file://")]


def _torch_first(
    python: Path, wanted: list[str], source: str, flags: list[str], environ: dict[str, str], build: _Build
) -> list[str]:
    """Install torch alone from `source` (no dependencies), at the release the cell's own resolution gives it (its
    exact pin, else the newest its requirement and its day allow on the index the rest comes from), and return the
    requirements with torch pinned to exactly what was installed, so the rest of the stack resolves around it. A
    CPU-only index carries no upload dates uv could hold to the day, so the day is decided here, on the main index;
    where a package of the day caps torch below that release the install fails with uv's reason, never silently."""
    line = next(r for r in wanted if _name(r) == "torch")
    requirement = Requirement(line)
    exact = [s.version for s in requirement.specifier if s.operator == "=="]
    release = exact[0].split("+")[0] if exact else _resolved_release(python, line, flags, environ, build)
    _run(
        ["pip", "install", "--compile-bytecode", "--python", str(python), "--no-deps", *torch_source_flags(source),
         f"torch=={release}"],
        build, environ, uv=True,
    )  # fmt: skip
    installed = installed_versions(python).get("torch")
    if not installed:
        raise InstallFailed(f"torch {release} from {source}: not installed")
    return [f"torch=={installed}" if _name(r) == "torch" else r for r in wanted]


def _resolved_release(python: Path, line: str, flags: list[str], environ: dict[str, str], build: _Build) -> str:
    """The torch release uv picks for `line` on the main index with the cell's flags (its day's cutoff)."""
    argv = [uv_binary(), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate", "--no-deps",
            "--python", str(python), *flags]  # fmt: skip
    remaining = build.deadline - time.monotonic()
    try:
        proc = subprocess.run(
            argv, input=line + "\n", capture_output=True, text=True, env=environ, timeout=max(remaining, 1)
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InstallFailed("install timed out resolving torch's release") from None
    if proc.returncode != 0:
        raise InstallFailed(summarise_install_error(proc.stderr or proc.stdout))
    for out in proc.stdout.splitlines():
        if out.lower().startswith("torch=="):
            return out.split("==", 1)[1].split(";")[0].strip().split("+")[0]
    raise InstallFailed(f"no torch release resolves for {line!r}")


def era_flags(cell: Cell, profile: Profile) -> list[str]:
    """A dated cell resolves every package as the index had it at the start of that day (uv's
    --exclude-newer), apart from the profile's `outside_era` packages, resolved as of the newest day."""
    if not cell.date:
        return []
    flags = ["--exclude-newer", f"{cell.date}T00:00:00Z"]
    for line in profile.outside_era:
        flags += ["--exclude-newer-package", f"{_name(line)}={era_exception_day(profile)}T23:59:59Z"]
    return flags


def _era_facts(cell: Cell, profile: Profile) -> tuple[str, ...]:
    """What a dated cell's exceptions, or its era lock's overlay, add to its environment's identity (nothing
    for other cells)."""
    if cell.date and profile.era_packages:
        try:
            return ("era-lock", *_overlay_requirements(cell, profile))
        except InstallFailed as exc:
            return ("era-lock-unresolved", str(exc))
    if not (cell.date and profile.outside_era):
        return ()
    return ("outside-era", *profile.outside_era, era_exception_day(profile))


def era_exception_day(profile: Profile) -> str:
    """The day `outside_era` packages are resolved as of: the profile's own, else the newest of its dates."""
    return profile.outside_era_day or max(profile.axes.get(DATE_AXIS, ("",)))


def _overlay_requirements(cell: Cell, profile: Profile) -> list[str]:
    """What a cell layers over the node: its requirement lines, or for a dated cell of an era-locked profile
    the day's overlay from the lock (a day with no stack over the node's torch fails to install, with uv's
    reason)."""
    if not (cell.date and profile.era_packages):
        return cell.requirements()
    from harness.versions.lock_file import lock_path, read_lock

    entry = read_lock(lock_path(profile.path.parent, profile.name))["days"].get(cell.date)
    if entry is None:
        raise InstallFailed(f"the era lock has no entry for {cell.date}: run python -m harness lock again")
    if entry.get("error"):
        raise InstallFailed(entry["error"])
    return [f"{name}=={version}" for name, version in entry["overlay"].items()]


def _build_overlay(cell: Cell, profile: Profile, options: InstallOptions, target: Path, build: _Build) -> EnvResult:
    python = Path(options.system_python or shutil.which("python3") or sys.executable)
    system = installed_versions(python)
    wanted = []
    for line in [*_overlay_requirements(cell, profile), *profile.extra_requirements]:
        requirement = Requirement(line)
        have = system.get(requirement.name.lower())
        if have is not None and (not requirement.specifier or requirement.specifier.contains(have, prereleases=True)):
            continue  # the node already satisfies it; 'latest' over a system stack means the node's own release
        wanted.append(line)
    for package in cell.system_packages():
        if package not in system:
            raise InstallFailed(f"{package} is pinned 'system' but {python} has no {package}")
    left_out: dict[str, str] = {}
    if options.wheelhouse is not None and profile.optional:
        for line in list(wanted):
            requirement = Requirement(line)
            pinned = [s.version for s in requirement.specifier if s.operator == "=="]
            name = requirement.name.lower()
            if name in profile.optional and pinned and not _has_wheel(options.wheelhouse, name, pinned[0]):
                wanted.remove(line)
                left_out[name] = f"no wheel of {name}=={pinned[0]} in the wheelhouse {options.wheelhouse.name}"
    if wanted:
        wanted += [s for s in profile.overlay_support if Requirement(s).name.lower() not in system]
        overlay = target / "site"
        links = ["--find-links", str(options.wheelhouse)] if options.wheelhouse else []
        index = ["--no-index"] if options.offline or options.wheelhouse else []
        _run(install_argv(installer(python), overlay, wanted, [*index, *links]), build)
        left_out |= leave_out_unimportable(python, overlay, profile.optional)
        wanted = [w for w in wanted if Requirement(w).name.lower() not in left_out]
        _check_overlay_closure(python, str(overlay), [Requirement(w).name for w in wanted])
        versions = installed_versions(python, pythonpath=str(overlay))
        return EnvResult(
            python,
            versions,
            False,
            0.0,
            pythonpath=str(overlay),
            mode="system-overlay",
            overlaid=sorted(Requirement(w).name.lower() for w in wanted),
            left_out=left_out,
        )
    target.mkdir(parents=True, exist_ok=True)
    return EnvResult(python, system, False, 0.0, mode="system", left_out=left_out)


def _has_wheel(wheelhouse: Path, name: str, version: str) -> bool:
    """Whether the wheelhouse holds a wheel of name==version (any tags)."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    for path in wheelhouse.glob("*.whl"):
        try:
            found, found_version, _, _ = parse_wheel_filename(path.name)
        except ValueError:
            continue
        if found == canonicalize_name(name) and str(found_version) == version:
            return True
    return False


def leave_out_unimportable(python: Path, overlay: Path, optional: tuple[str, ...]) -> dict[str, str]:
    """Remove from the overlay each optional package that cannot be imported over the node's stack (measured
    here, not assumed: a bitsandbytes with no library for this CUDA), so that what needs none of them still runs.
    Returns name -> the import's last error line."""
    from harness.define.packages import import_name

    left: dict[str, str] = {}
    for name in optional:
        dists = list(overlay.glob(f"{name.replace('-', '_')}-*.dist-info"))
        if not dists:
            continue
        module = import_name(name)
        env = dict(os.environ, PYTHONPATH=str(overlay))
        proc = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, env=env)
        if proc.returncode == 0:
            continue
        lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)]  # the exception line
        said = (raised or lines or [f"exit {proc.returncode}"])[-1][:300]
        left[name.lower()] = f"import {module} fails here: {said}"
        for dist in dists:
            for line in (dist / "RECORD").read_text().splitlines() if (dist / "RECORD").is_file() else []:
                top = line.split(",", 1)[0].split("/", 1)[0]
                if top and not top.endswith(".dist-info") and (overlay / top).exists():
                    _remove(overlay / top)
            _remove(dist)
    return left


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


CHECK_REQUIRES = """
import importlib.metadata as m, json, sys
from packaging.requirements import Requirement
problems = []
for name in json.loads(sys.argv[1]):
    for line in m.requires(name) or []:
        req = Requirement(line)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = m.version(req.name)
        except m.PackageNotFoundError:
            problems.append(f"{name} needs {req} (absent)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            problems.append(f"{name} needs {req} (found {have})")
print(json.dumps(problems))
"""


def _check_overlay_closure(python: Path, overlay: str, names: list[str]) -> None:
    """--no-deps overlays can miss what the node lacks: say so now, as install-failed, not later at import."""
    env = dict(os.environ, PYTHONPATH=overlay)
    proc = subprocess.run(
        [str(python), "-c", CHECK_REQUIRES, json.dumps(names)], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        return  # no `packaging` on the node: the worker's import check still catches a broken stack
    problems = json.loads(proc.stdout)
    if problems:
        raise InstallFailed(
            "the overlay over the system stack is incomplete: "
            + "; ".join(problems)
            + " (add them to [install] overlay_support and the wheelhouse)"
        )


def installed_versions(python: Path, pythonpath: str | None = None) -> dict[str, str]:
    """Resolved versions of every package the environment imports first (names normalised), plus python."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([str(python), "-c", LIST_VERSIONS], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def _name(requirement: str) -> str:
    return Requirement(requirement).name.lower()


def _run(args: list[str], build: _Build, env: dict[str, str] | None = None, uv: bool = False) -> None:
    remaining = build.deadline - time.monotonic()
    if remaining <= 0:
        raise InstallFailed("install timed out")
    command = [uv_binary(), *args] if uv else args
    guard.ensure_started()
    # The installer and its children (uv's bytecode compilers) carry our pid, so the guard kills them if we die,
    # and hold the environment's lock until the last of them has exited.
    tagged = dict(os.environ if env is None else env) | {ORCHESTRATOR_VAR: str(os.getpid())}
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=remaining,
            env=tagged,
            stdin=subprocess.DEVNULL,
            pass_fds=(build.lock_fd,),
        )
    except subprocess.TimeoutExpired:
        raise InstallFailed(f"install timed out after {remaining:.0f} s: {' '.join(args[:2])}") from None
    if proc.returncode != 0:
        raise InstallFailed(summarise_install_error(proc.stderr or proc.stdout))


def summarise_install_error(text: str, limit: int = 1500) -> str:
    """Keep the resolver's explanation, drop progress noise, bound the size: its first lines (what failed) and its
    last (why: a build's traceback ends on its exception, uv's hints come last), never cut before the cause."""
    noise = ("Resolved", "Prepared", "Installed", "Audited", "Using", "WARNING: Location")
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(noise)]
    start = next((i for i, ln in enumerate(lines) if "error" in ln.lower() or "No solution" in ln or "×" in ln), 0)
    summary = "\n".join(lines[start:])
    if not summary:
        return "the installer failed without a message"
    if len(summary) <= limit:
        return summary
    head, tail = summary[: limit // 3], summary[-(limit - limit // 3) :]
    head, tail = head[: head.rfind("\n") + 1 or len(head)], tail[tail.find("\n") + 1 :]
    return f"{head}... ({len(summary) - len(head) - len(tail)} characters left out)\n{tail}"
