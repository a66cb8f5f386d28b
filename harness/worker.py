"""The worker: runs inside a cell's environment and executes many scenario jobs in one process.

It is started by the launcher as `python harness/worker.py JOBS_FILE OUT_DIR` (or under torchrun for
distributed scenarios). It imports only the standard library and the scenario module, so it never
depends on the orchestrator's packages. Each rank appends events to `OUT_DIR/events.rank<R>.jsonl`,
flushed line by line, so the launcher sees progress live and a killed worker loses nothing finished.
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts harness/ on sys.path, where module names like profile.py would shadow the
# standard library for every import below (and the stack's), and scenarios must resolve from the repo root.
# Drop it before importing anything else.
if __name__ == "__main__":
    _HERE = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _HERE]

import faulthandler
import importlib
import json
import signal
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

MAX_MESSAGE = 4000


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
    # "w": a launch directory is never reused, and this file must hold this process's events only.
    events = open(Path(out_dir) / f"events.rank{rank}.jsonl", "w", buffering=1)

    def emit(event: dict[str, Any]) -> None:
        events.write(json.dumps(event, default=repr) + "\n")
        events.flush()
        os.fsync(events.fileno())

    _exit_with_orchestrator(os.environ.get("COMPAT_MATRIX_ORCHESTRATOR_PID"))
    started = time.monotonic()
    try:
        module = importlib.import_module(spec["module"])
        for package in spec.get("preload", []):
            importlib.import_module(package)
        if world_size > 1:
            _init_distributed(spec["device"], local_rank)
    except BaseException as exc:
        emit({"event": "import-failed", **_describe(exc)})
        return 3
    emit({"event": "ready", "import_s": round(time.monotonic() - started, 3), "pid": os.getpid()})

    for job in _jobs(spec):
        emit({"event": "start", "index": job["index"], "uid": job.get("uid")})
        result = _run_one(module, job, spec["device"], rank, local_rank, world_size)
        emit({"event": "end", "index": job["index"], "uid": job.get("uid"), **result})
        if result["status"] != "pass" and world_size > 1:
            if spec.get("stop_after_failure", True):
                # A failure can leave collectives out of step between ranks: let the launcher restart us.
                return 0
            # The scenario says its failures are symmetric: re-synchronise the ranks and go on. If they
            # cannot meet, the launcher's inactivity timeout restarts the group.
            import torch.distributed as dist

            dist.barrier()
    _finish_distributed(world_size)
    return 0


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


def _run_one(
    module: Any, job: dict[str, Any], device: str, rank: int, local_rank: int, world_size: int
) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="job-") as workdir, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx = {"device": device, "rank": rank, "local_rank": local_rank, "world_size": world_size, "workdir": workdir}
        try:
            observed = module.run(job["config"], job["variant"], ctx) or {}
            result: dict[str, Any] = {
                "status": "pass",
                "metrics": observed.get("metrics", {}),
                "path": observed.get("path"),
            }
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            result = {
                "status": "exception",
                **_describe(exc),
                "metrics": getattr(exc, "metrics", {}) or {},
                "path": getattr(exc, "path", None),
            }
            check = getattr(exc, "check", None)
            if check:
                result["check"] = check
    result["warnings"] = _unique_warnings(caught)
    result["duration_s"] = round(time.monotonic() - started, 4)
    return result


def _describe(exc: BaseException) -> dict[str, Any]:
    kind = type(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    return {
        "exc_type": f"{kind.__module__}.{kind.__qualname__}",
        "message": str(exc)[:MAX_MESSAGE],
        "traceback": "".join(traceback.format_exception(exc))[-MAX_MESSAGE:],
        # Where it was raised: tells a bug in our own scenario code from a failure inside the stack.
        "origin": frames[-1].filename if frames else None,
    }


def _unique_warnings(caught: list[warnings.WarningMessage], limit: int = 8) -> list[str]:
    seen: list[str] = []
    for item in caught:
        text = f"{item.category.__name__}: {str(item.message)[:300]}"
        if text not in seen:
            seen.append(text)
        if len(seen) >= limit:
            break
    return seen


def _init_distributed(device: str, local_rank: int) -> None:
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        # CPU tensors need a backend too (scenarios gather small metrics on CPU; DeepSpeed and FSDP use
        # CPU collectives in places): NCCL alone answers "No backend type associated with device type cpu".
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")


def _finish_distributed(world_size: int) -> None:
    if world_size <= 1:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
