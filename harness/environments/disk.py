"""What environments cost on disk, what a command will add before it starts, and a cap kept by pruning the least
recently used.

uv installs an environment by hardlinking each file from its own cache (`~/.cache/uv`; measured 2026-12-05: an
atlas day's environment of 5.8 GB holds 250 MB of its own, the bytecode; the rest, the CUDA torch and its libraries,
are links to uv's cache, shared with every other environment of that torch). So the disk a command needs is two
parts: what its new environments hold on their own, and what uv's cache must download (a torch not cached yet,
about 4.3 GB for PyPI's CUDA build). The cap counts what the environments folder alone holds: each file once, and
only where no link to it lies outside the folder (a file shared with uv's cache stays in uv's cache when its
environment goes: removing the environment would not free it, so it is not counted against the cap; uv's cache is
the user's, shared with their other projects: `uv cache prune` is theirs to run).

An environment in use is never removed: `mark_used` takes a shared lock on it for as long as the process runs (or
until `release`), and the pruner removes only what it can lock exclusively, as it locks builds (`envs.ensure_env`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UsageError

GB = 10**9
#: The cap when none is given, sized for a laptop: about 35 environments that share uv's cache (0.25 to 0.36 GB of
#: their own each; the flip probes of one session once left 40, 11 GB), or one or two that copied a CUDA torch.
DEFAULT_MAX_ENV_GB = 10.0
CAP_VAR = "COMPAT_MATRIX_MAX_ENV_GB"
#: What a built environment is named by (a cell's, or bisect-script's overlay over one).
MARKERS = (".compat-matrix-cell.json", ".compat-matrix-overlay.json")
USED_STAMP = ".compat-matrix-used"
SIZES = ".compat-matrix-disk.json"
#: Where no built environment says better (measured 2026-12-05 on the 2-core machine): a day's whole stack with
#: PyPI's CUDA torch (5.7 GB, torch 2.2 to 2.15) or a CPU torch (1.3 GB with torch 2.13.0+cpu), and what an
#: environment holds of its own beside uv's cache (the bytecode and metadata: 250 to 360 MB).
FALLBACK_STACK = {"cuda": int(5.7 * GB), "cpu": int(1.3 * GB)}
FALLBACK_OWN = int(0.3 * GB)

_HELD: dict[Path, int] = {}  # environment -> the descriptor of its use lock, for this process's life


def default_cap_gb() -> float:
    """`COMPAT_MATRIX_MAX_ENV_GB` where set (0: no cap), else the default."""
    given = os.environ.get(CAP_VAR)
    if not given:
        return DEFAULT_MAX_ENV_GB
    try:
        value = float(given)
    except ValueError:
        raise UsageError(f"{CAP_VAR}={given!r}: expected a number of GB (0: no cap)") from None
    if value < 0 or value != value:
        raise UsageError(f"{CAP_VAR}={given!r}: expected a number of GB, 0 or more (0: no cap)")
    return value


def cap_bytes(gb: float | None) -> int | None:
    """The cap in bytes; None for no cap (0 GB)."""
    return int(gb * GB) if gb else None


# --- what is there -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvDisk:
    """One built environment (or overlay) as the disk sees it."""

    path: Path
    #: Bytes no file outside this environment links: what removing it frees.
    own: int
    #: Bytes whose files are linked from elsewhere too (uv's cache, another environment).
    linked: int
    last_used: float
    #: The torch it holds, as its marker records it (None for an overlay without torch).
    torch: str | None = None
    build: str | None = None

    @property
    def whole(self) -> int:
        return self.own + self.linked


def environments(envs_dir: Path) -> list[Path]:
    """Every built environment in the folder: the cells' (a marker at the top) and bisect-script's overlays."""
    found = []
    for parent in (envs_dir, envs_dir / "script-overlays"):
        if not parent.is_dir():
            continue
        for child in sorted(parent.iterdir()):
            if child.is_dir() and not child.is_symlink() and any((child / m).is_file() for m in MARKERS):
                found.append(child)
    return found


def _files(root: Path):
    """(inode key, allocated bytes, link count) of every regular file under root, links not followed."""
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (st.st_mode & 0o170000) == 0o100000:
                yield (st.st_dev, st.st_ino), st.st_blocks * 512, st.st_nlink


def measure(path: Path) -> tuple[int, int]:
    """(own, linked) bytes of one environment, each file once: own where every link to it lies inside it."""
    seen: dict[tuple[int, int], list[int]] = {}
    for key, size, links in _files(path):
        entry = seen.setdefault(key, [size, links, 0])
        entry[2] += 1
    own = sum(size for size, links, found in seen.values() if found >= links)
    return own, sum(size for size, _, _ in seen.values()) - own


def folder_bytes(envs_dir: Path) -> int:
    """What the environments folder alone holds: each file once, where every link to it lies inside the folder."""
    if not envs_dir.is_dir():
        return 0
    seen: dict[tuple[int, int], list[int]] = {}
    for key, size, links in _files(envs_dir):
        entry = seen.setdefault(key, [size, links, 0])
        entry[2] += 1
    return sum(size for size, links, found in seen.values() if found >= links)


def last_used(path: Path) -> float:
    """When the environment was last used (its stamp, else its marker's time)."""
    for name in (USED_STAMP, *MARKERS):
        try:
            return (path / name).stat().st_mtime
        except OSError:
            continue
    return 0.0


def torch_of(path: Path) -> tuple[str | None, str | None]:
    """(the torch release with its build label, the build: "cpu", "cu132", ...), as the marker and files say."""
    try:
        versions = json.loads((path / MARKERS[0]).read_text()).get("versions") or {}
    except (OSError, ValueError, AttributeError):
        return None, None
    release = versions.get("torch")
    if not release:
        return None, None
    build = torch_build(path)
    return (f"{str(release).split('+')[0]}+{build}" if build else str(release)), build


def torch_build(prefix: Path) -> str | None:
    """The local label of the torch an environment holds ("cpu", "cu132", "rocm6.4"), read from torch/version.py
    without importing it (an atlas environment's distribution version never carries it: PyPI's CUDA wheel is
    "2.15.0"); None where there is no torch."""
    for version_file in sorted(prefix.glob("lib/python*/site-packages/torch/version.py")) + sorted(
        prefix.glob("site/torch/version.py")
    ):
        try:
            text = version_file.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("__version__"):
                value = line.split("=", 1)[1].strip().strip("'\"")
                return value.split("+", 1)[1] if "+" in value else "default"
    return None


def sizes(path: Path) -> EnvDisk:
    """The environment's sizes, measured once and kept beside it (an estimate after that: uv's cache may drop a
    file, which then counts as the environment's own)."""
    torch, build = torch_of(path)
    try:
        kept = json.loads((path / SIZES).read_text())
        own, linked = int(kept["own"]), int(kept["linked"])
    except (OSError, ValueError, KeyError, TypeError):
        own, linked = measure(path)
        try:
            (path / SIZES).write_text(json.dumps({"own": own, "linked": linked}) + "\n")
        except OSError:
            pass
    return EnvDisk(path, own, linked, last_used(path), torch, build)


# --- in use ----------------------------------------------------------------------------------------------------


def _use_lock(path: Path) -> Path:
    return path.parent / f".{path.name}.use"


def mark_used(path: Path) -> None:
    """This process uses the environment: stamp it (least recently used goes first) and hold it, shared, until
    `release` or the process ends, so that no pruner removes it meanwhile."""
    try:
        (path / USED_STAMP).touch()
    except OSError:
        return
    if path in _HELD:
        return
    try:
        fd = os.open(_use_lock(path), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        return
    _HELD[path] = fd


def release(path: Path) -> None:
    """This process no longer needs the environment: it may be pruned."""
    fd = _HELD.pop(path, None)
    if fd is not None:
        os.close(fd)


def _lock_all(path: Path) -> list[int] | None:
    """Exclusive locks on the environment's build lock and use lock, or None where any is held (a build, a run)."""
    held: list[int] = []
    for lock in (path.parent / f".{path.name}.lock", _use_lock(path)):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            break
        held.append(fd)
    else:
        return held
    for fd in held:
        os.close(fd)
    return None


# --- before a command ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One environment a command will use: where it lies and the torch it will hold, where known."""

    path: Path
    #: The torch release ("2.5.1"), None where the command resolves it (a dated cell: as of its day).
    torch: str | None = None
    #: "cuda" (PyPI's default wheel on Linux) or "cpu" (a CPU-only index, or a local CPU wheel).
    build: str = "cuda"


@dataclass
class DiskNeed:
    """What a command's environments will take, said before it starts."""

    reused: int
    built: int
    #: Bytes its new environments will hold (their own files, plus each torch not in any environment yet).
    new_bytes: int
    #: Torch releases no environment holds: uv downloads them (where its cache lacks them too).
    new_torches: list[str] = field(default_factory=list)
    unknown_torch: int = 0
    folder: int | None = None
    free: int | None = None
    cap: int | None = None

    def line(self) -> str:
        """One line: the environments, the disk they add, what is there, the cap and what is free."""
        size = f"{'up to ' if self.unknown_torch else 'about '}{self.new_bytes / GB:.1f} GB"
        torches = f"; new torch: {', '.join(self.new_torches)}" if self.new_torches else ""
        unknown = f"; {self.unknown_torch} whose torch is resolved as of its day" if self.unknown_torch else ""
        there = f"; the environments hold {self.folder / GB:.1f} GB of their own" if self.folder is not None else ""
        cap = (
            f" (cap {self.cap / GB:.0f} GB: the least recently used are removed first)"
            if self.cap
            else " (no cap: --max-env-gb)"
        )
        free = f"; {self.free / GB:.1f} GB free" if self.free is not None else ""
        return (
            f"disk: {self.built} environment(s) to build ({size}{torches}{unknown}), {self.reused} reused"
            f"{there}{cap}{free}"
        )


def estimate(planned: list[Planned], envs_dir: Path, cap: int | None, measure_folder: bool = False) -> DiskNeed:
    """What the planned environments add, from what the built ones measure (`typical`): each new one its own files,
    and a torch no environment holds yet its whole stack; a torch not known before resolving counts as new (the line
    says "up to")."""
    found = [sizes(p) for p in environments(envs_dir)]
    built = [e for e in found if (e.path / MARKERS[0]).is_file()]
    held = {_public(e.torch) + "|" + _kind(e.build) for e in built if e.torch}
    need = DiskNeed(reused=0, built=0, new_bytes=0, cap=cap)
    for item in dict.fromkeys(planned):
        if any((item.path / m).is_file() for m in MARKERS):
            need.reused += 1
            continue
        need.built += 1
        own, stack = typical(built, _kind(item.build))
        torch = item.torch or _same_stack(item.path, built)
        key = f"{torch}|{_kind(item.build)}" if torch else None
        if key is None:
            need.unknown_torch += 1
            need.new_bytes += stack
        elif key in held:
            need.new_bytes += own
        else:
            held.add(key)
            need.new_torches.append(f"{torch} ({_kind(item.build)})")
            need.new_bytes += stack
    # What the folder holds now, from each environment's own files as measured once (exact where, as uv installs
    # them, every shared file is a link to uv's cache; `folder_bytes` walks the folder where it must be exact).
    need.folder = folder_bytes(envs_dir) if measure_folder else sum(e.own for e in found)
    need.free = _free(envs_dir)
    return need


def _same_stack(path: Path, built: list[EnvDisk]) -> str | None:
    """The torch of a built environment of the same stack (its name before the last `-<hash>`: the same atlas day
    under other install settings resolves the same torch), where one is built."""
    stack = path.name.rsplit("-", 1)[0]
    return next((_public(e.torch) for e in built if e.torch and e.path.name.rsplit("-", 1)[0] == stack), None)


def typical(built: list[EnvDisk], kind: str) -> tuple[int, int]:
    """(own, whole stack) bytes of one more environment of this build of torch: the median of those built (a new
    environment of a torch already held adds only its own files; of a new torch, its whole stack), else the
    measured fallbacks (0.3 GB; 5.7 GB for PyPI's CUDA build, 1.3 GB for a CPU build)."""
    owns = [e.own for e in built]
    wholes = [e.whole for e in built if e.torch and _kind(e.build) == kind]
    own = int(statistics.median(owns)) if owns else FALLBACK_OWN
    return own, int(statistics.median(wholes)) if wholes else FALLBACK_STACK[kind]


def _free(envs_dir: Path) -> int | None:
    """Free disk where the environments go (its nearest existing folder: a fresh machine has none of them yet), or
    None where it cannot be read."""
    for place in (envs_dir, *envs_dir.parents):
        if place.exists():
            try:
                return shutil.disk_usage(place).free
            except OSError:
                return None
    return None


@dataclass(frozen=True)
class PerEnvironment:
    """What each environment a command builds as it goes will take (`flips`: its probes are decided as it runs)."""

    own: int
    stack: int
    folder: int
    free: int | None
    cap: int | None

    def line(self) -> str:
        cap = f" (cap {self.cap / GB:.0f} GB: the least recently used are removed first)" if self.cap else " (no cap)"
        free = f"; {self.free / GB:.1f} GB free" if self.free is not None else ""
        return (
            f"disk: each probe that builds an environment adds about {self.own / GB:.1f} GB, {self.stack / GB:.1f} GB "
            f"where its torch is new; the environments hold {self.folder / GB:.1f} GB of their own{cap}{free}"
        )


def per_environment(envs_dir: Path, cap: int | None, cpu: bool = False) -> PerEnvironment:
    """What one more environment takes, from those built (as `estimate` reckons it)."""
    found = [sizes(p) for p in environments(envs_dir)]
    built = [e for e in found if (e.path / MARKERS[0]).is_file()]
    own, stack = typical(built, "cpu" if cpu else "cuda")
    return PerEnvironment(own, stack, sum(e.own for e in found), _free(envs_dir), cap)


def _public(release: str | None) -> str:
    return str(release or "").split("+")[0]


def _kind(build: str | None) -> str:
    """ "cpu" for a CPU build, else "cuda" (PyPI's default wheel, or a labelled CUDA/ROCm build)."""
    return "cpu" if build == "cpu" else "cuda"


# --- the cap ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pruned:
    path: Path
    freed: int
    last_used: float


def prune(envs_dir: Path, cap: int | None, room: int = 0, keep: tuple[Path, ...] = ()) -> list[Pruned]:
    """Remove the least recently used environments until what the folder holds, plus `room` for what is about to be
    built, fits under `cap`; never one in use (its build or use lock held, by this process too) or in `keep`. Returns
    what went, oldest first. Half-removed leftovers of earlier removals go first."""
    _sweep_discarded(envs_dir)
    if cap is None or not envs_dir.is_dir():
        return []
    held = folder_bytes(envs_dir)
    if held + room <= cap:
        return []
    gone: list[Pruned] = []
    candidates = sorted((last_used(p), p) for p in environments(envs_dir) if p not in keep)
    for used, path in candidates:
        if held + room <= cap:
            break
        locks = _lock_all(path)
        if locks is None:
            continue
        try:
            before = held
            _remove(path)
            held = folder_bytes(envs_dir)
            gone.append(Pruned(path, max(before - held, 0), used))
        finally:
            for fd in locks:
                os.close(fd)
    return gone


def _remove(path: Path) -> None:
    """Rename first (a half-removed environment is never taken for a built one), then delete."""
    doomed = path.with_name(f".discard-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _sweep_discarded(envs_dir: Path) -> None:
    for parent in (envs_dir, envs_dir / "script-overlays"):
        for old in parent.glob(".discard-*") if parent.is_dir() else []:
            shutil.rmtree(old, ignore_errors=True)


def pruned_line(gone: list[Pruned]) -> str:
    """One line for what the cap removed."""
    freed = sum(p.freed for p in gone) / GB
    names = ", ".join(p.path.name for p in gone[:4]) + (f" and {len(gone) - 4} more" if len(gone) > 4 else "")
    return (
        f"disk: removed {len(gone)} least recently used environment(s) ({freed:.1f} GB) to stay under the cap: {names}"
    )
