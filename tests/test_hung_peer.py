"""A distributed job where one rank raises and the other waits for it in a collective: the record keeps the error,
which ranks gave no result, and where each of them waited (the hang a user sees), with real torchrun and gloo."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.execution.launcher import Job, LaunchSpec, run_jobs

PEER = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    def run(config, variant, ctx):
        if ctx["rank"] == 1:
            raise ValueError("You can't train a model that has been loaded in 8-bit or 4-bit precision on a "
                             "different device than the one you're training on.")
        dist.recv(torch.zeros(1), src=1)  # rank 0 goes on into its first collective and waits for rank 1 for ever
        return {"metrics": {}}
    """
)


def _spec(tmp_path: Path, stop_after_failure: bool) -> LaunchSpec:
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts.script_stacks import pinned_stack

    ci = load_profile("ci", MATRIX_DIR)
    stack = pinned_stack(ci, "torch", {"torch": ci.axes["torch"][0]}, [], InstallOptions(envs_dir=default_envs_dir()))
    assert stack.python is not None, stack.failure
    (tmp_path / "peer_scenario.py").write_text(PEER)
    return LaunchSpec(
        python=stack.python,
        module="peer_scenario",
        preload=(),
        device="cpu",
        world_size=2,
        env={"PYTHONPATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""},
        workdir=tmp_path / "work",
        job_timeout_s=15,
        start_timeout_s=120,
        stop_after_failure=stop_after_failure,
        distributed=True,
    )


@pytest.mark.matrix
def test_a_rank_that_waits_for_a_failed_peer_leaves_its_stack(tmp_path: Path) -> None:
    """The failed rank stays up (a worker that re-synchronises, as NCCL ranks stay in their teardown): its peer
    waits until the job's time limit, and the record says where."""
    [result] = list(run_jobs(_spec(tmp_path, stop_after_failure=False), [Job(0, {}, "baseline")]))
    assert result.status == "exception"
    assert "different device" in result.detail["message"]
    assert result.detail["ranks_without_result"] == [0]
    assert result.detail["waiting_in"] == {"0": "recv"}
    assert "peer_scenario.py" in result.detail["rank_stacks"]["0"]


@pytest.mark.matrix
def test_the_first_rank_to_fail_names_the_failure(tmp_path: Path) -> None:
    """The failed rank exits (gloo then breaks its peer's wait with 'Connection closed by peer'): the record names
    the failure that came first, not its consequence on the other rank."""
    [result] = list(run_jobs(_spec(tmp_path, stop_after_failure=True), [Job(0, {}, "baseline")]))
    assert result.status == "exception"
    assert "different device" in result.detail["message"], result.detail["message"]
    assert result.detail["rank"] == 1


ONE_RANK = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    def run(config, variant, ctx):
        t = torch.ones(1)
        dist.all_reduce(t)  # both ranks take part in the job
        if variant == "rank0_check" and ctx["rank"] == 0:
            raise AssertionError("check saved_adapter_empty violated: a check rank 0 makes alone")
        return {"metrics": {"sum": float(t)}}
    """
)


@pytest.mark.matrix
def test_a_failure_on_one_rank_stops_every_rank_before_the_next_job(tmp_path: Path) -> None:
    """Rank 0 fails a job that rank 1 passes: no rank goes on to the next job without its peer (rank 1 used to,
    and the next job read as a crash of rank 0); the next job runs in a fresh launch and passes."""
    spec = _spec(tmp_path, stop_after_failure=True)
    (tmp_path / "peer_scenario.py").write_text(ONE_RANK)
    results = list(run_jobs(spec, [Job(0, {}, "rank0_check"), Job(1, {}, "pass"), Job(2, {}, "pass")]))
    assert [r.status for r in results] == ["exception", "pass", "pass"], [r.detail.get("message") for r in results]
    assert "a check rank 0 makes alone" in results[0].detail["message"]


def test_the_peers_of_a_failed_rank_get_a_grace_not_the_whole_job_timeout() -> None:
    """The rule alone, on a folded state: once a rank raised, the silent peers are given PEER_GRACE_S (a 300 s job
    timeout is not waited out job after job: `audit --fix --measure` once spent 5 minutes per S9 world-size config
    on a stack whose every first rank raised)."""
    from harness.execution.launcher import PEER_GRACE_S, _peer_hung, _WatchState

    spec = type("Spec", (), {"job_timeout_s": 300.0})()
    state = _WatchState("t", [0, 1], launched=0.0, last_event=0.0, pending=[0])
    state.started[0] = 0.0
    assert not _peer_hung(state, spec, PEER_GRACE_S + 1)  # nobody failed: the job may run its timeout
    state.ends[0] = {0: {"status": "exception"}}
    state.last_event = 10.0  # rank 0's failure came in at 10 s
    assert not _peer_hung(state, spec, 10.0 + PEER_GRACE_S - 1)
    assert _peer_hung(state, spec, 10.0 + PEER_GRACE_S + 1)
    short = type("Spec", (), {"job_timeout_s": 5.0})()
    assert _peer_hung(state, short, 16.0)  # never longer than the job timeout
