"""The bisect search: the first flip, the ceil(log2 n) + 1 bound, and stepping over unusable releases.

The probes here are stand-ins (a table of outcomes per release) so every position of the flip can be
checked; the real thing, on deepspeed for S4 with real cell runs, is committed under results/bisect/.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from packaging.version import Version

from harness.define.profile import load_profile
from harness.environments.envs import InstallOptions
from harness.execution.options import MatrixOptions
from harness.tools.release_search import bisection as bisect_module
from tests.conftest import REPO_ROOT

VERSIONS = [f"0.19.{i}" for i in range(2, 9)]  # 7 releases, like deepspeed 0.19.2 .. 0.19.8


def run(monkeypatch, tmp_path: Path, states: dict[str, str]) -> bisect_module.Verdict:
    monkeypatch.setattr(bisect_module.releases, "releases", lambda *a, **k: [Version(v) for v in VERSIONS])

    def fake_probe(profile, base, package, version, scenario_id, variant, options, out_dir, signature, **_):
        return bisect_module.Probe(version, states[version], [], f"run-{version}", 1)

    monkeypatch.setattr(bisect_module, "probe_cell", fake_probe)
    profile = load_profile("cpu", REPO_ROOT / "matrix")
    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    return bisect_module.bisect(profile, "deepspeed", "S4", "baseline", options, out_root=tmp_path)


@pytest.mark.parametrize("flip", range(1, len(VERSIONS) + 1))
def test_finds_every_flip_position_within_the_bound(monkeypatch, tmp_path: Path, flip: int) -> None:
    states = {v: ("fail" if i < flip else "pass") for i, v in enumerate(VERSIONS)}
    verdict = run(monkeypatch, tmp_path, states)
    assert verdict.release == (VERSIONS[flip] if flip < len(VERSIONS) else None)
    assert len(verdict.bisect_runs) <= math.ceil(math.log2(len(VERSIONS))) + 1
    assert (
        tmp_path / next(p.name for p in tmp_path.iterdir() if p.name.startswith("deepspeed-")) / "verdict.json"
    ).is_file()


def test_unusable_release_is_stepped_over_and_reported(monkeypatch, tmp_path: Path) -> None:
    states = {v: ("fail" if i < 4 else "pass") for i, v in enumerate(VERSIONS)}
    states["0.19.5"] = "unusable"  # the first midpoint probed
    verdict = run(monkeypatch, tmp_path, states)
    assert verdict.release == "0.19.6"
    assert verdict.stepped_over == ["0.19.5"]
    states["0.19.6"] = "unusable"  # now the first good release cannot be tried: the answer is the next one
    verdict = run(monkeypatch, tmp_path / "again", states)
    assert verdict.release == "0.19.7" and set(verdict.stepped_over) == {"0.19.5", "0.19.6"}
