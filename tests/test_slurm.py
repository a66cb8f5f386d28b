"""Slurm as the scale-out engine, on a real single-host Slurm (slurmctld + two slurmd: nodes n1 and n2).

- A slice of the `ci` profile (S2, both cells) as a job array of 2 tasks (`compat-matrix slurm`) plus the
  merge-and-report job: the merged table holds exactly the outcomes a plain run of the profile shows for it.
- A distributed launch across the two nodes: `srun` starts one torchrun agent per node and they meet through
  torchrun's c10d rendezvous, one rank on each node.

Skipped, with the reason, where Slurm cannot be started (not installed, not root); .ci/run installs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.environments.envs import InstallOptions, default_envs_dir, ensure_env
from harness.execution.launcher import LaunchSpec, WorkerSession
from harness.knowledge.selection import select_runs
from harness.recording.records import record_key
from tests import slurm_cluster
from tests.conftest import REPO_ROOT, missing_component

pytestmark = pytest.mark.matrix


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[slurm_cluster.SlurmCluster]:
    reason = slurm_cluster.why_not()
    if reason:
        missing_component("slurm", f"Slurm tests not run: {reason}")
    started = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield started
    finally:
        started.stop()


#: What the array runs: S2 of the `ci` profile in both of its cells (a real failure on the old stack, the fixes that
#: work, configs not applicable there); the other scenarios add jobs, not another way for a shard to differ.
SLICE = ("--scenario", "S2-qlora-grad-flags")
SCENARIO = SLICE[1]


def outcomes(results: Path, scenario: str | None = None) -> dict[tuple[str, ...], tuple[str, str | None]]:
    """What the published table is made of: each key's shown outcome and failure signature (of one scenario)."""
    records, _ = select_runs(results).latest()
    return {
        record_key(r): (r["outcome"], r.get("signature"))
        for r in records
        if scenario is None or r["scenario"] == scenario
    }


def test_ci_profile_as_a_slurm_array_equals_a_plain_run(
    cluster: slurm_cluster.SlurmCluster, ci_run: Path, tmp_path: Path
) -> None:
    """A slice of the `ci` profile (S2, both cells) as an array of 2 tasks: the merged records and the report job's
    table say, key by key and entry by entry, what the plain run of the whole profile says of that slice."""
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "slurm",
            "--profile",
            "ci",
            "--tasks",
            "2",
            "--wait",
            "--results-dir",
            str(results),
            "--",
            *SLICE,
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=cluster.env(),
        timeout=1800,
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(results.glob("slurm/*/*.out")))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    runs = sorted(r for r in (results / "runs").iterdir() if (r / "meta.json").is_file())
    shards = sorted(tuple(json.loads((r / "meta.json").read_text())["shard"]) for r in runs)
    assert shards == [(1, 2), (2, 2)], "one run per array task, each its shard"
    cells = [{rec["cell"] for rec in map(json.loads, (r / "records.jsonl").read_text().splitlines())} for r in runs]
    assert all(len(c) == 1 for c in cells) and cells[0] != cells[1], "each task ran one of the two cells"
    plain = outcomes(ci_run, SCENARIO)
    assert outcomes(results) == plain
    assert {v[0] for v in plain.values()} >= {"pass", "fail"}, "the comparison covers a real failure"
    # What users read: the table the report job wrote says, entry by entry, what a plain run's table says
    # (verdicts, fix lines, other failures); only the provenance (run ids, times) differs.
    merged = summary_rows(results / "COMPATIBILITY.md")
    reference = {cell: {SCENARIO: row[SCENARIO]} for cell, row in summary_rows(ci_run / "COMPATIBILITY.md").items()}
    assert merged == reference, f"report job: {merged}\nplain run: {reference}"
    assert any("fixed by: " in entry for row in reference.values() for entry in row.values()), "a fix line is compared"


def summary_rows(table: Path) -> dict[str, dict[str, str]]:
    """The summary table of COMPATIBILITY.md: cell -> scenario -> its entry."""
    text = table.read_text()
    body = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    header = next((line for line in body.splitlines() if line.startswith("| cell |")), None)
    rows = [line for line in body.splitlines() if line.startswith("| `")]
    assert header and rows, f"no summary rows in {table}"
    scenarios = [name.strip() for name in header.split("|")[2:-1]]
    return {
        row.split("|")[1].strip(): dict(zip(scenarios, (e.strip() for e in row.split("|")[2:-1]), strict=True))
        for row in rows
    }


def current_cell_python() -> Path:
    profile = load_profile("ci", REPO_ROOT / "matrix")
    cell = next(c for c in expand(profile) if c.stack == "current")
    env = ensure_env(cell, profile, InstallOptions(envs_dir=default_envs_dir()))
    assert env.failure is None, env.failure
    return env.python


def test_two_node_launch_through_srun_and_c10d(
    cluster: slurm_cluster.SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    spec = LaunchSpec(
        python=current_cell_python(),
        module="tests.fault_scenarios.f1_faults",
        preload=("torch",),
        device="cpu",
        world_size=1,
        env={"CUDA_VISIBLE_DEVICES": ""},
        workdir=tmp_path / "worker" / "cell" / "F1",
        job_timeout_s=60,
        start_timeout_s=180,
        stop_after_failure=False,
        nnodes=2,
        rdzv_endpoint=f"127.0.0.1:{slurm_cluster.free_port()}",
    )
    with WorkerSession(spec) as session:
        first = list(session.run([({"n": 1}, "baseline"), ({"n": 2}, "baseline")]))
        # A job decided after the last result reaches the ranks on both nodes through the shared feed.
        later = session.run_one({"n": 3}, "deterministic_fail")
        again = session.run_one({"n": 4}, "baseline")
    assert [r.status for r in first] == ["pass", "pass"], [r.detail for r in first]
    assert all(r.detail["metrics"]["sum"] == 2.0 for r in first), "the all_reduce spans both nodes"
    assert first[0].detail["metrics"]["nodes"] == [0, 1], "one rank on each Slurm node"
    assert later.status == "exception" and later.detail["ranks_failed"] == [0, 1]
    assert again.status == "pass"
    # The allocation srun made for the steps ends with them (it may show as completing, CG, for a moment).
    deadline = time.monotonic() + 60
    while True:
        squeue = subprocess.run(["squeue", "-h"], env=cluster.env(), capture_output=True, text=True, timeout=30)
        if not squeue.stdout.strip() or time.monotonic() > deadline:
            break
        assert " R " not in squeue.stdout, f"a step still runs after the session closed: {squeue.stdout}"
        time.sleep(1)
    assert squeue.stdout.strip() == "", f"the srun steps ended with the session: {squeue.stdout}"
