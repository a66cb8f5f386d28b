"""I4 for QLoRA: merging a LoRA adapter into a 4-bit base, checked against what a right merge computes.

Merging into 4-bit weights requantizes them (peft: dequantize, add the LoRA delta, quantize again), a loss by
design, so the merged model is compared with the same requantization done by hand: bitsandbytes quantizes
(dequantize(W4) + s B A) with the base weight's own settings, and a float64 model with those weights gives the
reference logits. What that loss costs is recorded beside it (the requantized model against the exact merge,
W4 + s B A in float64), never taken for a failure.

The dequantized base weights are read once, right after loading and before any forward: on CPU, bitsandbytes
0.50's first forward repacks 4-bit weights in place for its CPU kernels, after which `dequantize_4bit` of the
packed data is not the weight the forward uses (measured; cf. bitsandbytes#2078, `Params4bit.to` skipping the
same packing's inverse). Whether the weights were packed at merge time is recorded.
"""

from __future__ import annotations

import copy
import tempfile
from typing import Any

from scenarios.kit import identities, measured

#: The 4-bit settings of a QLoRA base (the peft docs' recipe, NF4); compute and storage in float32 for the identity.
DTYPE = {"dtype": "float32"}


def trained_4bit(config: dict[str, Any], batch: list[dict[str, Any]], steps: int, lr: float, workdir: str) -> dict:
    """The config's tiny Llama saved, loaded in 4-bit, given the config's LoRA adapter and trained `steps` AdamW
    steps. Returns the model, the float64 facts taken before its first forward (each 4-bit weight dequantized, the
    other parameters as saved) and where the base was saved."""
    import torch
    from peft import get_peft_model

    from scenarios.kit import qlora
    from scenarios.kit.adapters import lora_config
    from scenarios.kit.models import tiny_llama

    saved = tiny_llama(hidden=config.get("hidden", 64), layers=config.get("layers", 2), vocab=config.get("vocab", 128))
    base_dir = f"{workdir}/base"
    saved.save_pretrained(base_dir)
    model, _, _ = qlora.load_base(DTYPE, base_dir, "cpu", "4bit")
    facts = {
        "plain": {k: v.detach().double().clone() for k, v in saved.state_dict().items()},
        "quantized": dequantized(model),
    }
    torch.manual_seed(identities.PEFT_SEED)
    extra = {"use_rslora": True} if config.get("use_rslora") else {}
    lora = lora_config(config.get("r", 8), config.get("alpha", 8), config.get("targets", "qv"), **extra)
    model = get_peft_model(model, lora)
    model.train()
    identities.train_adamw(model, batch, steps, lr)
    measured.note(adapter="qlora (nf4, float32 compute)", linear4bit=len(facts["quantized"]))
    return {"model": model, "base_dir": base_dir, **facts}


def dequantized(model: Any) -> dict[str, Any]:
    """Each Linear4bit weight as float64, by the name its weight has in a plain Llama ('model.layers.0...weight')."""
    import bitsandbytes as bnb

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            weight = module.weight
            plain = bnb.functional.dequantize_4bit(weight.data, weight.quant_state).detach().double().cpu()
            out[name.removeprefix("base_model.model.").replace(".base_layer", "") + ".weight"] = plain
    return out


def requantized(weight: Any, like: Any) -> Any:
    """`weight` (float32) quantized the way `like` (a loaded Params4bit) was, dequantized before any forward."""
    import bitsandbytes as bnb

    from scenarios.kit.qlora import _supported

    settings = {k: getattr(like, k) for k in ("blocksize", "compress_statistics", "quant_type", "quant_storage")}
    param = bnb.nn.Params4bit(weight.contiguous(), requires_grad=False, **_supported(bnb.nn.Params4bit, **settings))
    param = param.to("cpu")
    return bnb.functional.dequantize_4bit(param.data, param.quant_state).detach().double()


def packed_for_cpu(model: Any) -> bool:
    """Whether any 4-bit weight is held in bitsandbytes' CPU kernel packing now (measured at merge time)."""
    import bitsandbytes as bnb

    return any(
        bool(getattr(getattr(m.weight, "quant_state", None), "packing_format_for_cpu", False))
        for m in model.modules()
        if isinstance(m, bnb.nn.Linear4bit)
    )


def references(config: dict[str, Any], trained: dict[str, Any], layers: dict[str, Any], inputs: dict) -> dict:
    """Float64 logits: the base (4-bit weights dequantized), the exact merge (W4 + s B A) and the right 4-bit merge
    (requantized by hand as peft's merge does it: float32 dequantized weight plus the float32 LoRA delta)."""
    import torch

    deltas, requant = {}, {}
    for name, layer in layers.items():
        delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * layer.scaling["default"]
        key = f"{name}.weight"
        deltas[key] = delta.detach().double()
        requant[key] = requantized(trained["quantized"][key].float() + delta.detach(), layer.base_layer.weight)
    base = trained["quantized"]
    exact = {k: base[k] + d for k, d in deltas.items()}
    with torch.no_grad():
        return {
            "base": _float64_logits(config, trained, base, inputs),
            "exact": _float64_logits(config, trained, {**base, **exact}, inputs),
            "requantized": _float64_logits(config, trained, {**base, **requant}, inputs),
        }


def _float64_logits(config: dict[str, Any], trained: dict[str, Any], weights: dict[str, Any], inputs: dict) -> Any:
    from scenarios.kit.models import tiny_llama

    model = tiny_llama(hidden=config.get("hidden", 64), layers=config.get("layers", 2), vocab=config.get("vocab", 128))
    model = model.double().eval()
    state = dict(trained["plain"]) | weights
    model.load_state_dict({k: state[k] for k in model.state_dict()})
    return model(**inputs).logits


def merged_after_reload(trained: dict[str, Any], workdir: str) -> Any:
    """The workaround: the adapter saved, a 4-bit base loaded afresh with it, merged before any forward on it."""
    from peft import PeftModel

    from scenarios.kit import qlora

    adapter_dir = f"{workdir}/adapter"
    trained["model"].save_pretrained(adapter_dir)
    fresh, _, _ = qlora.load_base(DTYPE, trained["base_dir"], "cpu", "4bit")
    return PeftModel.from_pretrained(fresh, adapter_dir).merge_and_unload()


def run(config: dict[str, Any], batch: list[dict], steps: int, lr: float, reload: bool, layers_of: Any) -> dict:
    """The QLoRA merge identity: the merged model's logits against the right 4-bit merge by hand. `layers_of` gives
    the adapted layers by their plain name (the scenario's own reading of a PeftModel)."""
    import torch

    with tempfile.TemporaryDirectory() as workdir:
        trained = trained_4bit(config, batch, steps, lr, workdir)
        model = trained["model"]
        ids = identities.stacked(batch)
        inputs = {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"]}
        layers = layers_of(model)
        refs = references(config, trained, layers, inputs)
        with torch.no_grad():
            rounded = {"logits": model(**inputs).logits.double()}  # the 4-bit forward: float32 round-off
            packed = packed_for_cpu(model)
            merged_model = merged_after_reload(trained, workdir) if reload else copy.deepcopy(model).merge_and_unload()
            merged = {"logits": merged_model(**inputs).logits.double()}
    effect = {"logits": refs["exact"] - refs["base"]}
    # The floor: the 4-bit model's float32 forward against its float64 counterpart (W4 + s B A, adapter unmerged).
    exact = {"logits": refs["exact"]}
    outputs = identities.compare(merged, {"logits": refs["requantized"]}, rounded, effect, rounded_of=exact)
    by_design = identities.compare({"logits": refs["requantized"]}, exact, rounded, effect)
    measured.note(packed_for_cpu_at_merge=packed and not reload, merge_path="reload, then merge" if reload else "merge")
    return {
        "outputs": outputs,
        "metrics": {
            **identities.rounded(outputs),
            "merged_outputs": identities.rounded(outputs),
            "requantization_by_design": identities.rounded(by_design),
            "merged_layers": len(layers),
            "packed_for_cpu_at_merge": packed and not reload,
        },
    }
