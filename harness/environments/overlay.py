"""Packages layered over an interpreter in a `--target` directory that goes first on PYTHONPATH: a cell's
packages over a GPU node's own torch (`envs`), and `bisect-script`'s moved packages over an atlas environment
(`tools/script_verdicts/script_stacks.py`). One place says how such a directory is installed and how a half-built
one is thrown away, so the two kinds of overlay cannot drift apart."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

#: Prefix of an environment or overlay directory being removed (renamed first, then deleted).
DISCARD_PREFIX = ".discard-"


def uv_binary() -> str:
    """The uv that came with the orchestrator's environment, else the one on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise FileNotFoundError("uv is not installed; pip install -e . (the project depends on it)") from None
        return found


def installer(python: Path) -> list[str]:
    """The interpreter's own pip (an air-gapped node has no uv); uv's pip interface where it has no pip."""
    has_pip = subprocess.run([str(python), "-c", "import pip"], capture_output=True).returncode == 0
    if has_pip:
        return [str(python), "-m", "pip", "--disable-pip-version-check", "install"]
    return [uv_binary(), "pip", "install", "--python", str(python)]


def install_argv(prefix: list[str], site: Path, requirements: list[str], flags: list[str]) -> list[str]:
    """The install of `requirements` (pinned, no dependencies: the overlay holds exactly what was asked) into
    `site`, with `prefix` the installer and `flags` its index or wheelhouse flags."""
    return [*prefix, "--quiet", "--no-deps", "--target", str(site), *flags, *requirements]


def discard(target: Path) -> None:
    """Remove an environment or overlay directory that must not be reused. It is renamed first (atomic), so a new
    build starts on an empty path even if something still writes into the old tree; leftovers of earlier
    discards are removed too."""
    if target.exists():
        target.rename(target.with_name(f"{DISCARD_PREFIX}{target.name}-{os.getpid()}-{time.monotonic_ns()}"))
    for old in target.parent.glob(f"{DISCARD_PREFIX}{target.name}-*"):
        shutil.rmtree(old, ignore_errors=True)
