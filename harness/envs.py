"""Build (or reuse) one uv-managed virtual environment per cell.

uv does not read pip.conf, so the pip environment variables that point at the local CPU torch wheel
(`PIP_FIND_LINKS`) or a private index are translated into uv flags here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.cells import Cell
from harness.profile import Profile

MARKER = ".compat-matrix-cell.json"


@dataclass(frozen=True)
class EnvResult:
    """A ready environment, or the reason it could not be built."""

    python: Path | None
    versions: dict[str, str]
    reused: bool
    seconds: float
    failure: str | None = None


def uv_binary() -> str:
    """The uv that came with the orchestrator's environment, else the one on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise FileNotFoundError("uv is not installed; install the 'harness' dependency group") from None
        return found


def index_flags(environ: dict[str, str] | None = None) -> list[str]:
    """uv flags equivalent to the pip settings in the environment."""
    environ = dict(os.environ if environ is None else environ)
    flags: list[str] = []
    for location in environ.get("PIP_FIND_LINKS", "").split():
        flags += ["--find-links", location]
    if environ.get("PIP_INDEX_URL"):
        flags += ["--index-url", environ["PIP_INDEX_URL"]]
    for url in environ.get("PIP_EXTRA_INDEX_URL", "").split():
        flags += ["--extra-index-url", url]
    return flags


def default_envs_dir() -> Path:
    """Outside the work tree, so fresh clones and CI on the same machine reuse built cells."""
    base = os.environ.get("COMPAT_MATRIX_ENVS")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "compat-matrix" / "envs"


def env_dir_for(cell: Cell, profile: Profile, envs_dir: Path) -> Path:
    return envs_dir / f"{cell.cell_id}-{cell.env_key(profile.python, _extra(profile))}"


def _extra(profile: Profile) -> tuple[str, ...]:
    return (
        tuple(profile.extra_requirements) + tuple(profile.build_requires) + tuple(sorted(profile.install_env.items()))
    )


def ensure_env(cell: Cell, profile: Profile, envs_dir: Path, rebuild: bool = False) -> EnvResult:
    """Return a working environment for the cell, building it with uv unless a matching one exists."""
    start = time.monotonic()
    target = env_dir_for(cell, profile, envs_dir)
    marker = target / MARKER
    if marker.is_file() and not rebuild:
        data = json.loads(marker.read_text())
        return EnvResult(target / "bin" / "python", data["versions"], True, time.monotonic() - start)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    deadline = start + profile.install_timeout_s
    try:
        _run_uv(["venv", "--quiet", "--python", profile.python, str(target)], deadline)
        python = target / "bin" / "python"
        late = [r for r in cell.requirements() if _name(r) in profile.no_build_isolation]
        early = [r for r in cell.requirements() if r not in late] + list(profile.extra_requirements)
        if late:
            early += list(profile.build_requires)
        _run_uv(["pip", "install", "--python", str(python), *index_flags(), *early], deadline)
        if late:
            env = dict(os.environ) | profile.install_env
            _run_uv(
                ["pip", "install", "--python", str(python), "--no-build-isolation", *index_flags(), *early, *late],
                deadline,
                env=env,
            )
        versions = installed_versions(python)
    except InstallFailed as exc:
        shutil.rmtree(target, ignore_errors=True)
        return EnvResult(None, {}, False, time.monotonic() - start, failure=str(exc))
    marker.write_text(json.dumps({"requirements": cell.requirements(), "versions": versions}, indent=1))
    return EnvResult(python, versions, False, time.monotonic() - start)


def installed_versions(python: Path) -> dict[str, str]:
    """Resolved versions of every package in the environment (names normalised), plus python."""
    out = subprocess.run(
        [uv_binary(), "pip", "freeze", "--python", str(python)], capture_output=True, text=True, check=True
    ).stdout
    versions = {}
    for line in out.splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            versions[name.strip().lower().replace("_", "-")] = version.strip()
    py = subprocess.run(
        [str(python), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    versions["python"] = py
    return versions


class InstallFailed(Exception):
    """uv could not build the environment; the message is the resolver's or installer's reason."""


def _name(requirement: str) -> str:
    for sep in "=<>!~ [;":
        requirement = requirement.split(sep, 1)[0]
    return requirement.strip().lower()


def _run_uv(args: list[str], deadline: float, env: dict[str, str] | None = None) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise InstallFailed("install timed out")
    try:
        proc = subprocess.run(
            [uv_binary(), *args], capture_output=True, text=True, timeout=remaining, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise InstallFailed(f"install timed out: uv {' '.join(args[:2])}") from None
    if proc.returncode != 0:
        raise InstallFailed(summarise_uv_error(proc.stderr or proc.stdout))


def summarise_uv_error(text: str, limit: int = 1500) -> str:
    """Keep the resolver's explanation, drop progress noise, bound the size."""
    lines = [
        ln.rstrip()
        for ln in text.splitlines()
        if ln.strip() and not ln.lstrip().startswith(("Resolved", "Prepared", "Installed", "Audited", "Using"))
    ]
    start = next((i for i, ln in enumerate(lines) if "error" in ln.lower() or "No solution" in ln or "×" in ln), 0)
    summary = "\n".join(lines[start:])
    return summary[:limit] if summary else "uv failed without a message"
