"""`check` runs in exactly the environment it was started in: a package installed with `pip --target` onto the
user's PYTHONPATH is imported by its workers (it once was not: the workers' PYTHONPATH was the checkout alone)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from harness.paths import REPO_ROOT


def _wheel(directory: Path) -> Path:
    """A real wheel of a one-module package (built here: no index needed)."""
    name, version = "compat_matrix_target_probe", "1.0"
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": b"VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        record = []
        for member, data in files.items():
            archive.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}")
        archive.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    return path


def test_check_workers_import_a_package_from_the_users_pythonpath(tmp_path: Path) -> None:
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target),
         str(_wheel(tmp_path))],
        capture_output=True, text=True,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    env = dict(os.environ, PYTHONPATH=str(target), COMPAT_MATRIX_EXTRA_SCENARIOS="tests.fault_scenarios.f2_pythonpath")
    done = subprocess.run(
        [sys.executable, "-m", "harness", "check", "--scenario", "F2-pythonpath"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "F2-pythonpath" in out and "not reproduced (1)" in out, out
    assert "ModuleNotFoundError" not in out and "other failures" not in out, out


def test_run_script_sees_the_users_pythonpath(tmp_path: Path) -> None:
    """run-script runs the script here, as the user would: their PYTHONPATH after any --pythonpath overlay."""
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target),
         str(_wheel(tmp_path))],
        capture_output=True, text=True,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    script = tmp_path / "uses_it.py"
    script.write_text("import compat_matrix_target_probe\nassert compat_matrix_target_probe.VALUE == 42\n")
    env = dict(os.environ, PYTHONPATH=str(target))
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run-script", str(script), "--timeout", "120"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and "uses_it.py (1 rank(s)): pass" in done.stdout, done.stdout + done.stderr
