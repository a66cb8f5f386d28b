"""Blame by putting code back, on a package pair whose cause is known: two wheels of `toypkg` built here (1.0 good,
2.0 bad), unpacked as pip unpacks a pure wheel, several changed functions and methods that both runs execute, one
cause (`Scaler.apply`), a changed function the runs never call, and two reverts that cannot run alone (1.0's
`Scaler.__init__` and `Scaler.name` each call a helper 2.0 removed), so putting every candidate back at once cannot
run, nor can its module put back whole (it imports both helpers): the shape of the two peft flips the blame once gave
up on after three crashing runs ("the cause is elsewhere"); and 2.0's cause calls a helper 1.0 lacks, so the other way
needs it too. The real call tracer finds the candidates and the calls
between them; the real revert runtime puts them back in real processes; the blame names the cause and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from harness.tools.code_blame import changed_code
from harness.tools.code_blame.blame import (
    NEITHER,
    NEWER,
    OLDER,
    Candidate,
    blame,
    converse,
    ddmin,
    helpers_of,
    in_failing_order,
    revert_plan,
    run_reverted,
    source_with_decorators,
)
from harness.tools.code_blame.finding_verification import TRACER_DIR

CORE_1 = """
from .helpers import offset, _check, _label


def compute(x):
    scaler = Scaler(2)
    return scaler.apply(x) + offset()


class Scaler:
    def __init__(self, k):
        self.k = _check(k)

    @staticmethod
    def name():
        return _label("scaler")

    def apply(self, x):
        return x * self.k


def unused():
    return 1
"""
CORE_2 = """
from .helpers import offset, _bump


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
        return _bump(x * self.k)


def unused():
    return 2
"""
HELPERS_1 = """
def offset():
    return 0


def _check(k):
    return int(k)


def _label(text):
    return text
"""
HELPERS_2 = """
def offset():
    value = 0
    return value


def _bump(value):
    return value + 1
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


class _Pair:
    """toypkg 1.0 and 2.0 installed here, the reproducer traced at both, and a runner of reverted runs at either."""

    def __init__(self, tmp_path: Path) -> None:
        self.good = _installed(tmp_path, "1.0", CORE_1, HELPERS_1)
        self.bad = _installed(tmp_path, "2.0", CORE_2, HELPERS_2)
        self.script, self.tmp = tmp_path / "repro.py", tmp_path
        self.script.write_text(REPRO)
        self.older = _run(self.good, self.script, tmp_path / "trace-good")
        self.newer = _run(self.bad, self.script, tmp_path / "trace-bad")
        assert (self.older["exit_code"], self.newer["exit_code"]) == (0, 1), (self.older, self.newer)
        traces = (("1.0", tmp_path / "trace-good"), ("2.0", tmp_path / "trace-bad"))
        self.changed = changed_code.compare("toypkg", *traces)
        _, self.older_sources, _ = changed_code.read_traces(tmp_path / "trace-good")
        _, self.newer_sources, _ = changed_code.read_traces(tmp_path / "trace-bad")
        self.older_calls = changed_code.read_call_edges(tmp_path / "trace-good")
        self.newer_calls = changed_code.read_call_edges(tmp_path / "trace-bad")
        late = changed_code.read_lateness(tmp_path / "trace-bad")  # the failing run's
        self.candidates = in_failing_order([Candidate(c.file, c.qualname) for c in self.changed.changed], late)

    def run(self, site: Path) -> object:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
        command = [sys.executable, str(self.script)]
        return lambda plan: run_reverted(command, env, plan, (self.older, self.newer), cwd=self.tmp, timeout_s=120)

    def widen(self, candidate: Candidate, error: str) -> list[Candidate]:
        return helpers_of(candidate, self.older_sources, self.newer_sources, self.older_calls, error)

    def widen_other_way(self, candidate: Candidate, error: str) -> list[Candidate]:
        return helpers_of(candidate, self.newer_sources, self.older_sources, self.newer_calls, error)


def test_blame_names_the_cause_where_putting_everything_back_cannot_run(tmp_path: Path) -> None:
    pair = _Pair(tmp_path)
    names = {c.qualname for c in pair.changed.changed}
    assert names == {"compute", "Scaler.__init__", "Scaler.name", "Scaler.apply", "offset"}, names  # not `unused`
    # The order the failing run reaches them: the last called first (the name printed last, then the sum's parts).
    assert [c.qualname for c in pair.candidates][:3] == ["Scaler.name", "offset", "Scaler.apply"], pair.candidates
    found = blame("toypkg", "1.0", "2.0", pair.candidates, pair.older_sources, pair.run(pair.bad), widen=pair.widen)
    assert found.blamed == ["toypkg/core.py::Scaler.apply"] and found.how == "alone", found
    assert found.decided and found.verdict.startswith("reverting toypkg/core.py::Scaler.apply at toypkg 2.0"), found
    assert found.runs[0]["outcome"] == NEITHER and "_check" in found.runs[0]["error"]  # all at once: a helper is gone
    # Scaler.name could not run alone (its helper is gone in 2.0); with the helper it calls put back it ran.
    assert found.helpers == {"toypkg/core.py::Scaler.name": ["toypkg/helpers.py::_label"]}, found.helpers
    alone = {tuple(r["reverted"]): r["outcome"] for r in found.runs}
    assert alone[("toypkg/core.py::Scaler.name",)] == NEITHER and alone[("toypkg/helpers.py::offset",)] == NEWER
    assert alone[("toypkg/core.py::Scaler.name", "toypkg/helpers.py::_label")] == NEWER
    assert alone[("toypkg/core.py::Scaler.apply",)] == OLDER and len(found.runs) == 5, found.runs
    # The other way: 2.0's Scaler.apply calls a helper 1.0 lacks, so alone it cannot run in 1.0's run; with the
    # helper it calls (2.0's `_bump`, from the 2.0 run's calls) it gives 2.0's outcome.
    converse(found, pair.newer_sources, pair.run(pair.good), widen=pair.widen_other_way)
    assert found.converse["alone"]["outcome"] == NEITHER, found.converse
    assert found.converse["helpers"] == ["toypkg/helpers.py::_bump"] and found.converse["outcome"] == NEWER
    assert "with the helpers it calls, and nothing else changed" in found.verdict, found.verdict


def test_no_changed_function_is_said_only_where_every_candidate_ran(tmp_path: Path) -> None:
    """With the cause left out: where the candidates that cannot run alone are widened with their helpers, every one
    runs and none brings 1.0's outcome back, so the blame says no changed function explains it; without the helpers
    two could not run, and the verdict is 'not decided', naming them, never 'the cause is elsewhere'."""
    pair = _Pair(tmp_path)
    rest = [c for c in pair.candidates if c.qualname != "Scaler.apply"]
    run = pair.run(pair.bad)
    none = blame("toypkg", "1.0", "2.0", rest, pair.older_sources, run, widen=pair.widen)
    assert none.blamed == [] and none.decided and none.verdict.startswith("no changed function explains it"), none
    assert set(none.helpers) == {"toypkg/core.py::Scaler.name", "toypkg/core.py::Scaler.__init__"}, none.helpers
    stuck = blame("toypkg", "1.0", "2.0", rest, pair.older_sources, run)
    assert stuck.blamed == [] and not stuck.decided, stuck
    assert stuck.verdict.startswith("not decided: 2 of the 4 candidates: 2 could not run"), stuck.verdict
    assert "toypkg/core.py::Scaler.name" in stuck.verdict and "elsewhere" not in stuck.verdict, stuck.verdict
    assert sorted(stuck.unrunnable) == ["toypkg/core.py::Scaler.__init__", "toypkg/core.py::Scaler.name"]


def test_a_function_that_needs_a_removed_helper_of_another_module_finds_it() -> None:
    """The helpers a put-back function takes along: what its older source calls, by the trace's calls and by the
    names it imports from another module of the package, that the newer release lacks or wrote otherwise; a helper
    both releases wrote alike stays."""
    older = {"toypkg/core.py": CORE_1, "toypkg/helpers.py": HELPERS_1}
    newer = {"toypkg/core.py": CORE_2, "toypkg/helpers.py": HELPERS_2}
    init = Candidate("toypkg/core.py", "Scaler.__init__")
    assert helpers_of(init, older, newer, {}) == [Candidate("toypkg/helpers.py", "_check")]  # by its import
    calls = {("toypkg/core.py", "Scaler.name"): {("toypkg/helpers.py", "_label")}}
    same = {"toypkg/helpers.py": HELPERS_1 + "\n", "toypkg/core.py": CORE_2}
    assert helpers_of(Candidate("toypkg/core.py", "Scaler.name"), older, same, calls) == [], "the same helper stays"
    # The plan binds the names it imports where its new module lacks them.
    plan = revert_plan([init], older)
    assert {"name": "_check", "statement": "from .helpers import _check"} in plan["functions"][0]["bindings"]


def test_the_failing_traceback_orders_the_candidates() -> None:
    """The functions the failing run's traceback passes through come first, innermost first; then the last called."""
    a, b, c = (Candidate("toypkg/core.py", n) for n in ("compute", "Scaler.apply", "offset"))
    late = {(a.file, "compute"): 0.1, (b.file, "Scaler.apply"): 0.2, (c.file, "offset"): 0.9}
    traceback = (
        'Traceback (most recent call last):\n  File "/x/site-packages/toypkg/core.py", line 3, in compute\n'
        '  File "/x/site-packages/toypkg/core.py", line 9, in apply\nValueError: no'
    )
    assert in_failing_order([a, b, c], late, traceback, "toypkg") == [b, a, c]
    assert in_failing_order([a, b, c], late) == [c, b, a]
