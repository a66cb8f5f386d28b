"""Shared fixtures. Tests that build real cell environments are marked `matrix`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parent.parent

settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


def matrix_command(profile: object, results: object, *extra: object) -> list[str]:
    """`python -m harness matrix --profile P --results-dir R ...`, as the tests start it."""
    return [
        sys.executable,
        "-m",
        "harness",
        "matrix",
        "--profile",
        str(profile),
        "--results-dir",
        str(results),
        *map(str, extra),
    ]


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory) -> Path:
    """A plain run of the `ci` profile (results dir), shared by the matrix and Slurm tests."""
    import subprocess

    results = tmp_path_factory.mktemp("results")
    proc = subprocess.run(matrix_command("ci", results), capture_output=True, text=True, cwd=REPO_ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return results


def write_profile(tmp_path: Path, text: str, name: str = "p") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the fault-injection counts (issue: faults injected, classified, records lost, orphans)."""
    from tests.fault_ledger import summary_lines

    slurm = [
        r
        for key in ("passed", "failed", "skipped", "error")
        for r in terminalreporter.stats.get(key, [])
        if "test_slurm.py" in getattr(r, "nodeid", "")
    ]
    if slurm:
        terminalreporter.section("slurm")
        for report in slurm:
            why = f": {report.longrepr[2]}" if report.skipped and isinstance(report.longrepr, tuple) else ""
            terminalreporter.write_line(f"{report.nodeid.split('::')[-1]}: {report.outcome}{why}")
    lines = summary_lines()
    if lines:
        terminalreporter.section("fault injection summary")
        for line in lines:
            terminalreporter.write_line(line)
