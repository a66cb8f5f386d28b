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


def write_profile(tmp_path: Path, text: str, name: str = "p") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the fault-injection counts (issue: faults injected, classified, records lost, orphans)."""
    from tests.fault_ledger import summary_lines

    lines = summary_lines()
    if lines:
        terminalreporter.section("fault injection summary")
        for line in lines:
            terminalreporter.write_line(line)
