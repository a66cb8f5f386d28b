"""The worker: runs inside a cell's environment and executes many scenario jobs in one process (one job, for a
scenario that starts its own process group as a script does: SPEC `one_job_per_process`).

It is started by the launcher as `python -m runtime.worker JOBS_FILE OUT_DIR` from the repository root (or
under `torchrun -m` for distributed scenarios). It imports only the standard library, `runtime.job` and the
scenario module, so it never depends on the orchestrator's packages. Each rank appends events to
`OUT_DIR/events.rank<R>.jsonl`, flushed line by line, so the launcher sees progress live and a killed
worker loses nothing finished.
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from runtime.job import describe, finish_distributed, init_distributed, run_job


def main(jobs_file: str, out_dir: str) -> int:
    spec = json.loads(Path(jobs_file).read_text())
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    _stderr_to_file(Path(out_dir) / f"stderr.rank{rank}.log")
    # On SIGUSR1, write every thread's Python stack to this rank's stderr file: the launcher asks for it before
    # it kills a timed-out job, so the record says where each rank was stuck. faulthandler dumps from the C
    # signal handler, so it answers even while this process holds the GIL in C code.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    # And on a fatal signal (SIGABRT is the launcher's second ask, for a rank that did not answer SIGUSR1; a crash
    # in native code): the stacks are written as the process dies.
    # Only the thread that died: a crash's own last lines must stay in the record's stderr tail.
    faulthandler.enable(file=sys.stderr, all_threads=False)
    # "w": a launch directory is never reused, and this file must hold this process's events only.
    events = open(Path(out_dir) / f"events.rank{rank}.jsonl", "w", buffering=1)

    def emit(event: dict[str, Any]) -> None:
        events.write(json.dumps(event, default=repr) + "\n")
        events.flush()
        os.fsync(events.fileno())

    _exit_with_orchestrator(os.environ.get("COMPAT_MATRIX_ORCHESTRATOR_PID"))
    started = time.monotonic()
    owns_group = False
    try:
        module = importlib.import_module(spec["module"])
        for package in spec.get("preload", []):
            importlib.import_module(package)
        # A distributed scenario has a process group at 1 rank too; one that starts its own the way a user's script
        # does (SPEC "process_group": "scenario") gets none from us.
        scenario_spec = getattr(module, "SPEC", {})
        owns_group = scenario_spec.get("process_group") == "scenario"
        # Such a scenario measures how a script's first lines meet the stack, so each job gets processes of its
        # own: a process that ran a job before has a current device set, NCCL communicators made and destroyed,
        # and accelerate's state reset, which a fresh `torchrun script.py` has not (S8 on 2 GPUs: every hang in
        # a reused worker came at its second to fifth job).
        one_job = bool(scenario_spec.get("one_job_per_process", owns_group))
        if (world_size > 1 or spec.get("distributed")) and not owns_group:
            init_distributed(spec["device"], local_rank)
    except BaseException as exc:
        emit({"event": "import-failed", **describe(exc)})
        return 3
    _freeze_heap()
    emit({"event": "ready", "import_s": round(time.monotonic() - started, 3), "pid": os.getpid()})

    for number, job in enumerate(_jobs(spec)):
        emit({"event": "start", "index": job["index"], "uid": job.get("uid")})
        result = run_job(module.run, job["config"], job["variant"], spec["device"], rank, local_rank, world_size)
        emit({"event": "end", "index": job["index"], "uid": job.get("uid"), **result})
        if one_job:
            break  # the launcher starts fresh processes for the next job
        if number == 0:
            _freeze_heap()  # what the first job imported lazily (deepspeed's and transformers' submodules)
        failed = result["status"] != "pass"
        out_of_step = failed and not _ends_in_step(result, spec.get("in_step_failures") or ())
        if world_size > 1 and not owns_group and spec.get("stop_after_failure", True):
            # A job can fail on some ranks only (a check rank 0 makes alone): every rank learns it, so none goes on
            # to the next job without its peers (that job would fail for want of them, and read as a crash).
            failed, out_of_step = _on_any_rank(failed, out_of_step)
        if failed and world_size > 1:
            if owns_group and _refused(result):
                continue  # raised by every rank at the same point, after the scenario ended its own group
            if spec.get("stop_after_failure", True) and out_of_step:
                # A failure can leave collectives out of step between ranks: let the launcher restart us.
                return 0
            # The scenario says its failures are symmetric: re-synchronise the ranks and go on. If they
            # cannot meet, the launcher's inactivity timeout restarts the group.
            import torch.distributed as dist

            dist.barrier()
    finish_distributed(world_size)
    return 0


def _ends_in_step(result: dict[str, Any], in_step_failures: list[str] | tuple[str, ...]) -> bool:
    """A failure the scenario says every rank ends at the same point (SPEC "in_step_failures": "check:<name
    prefix>" for its checks, "not-applicable" for a refusal every rank makes alike), so the next job can run in
    the same group: no restart (about 25 s on a two-GPU node, several on CPU)."""
    check = result.get("check")
    if check:
        return any(
            str(check).startswith(kind[len("check:") :]) for kind in in_step_failures if kind.startswith("check:")
        )
    return _refused(result) and "not-applicable" in in_step_failures


def _refused(result: dict[str, Any]) -> bool:
    """The scenario refused the job as not applicable here (a skip, not a failure of the stack)."""
    return str(result.get("exc_type", "")).endswith(".NotApplicable")


def _on_any_rank(*flags: bool) -> tuple[bool, ...]:
    """Each flag as any rank has it, in one collective (all True where the peers cannot be reached any more)."""
    try:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return flags
        tensor = torch.tensor([1 if flag else 0 for flag in flags], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tuple(bool(x) for x in tensor.tolist())
    except Exception:
        return tuple(True for _ in flags)


def _freeze_heap() -> None:
    """Move what is alive now (torch, transformers, deepspeed: millions of objects) out of the cyclic GC's
    reach. Scenarios and DeepSpeed call gc.collect() after every job; with the libraries' objects frozen each
    call scans only the job's own objects (S4 on CPU: 0.47 s per call before, 0.01 s after). Garbage is
    collected first, so nothing dead is kept; a job's results do not depend on when collection runs."""
    gc.collect()
    gc.freeze()


def _stderr_to_file(path: Path) -> None:
    """Each rank's stderr (Python's and native code's, fd 2) goes to a file of its own, so the last lines
    of a rank that dies are not buried under torchrun's report of the other ranks."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def _jobs(spec: dict[str, Any]) -> Any:
    """The jobs file's jobs, then whatever the launcher appends to the feed file (a shrinker's next
    candidate, fix variants of a new failure) until it kills us: one warm worker serves them all."""
    yield from spec["jobs"]
    feed = spec.get("feed")
    if not feed:
        return
    offset = 0
    while True:
        with open(feed, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
        complete, _, _ = chunk.rpartition(b"\n")
        if not complete:
            time.sleep(0.02)
            continue
        offset += len(complete) + 1
        for line in complete.split(b"\n"):
            if line.strip():
                yield json.loads(line)


def _exit_with_orchestrator(pid_text: str | None) -> None:
    """If the orchestrator is killed (even with SIGKILL), stop too: no worker outlives its run."""
    if not pid_text:
        return
    pid = int(pid_text)

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(137)
            except PermissionError:
                pass
            time.sleep(1.0)

    threading.Thread(target=watch, name="orchestrator-watchdog", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
