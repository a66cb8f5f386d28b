"""S9 (I4): the merged model computes what the adapter model computes, and unmerging gives the base back.

Users merge a trained adapter into the base (`merge_and_unload()`) to export one model, and switch adapters with
`merge_adapter()` / `unmerge_adapter()`. PEFT fixed merge bugs in this window: DoRA's weight norm on Conv1D layers
(peft#1588, 0.11.0), LoRA bias merges with a scale other than 1 (peft#2489, 0.16.0), DoRA unmerge on fan_in_fan_out
layers (peft#3531, 0.21.0), several DoRA adapters on one module (peft#3608, 0.21.0).

A tiny Llama (fp32) gets a LoRA or DoRA adapter, trains 3 AdamW steps (so lora_B and DoRA's magnitude move off their
initial values), and then: the merged model's logits (`merge_and_unload()` on a copy) against the float64 adapter
model's logits on a fixed batch, as large as the adapter's effect on those logits (the float64 adapter model against
the float64 base); each merged weight against the formula by hand in float64 (LoRA: W + s B A; DoRA: m (W + s B A) /
||W + s B A|| per output row); and after `merge_adapter()` then `unmerge_adapter()`, every base weight against its
value before, as large as the merged change, with the floor of (W + D) - D in float32. The failures:
`check-identity-merge` (the merged outputs or weights are off) and `check-identity-unmerge`.

QLoRA (`adapter = "qlora"`, where this stack loads 4-bit on the device): merging into 4-bit weights requantizes them,
a loss by design, so the merged logits are checked against that same requantization done by hand
(`kit/qlora_merge.py`), and what the requantization costs is recorded beside it. The workaround `reload_then_merge`
merges into a 4-bit base loaded afresh with the saved adapter, before any forward on it. Unmerge is not checked on
4-bit weights (two requantizations), nor are bf16 bases.
"""

from __future__ import annotations

import copy
from typing import Any

from scenarios.compat import parse_variant
from scenarios.kit import identities, measured, strategies

SPEC = {
    "id": "S9-identity-merge",
    "title": "Training identity, merge: merged outputs are the adapter model's, and unmerge gives the base back",
    "known_issues": [
        "huggingface/peft#1588",
        "huggingface/peft#3531",
        "huggingface/peft#3608",
        "bitsandbytes-foundation/bitsandbytes#2078",
    ],
    "world_size": 1,
    "device": "any",
    "requires": ["torch", "transformers", "peft"],
    "target": ["check-identity-merge"],
    "controls": [],
    "variants": {
        "baseline": ("baseline", "merge_and_unload(), and merge_adapter() / unmerge_adapter(), as users call them"),
        "reload_then_merge": (
            "workaround",
            "QLoRA: save the adapter, load the 4-bit base afresh with it, merge before any forward on it",
        ),
    },
    "in_step_failures": ["check:identity-"],
    "table_metrics": ["off_by"],
    # Each config is a code path of its own (the Trainer, a loop by hand, label smoothing): flips are named per config.
    "flips_per_config": True,
}

SEED = {
    "adapter": "lora",
    "targets": "qv",
    "r": 8,
    "alpha": 16,
    "use_rslora": False,
    "data_seed": 1,
}
TRAIN_STEPS = 3
LR = 1e-2


def strategy() -> Any:
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "adapter": strategies.axis(SEED, "adapter", "dora", "qlora"),
            "targets": strategies.axis(SEED, "targets", "all-linear"),
            "r": strategies.axis(SEED, "r", 4, 16),
            "alpha": strategies.axis(SEED, "alpha", 8, 32),
            "use_rslora": strategies.axis(SEED, "use_rslora", True),
            "data_seed": strategies.axis(SEED, "data_seed", 2, 3),
        }
    )


EXAMPLES = [
    SEED,
    strategies.seed_config(SEED, adapter="dora"),
    strategies.seed_config(SEED, targets="all-linear"),
    strategies.seed_config(SEED, adapter="dora", targets="all-linear"),
    strategies.seed_config(SEED, adapter="qlora"),
]


def run(config: dict[str, Any], variant: str, ctx: dict[str, Any]) -> dict[str, Any]:
    import torch

    measured.start(ctx)
    reload = "reload_then_merge" in parse_variant(variant, ("reload_then_merge",))
    batch = identities.rows(config)
    if config["adapter"] == "qlora":
        return _qlora(config, batch, reload)
    measured.require(not reload, "reload_then_merge is a QLoRA workaround: only a 4-bit base is requantized")
    model = _trained(config, batch)
    ids = identities.stacked(batch)
    inputs = {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"]}

    with torch.no_grad():
        exact = copy.deepcopy(model).double()
        reference = {"logits": exact(**inputs).logits}
        with exact.disable_adapter():
            base = {"logits": exact(**inputs).logits}
        rounded = {"logits": model(**inputs).logits.double()}
        hand = _merged_weights_by_hand(exact)
        merged_model = copy.deepcopy(model).merge_and_unload()
        merged = {"logits": merged_model(**inputs).logits}
        merged_weights = {n: m.weight.detach() for n, m in merged_model.named_modules() if n in hand}
    effect = {"logits": reference["logits"] - base["logits"]}
    outputs = identities.compare(merged, reference, rounded, effect)
    weights = identities.compare(
        merged_weights, hand, {n: w.float().double() for n, w in hand.items()}, _deltas(exact, hand)
    )
    unmerge, unmerged_at = _unmerge(model)
    metrics = {
        **identities.rounded(outputs),
        "merged_outputs": identities.rounded(outputs),
        "merged_weights": identities.rounded(weights),
        "unmerged_base": identities.rounded(unmerge),
        "merged_layers": len(hand),
    }
    measured.note(adapter=config["adapter"], merged_layers=len(hand), merge_calls="merge_and_unload, merge/unmerge")
    if not identities.holds(outputs):
        identities.fail("identity-merge", outputs, "the merged model's logits", metrics, of="the adapter's effect")
    if not identities.holds(weights):
        identities.fail("identity-merge", weights, "the merged weights", metrics, of="the merged change")
    if not identities.holds(unmerge):
        identities.fail("identity-unmerge", unmerge, f"the base weights after unmerge ({unmerged_at})", metrics,
                        of="the merged change")  # fmt: skip
    return {"metrics": metrics, "path": "merge_and_unload"}


def _qlora(config: dict[str, Any], batch: list[dict[str, Any]], reload: bool) -> dict[str, Any]:
    """The merged 4-bit model's logits against the right 4-bit merge by hand (kit/qlora_merge.py)."""
    from scenarios.kit import qlora_merge

    found = qlora_merge.run(config, batch, TRAIN_STEPS, LR, reload, _lora_layers)
    if not identities.holds(found["outputs"]):
        identities.fail("identity-merge", found["outputs"], "the merged 4-bit model's logits (against the same "
                        "requantization by hand)", found["metrics"], of="the adapter's effect")  # fmt: skip
    return {"metrics": found["metrics"], "path": "reload, then merge_and_unload" if reload else "merge_and_unload"}


def _trained(config: dict[str, Any], batch: list[dict[str, Any]]) -> Any:
    """The config's model, its adapter trained TRAIN_STEPS AdamW steps on `batch` (lora_B and magnitude move)."""
    return identities.train_adamw(identities.build_model(config), batch, TRAIN_STEPS, LR)


def _lora_layers(model: Any) -> dict[str, Any]:
    """The adapted linear layers, by the name their base weight has after merge_and_unload (the PEFT wrapper's name
    without the PeftModel prefix)."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            out[name.removeprefix("base_model.model.")] = module
    return out


def _merged_weights_by_hand(model: Any) -> dict[str, Any]:
    """Each adapted layer's merged weight from the formulas, in the model's dtype (float64 here): LoRA W + s B A;
    DoRA m * (W + s B A) / ||W + s B A|| with the norm over each output row (peft's weight norm, detached)."""
    hand = {}
    for name, layer in _lora_layers(model).items():
        weight = layer.base_layer.weight.detach()
        delta = layer.scaling["default"] * (layer.lora_B["default"].weight @ layer.lora_A["default"].weight)
        combined = weight + delta
        magnitude = getattr(layer, "lora_magnitude_vector", None)
        if magnitude is not None and "default" in magnitude:
            vector = magnitude["default"]  # a parameter (peft 0.9, 0.10) or a module holding one as its weight
            m = getattr(vector, "weight", vector).detach().reshape(-1, 1)
            combined = m * combined / combined.norm(p=2, dim=1, keepdim=True)
        hand[name] = combined
    return hand


def _deltas(model: Any, hand: dict[str, Any]) -> dict[str, Any]:
    """The merged change of each layer (hand merged weight - base weight): the scale of the weight identities."""
    layers = _lora_layers(model)
    return {n: hand[n] - layers[n].base_layer.weight.detach() for n in hand}


def _unmerge(model: Any) -> tuple[dict[str, Any], str]:
    """merge_adapter() then unmerge_adapter() on a copy; each base weight against its value before, the merged change as
    the scale, the float32 round-off of (W + D) - D as the floor."""
    import torch

    work = copy.deepcopy(model)
    layers = _lora_layers(work)
    before = {n: layer.base_layer.weight.detach().double().clone() for n, layer in layers.items()}
    with torch.no_grad():
        work.merge_adapter()
        merged = {n: layer.base_layer.weight.detach().double().clone() for n, layer in layers.items()}
        work.unmerge_adapter()
    after = {n: layer.base_layer.weight.detach() for n, layer in layers.items()}
    change = {n: merged[n] - before[n] for n in before}
    floor = {n: (before[n].float() + change[n].float() - change[n].float()).double() for n in before}
    if not any(float(c.abs().max()) > 0 for c in change.values()):
        return identities.compare(after, before, floor, {n: torch.ones(1) for n in before}), "merge changed nothing"
    return identities.compare(after, before, floor, change), "merge_adapter, unmerge_adapter"
