"""What really ran, measured while a job runs: every record carries it as `setup`, and a pass counts only when the
declared setup ran (`scenarios/applicability.py` compares them).

A scenario's `run` calls `start(ctx)` first; kit functions then `note(...)` facts as the setup is built (the
quantized weights after loading, the FSDP that wrapped the model, the ZeRO stage, the Trainer's distributed
settings, ...). The facts live in `ctx["setup"]`, which the job returns whether the job passed or raised, so a
failure says what it ran on too. `require(...)` ends a job as not applicable the moment a declared setup cannot
run here. The facts are plain JSON; torch is imported only inside the functions that measure a model.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from scenarios import compat

_current: dict[str, Any] = {}


def start(ctx: dict[str, Any]) -> dict[str, Any]:
    """Begin measuring one job: its facts go to `ctx["setup"]` (a new dict: nothing carries over from the last job
    of a warm worker). Records the world size the ranks really form."""
    global _current
    _current = ctx.setdefault("setup", {})
    _current.clear()
    _current["world_size"] = _world_size(ctx)
    _current["device"] = str(ctx.get("device", "cpu"))
    return _current


def note(**facts: Any) -> None:
    """Add measured facts (JSON values) to the current job's setup."""
    _current.update(facts)


def require(condition: bool, reason: str) -> None:
    """The declared setup cannot run here: end the job as not applicable (never a pass or a fail), saying why."""
    if not condition:
        note(not_applicable=reason)
        raise compat.NotApplicable(reason)


def model(model: Any, prefix: str = "") -> dict[str, Any]:
    """Parameter dtypes (frozen base and trainable adapters apart), 4-bit modules and how many of their weights
    are really quantized, and the FSDP that wraps the model; noted under `prefix` and returned."""
    frozen: Counter[str] = Counter()
    trainable: Counter[str] = Counter()
    for param in model.parameters():
        (trainable if param.requires_grad else frozen)[str(param.dtype).replace("torch.", "")] += 1
    facts = {
        "base_dtypes": dict(sorted(frozen.items())),
        "adapter_dtypes": dict(sorted(trainable.items())),
        **quantization(model),
        "fsdp": fsdp_version(model),
    }
    note(**{f"{prefix}{k}": v for k, v in facts.items()})
    return facts


def quantization(model: Any) -> dict[str, Any]:
    """How many bitsandbytes 4-bit modules the model has, and how many of their weights hold quantized data (a
    quant_state and packed storage): a Linear4bit whose weight was never quantized runs no QLoRA."""
    modules = [m for m in model.modules() if type(m).__name__ in ("Linear4bit", "LinearNF4", "LinearFP4")]
    quantized = sum(1 for m in modules if _is_quantized(getattr(m, "weight", None)))
    return {"linear4bit_modules": len(modules), "quantized_weights": quantized}


def _is_quantized(weight: Any) -> bool:
    """A quantized weight has a quant_state and packed storage: fewer elements than the matrix it stands for."""
    state = getattr(weight, "quant_state", None) if weight is not None else None
    if state is None:
        return False
    shape = getattr(state, "shape", None)
    if shape is None:
        return True
    original = 1
    for size in shape:
        original *= int(size)
    return weight.numel() < original


def fsdp_version(model: Any) -> str | None:
    """'fsdp1' or 'fsdp2' where FSDP wraps some module of the model, else None."""
    try:
        import torch.distributed.fsdp as fsdp
    except ImportError:
        return None
    modules = list(model.modules())
    if any(isinstance(m, fsdp.FullyShardedDataParallel) for m in modules):
        return "fsdp1"
    fsdp2_module = getattr(fsdp, "FSDPModule", None)
    if fsdp2_module is None:
        try:
            from torch.distributed._composable.fsdp import FSDPModule as fsdp2_module
        except ImportError:
            return None
    return "fsdp2" if any(isinstance(m, fsdp2_module) for m in modules) else None


def trainer(trainer: Any) -> None:
    """The Trainer's effective distributed settings: accelerate's distributed type, the FSDP plugin's version,
    the DeepSpeed stage, mixed precision and checkpointing as the TrainingArguments resolved them."""
    args = trainer.args
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    plugin = getattr(state, "fsdp_plugin", None)
    facts: dict[str, Any] = {
        "distributed_type": str(getattr(state, "distributed_type", None)).rsplit(".", 1)[-1],
        "mixed_precision": str(getattr(state, "mixed_precision", None)),
        "bf16": bool(getattr(args, "bf16", False)),
        "fp16": bool(getattr(args, "fp16", False)),
        "gradient_checkpointing": bool(getattr(args, "gradient_checkpointing", False)),
        "gradient_checkpointing_kwargs": getattr(args, "gradient_checkpointing_kwargs", None),
    }
    if plugin is not None:
        facts["fsdp_plugin_version"] = int(getattr(plugin, "fsdp_version", 1) or 1)
    ds = getattr(state, "deepspeed_plugin", None)
    if ds is not None:
        facts["zero_stage"] = int(getattr(ds, "zero_stage", 0) or 0)
    note(trainer=facts)


def _world_size(ctx: dict[str, Any]) -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except ImportError:
        pass
    return int(ctx.get("world_size", 1))
