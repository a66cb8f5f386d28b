"""The launcher against real worker processes: pass, failure, hang, crash, import failure.

The toy scenario below uses only the standard library, so these tests need no ML stack; the worker,
the event protocol, timeouts and process-tree cleanup are the real ones.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

from harness.execution.launcher import Job, LaunchSpec, WorkerSession, run_jobs
from harness.processes.proctree import processes_started_by, processes_with_token
from tests.fault_ledger import record_fault

TOY = textwrap.dedent(
    """
    import os, time, subprocess, sys
    def run(config, variant, ctx):
        if variant == "pass":
            return {"metrics": {"x": 1}, "path": "toy"}
        if variant == "fail":
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        if variant == "hang":
            # a grandchild in its own session, like torchrun's ranks: it must not outlive the run
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
            time.sleep(600)
        if variant == "abort":
            os.abort()
    """
)


def spec(tmp_path: Path, module: str = "toy_scenario", timeout: float = 3.0) -> LaunchSpec:
    (tmp_path / "toy_scenario.py").write_text(TOY)
    (tmp_path / "broken_scenario.py").write_text("import no_such_package_anywhere\n")
    return LaunchSpec(
        python=Path(sys.executable),
        module=module,
        preload=(),
        device="cpu",
        world_size=1,
        env={"PYTHONPATH": str(tmp_path)},
        workdir=tmp_path / "work",
        job_timeout_s=timeout,
        start_timeout_s=30,
    )


def test_pass_fail_hang_abort_in_one_stream(tmp_path: Path) -> None:
    jobs = [Job(i, {}, v) for i, v in enumerate(["pass", "fail", "hang", "pass", "abort", "pass"])]
    started = time.monotonic()
    results = list(run_jobs(spec(tmp_path), jobs))
    assert [r.status for r in results] == ["pass", "exception", "timeout", "pass", "crash", "pass"]
    assert results[0].detail["metrics"] == {"x": 1}
    assert "element 0" in results[1].detail["message"]
    assert "SIGABRT" in results[4].detail["message"]
    assert time.monotonic() - started < 60


def test_no_process_outlives_a_timeout(tmp_path: Path) -> None:
    results = list(run_jobs(spec(tmp_path, timeout=2.0), [Job(0, {}, "hang")]))
    record_fault("hang with a grandchild in its own session", "timeout", results[0].status, orphans=len(_orphans()))
    assert results[0].status == "timeout"
    assert _orphans() == []


def _orphans() -> list[int]:
    """Every process the launcher started carries our pid in its environment; none may be left."""
    return processes_started_by(os.getpid())


def test_stack_that_does_not_import_is_env_broken(tmp_path: Path) -> None:
    results = list(run_jobs(spec(tmp_path, module="broken_scenario"), [Job(0, {}, "pass"), Job(1, {}, "pass")]))
    record_fault("stack fails at import", "env-broken", "/".join(sorted({r.status for r in results})))
    assert [r.status for r in results] == ["env-broken", "env-broken"]
    assert "no_such_package_anywhere" in results[0].detail["message"]


def test_token_scan_finds_nothing_for_unknown_token() -> None:
    assert processes_with_token("not-a-real-token") == []


def test_session_feeds_jobs_to_one_warm_worker(tmp_path: Path) -> None:
    """The shrinker's path: each next job is decided after the last result, and the worker stays up."""
    with WorkerSession(spec(tmp_path)) as session:
        assert session.run_one({}, "pass").status == "pass"
        statuses = [r.status for r in session.run([({}, "fail"), ({}, "pass")])]
        assert statuses == ["exception", "pass"]
        after_abort = [r.status for r in session.run([({}, "abort"), ({}, "pass")])]
        assert after_abort == ["crash", "pass"]  # the session relaunches a worker after a crash
        assert session.run_one({"n": 1}, "pass").status == "pass"
        assert session.queue.launches == 2
    assert _orphans() == []


def test_an_early_started_worker_takes_its_jobs_when_they_come(tmp_path: Path) -> None:
    """The executor starts the next scenario's worker while the current one runs: it imports, waits on its
    feed, runs what is queued later in that same launch, and a session closed before any job leaves nothing."""
    with WorkerSession(spec(tmp_path)) as session:
        session.start_early()
        time.sleep(1.0)  # the worker is up and idle, with no job yet
        assert [r.status for r in session.run([({}, "pass"), ({}, "fail"), ({}, "pass")])] == [
            "pass",
            "exception",
            "pass",
        ]
        assert session.queue.launches == 1
        launch_dirs = list((tmp_path / "work").iterdir())
        assert len(launch_dirs) == 1
    (tmp_path / "unused").mkdir()
    unused = WorkerSession(spec(tmp_path / "unused"))
    unused.start_early()
    time.sleep(0.5)
    unused.close()
    assert _orphans() == []


FRESH = textwrap.dedent(
    """
    import os
    SPEC = {"one_job_per_process": ONE_JOB}
    def run(config, variant, ctx):
        if variant == "fail":
            raise RuntimeError("refused")
        return {"metrics": {"pid": os.getpid()}, "path": "toy"}
    """
)


def _pids_of(tmp_path: Path, one_job: bool) -> tuple[list[str], list[int | None], int]:
    tmp_path.mkdir()
    (tmp_path / "fresh_scenario.py").write_text(FRESH.replace("ONE_JOB", str(one_job)))
    with WorkerSession(spec(tmp_path, module="fresh_scenario")) as session:
        session.start_early()
        results = list(session.run([({}, "pass"), ({}, "fail"), ({}, "pass")]))
        results.append(session.run_one({}, "pass"))  # a job queued after the others' results, as a fix is
        launches = session.queue.launches
    return [r.status for r in results], [r.detail.get("metrics", {}).get("pid") for r in results], launches


def test_a_scenario_that_asks_for_it_runs_each_job_in_processes_of_its_own(tmp_path: Path) -> None:
    """S8 measures how a script's first lines meet the stack: a job after another in the same processes is not
    what a fresh `torchrun script.py` meets, so each job gets a new worker, and none is lost on the way."""
    statuses, pids, launches = _pids_of(tmp_path / "fresh", one_job=True)
    assert statuses == ["pass", "exception", "pass", "pass"]
    passed = [pid for pid in pids if pid is not None]
    assert len(passed) == 3 and len(set(passed)) == 3
    assert launches == 4
    statuses, pids, launches = _pids_of(tmp_path / "warm", one_job=False)  # the default: one warm worker
    assert statuses == ["pass", "exception", "pass", "pass"]
    assert len({pid for pid in pids if pid is not None}) == 1 and launches == 1
    assert _orphans() == []


def test_no_early_start_across_slurm_nodes(tmp_path: Path) -> None:
    """An early srun step would queue behind the running one while its start timeout runs: not started."""
    session = WorkerSession(replace(spec(tmp_path), nnodes=2, rdzv_endpoint="127.0.0.1:1"))
    session.start_early()
    assert session._early is None and not (tmp_path / "work").exists()


def test_workers_import_the_standard_library_not_a_same_named_module_of_ours(tmp_path: Path) -> None:
    """harness/ has modules named like stdlib ones (profile.py; bisect.py once broke every worker, since
    random imports bisect). The worker runs as `-m runtime.worker` from the repository root, so none of them is
    on its path: a scenario importing `bisect` and `profile` gets the standard library's."""
    (tmp_path / "stdlib_user.py").write_text(
        textwrap.dedent(
            """
            import bisect, profile, random
            def run(config, variant, ctx):
                assert hasattr(bisect, "insort") and hasattr(profile, "Profile"), (bisect.__file__, profile.__file__)
                return {"metrics": {}}
            """
        )
    )
    [result] = run_jobs(spec(tmp_path, module="stdlib_user"), [Job(0, {}, "x")])
    assert result.status == "pass", result.detail


def test_first_per_signature_retries_one_failure_per_signature(tmp_path: Path) -> None:
    """The default retry scope confirms a signature once per batch, not every failure that has it."""
    from harness.define.profile import RetryPolicy
    from harness.execution.launcher import WorkerSession
    from harness.execution.scenario_run import _run_batch, observed

    items = [("fail", {"config": {"n": i}, "config_id": str(i), "source": "example"}) for i in range(5)]
    with WorkerSession(spec(tmp_path)) as session:
        results = list(_run_batch([session], items, RetryPolicy(times=1), set(), lambda r, _: observed(r)))
        jobs_run = len(session.queue.jobs)
    assert jobs_run == 6, "five failures, one retry for their one signature"
    assert sum(1 for _, _, fields in results if "attempts" in fields) == 1
    assert all(fields["outcome"] == "fail" for _, _, fields in results)


def test_the_collective_a_rank_waits_in_is_read_from_its_stack() -> None:
    from harness.execution.launcher import waiting_in

    dump = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
        "\n"
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/env/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2806 in all_reduce\n'
        '  File "/env/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper\n'
        '  File "/repo/tests/fault_scenarios/f1_faults.py", line 58 in run\n'
    )
    asleep = (
        'Current thread 0x00007f0000000003 (most recent call first):\n  File "/repo/f1_faults.py", line 54 in run\n'
    )
    assert waiting_in({0: dump, 1: asleep}) == {0: "all_reduce", 1: None}
