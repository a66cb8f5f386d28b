"""Multi-node on one machine: two torchrun agents meet through a c10d rendezvous on 127.0.0.1.

Node 0 is the launcher (as `matrix --nnodes 2 --rdzv-endpoint ...` uses it); node 1 is a real
`python -m harness node-agent` process watching the shared launch directory. One rank runs under each
agent, in the CI mini matrix's "current" cell environment (torch, gloo), and they all-reduce together.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.environments.envs import InstallOptions, default_envs_dir, ensure_env
from harness.execution.launcher import LaunchSpec, WorkerSession
from harness.execution.proctree import processes_started_by
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.matrix


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def current_cell_python() -> Path:
    profile = load_profile("ci", REPO_ROOT / "matrix")
    cell = next(c for c in expand(profile) if c.stack == "current")
    env = ensure_env(cell, profile, InstallOptions(envs_dir=default_envs_dir()))
    assert env.failure is None, env.failure
    return env.python


def test_two_agents_rendezvous_and_share_the_job_feed(tmp_path: Path) -> None:
    python = current_cell_python()
    shared = tmp_path / "shared"
    shared.mkdir()
    agent = subprocess.Popen(
        [sys.executable, "-m", "harness", "node-agent", "--watch", str(shared)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    spec = LaunchSpec(
        python=python,
        module="tests.fault_scenarios.f1_faults",
        preload=("torch",),
        device="cpu",
        world_size=1,
        env={"CUDA_VISIBLE_DEVICES": ""},
        workdir=shared / "worker" / "cell" / "F1",
        job_timeout_s=60,
        start_timeout_s=180,
        stop_after_failure=False,
        nnodes=2,
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
    )
    try:
        with WorkerSession(spec) as session:
            first = [r for r in session.run([({"n": 1}, "baseline"), ({"n": 2}, "baseline")])]
            # A job decided after the last result reaches both nodes' ranks through the shared feed.
            later = session.run_one({"n": 3}, "deterministic_fail")
            again = session.run_one({"n": 4}, "baseline")
        assert [r.status for r in first] == ["pass", "pass"]
        assert all(r.detail["metrics"]["sum"] == 2.0 for r in first), "the all_reduce spans both agents"
        assert later.status == "exception" and later.detail["ranks_failed"] == [0, 1]
        assert again.status == "pass"
        launch = next(shared.glob("worker/cell/F1/launch-*"))
        assert (launch / "events.rank0.jsonl").is_file() and (launch / "events.rank1.jsonl").is_file()
        assert list(launch.glob("agent-*.log")), "node 1's torchrun agent was started by the node agent"
        assert (launch / "stop").is_file()
        time.sleep(2)
        assert not processes_started_by(agent.pid), "the node agent stopped its part of the launch"
    finally:
        agent.terminate()
        agent.wait(timeout=30)
