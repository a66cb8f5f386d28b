"""Tiny real models built from configs in code, saved and loaded the way users load theirs, and token data."""

from __future__ import annotations

import os
from typing import Any

from scenarios import compat


def tiny_llama(
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 128,
    dtype: str = "float32",
    seed: int = 0,
    intermediate: int | None = None,
    heads: int = 4,
    kv_heads: int = 4,
    max_positions: int = 128,
) -> Any:
    """A real LlamaForCausalLM built from a config in code (no hub access anywhere). Tiny by default; the
    same builder makes decoder layers of a real model's shape (e.g. 8B-class: hidden 4096, intermediate
    14336, 32 heads, 8 KV heads) for measurements that only mean something at size."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
    )
    model = LlamaForCausalLM(config).to(compat.torch_dtype(dtype))
    model.train()
    return model


def dtype_kwarg(dtype: Any) -> dict[str, Any]:
    """`from_pretrained`'s dtype keyword: `dtype=` from transformers 4.56 on, `torch_dtype=` before."""
    value = compat.torch_dtype(dtype) if isinstance(dtype, str) else dtype
    key = "dtype" if compat.version_tuple(compat.version_of("transformers")) >= (4, 56) else "torch_dtype"
    return {key: value}


def save_pretrained_tiny(config: dict[str, Any], directory: str) -> None:
    """Build the config's tiny Llama and `save_pretrained` it (single process: every rank would race)."""
    model = tiny_llama(
        hidden=config["hidden"],
        layers=config["layers"],
        vocab=config["vocab"],
        dtype=config["dtype"],
        seed=config["seed"],
        # Optional real-model shape keys (S5 at 8B-class size); absent in the tiny configs.
        intermediate=config.get("intermediate"),
        heads=config.get("heads", 4),
        kv_heads=config.get("kv_heads", 4),
        max_positions=max(128, int(config.get("seq", 0))),
    )
    model.save_pretrained(directory)
    del model


def save_by_hand(model: Any, directory: str) -> None:
    """config.json + model.safetensors on every rank. Not save_pretrained: transformers 5.x writes only on
    global rank 0 once a process group exists, and each rank's workdir is private."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    model.config.to_json_file(os.path.join(directory, "config.json"))
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def load_llama(directory: str, dtype: str) -> Any:
    """`from_pretrained` in train mode: it returns eval mode, where checkpointing silently does nothing."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(directory, **dtype_kwarg(dtype))
    model.train()
    return model


def hf_model(peft_or_hf: Any) -> Any:
    """The transformers model under a PeftModel (or the model itself)."""
    get_base = getattr(peft_or_hf, "get_base_model", None)
    return get_base() if callable(get_base) else peft_or_hf


def decoder_layers(model: Any) -> Any:
    """The decoder layers of a (PEFT-wrapped) Llama."""
    return hf_model(model).model.layers


def device_of(ctx: dict[str, Any]) -> Any:
    """This rank's torch device (and the current CUDA device set to it)."""
    import torch

    if ctx.get("device", "cpu") == "cuda":
        device = torch.device("cuda", ctx.get("local_rank", 0))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def token_rows(vocab: int, seq: int, count: int, seed: int) -> list[dict[str, Any]]:
    """Random token rows with labels, as a map-style dataset (no datasets package, no hub)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        ids = torch.randint(0, vocab, (seq,), generator=gen)
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows
