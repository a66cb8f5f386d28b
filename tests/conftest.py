"""Shared fixtures. Tests that build real cell environments are marked `matrix`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, seed, settings

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Property tests explore fresh examples on every run (failures found are kept in .hypothesis/ and replayed
#: first), except under CI=true, where they replay the examples of one recorded seed: CI is reproducible, and
#: a developer's runs keep looking. COMPAT_MATRIX_HYPOTHESIS_SEED (or --hypothesis-seed) replays any seed.
HYPOTHESIS_SEED_VAR = "COMPAT_MATRIX_HYPOTHESIS_SEED"
CI_HYPOTHESIS_SEED = 20261125
_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", print_blob=True, **_COMMON)
settings.register_profile("dev", **_COMMON)


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


settings.load_profile("ci" if under_ci() else "dev")


def _hypothesis_seed() -> int | None:
    if os.environ.get(HYPOTHESIS_SEED_VAR):
        return int(os.environ[HYPOTHESIS_SEED_VAR])
    return CI_HYPOTHESIS_SEED if under_ci() else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under CI (or with the seed variable) every property test of the suite replays that seed (Hypothesis'
    @seed on the test itself: the harness's own draws, which bring their own seeds, are left alone). Under
    `nox -s tests` (pytest-xdist, two workers) the tests that share a fixture share a worker
    (tests/worker_groups.py)."""
    from tests import worker_groups

    worker_groups.assign(config, items)
    chosen = _hypothesis_seed()
    if chosen is None:
        return
    for item in items:
        test = getattr(item, "obj", None)
        if test is not None and is_hypothesis_test(test):
            seed(chosen)(test)


def pytest_report_header(config: pytest.Config) -> str:
    chosen = _hypothesis_seed()
    if chosen is None:
        return "hypothesis: fresh examples this run (failures are kept in .hypothesis/ and tried first next time)"
    return f"hypothesis: seed {chosen} for the property tests (replay with {HYPOTHESIS_SEED_VAR}={chosen})"


def missing_component(component: str, why: str) -> NoReturn:
    """A test that needs a system component the machine lacks: a skip with the reason on a developer's machine;
    under CI=true a failure, naming the component and showing what `.ci/run`'s install of it printed (CI must
    never go green by skipping what it was meant to test)."""
    if not under_ci():
        pytest.skip(why)
    logs = Path(os.environ.get("COMPAT_MATRIX_CI_LOGS", REPO_ROOT / ".ci" / "logs"))
    log = logs / f"install-{component}.log"
    shown = log.read_text(errors="replace")[-4000:] if log.is_file() else f"(no install log at {log})"
    pytest.fail(f"{component} is required under CI=true and is missing: {why}\n--- {log} ---\n{shown}")


def run_node(script: str, *args: str, timeout: int = 600) -> Any:
    """The JSON a node script writes (`node -e script args...`): how the page's own JavaScript (judge.js, read.js,
    config.js) is held to Python's here, without a browser."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        missing_component("nodejs", "node is not installed (Debian: apt-get install nodejs; .ci/run does)")
    done = subprocess.run([node, "-e", script, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


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


def found_in_ci_env(script_text: str, tmp_path: Path, *args: str) -> dict:
    """Run a script in the CI profile's current cell environment (real torch, transformers and peft; built once and
    reused) from the checkout, and return the JSON it printed after "FOUND "."""
    import subprocess

    from harness.define.cells import expand
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir, ensure_env
    from harness.paths import MATRIX_DIR

    ci = load_profile("ci", MATRIX_DIR)
    cell = next(c for c in expand(ci) if c.cell_id.startswith("current"))
    env = ensure_env(cell, ci, InstallOptions(envs_dir=default_envs_dir()))
    assert env.python is not None, env.failure
    script = tmp_path / "script.py"
    script.write_text(script_text)
    done = subprocess.run(
        [str(env.python), str(script), *args],
        cwd=REPO_ROOT, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("FOUND ")), None)
    assert line, done.stdout + done.stderr
    return json.loads(line[6:])


def write_profile(tmp_path: Path, text: str, name: str = "p") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


_faults_reported = 0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Each fault row this process recorded since the last report rides on this report (under pytest-xdist the
    summary is printed by the main process, which sees the reports and not the workers' ledgers)."""
    global _faults_reported
    from tests.fault_ledger import FAULT_PROPERTY, LEDGER

    report = yield
    report.user_properties.extend((FAULT_PROPERTY, row) for row in LEDGER[_faults_reported:])
    _faults_reported = len(LEDGER)
    return report


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the fault-injection counts (issue: faults injected, classified, records lost, orphans)."""
    from tests.fault_ledger import rows_of, summary_lines

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
            name = report.nodeid.split("::")[-1].split("@")[0]  # pytest-xdist's loadgroup adds "@group"
            terminalreporter.write_line(f"{name}: {report.outcome}{why}")
    reports = [r for kept in terminalreporter.stats.values() for r in kept if hasattr(r, "user_properties")]
    reports.sort(key=lambda r: getattr(r, "start", 0.0))  # in the order the phases ran, as the ledger was filled
    lines = summary_lines(rows_of(reports))
    if lines:
        terminalreporter.section("fault injection summary")
        for line in lines:
            terminalreporter.write_line(line)


def screenshot_path(name: str) -> Path:
    """Where a browser test keeps its screenshot: beside CI's logs (.ci/logs/screenshots/, uploaded as the run's
    artifact by the tests workflow, never committed)."""
    folder = Path(os.environ.get("COMPAT_MATRIX_CI_LOGS", REPO_ROOT / ".ci" / "logs")) / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name
