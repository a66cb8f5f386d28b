"""S2: QLoRA grad flags.

Failure mode: reentrant activation checkpointing whose block inputs do not require grad (frozen
embeddings, frozen / quantized base) gives ``RuntimeError: element 0 of tensors does not require grad
and does not have a grad_fn`` at ``loss.backward()``, after the torch warning ``None of the inputs have
requires_grad=True. Gradients will be None``.

Baseline (what a user of the stack writes by default): load the model, ``model.train()``, turn on
checkpointing with the release defaults (no kwargs), ``get_peft_model``, train a few steps.

Model paths (``config["base"]``, the path that really ran is returned as ``path``):

* ``"4bit"``: a tiny Llama saved with ``save_pretrained`` and loaded with ``from_pretrained`` and a
  ``BitsAndBytesConfig`` (nf4, compute dtype = quant storage = model dtype). Where the stack refuses
  4-bit loading on this device (transformers 4.4x without CUDA), or bitsandbytes is not installed, the run
  goes on with the plain frozen base and returns ``path="frozen-base"``, with the reason in
  ``metrics["fallback_reason"]``.
* ``"frozen-base"``: the same model loaded unquantized, all base parameters frozen.
* ``"manual-4bit"``: unquantized load, then every decoder ``nn.Linear`` is replaced by hand with a
  ``bnb.nn.Linear4bit`` and the model is flagged ``is_loaded_in_4bit = is_quantized = True``, which is
  what transformers' bnb loader sets. It exists because PEFT treats quantized and unquantized bases
  differently (``PeftModel._prepare_model_for_gradient_checkpointing`` calls
  ``enable_input_require_grads()`` only for unquantized models), so ``frozen-base`` is *not* an
  equivalent of ``4bit`` for this failure mode.

``config["order"]``: ``"ckpt_then_peft"`` (checkpointing on the base model, then ``get_peft_model``,
the order in the brief and in most QLoRA scripts) or ``"peft_then_ckpt"`` (``get_peft_model`` first, then
checkpointing on the PEFT model, the order ``Trainer(gradient_checkpointing=True)`` produces).

Variants (joinable with ``+``): ``enable_input_require_grads``, ``use_reentrant_false``,
``prepare_model_for_kbit_training`` (replaces the checkpointing call, and is called before
``get_peft_model`` whatever the order), ``seed_misspelled_api`` (the seed's
``enable_input_requires_grad``, probed the way user code does: ``getattr(model, name, None)``).

Helpers used by ``s2_qlora_fsdp_grad_flags`` and ``s5_dora_memory`` live here too (prefixed ``_``).
"""

from __future__ import annotations

import re
import time
import warnings

from scenarios import compat

SPEC = {
    "id": "S2-qlora-grad-flags",
    "title": "QLoRA + gradient checkpointing: frozen inputs and reentrant checkpointing (element 0 ... grad_fn)",
    "known_issues": [
        "huggingface/peft#1577",
        "huggingface/peft#2125",
        "huggingface/transformers#33930",
        "huggingface/peft#137",
        "huggingface/transformers#42489",
    ],
    "world_size": 1,
    "device": "any",
    "requires": ["torch", "transformers", "peft", "bitsandbytes"],
    "target": ["no-grad-element-0"],
    "controls": [],
    "variants": {
        "baseline": ("baseline", "the config as drawn: what a user of this stack writes by default"),
        "enable_input_require_grads": ("fix", "model.enable_input_require_grads() before training"),
        "use_reentrant_false": ("fix", "gradient_checkpointing_kwargs={'use_reentrant': False}"),
        "prepare_model_for_kbit_training": ("fix", "peft.prepare_model_for_kbit_training(model) before get_peft_model"),
        "seed_misspelled_api": (
            "fix",
            "the seed article's code: a hasattr probe for enable_input_requires_grad, which does not exist",
        ),
    },
}

FIXES = ("enable_input_require_grads", "use_reentrant_false", "prepare_model_for_kbit_training", "seed_misspelled_api")
BASES = ("4bit", "frozen-base", "manual-4bit")
ORDERS = ("ckpt_then_peft", "peft_then_ckpt")
TARGET_SETS = (
    ["q_proj", "v_proj"],
    ["q_proj", "k_proj", "v_proj", "o_proj"],
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)

# The seed spells the fix `enable_input_requires_grad`; the real API is `enable_input_require_grads`.
SEED_MISSPELLED_API = "enable_input_requires_grad"

_NO_INPUT_GRAD_WARNING = "None of the inputs have requires_grad=True"

#: The seed's setup: QLoRA (nf4, bf16 compute and storage), default checkpointing, then PEFT.
_SEED = {
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

EXAMPLES: list[dict] = [
    _SEED,
    # Trainer-style order: PEFT first, then checkpointing on the PEFT model.
    dict(_SEED, order="peft_then_ckpt"),
    # A quantized-looking base on stacks that cannot load 4-bit on this device.
    dict(_SEED, base="manual-4bit"),
    dict(_SEED, base="frozen-base"),
]


def strategy():
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "base": st.sampled_from(BASES),
            "order": st.sampled_from(ORDERS),
            "dtype": st.sampled_from(["bfloat16", "float32"]),
            "hidden": st.sampled_from([64, 128]),
            "layers": st.integers(1, 2),
            "vocab": st.sampled_from([128, 256]),
            "rank": st.sampled_from([4, 8, 16]),
            "alpha": st.sampled_from([8, 16, 32]),
            "targets": st.sampled_from(TARGET_SETS),
            "steps": st.integers(2, 3),
            "batch": st.integers(1, 2),
            "seq": st.sampled_from([8, 16]),
            "seed": st.integers(0, 2**16),
        }
    )


# --------------------------------------------------------------------------------------------------
# helpers (shared with s2_qlora_fsdp_grad_flags and s5_dora_memory)


def _dtype_kwarg(torch_dtype) -> dict:
    """from_pretrained's dtype keyword: `dtype` from transformers 4.56, `torch_dtype` before."""
    if compat.version_tuple(compat.version_of("transformers")) >= (4, 56):
        return {"dtype": torch_dtype}
    return {"torch_dtype": torch_dtype}


def _save_tiny_llama(config: dict, directory: str) -> None:
    model = compat.tiny_llama(
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


# Messages of the refusals seen when a stack cannot load bnb 4-bit without CUDA
# (transformers 4.41.2: "RuntimeError: No GPU found. A GPU is needed for quantization.").
_NO_4BIT_HERE = re.compile(r"GPU|CUDA|accelerator|bitsandbytes", re.IGNORECASE)


def _load(config: dict, directory: str, device: str, base: str) -> tuple:
    """Load the saved tiny model along the requested path.

    Returns (model, path, metrics). ``path`` is the path that really ran: "4bit", "frozen-base"
    (requested, or the fallback when 4-bit loading is refused on this device) or "manual-4bit".
    """
    import torch
    from transformers import LlamaForCausalLM

    dtype = compat.torch_dtype(config["dtype"])
    metrics: dict = {"requested_base": base}
    if base == "4bit" and compat.version_of("bitsandbytes") is None:
        metrics["fallback_reason"] = "bitsandbytes is not installed in this cell"
        base = "frozen-base"
    if base == "4bit":
        from transformers import BitsAndBytesConfig

        qconf = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype
        )
        kwargs = dict(quantization_config=qconf, **_dtype_kwarg(dtype))
        if device == "cuda":
            kwargs["device_map"] = {"": torch.cuda.current_device()}
        try:
            model = LlamaForCausalLM.from_pretrained(directory, **kwargs)
        except (RuntimeError, ImportError, ValueError) as exc:
            if device == "cuda" or not _NO_4BIT_HERE.search(str(exc)):
                raise
            metrics["fallback_reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            base = "frozen-base"
        else:
            metrics["n_linear4bit"] = _count_linear4bit(model)
            return model, "4bit", metrics
    model = LlamaForCausalLM.from_pretrained(directory, **_dtype_kwarg(dtype))
    if device == "cuda":
        model = model.to("cuda")
    for param in model.parameters():
        param.requires_grad_(False)
    if base == "manual-4bit":
        _quantize_by_hand(model, dtype, device)
        metrics["n_linear4bit"] = _count_linear4bit(model)
        return model, "manual-4bit", metrics
    if base != "frozen-base":
        raise ValueError(f"unknown base {base!r}")
    return model, "frozen-base", metrics


def _quantize_by_hand(model, dtype, device: str) -> None:
    """Replace each decoder nn.Linear by bnb.nn.Linear4bit (nf4) and set the flags transformers' loader sets."""
    import bitsandbytes as bnb
    import torch

    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, lin in list(parent.named_children()):
                if not isinstance(lin, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(
                    lin.in_features,
                    lin.out_features,
                    bias=lin.bias is not None,
                    compute_dtype=dtype,
                    quant_type="nf4",
                    quant_storage=dtype,
                )
                data = lin.weight.data.detach().clone().cpu()
                try:
                    q.weight = bnb.nn.Params4bit(
                        data, requires_grad=False, quant_type="nf4", quant_storage=dtype, module=q
                    )
                except TypeError:  # bitsandbytes < 0.43: no `module` (and no quant_state recovery under FSDP)
                    q.weight = bnb.nn.Params4bit(data, requires_grad=False, quant_type="nf4", quant_storage=dtype)
                if lin.bias is not None:
                    q.bias = torch.nn.Parameter(lin.bias.data.detach().clone(), requires_grad=False)
                q = q.to(device)  # Params4bit quantizes on its first move to a real device
                # (with module=q it also records the state on q.quant_state, from where bnb restores it when
                # FSDP flattening replaces the Params4bit by a plain tensor)
                setattr(parent, name, q)
    model.is_loaded_in_4bit = True
    model.is_quantized = True


def _count_linear4bit(model) -> int:
    return sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")


def _checkpoint_state(model) -> dict:
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


def _hf_model(peft_or_hf):
    """The transformers model under a PeftModel (or the model itself)."""
    get_base = getattr(peft_or_hf, "get_base_model", None)
    return get_base() if callable(get_base) else peft_or_hf


def _prepare(config: dict, fixes: set[str], model, lora_cls_probe: bool = True) -> tuple:
    """Checkpointing + PEFT along the user's path; returns (peft_model, metrics)."""
    from peft import LoraConfig, get_peft_model

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
    lora = LoraConfig(
        r=config["rank"],
        lora_alpha=config["alpha"],
        target_modules=list(config["targets"]),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)
    if order == "peft_then_ckpt" and "prepare_model_for_kbit_training" not in fixes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            metrics["checkpoint_api"] = compat.enable_checkpointing(peft_model, use_reentrant)
        if "seed_misspelled_api" in fixes:
            misspelled(peft_model)
    if "enable_input_require_grads" in fixes:
        _hf_model(peft_model).enable_input_require_grads()
    peft_model.train()
    if lora_cls_probe:
        classes = {
            type(m).__module__.rsplit(".", 1)[-1] + "." + type(m).__name__
            for m in peft_model.modules()
            if hasattr(m, "lora_A") and hasattr(m, "base_layer")
        }
        metrics["lora_layer_classes"] = ",".join(sorted(classes))
    metrics.update(_checkpoint_state(_hf_model(peft_model)))
    return peft_model, metrics


def _train(model, config: dict, device: str, trainable, generator_seed: int) -> dict:
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
    no_input_grad_warnings = sum(1 for w in caught if _NO_INPUT_GRAD_WARNING in str(w.message))
    return {
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "steps": len(losses),
        "train_s": round(time.perf_counter() - t0, 4),
        "no_input_grad_warnings": no_input_grad_warnings,
        "trainable_without_grad": missing_grads,
    }


def _check_grads(metrics: dict, n_trainable: int) -> None:
    if n_trainable == 0:
        raise compat.CheckFailed("trainable_params", "the PEFT model has no trainable parameters", metrics=metrics)
    if metrics["trainable_without_grad"]:
        raise compat.CheckFailed(
            "adapter_grads",
            f"{metrics['trainable_without_grad']} of {n_trainable} trainable tensors got no gradient "
            f"(silent: backward did not raise)",
            metrics=metrics,
        )


# --------------------------------------------------------------------------------------------------


def run(config: dict, variant: str, ctx: dict) -> dict:
    import tempfile

    import torch

    fixes = compat.parse_variant(variant, FIXES)
    device = ctx.get("device", "cpu")
    torch.manual_seed(config["seed"])
    with tempfile.TemporaryDirectory(dir=ctx.get("workdir")) as directory:
        _save_tiny_llama(config, directory)
        model, path, metrics = _load(config, directory, device, config.get("base", "4bit"))
    peft_model, prep = _prepare(config, fixes, model)
    metrics.update(prep)
    metrics["order"] = config.get("order", "ckpt_then_peft")
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    metrics["n_trainable_tensors"] = len(trainable)
    metrics.update(_train(peft_model, config, device, trainable, config["seed"]))
    _check_grads(metrics, len(trainable))
    return {"metrics": metrics, "path": path}
