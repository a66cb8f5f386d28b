"""Blame by putting code back, on a package pair whose cause is known: two wheels of `toypkg` built here (1.0 good,
2.0 bad), unpacked as pip unpacks a pure wheel, several changed functions and methods that both runs execute, one
cause (`Scaler.apply`), a changed function the runs never call, and one revert that cannot run alone (1.0's
`Scaler.__init__` calls a helper 2.0 removed). The real call tracer finds the candidates; the real revert runtime
puts them back in real processes; ddmin names the cause and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from harness.tools import changed_code
from harness.tools.blame import (
    NEITHER,
    NEWER,
    OLDER,
    Candidate,
    blame,
    converse,
    ddmin,
    run_reverted,
    source_with_decorators,
)
from harness.tools.findings import TRACER_DIR

CORE_1 = """
from .helpers import offset, _check


def compute(x):
    scaler = Scaler(2)
    return scaler.apply(x) + offset()


class Scaler:
    def __init__(self, k):
        self.k = _check(k)

    @staticmethod
    def name():
        return "scaler"

    def apply(self, x):
        return x * self.k


def unused():
    return 1
"""
CORE_2 = """
from .helpers import offset


def compute(x):
    scaler = Scaler(2)  # a changed comment only
    result = scaler.apply(x)
    return result + offset()


class Scaler:
    def __init__(self, k):
        self.k = int(k)

    @staticmethod
    def name():
        return "Scaler"

    def apply(self, x):
        return x * self.k + 1


def unused():
    return 2
"""
HELPERS_1 = """
def offset():
    return 0


def _check(k):
    return int(k)
"""
HELPERS_2 = """
def offset():
    value = 0
    return value
"""
REPRO = """
import toypkg
value = toypkg.compute(3)
print(toypkg.Scaler.name())
if value == 6:
    print("ok: compute(3) is 6")
else:
    print(f"FAIL: compute(3) is {value}, not 6")
    raise SystemExit(1)
"""


def _wheel(folder: Path, version: str, core: str, helpers: str) -> Path:
    """A pure wheel of toypkg, as a build backend writes one."""
    path = folder / f"toypkg-{version}-py3-none-any.whl"
    info = f"toypkg-{version}.dist-info"
    files = {
        "toypkg/__init__.py": "from .core import compute, Scaler\n",
        "toypkg/core.py": core,
        "toypkg/helpers.py": helpers,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: toypkg\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]))
    return path


def _installed(tmp_path: Path, version: str, core: str, helpers: str) -> Path:
    target = tmp_path / f"site-{version}"
    with zipfile.ZipFile(_wheel(tmp_path, version, core, helpers)) as archive:
        archive.extractall(target)  # a pure wheel installs as its files
    return target


def _run(site: Path, script: Path, trace: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(TRACER_DIR), str(site)]) if trace else str(site)
    if trace:
        env |= {"COMPAT_MATRIX_TRACE_PACKAGE": "toypkg", "COMPAT_MATRIX_TRACE_DIR": str(trace)}
        trace.mkdir()
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return {"exit_code": proc.returncode, "line": lines[-1] if lines else None}


def test_ddmin_finds_the_smallest_set_that_needs_two_and_reads_neither_as_no() -> None:
    calls = []

    def test(chosen: list[int]) -> str:
        calls.append(list(chosen))
        if 5 in chosen and 9 in chosen:
            return OLDER
        return NEITHER if 2 in chosen else NEWER

    assert sorted(ddmin(list(range(12)), test)) == [5, 9]
    assert len(calls) < 40


def test_source_with_decorators_keeps_the_decorator() -> None:
    assert source_with_decorators(CORE_1, "Scaler.name").startswith("    @staticmethod\n    def name")
    assert source_with_decorators(CORE_1, "Scaler.nothing") is None


def test_blame_names_the_cause_on_a_package_pair_built_here(tmp_path: Path) -> None:
    good, bad = _installed(tmp_path, "1.0", CORE_1, HELPERS_1), _installed(tmp_path, "2.0", CORE_2, HELPERS_2)
    script = tmp_path / "repro.py"
    script.write_text(REPRO)
    older, newer = _run(good, script, tmp_path / "trace-good"), _run(bad, script, tmp_path / "trace-bad")
    assert (older["exit_code"], newer["exit_code"]) == (0, 1), (older, newer)
    changed = changed_code.compare("toypkg", ("1.0", tmp_path / "trace-good"), ("2.0", tmp_path / "trace-bad"))
    names = {c.qualname for c in changed.changed}
    assert names == {"compute", "Scaler.__init__", "Scaler.name", "Scaler.apply", "offset"}, names  # not `unused`
    _, older_sources, _ = changed_code.read_traces(tmp_path / "trace-good")
    candidates = [Candidate(c.file, c.qualname) for c in changed.changed]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(bad)}

    def run(plan: dict) -> dict:
        return run_reverted([sys.executable, str(script)], env, plan, (older, newer), cwd=tmp_path, timeout_s=120)

    found = blame("toypkg", "1.0", "2.0", candidates, older_sources, run)
    assert found.blamed == ["toypkg/core.py::Scaler.apply"], found
    assert found.unrunnable == ["toypkg/core.py::Scaler.__init__"], found  # its helper is gone in 2.0
    assert found.runs[0]["outcome"] == NEITHER  # everything put back: __init__ raises, no evidence either way
    assert any(r["reverted"] == ["toypkg/core.py::Scaler.apply"] and r["outcome"] == OLDER for r in found.runs)
    assert len(found.runs) <= 12, len(found.runs)
    # The other way: 2.0's Scaler.apply put into 1.0's run gives 2.0's outcome.
    _, newer_sources, _ = changed_code.read_traces(tmp_path / "trace-bad")
    good_env = env | {"PYTHONPATH": str(good)}
    converse(found, newer_sources, lambda plan: run_reverted([sys.executable, str(script)], good_env, plan,
                                                              (older, newer), cwd=tmp_path, timeout_s=120))  # fmt: skip
    assert found.converse["outcome"] == NEWER and "the other way" in found.verdict, found.converse
    # The test can fail: with the cause left out, nothing gives the older outcome.
    rest = [c for c in candidates if c.qualname != "Scaler.apply"]
    none = blame("toypkg", "1.0", "2.0", rest, older_sources, run)
    assert none.blamed == [] and "the cause is elsewhere" in none.verdict, none
