"""`nox -s tests` runs pytest in two xdist workers: a shared fixture must still be made once (tests/worker_groups.py).

A small suite of its own, run for real with `-n 2 --dist loadgroup`: one session fixture used by two modules, one
module fixture used by several tests of a third, and enough other tests that both workers take work. Each fixture
writes a line when it is made; with the groups lost (as with pytest 9.2 and xdist's own marks) each is made twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

CONFTEST = """
import os, time
from pathlib import Path
import pytest
from tests import worker_groups

def pytest_collection_modifyitems(config, items):
    worker_groups.assign(config, items, root=Path(__file__).parent)

@pytest.fixture(scope="session")
def shared_run():
    time.sleep(0.5)
    with open(os.environ["MADE_LOG"], "a") as log:
        log.write(f"session {os.environ.get('PYTEST_XDIST_WORKER')}\\n")
"""
USES_SESSION = """
import time
def test_one(shared_run): time.sleep(0.1)
def test_two(shared_run): time.sleep(0.1)
"""
USES_MODULE = """
import os, time
import pytest
@pytest.fixture(scope="module")
def module_run():
    with open(os.environ["MADE_LOG"], "a") as log:
        log.write(f"module {os.environ.get('PYTEST_XDIST_WORKER')}\\n")
@pytest.mark.parametrize("i", range(6))
def test_each(module_run, i): time.sleep(0.1)
"""
UNIT = """
import time
import pytest
@pytest.mark.parametrize("i", range(10))
def test_unit(i, tmp_path): time.sleep(0.05)
"""


def test_each_shared_fixture_is_made_once_over_two_workers(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for name, text in (("a", USES_SESSION), ("b", USES_SESSION), ("c", USES_MODULE), ("d", UNIT), ("e", UNIT)):
        (suite / f"test_{name}.py").write_text(text)
    (suite / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "made.log"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-v"],
        cwd=suite, env={"PYTHONPATH": str(REPO_ROOT), "MADE_LOG": str(log), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    made = log.read_text().splitlines()
    assert sorted(m.split()[0] for m in made) == ["module", "session"], made
    workers = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("[gw")}
    assert workers == {"[gw0]", "[gw1]"}, "premise: both workers took tests\n" + done.stdout
    assert "@session-fixtures" in done.stdout, "the grouped tests say their group"
