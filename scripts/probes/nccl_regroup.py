"""Plain torch, no harness and no HF library: create an NCCL process group, gather once, destroy it, and again,
GROUPS times in one pair of processes. It asks whether a process that already made and destroyed a group meets a
hang the next time (S8's hangs in reused workers came at their second to fifth job) or a fresh one does too.

    torchrun --standalone --nproc-per-node 2 scripts/probes/nccl_regroup.py --groups 5 --form nccl

Each rank prints one JSON line per group ({"rank", "group", "form", "s"}); a group stuck for --stuck-s seconds
dumps every thread's stack to stderr and ends the process with exit code 1 (faulthandler), so the line that is
missing names the group that hung.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def one_group(form: str, local_rank: int) -> None:
    """What a script's first lines do (`nccl`: init_process_group("nccl"), then the device is set, as accelerate
    sets it; `device_id`: set_device and device_id=, NCCL's eager start), then one gather and the end."""
    device = torch.device("cuda", local_rank)
    if form == "device_id":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("nccl")
        torch.cuda.set_device(device)
    mine = torch.full((4,), float(dist.get_rank()), device=device)
    gathered = torch.empty(4 * dist.get_world_size(), device=device)
    dist.all_gather_into_tensor(gathered, mine)
    torch.cuda.synchronize(device)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=5, help="groups made and destroyed in turn in one process")
    parser.add_argument("--form", choices=("nccl", "device_id"), default="nccl")
    parser.add_argument("--stuck-s", type=float, default=30.0, help="a group taking longer than this is a hang")
    args = parser.parse_args()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    for group in range(1, args.groups + 1):
        faulthandler.dump_traceback_later(args.stuck_s, exit=True, file=sys.stderr)
        began = time.monotonic()
        one_group(args.form, local_rank)
        faulthandler.cancel_dump_traceback_later()
        line = {"rank": rank, "group": group, "form": args.form, "s": round(time.monotonic() - began, 3)}
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
