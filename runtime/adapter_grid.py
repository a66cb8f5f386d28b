"""Adapters carried across releases, the cell side (`python -m runtime.adapter_grid save|load JOB.json`): one day's
environment saves S10's seed adapters, or loads every adapter other days saved and judges each against the formula
model of its saved file, computed here, on the load day (`scenarios/kit/roundtrip.py`).

A job file names the store, this day, the configs (id -> config) and, for `load`, the (saved on, config id) pairs to
load. Each outcome is one JSON line appended to this day's `saves.jsonl` or `loads.jsonl` the moment it is known, so an
interrupted run keeps what it measured, and a rerun skips what a line already holds.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any


def _done(path: str, key: str) -> set[str]:
    if not os.path.isfile(path):
        return set()
    with open(path) as handle:
        return {json.loads(line)[key] for line in handle if line.strip()}


def _append(path: str, entry: dict[str, Any]) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(entry, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _failure(exc: BaseException) -> dict[str, Any]:
    from scenarios import compat

    if isinstance(exc, compat.NotApplicable):
        return {"outcome": "not-applicable", "why": str(exc)}
    if isinstance(exc, compat.CheckFailed):
        return {"outcome": "fail", "check": exc.check, "message": str(exc)[:2000], "metrics": exc.metrics}
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return {"outcome": "error", "exc_type": kind, "message": str(exc)[:2000],
            "traceback": traceback.format_exc()[-4000:]}  # fmt: skip


def save(job: dict[str, Any]) -> None:
    import torch

    from scenarios.kit import identities, roundtrip

    day, store = job["day"], job["store"]
    out = os.path.join(store, "saved", day)
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "saves.jsonl")
    done = _done(log, "config_id")
    for config_id, config in job["configs"].items():
        if config_id in done:
            continue
        started = time.monotonic()
        folder = os.path.join(out, config_id)
        entry: dict[str, Any] = {"config_id": config_id, "day": day}
        try:
            why_not = roundtrip.supported(config)
            if why_not:
                from scenarios import compat

                raise compat.NotApplicable(why_not)
            os.makedirs(folder, exist_ok=True)
            batch = {"input_ids": torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(3))}
            identities.tensors_to_file(batch, os.path.join(folder, "batch.pt"))
            roundtrip.save(config, batch, os.path.join(folder, "saved"))
            entry["outcome"] = "saved"
        except Exception as exc:
            entry |= _failure(exc)
        entry["seconds"] = round(time.monotonic() - started, 2)
        _append(log, entry)
        print(f"saved {day} {config_id}: {entry['outcome']}", flush=True)


def load(job: dict[str, Any]) -> None:
    from scenarios import s10_adapter_roundtrip as s10
    from scenarios.kit import roundtrip

    day, store = job["day"], job["store"]
    out = os.path.join(store, "loaded", day)
    os.makedirs(out, exist_ok=True)
    # One log per fixed hash seed (PYTHONHASHSEED, set by the orchestrator): a config with several modules_to_save
    # heads is loaded under each (peft#2289), in a process of its own.
    seed = os.environ.get("PYTHONHASHSEED", "")
    log = os.path.join(out, f"loads-hash-{seed}.jsonl" if seed else "loads.jsonl")
    done = _done(log, "pair")
    for saved_on, config_id in job["pairs"]:
        pair = f"{saved_on}|{config_id}"
        if pair in done:
            continue
        config = job["configs"][config_id]
        root = os.path.join(store, "saved", saved_on, config_id, "saved")
        workdir = os.path.join(out, saved_on, config_id, f"hash-{seed}" if seed else "")
        started = time.monotonic()
        entry: dict[str, Any] = {"pair": pair, "saved_on": saved_on, "loaded_on": day, "config_id": config_id,
                                 "hash_seed": seed or None}  # fmt: skip
        payload = {"config": config, "root": root, "batch": os.path.join(os.path.dirname(root), "batch.pt")}
        try:
            result = s10.judge(config, root, roundtrip.load(payload, {"workdir": workdir, "device": "cpu"}))
            entry |= {"outcome": "pass", "metrics": result["metrics"]}
        except Exception as exc:
            entry |= _failure(exc)
        entry["seconds"] = round(time.monotonic() - started, 2)
        _append(log, entry)
        print(f"loaded {saved_on} {config_id} on {day}: {entry['outcome']}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("save", "load"):
        print("usage: python -m runtime.adapter_grid save|load JOB.json", file=sys.stderr)
        return 2
    with open(argv[1]) as handle:
        job = json.load(handle)
    (save if argv[0] == "save" else load)(job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
