"""The QLoRA user path: a base loaded in 4-bit (or a frozen or hand-quantized stand-in where 4-bit loading is
refused), checkpointing and PEFT in the user's order with the fixes users apply, and a few AdamW steps.

Shared by S2 (one process) and S2-FSDP (the same path under FSDP) and by S5 (DoRA over these bases).
"""

from __future__ import annotations

import re
import time
import warnings

from scenarios import compat
from scenarios.kit import measured
from scenarios.kit.adapters import TARGETS, lora_config
from scenarios.kit.models import dtype_kwarg, hf_model

BASES = ("4bit", "frozen-base", "manual-4bit")
ORDERS = ("ckpt_then_peft", "peft_then_ckpt")
FIXES = ("enable_input_require_grads", "use_reentrant_false", "prepare_model_for_kbit_training", "seed_misspelled_api")
# The seed spells the fix `enable_input_requires_grad`; the real API is `enable_input_require_grads`.
SEED_MISSPELLED_API = "enable_input_requires_grad"
NO_INPUT_GRAD_WARNING = "None of the inputs have requires_grad=True"
TARGET_SETS = (TARGETS["qv"], TARGETS["attn"], TARGETS["all-linear"])

#: The seed's setup: QLoRA (nf4, bf16 compute and storage), default checkpointing, then PEFT.
SEED = {
    "base": "4bit",
    "order": "ckpt_then_peft",
    "dtype": "bfloat16",
    "hidden": 64,
    "layers": 2,
    "vocab": 128,
    "rank": 8,
    "alpha": 16,
    "targets": ["q_proj", "v_proj"],
    "steps": 3,
    "batch": 2,
    "seq": 16,
    "seed": 0,
}


#: The fixes `prepare` applies, as a scenario's variants.
VARIANTS = {
    "baseline": ("baseline", "the config as drawn: what a user of this stack writes by default"),
    "enable_input_require_grads": ("fix", "model.enable_input_require_grads() before training"),
    "use_reentrant_false": ("fix", "gradient_checkpointing_kwargs={'use_reentrant': False}"),
    "prepare_model_for_kbit_training": ("fix", "peft.prepare_model_for_kbit_training(model) before get_peft_model"),
    "seed_misspelled_api": (
        "fix",
        "the seed article's code: a hasattr probe for enable_input_requires_grad, which does not exist",
    ),
}

# Messages of the refusals seen when a stack cannot load bnb 4-bit without CUDA
# (transformers 4.41.2: "RuntimeError: No GPU found. A GPU is needed for quantization.").
NO_4BIT_HERE = re.compile(r"GPU|CUDA|accelerator|bitsandbytes", re.IGNORECASE)


def load_base(config: dict, directory: str, device: str, base: str) -> tuple:
    """Load the saved tiny model along the requested path.

    Returns (model, path, metrics); ``path`` is the path that ran: "4bit", "frozen-base" or "manual-4bit". A
    quantized base that cannot be had here (bitsandbytes missing, a stack that refuses 4-bit loading on this
    device, a bitsandbytes that does not quantize on it) ends the job as not applicable, saying why: it never
    goes on with an unquantized model under a QLoRA config.
    """
    import torch
    from transformers import LlamaForCausalLM

    dtype = compat.torch_dtype(config["dtype"])
    metrics: dict = {"requested_base": base}
    if base in ("4bit", "manual-4bit"):
        measured.require(compat.version_of("bitsandbytes") is not None, "bitsandbytes is not installed in this cell")
    if base == "4bit":
        from transformers import BitsAndBytesConfig

        qconf = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype
        )
        kwargs = dict(quantization_config=qconf, **dtype_kwarg(dtype))
        if device == "cuda":
            kwargs["device_map"] = {"": torch.cuda.current_device()}
        try:
            model = LlamaForCausalLM.from_pretrained(directory, **kwargs)
        except (RuntimeError, ImportError, ValueError) as exc:
            if device == "cuda" or not NO_4BIT_HERE.search(str(exc)):
                raise
            transformers = compat.version_of("transformers")
            measured.require(False, f"transformers {transformers} refuses 4-bit loading on {device}: {_first(exc)}")
        _require_quantized(model, "4bit", device)
        metrics["n_linear4bit"] = count_linear4bit(model)
        return model, "4bit", metrics
    model = LlamaForCausalLM.from_pretrained(directory, **dtype_kwarg(dtype))
    if device == "cuda":
        model = model.to("cuda")
    for param in model.parameters():
        param.requires_grad_(False)
    if base == "manual-4bit":
        quantize_by_hand(model, dtype, device)
        _require_quantized(model, "manual-4bit", device)
        metrics["n_linear4bit"] = count_linear4bit(model)
        return model, "manual-4bit", metrics
    if base != "frozen-base":
        raise ValueError(f"unknown base {base!r}")
    measured.model(model)
    return model, "frozen-base", metrics


def _require_quantized(model, base: str, device: str) -> None:
    """A QLoRA config runs only on weights that really hold 4-bit data (measured, not assumed)."""
    facts = measured.model(model)
    bnb = compat.version_of("bitsandbytes")
    measured.require(
        facts["quantized_weights"] > 0,
        f"bitsandbytes {bnb} quantized none of the {facts['linear4bit_modules']} Linear4bit weights on {device} "
        f"({base} base)",
    )


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def quantize_by_hand(model, dtype, device: str) -> None:
    """Replace each decoder nn.Linear by bnb.nn.Linear4bit (nf4) and set the flags transformers' loader sets."""
    import bitsandbytes as bnb
    import torch

    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, lin in list(parent.named_children()):
                if not isinstance(lin, torch.nn.Linear):
                    continue
                # bitsandbytes < 0.43 has no quant_storage (storage is uint8) and no `module` (no quant_state
                # recovery under FSDP): pass what this release takes.
                linear = _supported(bnb.nn.Linear4bit, compute_dtype=dtype, quant_type="nf4", quant_storage=dtype)
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None, **linear)
                data = lin.weight.data.detach().clone().cpu()
                weight = _supported(bnb.nn.Params4bit, quant_type="nf4", quant_storage=dtype, module=q)
                q.weight = bnb.nn.Params4bit(data, requires_grad=False, **weight)
                if lin.bias is not None:
                    q.bias = torch.nn.Parameter(lin.bias.data.detach().clone(), requires_grad=False)
                q = q.to(device)  # Params4bit quantizes on its first move to a real device
                # (with module=q it also records the state on q.quant_state, from where bnb restores it when
                # FSDP flattening replaces the Params4bit by a plain tensor)
                setattr(parent, name, q)
    model.is_loaded_in_4bit = True
    model.is_quantized = True


def _supported(factory, **kwargs) -> dict:
    """The keyword arguments this release of `factory` accepts."""
    import inspect

    target = factory.__new__ if "__new__" in vars(factory) else factory
    parameters = inspect.signature(target).parameters
    return {k: v for k, v in kwargs.items() if k in parameters}


def count_linear4bit(model) -> int:
    return sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")


def checkpoint_state(model) -> dict:
    """Which checkpoint function the layers got, and whether input grads are hooked."""
    import functools

    reentrant = set()
    active = 0
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            active += 1
        func = getattr(module, "_gradient_checkpointing_func", None)
        if func is not None and getattr(module, "gradient_checkpointing", False):
            if isinstance(func, functools.partial):
                value = func.keywords.get("use_reentrant", "unset")
                # torch.utils.checkpoint falls back to reentrant (with a warning) when it is not passed
                reentrant.add(str(value))
            else:
                reentrant.add("plain")
    hooked = any(
        getattr(m, "_require_grads_hook", None) is not None or getattr(m, "_require_grads_hooks", None)
        for m in model.modules()
    )
    return {
        "checkpointing_modules": active,
        "checkpointing_active": active > 0,
        "use_reentrant": ",".join(sorted(reentrant)) or "none",
        "input_grads_hooked": bool(hooked),
    }


def prepare(config: dict, fixes: set[str], model, lora_cls_probe: bool = True) -> tuple:
    """Checkpointing + PEFT along the user's path; returns (peft_model, metrics)."""
    from peft import get_peft_model

    metrics: dict = {}
    order = config.get("order", "ckpt_then_peft")
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}")
    use_reentrant = False if "use_reentrant_false" in fixes else None
    model.train()

    def misspelled(target) -> None:
        fn = getattr(target, SEED_MISSPELLED_API, None)  # what user code that probes for the seed's API does
        metrics["seed_api_found"] = fn is not None
        if fn is not None:
            fn()

    if "prepare_model_for_kbit_training" in fixes:
        from peft import prepare_model_for_kbit_training

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = prepare_model_for_kbit_training(model)
        metrics["checkpoint_api"] = "prepare_model_for_kbit_training"
    elif order == "ckpt_then_peft":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            metrics["checkpoint_api"] = compat.enable_checkpointing(model, use_reentrant)
    if "seed_misspelled_api" in fixes and order == "ckpt_then_peft":
        misspelled(model)
    peft_model = get_peft_model(model, lora_config(config["rank"], config["alpha"], list(config["targets"])))
    if order == "peft_then_ckpt" and "prepare_model_for_kbit_training" not in fixes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            metrics["checkpoint_api"] = compat.enable_checkpointing(peft_model, use_reentrant)
        if "seed_misspelled_api" in fixes:
            misspelled(peft_model)
    if "enable_input_require_grads" in fixes:
        hf_model(peft_model).enable_input_require_grads()
    peft_model.train()
    if lora_cls_probe:
        classes = {
            type(m).__module__.rsplit(".", 1)[-1] + "." + type(m).__name__
            for m in peft_model.modules()
            if hasattr(m, "lora_A") and hasattr(m, "base_layer")
        }
        metrics["lora_layer_classes"] = ",".join(sorted(classes))
    metrics.update(checkpoint_state(hf_model(peft_model)))
    measured.model(peft_model)
    measured.note(checkpointing=metrics["checkpointing_active"], use_reentrant=metrics["use_reentrant"])
    return peft_model, metrics


def train(model, config: dict, device: str, trainable, generator_seed: int) -> dict:
    """A few AdamW steps; raises whatever the stack raises. Returns metrics."""
    import torch

    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    gen = torch.Generator().manual_seed(generator_seed)
    ids = torch.randint(0, config["vocab"], (config["batch"], config["seq"]), generator=gen).to(device)
    losses = []
    missing_grads = 0
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(config["steps"]):
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            missing_grads = max(missing_grads, sum(1 for p in trainable if p.grad is None))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(out.loss.detach().float()))
    no_input_grad_warnings = sum(1 for w in caught if NO_INPUT_GRAD_WARNING in str(w.message))
    return {
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "steps": len(losses),
        "train_s": round(time.perf_counter() - t0, 4),
        "no_input_grad_warnings": no_input_grad_warnings,
        "trainable_without_grad": missing_grads,
    }
