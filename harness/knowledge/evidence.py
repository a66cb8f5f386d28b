"""A record as evidence: where it ran (device class, atlas, world size), on which stack (the public releases of the
axis packages), under which setup (the vocabulary of `define/setup.py`), and what it shows of its scenario's target:
the failure, a pass, another failure (no evidence either way) or nothing (it could not run here)."""

from __future__ import annotations

from typing import Any

from harness.define import setup as vocabulary
from harness.define.packages import AXIS_PACKAGES, imported_with, public_version
from harness.recording.outcomes import BAD, UNUSABLE
from harness.recording.verdicts import matches

#: What a record says of a failure: it shows it, it passes, it failed another way (no evidence), or nothing.
SHOWS, PASSES, OTHER, NONE = "shows", "passes", "other", "none"


def device_class(record: dict[str, Any]) -> str:
    """'cpu' or 'cuda': a failure on GPUs may not show on CPU (another kernel), so each device class has its own."""
    return str((record.get("hardware") or {}).get("device") or "cpu")


def atlas_of(record: dict[str, Any]) -> str:
    """Which atlas a record belongs to: 'cpu', 'cuda' (one GPU), 'cuda-ws<N>' (N GPUs of one node)."""
    hardware = record.get("hardware") or {}
    device = str(hardware.get("device") or "cpu")
    gpus = int(hardware.get("gpu_count") or 0)
    return f"{device}-ws{gpus}" if device == "cuda" and gpus > 1 else device


def world_size(record: dict[str, Any]) -> int:
    return int((record.get("hardware") or {}).get("world_size") or 1)


def stack_of(record: dict[str, Any]) -> dict[str, str]:
    """The public release of each axis package the record ran ({'torch': '2.11.0', ...}; packages it lacks left out)."""
    versions = record.get("versions") or {}
    return {p: str(public_version(str(versions[p]))) for p in AXIS_PACKAGES if versions.get(p)}


def setup_of(record: dict[str, Any], spec: dict[str, Any] | None) -> dict[str, str]:
    """The record's setup in the vocabulary's words (its config over its scenario's SPEC `setup`)."""
    return vocabulary.setup_of(record.get("config"), spec)


def state(record: dict[str, Any], spec: dict[str, Any] | None) -> str:
    """What the record shows of its scenario's target: SHOWS, PASSES, OTHER (failed another way) or NONE (could not
    run here, not applicable, a skip). A timeout or another failure is never evidence for or against the target."""
    outcome = record["outcome"]
    if outcome == "pass":
        return PASSES
    if outcome in UNUSABLE or outcome == "skip" or record.get("signature") == "not-applicable":
        return NONE
    target = list((spec or {}).get("target") or [])
    if outcome in BAD and matches(record.get("signature"), target):
        return SHOWS
    return OTHER if outcome in BAD else NONE


def depends_of(spec: dict[str, Any] | None, setup: dict[str, str]) -> list[str]:
    """The axis packages a config of this setup can depend on: its scenario's (SPEC `requires`), those its setup
    brings (ZeRO-3: deepspeed; QLoRA: bitsandbytes; the Trainer: accelerate), and those these import whenever they
    are imported (peft imports transformers and accelerate), in table order."""
    if not (spec or {}).get("requires"):
        return list(AXIS_PACKAGES)  # a scenario that does not say what it imports depends on every package
    wanted = imported_with(set((spec or {}).get("requires") or []) | vocabulary.brought_packages(setup))
    return [p for p in AXIS_PACKAGES if p in wanted]
