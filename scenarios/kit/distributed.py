"""What the ranks of a distributed scenario agree on."""

from __future__ import annotations

from typing import Any


def is_distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def mean_over_ranks(values: list[float]) -> list[float]:
    """Element-wise mean over ranks (the values themselves where there is one process)."""
    import torch
    import torch.distributed as dist

    if not values:
        return []
    t = torch.tensor(values, dtype=torch.float64)
    if is_distributed():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return [float(v) for v in t]


class PeerFailed(RuntimeError):
    """Another rank failed during setup; raised here instead of hanging in the next collective."""


def setup_barrier(local_exc: BaseException | None) -> None:
    """All ranks agree that setup went fine before the first collective of the stack.

    A rank whose setup raised re-raises its own exception unchanged; the others raise PeerFailed instead of
    waiting in a collective until the process-group timeout (30 min for gloo).
    """
    import torch
    import torch.distributed as dist

    if not is_distributed():
        if local_exc is not None:
            raise local_exc
        return
    flag = torch.tensor([1 if local_exc is not None else 0], dtype=torch.int64)
    dist.all_reduce(flag)
    if local_exc is not None:
        raise local_exc
    if int(flag.item()):
        raise PeerFailed(f"{int(flag.item())} other rank(s) failed during setup")


def shared_directory(ctx: dict[str, Any], prefix: str, fill: Any) -> str:
    """A directory rank 0 makes and fills (`fill(path)`), which every rank then reads (one host)."""
    import os
    import tempfile

    import torch.distributed as dist

    holder = [None]
    if dist.get_rank() == 0:
        directory = tempfile.mkdtemp(prefix=prefix, dir=ctx.get("workdir"))
        fill(directory)
        holder = [directory]
    dist.broadcast_object_list(holder, src=0)
    dist.barrier()
    if not os.path.isdir(holder[0]):
        raise RuntimeError(
            f"rank {dist.get_rank()} cannot see rank 0's model dir {holder[0]} (ranks on different hosts?)"
        )
    return holder[0]
