"""Start workers in a cell's environment, watch their events, enforce timeouts, leave nothing running.

One launch runs a list of jobs. If the worker dies, hangs, or stops after a distributed failure, the
launcher records what happened to the job in flight and relaunches a fresh worker for the rest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import pause_points
from harness.execution.phases import CLOCK
from harness.execution.slurm import srun_prefix
from harness.paths import REPO_ROOT
from harness.processes import guard
from harness.processes.proctree import ORCHESTRATOR_VAR, TOKEN_VAR, kill_token

#: The cell-side worker, run as a module from the repository root (on PYTHONPATH): nothing of harness/ is on
#: the worker's path, so no orchestrator module can shadow the standard library or the stack there.
WORKER_MODULE = "runtime.worker"
POLL_S = 0.1
STDERR_TAIL = 3000


@dataclass
class Job:
    index: int
    config: dict[str, Any]
    variant: str


@dataclass
class JobResult:
    """What happened to one job: the worker's end event(s), or what the launcher saw instead."""

    index: int
    status: str  # pass | exception | timeout | crash | env-broken
    detail: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0


@dataclass(frozen=True)
class LaunchSpec:
    python: Path
    module: str
    preload: tuple[str, ...]
    device: str
    world_size: int
    env: dict[str, str]
    workdir: Path
    job_timeout_s: float
    start_timeout_s: float
    #: Restart the worker group after a failed distributed job (collectives may be out of step).
    stop_after_failure: bool = True
    #: Checks (name prefixes) whose failure the scenario ends on every rank at one point: no restart after them.
    in_step_failures: tuple[str, ...] = ()
    #: RLIMIT_AS for the worker tree, in MiB (CPU only; None: no limit).
    memory_limit_mb: int | None = None
    #: Multi-node: `srun` starts one torchrun agent on each of this many nodes of the Slurm allocation and
    #: they meet at `rdzv_endpoint` (c10d rendezvous). The launch directory must be on a filesystem all
    #: nodes share. `world_size` counts ranks per node.
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    #: Which packing slot this worker is (e.g. {"cuda_visible_devices": "2"}), for the records.
    slot: dict[str, str] = field(default_factory=dict)
    #: A distributed scenario: launched under torchrun with a process group even at one rank (single_rank).
    distributed: bool = False

    @property
    def total_ranks(self) -> int:
        return max(1, self.world_size) * self.nnodes


def stack_env(device: str, extensions_dir: Path) -> dict[str, str]:
    """What every worker's environment sets: no hub access, quiet tokenizers, a JIT cache for DeepSpeed's ops,
    DeepSpeed on CPU where there is no GPU, and NVLink multicast off on GPUs (it can take a shared host down)."""
    env = {
        "TORCH_EXTENSIONS_DIR": str(extensions_dir),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    if device == "cpu":
        return env | {"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    return env | {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class JobQueue:
    """The jobs of one launch series. More may be added between results (the consumer of `run_jobs`
    runs between yields), and they go to the warm worker through its feed file."""

    def __init__(self, jobs: list[Job] | None = None) -> None:
        self.jobs: list[Job] = list(jobs or [])
        self.done: set[int] = set()
        self.launches = 0
        #: The launch running the queue now (a session closed from another thread stops it).
        self.current: Launch | None = None

    def add(self, job: Job) -> None:
        self.jobs.append(job)

    def remaining(self) -> list[Job]:
        return [j for j in self.jobs if j.index not in self.done]


def run_jobs(spec: LaunchSpec, jobs: list[Job] | JobQueue, early: Launch | None = None) -> Iterator[JobResult]:
    """Yield one JobResult per job, in order, relaunching workers as needed.

    With a JobQueue, jobs added after a result is yielded run in the same worker. The generator ends
    when it is resumed with nothing left to run. `early`: a worker started before its jobs were known
    (`start_early`), used for the first launch.
    """
    queue = jobs if isinstance(jobs, JobQueue) else JobQueue(jobs)
    while queue.remaining():
        queue.launches += 1
        produced = 0
        launch, early = early or _start(spec, queue, queue.launches), None
        queue.current = launch
        for result in _watch_launch(spec, launch):
            produced += 1
            queue.done.add(result.index)
            CLOCK.add("jobs", result.duration_s)
            yield result
            if result.status == "env-broken":
                while queue.remaining():
                    job = queue.remaining()[0]
                    queue.done.add(job.index)
                    yield JobResult(job.index, "env-broken", result.detail)
                return
        remaining = queue.remaining()
        if produced == 0 and remaining:
            # A worker that made no progress at all would loop forever: report and stop.
            queue.done.add(remaining[0].index)
            yield JobResult(remaining[0].index, "crash", {"message": "worker exited without running any job"})
    if early is not None:
        _stop(spec, early)


class WorkerSession:
    """A warm worker for one cell x scenario: batches of jobs, or one job at a time (the shrinker
    asks for its next candidate only after seeing the last result). Results come back in order."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.queue = JobQueue()
        self._results: Iterator[JobResult] | None = None
        self._early: Launch | None = None

    def start_early(self) -> None:
        """Start the worker now, before any job is queued: it imports the stack (3 to 8 s on CPU) while the
        previous scenario's jobs run, and takes its jobs from the feed once they come. Not across Slurm nodes:
        an early srun step would wait for the running step's nodes while its start timeout runs."""
        if self._results is None and self._early is None and self.spec.nnodes == 1:
            self._early = _start(self.spec, self.queue, self.queue.launches + 1)

    def run(self, items: list[tuple[dict[str, Any], str]]) -> Iterator[JobResult]:
        """Queue (config, variant) jobs; yield their results in order. Consume them all before the next call."""
        count = len(items)
        for config, variant in items:
            self.queue.add(Job(len(self.queue.jobs), config, variant))
        for _ in range(count):
            yield self._next()

    def run_one(self, config: dict[str, Any], variant: str) -> JobResult:
        return next(self.run([(config, variant)]))

    def _next(self) -> JobResult:
        if self._results is not None:
            try:
                return next(self._results)
            except StopIteration:
                pass
        self._results = run_jobs(self.spec, self.queue, self._early)
        self._early = None
        return next(self._results)

    def close(self) -> None:
        """Stop the worker (its whole process tree). Safe from another thread than the one driving the session
        (an interrupt reaches the main thread while packing threads drive their sessions): the running launch
        is stopped, and the thread's generator then ends on its own."""
        if self._results is not None:
            try:
                self._results.close()  # type: ignore[attr-defined]
            except ValueError:  # "generator already executing": in a packing thread right now
                if self.queue.current is not None:
                    _stop(self.spec, self.queue.current)
            self._results = None
        if self._early is not None:
            _stop(self.spec, self._early)
            self._early = None

    def __enter__(self) -> WorkerSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Launch:
    """One started worker group: its process, launch directory, feed and token."""

    proc: subprocess.Popen
    out_dir: Path
    feed: _Feed
    token: str
    jobs: list[Job]
    launched: float


def _start(spec: LaunchSpec, queue: JobQueue, attempt: int) -> Launch:
    """Start a worker group for the queue's remaining jobs (none yet for an early start: they come by feed)."""
    guard.ensure_started()
    token = uuid.uuid4().hex
    out_dir = _new_launch_dir(spec.workdir, attempt, token)
    jobs_file = out_dir / "jobs.json"
    feed = _Feed(out_dir / "feed.jsonl", queue, token)
    jobs = queue.remaining()
    jobs_file.write_text(
        json.dumps(
            {
                "module": spec.module,
                "preload": list(spec.preload),
                "device": spec.device,
                "stop_after_failure": spec.stop_after_failure,
                "in_step_failures": list(spec.in_step_failures),
                "distributed": spec.distributed,
                "jobs": [_job_json(j, token) for j in jobs],
                "feed": str(feed.path),
            }
        )
    )
    env = (
        dict(os.environ)
        | spec.env
        | {
            TOKEN_VAR: token,
            ORCHESTRATOR_VAR: str(os.getpid()),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), spec.env.get("PYTHONPATH", "")])),
            "PYTHONUNBUFFERED": "1",
        }
    )
    command = _command(spec, jobs_file, out_dir)
    with open(out_dir / "stdout.log", "wb") as stdout, open(out_dir / "stderr.log", "wb") as stderr:
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(REPO_ROOT),
            preexec_fn=_address_space_limit(spec.memory_limit_mb),
        )
    return Launch(proc, out_dir, feed, token, jobs, time.monotonic())


def _watch_launch(spec: LaunchSpec, launch: Launch) -> Iterator[JobResult]:
    try:
        yield from _watch(spec, launch)
    finally:
        _stop(spec, launch)


def _stop(spec: LaunchSpec, launch: Launch) -> None:
    """End a launch and everything it started (ranks run in sessions of their own: the token finds them)."""
    if spec.nnodes > 1:
        _end_step(launch.proc)  # srun forwards SIGTERM to every node's agent and ends the step
    kill_token(launch.token)
    if launch.proc.poll() is None:
        launch.proc.kill()
    launch.proc.wait()


def _address_space_limit(limit_mb: int | None) -> Any:
    """A preexec hook capping the worker tree's address space, so a runaway allocation fails in the worker
    (and is recorded as an OOM crash) instead of dragging the whole machine into the kernel's OOM killer."""
    if limit_mb is None:
        return None

    def apply() -> None:
        import resource

        limit = limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def _command(spec: LaunchSpec, jobs_file: Path, out_dir: Path) -> list[str]:
    if spec.total_ranks <= 1 and not spec.distributed:
        return [str(spec.python), "-m", WORKER_MODULE, str(jobs_file), str(out_dir)]
    if spec.nnodes > 1:
        if not spec.rdzv_endpoint:
            raise ValueError("multi-node launches need a rendezvous endpoint (HOST:PORT)")
        where = [
            f"--nnodes={spec.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={spec.rdzv_endpoint}",
            f"--rdzv-id={out_dir.parent.name}-{out_dir.name}-{uuid.uuid4().hex[:8]}",
        ]
    else:
        where = ["--standalone"]
    return [
        *(srun_prefix(spec.nnodes) if spec.nnodes > 1 else []),
        str(spec.python),
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc-per-node={spec.world_size}",
        "--max-restarts=0",
        "-m",
        WORKER_MODULE,
        str(jobs_file),
        str(out_dir),
    ]


def _end_step(proc: subprocess.Popen) -> None:
    """Stop a multi-node launch on every node: the remote agents are not this machine's processes, so they are
    ended through srun (SIGTERM: srun signals the step's tasks everywhere), then srun itself."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _new_launch_dir(workdir: Path, attempt: int, token: str) -> Path:
    """A directory no earlier launch used: a resumed run (whose attempt counter starts again at 1) must never
    read the events an earlier process's workers left behind."""
    workdir.mkdir(parents=True, exist_ok=True)
    out_dir = workdir / f"launch-{attempt:03d}-{token[:8]}"
    out_dir.mkdir()
    return out_dir


def job_uid(token: str, index: int) -> str:
    """Unique per launch attempt: the launcher accepts only events carrying the ids of the jobs it sent."""
    return f"{token[:12]}-{index}"


def _job_json(job: Job, token: str) -> dict[str, Any]:
    return {"index": job.index, "uid": job_uid(token, job.index), "config": job.config, "variant": job.variant}


class _Feed:
    """Appends jobs added to the queue after launch to the file the worker tails."""

    def __init__(self, path: Path, queue: JobQueue, token: str) -> None:
        self.path = path
        self.queue = queue
        self.token = token
        self.sent = len(queue.jobs)
        path.write_bytes(b"")

    def new_jobs(self) -> list[int]:
        fresh = self.queue.jobs[self.sent :]
        self.sent = len(self.queue.jobs)
        if fresh:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write("".join(json.dumps(_job_json(j, self.token)) + "\n" for j in fresh))
        return [j.index for j in fresh]


@dataclass
class _WatchState:
    """What the polls of one launch have seen so far, folded event by event: which ranks are ready (and
    their pids, to ask for stacks), which jobs started and which ranks ended them, what is still pending."""

    token: str
    ranks: list[int]
    launched: float  # the start timeout runs from the real launch
    last_event: float
    pending: list[int]
    exited: bool = False  # as the last poll saw it, before reading: every event it wrote is read after
    ready: set[int] = field(default_factory=set)
    pids: dict[int, int] = field(default_factory=dict)  # rank -> its worker's pid (from the ready event)
    started: dict[int, float] = field(default_factory=dict)  # job index -> monotonic start (first rank)
    ends: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)  # job index -> rank -> end event

    def fold(self, rank: int, event: dict[str, Any], now: float) -> str | None:
        """Take one rank's event in. Says "all-ready" when it made every rank ready, "import-failed" when the
        worker cannot import the stack; events of another launch's jobs are ignored (never matched to ours)."""
        self.last_event = now
        kind = event["event"]
        if kind == "ready":
            self.ready.add(rank)
            if event.get("pid"):
                self.pids[rank] = int(event["pid"])
            return "all-ready" if self.all_ready else None
        if kind == "import-failed":
            return "import-failed"
        if event.get("uid") != job_uid(self.token, event.get("index", -1)):
            return None
        if kind == "start":
            self.started.setdefault(event["index"], now)
        elif kind == "end":
            self.ends.setdefault(event["index"], {})[rank] = event
        return None

    @property
    def all_ready(self) -> bool:
        return len(self.ready) == len(self.ranks)

    @property
    def current(self) -> int:
        """The job in flight (or next): the first pending one."""
        return self.pending[0]

    def partial(self) -> dict[int, dict[str, Any]]:
        """The current job's end events so far, by rank."""
        return self.ends.get(self.current, {})

    def without_result(self) -> list[int]:
        """The ranks that have not ended the current job."""
        return sorted(set(self.ranks) - set(self.partial()))


def _watch(spec: LaunchSpec, launch: Launch) -> Iterator[JobResult]:
    """Poll a launch until its jobs are done or a rule ends it: each poll folds the ranks' new events, yields
    the jobs every rank ended, then applies `_RULES` in order to the job in flight; the first that holds ends
    the launch, with a result for that job or none (the caller relaunches for the rest)."""
    waited_from = time.monotonic()  # worker-start counts only the wait: an early start overlapped other work
    readers = {rank: _EventReader(launch.out_dir / f"events.rank{rank}.jsonl") for rank in range(spec.total_ranks)}
    pending = [j.index for j in launch.jobs] + launch.feed.new_jobs()
    state = _WatchState(launch.token, sorted(readers), launch.launched, waited_from, pending)
    while state.pending:
        state.exited = launch.proc.poll() is not None
        for rank, reader in readers.items():
            for event in reader.read():
                seen = state.fold(rank, event, time.monotonic())
                if seen == "all-ready":
                    CLOCK.add("worker-start", time.monotonic() - waited_from)
                    pause_points.reached("workers-ready")
                elif seen == "import-failed":
                    detail = {k: event.get(k) for k in ("exc_type", "message", "traceback")}
                    detail |= {"cause": event["cause"]} if event.get("cause") else {}
                    yield JobResult(state.current, "env-broken", detail)
                    return
        yield from _finished_jobs(state, launch.feed)
        if not state.pending:
            return
        now = time.monotonic()
        for holds, result_of in _RULES:
            if holds(state, spec, now):
                result = result_of(state, spec, launch, now)
                if result is not None:
                    yield result
                return
        time.sleep(POLL_S)


def _finished_jobs(state: _WatchState, feed: _Feed) -> Iterator[JobResult]:
    """The pending jobs every rank has ended, in order. The consumer may queue more jobs while we are
    suspended: they go to the feed, and the idle time while the consumer thought is not a hang."""
    while state.pending and len(state.partial()) == len(state.ranks):
        index = state.pending.pop(0)
        yield _combine(index, state.ends[index])
        state.pending.extend(feed.new_jobs())
        if state.pending and state.current not in state.started:
            state.last_event = time.monotonic()


# The rules, each a pure decision on the folded state and the poll's time, in the order they apply.


def _some_rank_failed(state: _WatchState) -> bool:
    return any(e["status"] != "pass" for e in state.partial().values())


def _rank_died(state: _WatchState, spec: LaunchSpec, now: float) -> bool:
    """Some ranks raised, and the worker group exited without the others' results: they died."""
    return _some_rank_failed(state) and state.exited and bool(state.without_result())


#: How long the other ranks get to report once one rank raised (they usually wait in a collective the failed rank
#: never joins): at most the job timeout. The exception is the observation; waiting longer only delays it.
PEER_GRACE_S = 30.0


def _peer_hung(state: _WatchState, spec: LaunchSpec, now: float) -> bool:
    """Some ranks raised, and the others have said nothing for the grace (or are past the job timeout, or exited)."""
    overran = now - state.started.get(state.current, now) > spec.job_timeout_s
    silent = now - state.last_event > min(PEER_GRACE_S, spec.job_timeout_s)
    return _some_rank_failed(state) and (state.exited or overran or silent)


def _job_timed_out(state: _WatchState, spec: LaunchSpec, now: float) -> bool:
    return state.current in state.started and now - state.started[state.current] > spec.job_timeout_s


def _start_timed_out(state: _WatchState, spec: LaunchSpec, now: float) -> bool:
    waiting = state.current not in state.started and not state.all_ready
    return waiting and now - state.launched > spec.start_timeout_s


def _stuck_between_jobs(state: _WatchState, spec: LaunchSpec, now: float) -> bool:
    """Every rank ready, no job started, no event for a job timeout (e.g. re-synchronising ranks)."""
    idle = state.current not in state.started and state.all_ready
    return idle and now - state.last_event > spec.job_timeout_s


def _died_in_job(state: _WatchState, spec: LaunchSpec, now: float) -> bool:
    return state.exited and (state.current in state.started or bool(state.partial()))


def _died_starting(state: _WatchState, spec: LaunchSpec, now: float) -> bool:
    return state.exited and not state.all_ready


def _exited(state: _WatchState, spec: LaunchSpec, now: float) -> bool:
    """The worker stopped early on purpose (after a distributed failure)."""
    return state.exited


# What each rule records for the job in flight (None: no result, relaunch for the rest). These do the I/O:
# stderr tails, and the stacks of ranks still running.


def _rank_died_result(state: _WatchState, spec: LaunchSpec, launch: Launch, now: float) -> JobResult:
    """A crash: the survivors' exception (typically a collective whose peer vanished) is only its consequence."""
    partial, missing = state.partial(), state.without_result()
    combined = _combine(state.current, partial)
    survivors = combined.detail.get("message", "")
    return JobResult(
        state.current,
        "crash",
        {
            "message": f"rank(s) {missing} died during the job "
            f"(worker group {_exit_text(launch.proc.returncode)}); the other ranks then raised: {survivors[:300]}",
            "stderr_tail": _stderr_tail(launch.out_dir, missing or sorted(partial)),
            "ranks_without_result": missing,
        },
        combined.duration_s,
    )


def _peer_hung_result(state: _WatchState, spec: LaunchSpec, launch: Launch, now: float) -> JobResult:
    """The exception is the observation. The peers still run, waiting for the failed rank (in the collective
    their stacks name): that wait is what a user sees as a hang, so the record keeps where each of them waited."""
    partial, missing = state.partial(), state.without_result()
    result = _combine(state.current, partial)
    result.detail["ranks_without_result"] = missing
    if missing and not state.exited:
        stacks = hang_stacks({r: state.pids[r] for r in missing if r in state.pids}, launch.out_dir)
        if stacks:
            result.detail["rank_stacks"] = {str(r): text for r, text in sorted(stacks.items())}
            result.detail["waiting_in"] = {str(r): w for r, w in sorted(waiting_in(stacks).items())}
    result.detail["stderr_tail"] = _stderr_tail(launch.out_dir, missing or sorted(partial))
    return result


def _job_timeout_result(state: _WatchState, spec: LaunchSpec, launch: Launch, now: float) -> JobResult:
    """A timeout with every rank's stack and the collective it waits in.

    A rank that writes no stack when asked (SIGUSR1) is not running Python's signal handling any more
    (interpreter shutdown, native code with the signal masked): a finding of its own; SIGABRT may still have
    made it write one as it died."""
    unanswered: list[int] = []
    stacks = hang_stacks(state.pids, launch.out_dir, unanswered)
    where = waiting_in(stacks)
    silent = sorted(set(state.pids) - set(stacks))
    said = "; ".join(
        [f"rank {r} in {w or 'no collective'}" for r, w in sorted(where.items())]
        + [f"rank {r} answered only SIGABRT" for r in unanswered if r in stacks]
        + [f"rank {r} wrote no Python stack" for r in silent]
    )
    return JobResult(
        state.current,
        "timeout",
        {
            "message": f"job exceeded {spec.job_timeout_s:.0f} s; the whole process tree was killed"
            + (f"; stuck: {said}" if said else ""),
            "stderr_tail": _stderr_tail(launch.out_dir, state.ranks),
            "rank_stacks": {str(r): text for r, text in sorted(stacks.items())},
            "waiting_in": {str(r): w for r, w in sorted(where.items())},
            **({"ranks_without_stack": silent} if silent else {}),
            **({"ranks_deaf_to_sigusr1": unanswered} if unanswered else {}),
        },
        now - state.started[state.current],
    )


def _tail_result(state: _WatchState, launch: Launch, status: str, message: str, duration_s: float = 0.0) -> JobResult:
    """The current job ended as the launcher saw it: what happened, and the tail of every rank's stderr."""
    detail = {"message": message, "stderr_tail": _stderr_tail(launch.out_dir, state.ranks)}
    return JobResult(state.current, status, detail, duration_s)


def _start_timeout_result(state: _WatchState, spec: LaunchSpec, launch: Launch, now: float) -> JobResult:
    message = f"worker did not become ready within {spec.start_timeout_s:.0f} s"
    return _tail_result(state, launch, "timeout", message, now - state.launched)


def _died_in_job_result(state: _WatchState, spec: LaunchSpec, launch: Launch, now: float) -> JobResult:
    message = f"worker exited with {_exit_text(launch.proc.returncode)} during the job"
    return _tail_result(state, launch, "crash", message, now - state.started.get(state.current, now))


def _died_starting_result(state: _WatchState, spec: LaunchSpec, launch: Launch, now: float) -> JobResult:
    message = f"worker exited with {_exit_text(launch.proc.returncode)} before it was ready"
    return _tail_result(state, launch, "crash", message)


def _no_result(state: _WatchState, spec: LaunchSpec, launch: Launch, now: float) -> None:
    """Drop this worker without a result: the caller relaunches one for the remaining jobs."""
    return None


_Rule = Callable[[_WatchState, LaunchSpec, float], bool]
_ResultOf = Callable[[_WatchState, LaunchSpec, Launch, float], JobResult | None]
#: In order: the first rule that holds ends the launch.
_RULES: tuple[tuple[_Rule, _ResultOf], ...] = (
    (_rank_died, _rank_died_result),
    (_peer_hung, _peer_hung_result),
    (_job_timed_out, _job_timeout_result),
    (_start_timed_out, _start_timeout_result),
    (_stuck_between_jobs, _no_result),
    (_died_in_job, _died_in_job_result),
    (_died_starting, _died_starting_result),
    (_exited, _no_result),
)


STACK_WAIT_S = 2.0
_DUMP_START = re.compile(r"^(?:(?:Current thread|Thread) 0x[0-9a-f]+ |Stack )\(most recent call first\):", re.M)
#: Collectives a stack can be waiting in (torch.distributed, its c10d internals, DeepSpeed's comm layer).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "barrier",
    "monitored_barrier",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "wait",
)


def hang_stacks(pids: dict[int, int], out_dir: Path, unanswered: list[int] | None = None) -> dict[int, str]:
    """Each rank's Python stacks at this moment: SIGUSR1 makes the worker's faulthandler write them to the
    rank's stderr file (a maintained tool, no stack walker of ours), and we read back what it appended."""
    import signal

    sizes = {rank: _size(out_dir / f"stderr.rank{rank}.log") for rank in pids}
    stacks: dict[int, str] = {}
    # SIGUSR1 first (the rank lives on); a rank that writes nothing to it (a handler replaced by native code, a
    # signal mask) gets SIGABRT, which the worker's faulthandler answers as the process dies: it is killed anyway.
    for ask in (signal.SIGUSR1, signal.SIGABRT):
        for rank, pid in pids.items():
            if rank not in stacks:
                try:
                    os.kill(pid, ask)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and len(stacks) < len(pids):
            time.sleep(0.1)
            for rank in pids:
                if rank in stacks:
                    continue
                with open(out_dir / f"stderr.rank{rank}.log", "rb") as handle:
                    handle.seek(sizes[rank])
                    text = handle.read().decode("utf-8", "replace")
                found = list(_DUMP_START.finditer(text))
                if found:
                    stacks[rank] = text[found[0].start() :][-6000:]
        if len(stacks) == len(pids):
            break
        if ask == signal.SIGUSR1 and unanswered is not None:
            unanswered.extend(sorted(set(pids) - set(stacks)))
    return stacks


def waiting_in(stacks: dict[int, str]) -> dict[int, str | None]:
    """The collective each rank's main thread is in, where its stack tells (innermost torch/deepspeed frame)."""
    where: dict[int, str | None] = {}
    for rank, text in stacks.items():
        current = text.split("Current thread", 1)[-1]  # the thread the signal interrupted: the job's
        found = None
        for match in re.finditer(r'File "([^"]+)", line \d+ in (\w+)', current):
            path, function = match.groups()
            if function in COLLECTIVES and ("distributed" in path or "deepspeed" in path):
                found = function
                break
        where[rank] = found
    return where


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _combine(index: int, by_rank: dict[int, dict[str, Any]]) -> JobResult:
    """A distributed job fails if any rank failed; report the failure that came first (the shortest job: a peer
    that failed later in a collective, 'Connection closed by peer', failed because of it), the lowest rank of ties."""
    failing = sorted(
        ((rank, e) for rank, e in by_rank.items() if e["status"] != "pass"),
        key=lambda item: (round(float(item[1].get("duration_s") or 0.0), 1), item[0]),
    )
    rank, event = failing[0] if failing else min(by_rank.items())
    detail = {k: v for k, v in event.items() if k not in ("event", "index", "uid", "status")}
    detail["rank"] = rank
    if len(by_rank) > 1:
        detail["ranks_failed"] = sorted(r for r, _ in failing)
    return JobResult(index, event["status"], detail, max(e.get("duration_s", 0.0) for e in by_rank.values()))


def _stderr_tail(out_dir: Path, ranks: list[int]) -> str:
    """The last stderr lines of the ranks of interest (each rank writes its own file), then the launcher's
    (torchrun's summary names the rank that died first and how)."""
    parts = []
    share = STDERR_TAIL // (len(ranks) + 1)
    for rank in ranks:
        text = _tail(out_dir / f"stderr.rank{rank}.log", share).strip()
        if text:
            parts.append(f"--- rank {rank} stderr ---\n{text}")
    text = _tail(out_dir / "stderr.log", share).strip()
    if text:
        parts.append(f"--- launcher stderr ---\n{text}")
    return "\n".join(parts)


def _tail(path: Path, limit: int = STDERR_TAIL) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        import signal

        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


class _EventReader:
    """Reads complete JSON lines appended by one rank; a partial last line waits for the rest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return events
        complete, _, _ = chunk.rpartition(b"\n")
        if not complete:
            return events
        self.offset += len(complete) + 1
        for line in complete.split(b"\n"):
            if line.strip():
                events.append(json.loads(line))
        return events


if __name__ == "__main__":  # pragma: no cover - manual debugging aid
    sys.exit("use `python -m harness` instead")
