"""Blame as bisect-script's last step, on the package pair whose cause is known (`tests/test_blame.py`: toypkg 1.0
good, 2.0 bad, one cause `Scaler.apply`, two reverts that cannot run alone, so neither can every candidate at once).
The stacks are this interpreter with each release's files first on the path; the runs are the real `run_script` (the
probe's sitecustomize first, then the tracer's or the revert's, then the stack's), judged as the verdict judges its
runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.define.profile import load_profile
from harness.environments.envs import InstallOptions
from harness.paths import MATRIX_DIR
from harness.recording.flip import Flip
from harness.tools.script_verdicts.script_bisect import End, ScriptBisect
from harness.tools.script_verdicts.script_blame import blame_verdict, prepared
from harness.tools.script_verdicts.script_stacks import Stack
from tests.test_blame import CORE_1, CORE_2, HELPERS_1, HELPERS_2, REPRO, _installed


class _ToyStacks:
    """toypkg's two releases over this interpreter, as a verdict's older stack and its move."""

    def __init__(self, sites: dict[str, Path]) -> None:
        self.sites = sites

    def scan(self, end) -> Stack:
        version = end.pins["toypkg"]
        return Stack(
            end.label, Path(sys.executable), {"toypkg": version}, "pinned", pythonpath=str(self.sites[version])
        )

    def move(self, base: Stack, package: str, version: str, older, newer) -> Stack:
        site = str(self.sites[version])
        return Stack(f"{base.label} + {package}=={version}", Path(sys.executable), {package: version}, "overlay",
                     pythonpath=site)  # fmt: skip


def _bisect(tmp_path: Path, sites: dict[str, Path]) -> tuple[ScriptBisect, dict]:
    script = tmp_path / "repro.py"
    script.write_text(REPRO)
    options = InstallOptions(envs_dir=tmp_path / "envs")
    bisect = ScriptBisect(script, tmp_path / "verdict", load_profile("history", MATRIX_DIR), options,
                          source=_ToyStacks(sites), say=lambda _: None)  # fmt: skip
    from harness.tools.script_verdicts.script_blame import _run

    failing = _run(bisect, _ToyStacks(sites).scan(End(pins={"toypkg": "2.0"})), "bad")  # its signature is the target
    flip = Flip("toypkg==1.0", "toypkg==2.0", "pass", "target", {"toypkg": ["1.0", "2.0"]})
    flip.package, flip.release, flip.last_release_before = "toypkg", "2.0", "1.0"
    verdict = {
        "flips": [flip.as_script_json()],
        "target": {"signature": failing.run.signature, "error": failing.run.error},
    }
    return prepared(bisect, verdict), verdict


def test_bisect_script_blames_the_one_cause(tmp_path: Path) -> None:
    sites = {
        "1.0": _installed(tmp_path, "1.0", CORE_1, HELPERS_1),
        "2.0": _installed(tmp_path, "2.0", CORE_2, HELPERS_2),
    }
    bisect, verdict = _bisect(tmp_path, sites)
    found = blame_verdict(bisect, verdict)
    assert found is not None and found["blamed"] == ["toypkg/core.py::Scaler.apply"], found
    # Every candidate at once cannot run (1.0's __init__ and name call helpers 2.0 removed): one at a time, the last
    # called first; name runs only with the helper it calls, and apply alone gives 1.0's outcome.
    assert found["runs"][0]["outcome"] == "neither" and found["how"] == "alone", found["runs"]
    assert found["helpers"] == {"toypkg/core.py::Scaler.name": ["toypkg/helpers.py::_label"]}, found["helpers"]
    assert found["unrunnable"] == [] and "elsewhere" not in found["verdict"], found
    assert found["sides"]["older"]["state"] == "pass" and found["sides"]["newer"]["state"] == "target", found["sides"]
    assert found["converse"]["outcome"] == "newer", found["converse"]  # 2.0's apply in 1.0's run fails as 2.0 does
    saved = json.loads((bisect.out_dir / "blame.json").read_text())
    assert saved["blamed"] == found["blamed"] and (bisect.out_dir / "changed.json").is_file()
    assert "reverted whole" not in found["verdict"], "no module was needed whole"


def test_a_pair_that_does_not_flip_here_is_not_blamed(tmp_path: Path) -> None:
    """Both releases pass here (2.0 is 1.0 again): any revert would 'pass', so nothing is blamed, and it says why."""
    sites = {
        "1.0": _installed(tmp_path, "1.0", CORE_1, HELPERS_1),
        "2.0": _installed(tmp_path, "2.0", CORE_1, HELPERS_1),
    }
    bisect, verdict = _bisect(tmp_path, sites)
    found = blame_verdict(bisect, verdict)
    assert found is not None and found["blamed"] == [] and found["runs"] == []
    assert found["verdict"].startswith("not blamed: the traced runs did not flip here"), found["verdict"]


def test_a_call_refused_for_its_arguments_is_a_candidate() -> None:
    """accelerate 1.0.0's Accelerator.__init__ refuses `dispatch_batches` before its body runs, so no trace shows it in
    the failing run: the function the error names, executed by the other run, is put back too (where its older
    source is at hand), and nothing the error does not name."""
    from harness.tools.code_blame.blame import refused_calls
    from harness.tools.code_blame.changed_code import ChangedCode

    changed = ChangedCode(
        "toypkg", "1.0", "2.0", 3, only_older=["toypkg/core.py::Scaler.__init__", "toypkg/core.py::unused"]
    )
    error = "TypeError: Scaler.__init__() got an unexpected keyword argument 'k'"
    found = refused_calls(changed, error, {"toypkg/core.py": CORE_1})
    assert [str(c) for c in found] == ["toypkg/core.py::Scaler.__init__"]
    assert refused_calls(changed, error, {}) == [], "no older source, nothing to put back"
    assert refused_calls(changed, "ValueError: Scaler.__init__ failed", {"toypkg/core.py": CORE_1}) == []


def test_a_revert_of_a_module_the_probe_watches_runs(tmp_path: Path) -> None:
    """The script probe watches `accelerate.accelerator` as it is imported, and the revert patches the modules of its
    plan: two meta-path finders that each ask every other finder. A revert inside accelerate once asked them of each
    other without end (RecursionError, so blame had no evidence); now the function is put back and the run ends."""
    from harness.execution.script_launch import run_script
    from harness.tools.code_blame import blame as blaming

    site = tmp_path / "site" / "accelerate"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (site / "accelerator.py").write_text("class Accelerator:\n    def value(self):\n        return 2\n")
    script = tmp_path / "script.py"
    script.write_text(
        "from accelerate.accelerator import Accelerator\nassert Accelerator().value() == 1, 'not put back'\n"
    )
    plan = {"functions": [{"module": "accelerate.accelerator", "qualname": "Accelerator.value",
                           "source": "def value(self):\n    return 1\n"}], "modules": []}  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "report").mkdir()
    env = {"COMPAT_MATRIX_REVERT": str(tmp_path / "plan.json"), "COMPAT_MATRIX_REVERT_REPORT": str(tmp_path / "report")}
    pythonpath = f"{blaming.REVERT_DIR}:{tmp_path / 'site'}"
    found = run_script(Path(sys.executable), script, timeout_s=120, pythonpath=pythonpath, extra_env=env)
    assert found.outcome == "pass", (found.error, found.stderr_tail[-800:])
    reports = [json.loads(p.read_text()) for p in (tmp_path / "report").glob("revert-*.json")]
    assert any("accelerate.accelerator.Accelerator.value" in r["applied"] for r in reports), reports


def test_put_back_code_raises_in_its_own_name(tmp_path: Path) -> None:
    """A call the put-back code refuses says the function's own name, as the release's does ('A.__init__() got an
    unexpected keyword argument'), so its failure is judged the same failure (accelerate 1.0.0's converse)."""
    import os
    import subprocess

    site = tmp_path / "site" / "toy"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("class A:\n    def __init__(self, x=1):\n        self.x = x\n")
    older = "def __init__(self):\n    self.x = 0\n"
    plan = {"functions": [{"module": "toy", "qualname": "A.__init__", "source": older}], "modules": []}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    from harness.tools.code_blame.blame import REVERT_DIR

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {
        "PYTHONPATH": f"{REVERT_DIR}{os.pathsep}{tmp_path / 'site'}",
        "COMPAT_MATRIX_REVERT": str(tmp_path / "plan.json"),
    }
    proc = subprocess.run([sys.executable, "-c", "import toy; toy.A(x=2)"], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.stderr.strip().splitlines()[-1] == "TypeError: A.__init__() got an unexpected keyword argument 'x'"
