"""Pruning impossible cells from package metadata before anything is installed."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.planning.pruning import conflict
from tests.conftest import REPO_ROOT, matrix_command, write_profile

PROFILE = """
[profile]
device = "cpu"
scenarios = ["S3-*"]
[axes]
peft = ["0.12.0"]
accelerate = ["0.20.0", "0.31.0"]
"""


def wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    """A minimal wheel: only its METADATA matters here (what an index serves as the PEP 658 file)."""
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [
        f"Requires-Dist: {r}" for r in requires
    ]
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(lines) + "\n")


@pytest.fixture
def wheelhouse(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "peft", "0.12.0", ["accelerate>=0.21.0", "torch>=1.13.0", 'pytest; extra == "test"'])
    wheel(folder, "accelerate", "0.20.0", ["numpy>=1.17"])
    wheel(folder, "accelerate", "0.31.0", ["numpy>=1.17"])
    return folder


def test_a_pin_outside_another_pins_requirement_is_pruned_with_the_reason(tmp_path: Path, wheelhouse: Path) -> None:
    cells = expand(load_profile(str(write_profile(tmp_path, PROFILE)), tmp_path))
    reasons = {c.pins["accelerate"]: conflict(c, "3.11", wheelhouse) for c in cells}
    assert reasons["0.31.0"] is None
    assert reasons["0.20.0"] == "peft 0.12.0 requires accelerate>=0.21.0; the cell pins accelerate 0.20.0"


def test_the_matrix_skips_a_pruned_cell_without_installing_it(tmp_path: Path, wheelhouse: Path) -> None:
    profile = write_profile(tmp_path, PROFILE.replace('["0.20.0", "0.31.0"]', '["0.20.0"]'))
    results = tmp_path / "results"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            *matrix_command(str(profile), str(results)),
            "--offline",
            "--wheelhouse",
            str(wheelhouse),
            "--envs-dir",
            str(tmp_path / "envs"),
            "--no-report",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=dict(__import__("os").environ) | env,
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in next(results.glob("runs/*/records.jsonl")).read_text().splitlines()]
    assert records and {r["signature"] for r in records} == {"pruned-incompatible-pins"}
    assert all("requires accelerate>=0.21.0" in r["message"] for r in records)
    assert not (tmp_path / "envs").exists() or not any((tmp_path / "envs").iterdir()), "nothing was installed"
