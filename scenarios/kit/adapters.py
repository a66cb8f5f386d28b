"""LoRA / DoRA setup: one table of target-module sets, one LoraConfig builder, adapter dtypes."""

from __future__ import annotations

from typing import Any

from scenarios import compat
from scenarios.kit import measured

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
    """get_peft_model as a user of this peft release writes it (`adapter_fp32=True`), or with the adapters cast to
    the model's dtype (`adapter_fp32=False`, the uniform-dtype setup).

    peft >= 0.12 takes `autocast_adapter_dtype` (default True: adapters in fp32). Older releases have no such
    switch and create the adapters in the base layer's dtype: that is what their users get, so it is what runs
    here too (nothing is forced to fp32). `setup.adapter_dtypes` in the record says which dtype really ran.
    """
    import inspect

    from peft import get_peft_model

    if "autocast_adapter_dtype" in inspect.signature(get_peft_model).parameters:
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=bool(adapter_fp32))
    else:
        peft_model = get_peft_model(model, config)
    if not adapter_fp32:
        want = compat.torch_dtype(model_dtype)
        for name, param in peft_model.named_parameters():
            if "lora_" in name and param.is_floating_point() and param.dtype != want:
                param.data = param.data.to(want)
    measured.note(adapter_dtype_rule="peft-default" if adapter_fp32 else f"cast-to-{model_dtype}")
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
