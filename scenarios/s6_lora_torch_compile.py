"""S6: LoRA + torch.compile: an adapter added to an already-compiled model saves as a no-op.

Known shape: huggingface/peft#2957 (a model compiled first, LoRA added after: module names carry torch.compile's
`_orig_mod.` prefix). Training works and exits 0, but `save_pretrained` writes every adapter key with that
prefix; `PeftModel.from_pretrained` on a plain model matches none of them (peft >= 0.13 warns "Found missing
adapter keys", older releases say nothing) and leaves lora_B at its zero init: the saved adapter does nothing.

This file is also the worked example of docs/scenario-contract.md: a scenario on the kit (scenarios/kit/).
"""

from __future__ import annotations

from hypothesis import strategies as st

from scenarios import compat
from scenarios.kit import checks, measured, strategies
from scenarios.kit.adapters import lora_config, named_trainable
from scenarios.kit.models import device_of, tiny_llama

SPEC = {
    "id": "S6-lora-torch-compile",
    "title": "LoRA + torch.compile: an adapter added after compiling reloads as a no-op (_orig_mod. keys)",
    "known_issues": ["huggingface/peft#2957"],
    "world_size": 1,
    "device": "any",
    "requires": ["torch", "transformers", "peft"],
    "target": ["check-adapter_survives_reload"],
    # The order PEFT's docs recommend: add the adapter, then compile.
    "controls": [{"order": "peft_then_compile"}],
    "variants": {
        "baseline": ("baseline", "the config as drawn: what a user of this stack writes by default"),
        "strip_orig_mod_prefix": (
            "fix",
            "save get_peft_model_state_dict(model) with '_orig_mod.' removed from every key, and the adapter config",
        ),
        "peft_then_compile": ("workaround", "get_peft_model first, torch.compile on the PEFT model after"),
    },
    # Why the compile-first order fails on every release, where the records say it does (listed once, as a pitfall).
    "own_code": {
        "order=compile_then_peft": (
            "an adapter added after torch.compile: its keys are saved under '_orig_mod.' and reload as a no-op, "
            "whatever the release"
        ),
    },
}

FIXES = ("strip_orig_mod_prefix", "peft_then_compile")

#: The seed (peft#2957's order): compile the base model, then add LoRA, train, save, reload elsewhere.
SEED = {
    "order": "compile_then_peft",
    "backend": "aot_eager",  # dynamo + AOT autograd without code generation: runs wherever torch does
    "use_dora": False,
    "r": 8,
    "alpha": 16,
    "targets": "qv",
    "hidden": 64,
    "steps": 2,
    "seed": 0,
}

EXAMPLES: list[dict] = [SEED]


def strategy():
    def axis(name: str, *others):
        return strategies.axis(SEED, name, *others)

    return st.fixed_dictionaries(
        {
            "order": axis("order", "peft_then_compile"),
            "backend": axis("backend", "eager"),
            "use_dora": axis("use_dora", True),
            "r": axis("r", 4, 16),
            "alpha": axis("alpha", 8, 32),
            "targets": axis("targets", "attn", "all-linear"),
            "hidden": axis("hidden", 32),
            "steps": axis("steps", 3),
            "seed": axis("seed", 1, 2),
        }
    )


def run(config: dict, variant: str, ctx: dict) -> dict:
    measured.start(ctx)  # what really ran goes into the record's setup
    import os

    import torch
    from peft import PeftModel, get_peft_model

    cfg = {**SEED, **config}
    fixes = compat.parse_variant(variant, FIXES)
    order = "peft_then_compile" if "peft_then_compile" in fixes else cfg["order"]
    device = device_of(ctx)
    adapters = lora_config(cfg["r"], cfg["alpha"], cfg["targets"], use_dora=cfg["use_dora"])
    base = tiny_llama(hidden=cfg["hidden"], seed=cfg["seed"]).to(device)
    if order == "compile_then_peft":
        model = get_peft_model(torch.compile(base, backend=cfg["backend"]), adapters)
        forward = model
    elif order == "peft_then_compile":
        model = get_peft_model(base, adapters)
        forward = torch.compile(model, backend=cfg["backend"])
    else:
        raise ValueError(f"unknown order {cfg['order']!r}")

    trainable = named_trainable(model)
    before = {n: p.detach().float().clone() for n, p in trainable}
    optimizer = torch.optim.AdamW([p for _, p in trainable], lr=1e-2)
    gen = torch.Generator().manual_seed(cfg["seed"])
    losses = []
    for _ in range(cfg["steps"]):
        ids = torch.randint(0, 128, (2, 16), generator=gen).to(device)
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    after = {n: p.detach().float().clone() for n, p in trainable}
    metrics = {"losses": losses, "order": order, **checks.compare(before, after)}
    checks.finite_loss(losses, metrics)
    checks.adapters_changed(metrics, cfg["steps"])

    # What the user sees: the saved adapter, loaded into a fresh copy of the base, gives the trained outputs.
    probe = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(99)).to(device)
    model.eval()
    with torch.no_grad():
        trained_logits = forward(input_ids=probe).logits.float()
    directory = os.path.join(ctx["workdir"], "adapter")
    if "strip_orig_mod_prefix" in fixes:
        _save_stripped(model, directory)
    else:
        model.save_pretrained(directory)
    saved_keys = _saved_keys(directory)
    reloaded = PeftModel.from_pretrained(tiny_llama(hidden=cfg["hidden"], seed=cfg["seed"]).to(device), directory)
    reloaded.eval()
    with torch.no_grad():
        reloaded_logits = reloaded(input_ids=probe).logits.float()
    difference = float((trained_logits - reloaded_logits).abs().max())
    metrics |= {
        "saved_keys_with_orig_mod": sum("_orig_mod." in k for k in saved_keys),
        "saved_keys": len(saved_keys),
        "reload_max_abs_logit_diff": difference,
    }
    if difference > 1e-3:
        raise compat.CheckFailed(
            "adapter_survives_reload",
            f"the reloaded adapter's logits differ from the trained model's by {difference:.3g} "
            f"({metrics['saved_keys_with_orig_mod']} of {len(saved_keys)} saved keys carry '_orig_mod.')",
            metrics,
        )
    return {"metrics": metrics, "path": order}


def _save_stripped(model, directory: str) -> None:
    """The fix users apply: save the adapter state dict without torch.compile's `_orig_mod.` prefix."""
    import os

    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = {k.replace("_orig_mod.", ""): v.detach().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    os.makedirs(directory, exist_ok=True)
    save_file(state, os.path.join(directory, "adapter_model.safetensors"), metadata={"format": "pt"})
    model.peft_config["default"].save_pretrained(directory)


def _saved_keys(directory: str) -> list[str]:
    import os

    from safetensors import safe_open

    path = os.path.join(directory, "adapter_model.safetensors")
    if not os.path.exists(path):  # old releases save adapter_model.bin
        import torch

        return list(torch.load(os.path.join(directory, "adapter_model.bin"), map_location="cpu"))
    with safe_open(path, framework="pt") as handle:
        return list(handle.keys())
