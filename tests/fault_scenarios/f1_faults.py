"""Fault injection for the harness's own tests, not a compatibility scenario.

Real torchrun ranks and real gloo collectives, made to hang, die, run out of memory or fail at random,
so the tests can check that every fault becomes a classified record and nothing is left running. It is
found only when $COMPAT_MATRIX_EXTRA_SCENARIOS names it.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
from pathlib import Path

SPEC = {
    "id": "F1-faults",
    "title": "Injected faults (harness tests only)",
    "known_issues": [],
    "world_size": 2,
    # Injected failures are symmetric (both ranks raise at the same point): no restart after them.
    "restart_after_failure": False,
    "device": "cpu",
    "requires": ["torch"],
    "target": [],
    "controls": [],
    "variants": {
        "baseline": ("baseline", "both ranks all_reduce and pass"),
        "hang_in_collective": ("measurement", "injected fault: hang in collective"),
        "rank_abort": ("measurement", "injected fault: rank abort"),
        "segfault": ("measurement", "injected fault: segfault"),
        "oom": ("measurement", "injected fault: oom"),
        "flaky": ("measurement", "injected fault: flaky"),
        "deterministic_fail": ("measurement", "injected fault: deterministic fail"),
        "gil_spin": ("measurement", "injected fault: gil spin"),
    },
}

EXAMPLES = [{"n": 1}]


def strategy():
    from hypothesis import strategies as st

    return st.fixed_dictionaries({"n": st.just(1)})


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(config: dict, variant: str, ctx: dict) -> dict:
    import torch
    import torch.distributed as dist

    rank = ctx["rank"]
    tensor = torch.ones(1)
    if variant == "hang_in_collective":
        if rank == 1:
            _say("rank 1: sleeping instead of joining all_reduce")
            time.sleep(3600)
        dist.all_reduce(tensor)
    elif variant == "rank_abort":
        if rank == 1:
            _say("rank 1: calling os.abort()")
            os.abort()
        dist.all_reduce(tensor)
    elif variant == "segfault":
        if rank == 1:
            _say("rank 1: about to dereference NULL")
            ctypes.string_at(0)
        dist.all_reduce(tensor)
    elif variant == "oom":
        torch.empty(64 * 2**30, dtype=torch.uint8).fill_(1)  # 64 GiB, far over the profile's worker limit
    elif variant == "flaky":
        marker = Path(os.environ["COMPAT_MATRIX_SCENARIO_FAULT_DIR"]) / f"flaky-{config['n']}-rank{rank}"
        first_attempt = not marker.exists()
        marker.touch()
        dist.all_reduce(tensor)
        if first_attempt:
            raise RuntimeError("injected failure on the first attempt only")
    elif variant == "deterministic_fail":
        raise RuntimeError("injected failure on every attempt")
    elif variant == "gil_spin":
        # Catastrophic backtracking: 2**40 steps inside the regex engine, which never releases the GIL, so no
        # Python thread of this process (the orchestrator watchdog included) runs again.
        _say(f"rank {rank}: matching a catastrophic regex, holding the GIL")
        re.match(r"(a+)+$", "a" * 40 + "b")
    dist.all_reduce(tensor)
    # Which Slurm node each rank ran on (-1 outside Slurm), so a multi-node test sees the ranks spread.
    node = torch.tensor([float(os.environ.get("SLURM_NODEID", -1))])
    nodes = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(nodes, node)
    return {"metrics": {"sum": float(tensor.item()), "nodes": sorted(int(n.item()) for n in nodes)}}
