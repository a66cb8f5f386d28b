# /// script
# dependencies = ["nox>=2025.2.9", "uv>=0.5"]
# ///
"""Front door of the compatibility matrix. Thin sessions over the `compat-matrix` command.

`nox -l` lists the sessions; `nox -s matrix -- --help` shows the matrix options.
"""

from __future__ import annotations

import os

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["matrix"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
#: The project itself, editable: `compat-matrix` on PATH, harness/runtime/scenarios importable from the checkout.
HARNESS_DEPS = ["-e", "."]
TEST_DEPS = nox.project.dependency_groups(PYPROJECT, "test")
LINT_DEPS = nox.project.dependency_groups(PYPROJECT, "lint")


@nox.session
def matrix(session: nox.Session) -> None:
    """Run (or resume) a profile's matrix (default: `default`, the coffee-break answer on CPU; gpu with a GPU)."""
    session.install(*HARNESS_DEPS)
    session.run("compat-matrix", "matrix", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Regenerate results/COMPATIBILITY.md from recorded runs (`-- --run ID` to choose runs)."""
    session.install(*HARNESS_DEPS)
    session.run("compat-matrix", "report", *session.posargs)


@nox.session(default=False)
def grow(session: nox.Session) -> None:
    """Keep the atlas current (run it when a release is newer than the newest atlas day): resume what a growth left,
    grow the new days, watch the new releases, name the new flips, report (`-- --plan` says what it would run)."""
    session.install(*HARNESS_DEPS)
    session.run("compat-matrix", "grow", *session.posargs)


@nox.session(name="list")
def list_(session: nox.Session) -> None:
    """List profiles, scenarios or a profile's cells (`-- cells --profile cpu --json`)."""
    session.install(*HARNESS_DEPS)
    session.run("compat-matrix", "list", *(session.posargs or ["scenarios"]))


def _workers() -> list[str]:
    """Two pytest-xdist workers where this process may use two cores or more: the tests that share a fixture (the
    `ci` run, a module's fault run) in one worker (tests/worker_groups.py), the rest dealt out. One core: one
    process."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return ["-n", "2", "--dist", "loadgroup"] if cores >= 2 else []


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests of the harness plus a real mini matrix on CPU (pass `-- -m "not matrix"` for the fast part,
    `-- -n 0` for one process)."""
    session.install(*HARNESS_DEPS, *TEST_DEPS)
    session.run("python", "-m", "pytest", *_workers(), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install(*LINT_DEPS)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(default=False)
def wheelhouse(session: nox.Session) -> None:
    """Download/build every wheel a profile needs for an air-gapped node (`-- --profile gpu --dest DIR`)."""
    session.install(*HARNESS_DEPS, "pip")
    session.run("compat-matrix", "wheelhouse", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks: env build uv cold/warm vs pip, persistent worker vs process per config, the site's first render
    (`-- --site`) (prints a table)."""
    session.install(*HARNESS_DEPS, "selenium")
    session.run("compat-matrix", "bench", *session.posargs)


@nox.session(default=False)
def bisect(session: nox.Session) -> None:
    """First release where a scenario's outcome flips: `nox -s bisect -- --package deepspeed --scenario S4`."""
    session.install(*HARNESS_DEPS)
    session.run("compat-matrix", "bisect", *session.posargs)


if __name__ == "__main__":
    nox.main()
