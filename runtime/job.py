"""One job: call a scenario's `run(config, variant, ctx)` and describe what happened, as plain data.

Shared by the worker and by every reproducer (which embeds this file verbatim), so the two set a job up the
same way: the same ctx, the same distributed init, the same description of an exception.
"""

from __future__ import annotations

import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

MAX_MESSAGE = 4000


def run_job(
    run: Callable[[dict[str, Any], str, dict[str, Any]], Any],
    config: dict[str, Any],
    variant: str,
    device: str,
    rank: int,
    local_rank: int,
    world_size: int,
) -> dict[str, Any]:
    """status 'pass' with the scenario's metrics and path, or 'exception' with its description. A failed
    check (an exception with a `check` attribute) names the check; its metrics and path are kept. Either way
    `setup` holds what the scenario measured of the setup that really ran (ctx["setup"])."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="job-") as workdir, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx = {"device": device, "rank": rank, "local_rank": local_rank, "world_size": world_size, "workdir": workdir}
        try:
            observed = run(config, variant, ctx) or {}
            result: dict[str, Any] = {
                "status": "pass",
                "metrics": observed.get("metrics", {}),
                "path": observed.get("path"),
                "setup": ctx.get("setup") or {},
            }
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            result = {
                "status": "exception",
                **describe(exc),
                "metrics": getattr(exc, "metrics", {}) or {},
                "path": getattr(exc, "path", None),
                "setup": ctx.get("setup") or {},  # what ran up to the failure (scenarios/kit/measured.py)
            }
            check = getattr(exc, "check", None)
            if check:
                result["check"] = check
    result["warnings"] = unique_warnings(caught)
    result["duration_s"] = round(time.monotonic() - started, 4)
    return result


def describe(exc: BaseException) -> dict[str, Any]:
    """Type, message, traceback tail, and where it was raised: the last tells a bug in our own scenario
    code from a failure inside the stack."""
    kind = type(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    found = {
        "exc_type": f"{kind.__module__}.{kind.__qualname__}",
        "message": str(exc)[:MAX_MESSAGE],
        "traceback": "".join(traceback.format_exception(exc))[-MAX_MESSAGE:],
        "origin": frames[-1].filename if frames else None,
    }
    root = root_cause(exc)
    if root is not exc:  # the traceback's tail is the last exception; what started it is kept apart
        found["cause"] = "".join(traceback.format_exception(root, chain=False))[-MAX_MESSAGE:]
    return found


def root_cause(exc: BaseException) -> BaseException:
    """The first exception of a chain ('During handling of the above exception...'): transformers' lazy import says
    "Could not import module 'BloomPreTrainedModel'" where torch lacking an attribute was the reason."""
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ or exc.__context__
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def unique_warnings(caught: list[warnings.WarningMessage], limit: int = 8) -> list[str]:
    seen: list[str] = []
    for item in caught:
        text = f"{item.category.__name__}: {str(item.message)[:300]}"
        if text not in seen:
            seen.append(text)
        if len(seen) >= limit:
            break
    return seen


def init_distributed(device: str, local_rank: int) -> None:
    """The process group every distributed scenario runs in (torchrun set RANK, WORLD_SIZE, MASTER_*)."""
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


def finish_distributed(world_size: int) -> None:
    """End the process group where one was made (a distributed scenario has one at world size 1 too)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
