"""DeepSpeed ZeRO: the config users pass, gathered copies of (partitioned) parameters, and cleanup."""

from __future__ import annotations

from typing import Any


def ds_config(stage: int, dtype: str, batch: int, trainer: bool) -> dict[str, Any]:
    """A ZeRO config as a DeepSpeed loop passes it, or as `Trainer(deepspeed=dict)` takes it ("auto" values)."""
    bf16 = dtype == "bfloat16"
    return {
        "train_micro_batch_size_per_gpu": "auto" if trainer else batch,
        "gradient_accumulation_steps": "auto" if trainer else 1,
        "gradient_clipping": "auto" if trainer else 1.0,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": "auto" if trainer else bf16},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def gathered_snapshot(named: list[tuple[str, Any]]) -> dict[str, Any]:
    """Full (gathered) fp32 copies of the given parameters; a collective under ZeRO-3."""
    import deepspeed

    # One parameter at a time: gathered as one list, one tensor of it sometimes came back as stale memory on CPU
    # with gloo (S7's check caught values like 4.3e8 in a lora_A whose saved copy was right).
    snapshot = {}
    for name, param in named:
        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            snapshot[name] = param.detach().float().cpu().clone()
    return snapshot


def cleanup(*engines: Any) -> None:
    """Destroy engines and forget the HF DeepSpeed config, so the next job in this worker starts clean. A
    cleanup after a failed run must never mask the stack's exception."""
    import gc

    for engine in engines:
        destroy = getattr(engine, "destroy", None)
        if callable(destroy):
            try:
                destroy()
            except Exception:
                pass
    try:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    except Exception:
        pass
    gc.collect()
