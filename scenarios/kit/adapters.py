"""LoRA / DoRA setup: one table of target-module sets, one LoraConfig builder, adapter dtypes."""

from __future__ import annotations

from typing import Any

from scenarios import compat

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
ALL_LINEAR = ATTENTION + MLP
#: Named target-module sets, as configs name them ("all" is S4's older name for "all-linear").
TARGETS: dict[str, list[str]] = {
    "q": ["q_proj"],
    "qv": ["q_proj", "v_proj"],
    "attn": ATTENTION,
    "mlp": MLP,
    "all-linear": ALL_LINEAR,
    "all": ALL_LINEAR,
}


def target_modules(targets: str | list[str]) -> list[str]:
    """A set's name, or an explicit list of module names."""
    return list(TARGETS[targets]) if isinstance(targets, str) else list(targets)


def lora_config(
    r: int,
    alpha: int,
    targets: str | list[str],
    use_dora: bool = False,
    layers: list[int] | None = None,
    **extra: Any,
) -> Any:
    """peft.LoraConfig for a causal LM without dropout (the scenarios' losses must be deterministic)."""
    from peft import LoraConfig

    if use_dora:
        extra["use_dora"] = True  # only when asked: releases before DoRA have no such field
    if layers is not None:
        extra["layers_to_transform"] = layers
    return LoraConfig(
        r=r, lora_alpha=alpha, target_modules=target_modules(targets), lora_dropout=0.0, task_type="CAUSAL_LM", **extra
    )


def peft_model_with_adapter_dtype(model: Any, config: Any, adapter_fp32: bool, model_dtype: str) -> Any:
    """get_peft_model with adapters in fp32 (`adapter_fp32`) or in the model's dtype, on every peft release.

    peft >= 0.12 takes `autocast_adapter_dtype` (default True: adapters in fp32); older releases do not, so
    the adapter dtype is then set by hand to mean the same thing.
    """
    import inspect

    import torch
    from peft import get_peft_model

    if "autocast_adapter_dtype" in inspect.signature(get_peft_model).parameters:
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=bool(adapter_fp32))
    else:
        peft_model = get_peft_model(model, config)
    want = torch.float32 if adapter_fp32 else compat.torch_dtype(model_dtype)
    for name, param in peft_model.named_parameters():
        if "lora_" in name and param.is_floating_point() and param.dtype != want:
            param.data = param.data.to(want)
    return peft_model


def cast_trainable(model: Any, dtype: str) -> None:
    """What a user who casts the trainable (adapter) params to the model dtype does."""
    want = compat.torch_dtype(dtype)
    for param in model.parameters():
        if param.requires_grad and param.is_floating_point() and param.dtype != want:
            param.data = param.data.to(want)


def named_trainable(module: Any) -> list[tuple[str, Any]]:
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def trainable_dtypes(model: Any) -> list[str]:
    return sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.requires_grad})
