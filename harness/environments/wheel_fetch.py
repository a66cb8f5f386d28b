"""Fetching one wheel or building one from its sdist, for a wheelhouse: the two steps both the profile
wheelhouse (`wheelhouse.py`) and the era wheels of a dated GPU profile (`era_wheels.py`) take."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

from harness.define import packages
from harness.environments import envs


def download(lines: list[str], dest: Path, python: str, platforms: list[str]) -> None:
    tags = [flag for p in platforms for flag in ("--platform", p)]
    for line in lines:
        print(f"  download {line}", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python,
                "--implementation",
                "cp",
                *tags,
                "-d",
                str(dest),
                line,
            ],
            check=True,
        )


def build_sdists(lines: list[str], dest: Path, torch: str) -> None:
    if not lines:
        return
    names = [Requirement(line).name.lower() for line in lines]
    tools = [torch, *packages.build_requirements(names), "numpy", "pip"]
    build_env = packages.build_env(names)
    shown = " ".join(f"{k}={v}" for k, v in build_env.items())
    uv = envs.uv_binary()
    with tempfile.TemporaryDirectory(prefix="wheelhouse-build-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([uv, "venv", "-q", "--python", "3.11", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        subprocess.run([uv, "pip", "install", "-q", "--python", python, *envs.index_flags(), *tools], check=True)
        env = dict(os.environ) | build_env
        for line in lines:
            print(f"  build {line} (pure-Python wheel, {shown or 'no build variables'}, over {torch})", flush=True)
            subprocess.run(
                [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dest), line],
                check=True,
                env=env,
            )
