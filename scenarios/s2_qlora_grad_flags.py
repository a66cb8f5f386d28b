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

The path itself (loading, checkpointing and PEFT in the user's order, training) is the kit's
``scenarios/kit/qlora.py``, shared with ``s2_qlora_fsdp_grad_flags`` and ``s5_dora_memory``.
"""

from __future__ import annotations

from scenarios import compat
from scenarios.kit import checks, measured, qlora
from scenarios.kit.models import save_pretrained_tiny
from scenarios.kit.qlora import BASES, FIXES, ORDERS

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
    # What every config of this scenario is, where a config does not say (the setup an advisory applies to).
    "setup": {"adapter": "qlora"},
    "requires": ["torch", "transformers", "peft", "bitsandbytes"],
    "target": ["no-grad-element-0"],
    # A frozen (unquantized) base with checkpointing turned on before get_peft_model cannot show the target:
    # PeftModel._prepare_model_for_gradient_checkpointing calls enable_input_require_grads() for an unquantized
    # base (see the docstring). It runs as a control, expected to pass, never in the target's count.
    "controls": [{"base": "frozen-base", "order": "ckpt_then_peft"}],
    # The fix a user's config can already hold, in the setup vocabulary (the judge clears the failure for it).
    "variant_setup": {"use_reentrant_false": {"use_reentrant": "false"}},
    "variants": dict(qlora.VARIANTS),
}

_SEED = qlora.SEED

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
            "targets": st.sampled_from(qlora.TARGET_SETS),
            "steps": st.integers(2, 3),
            "batch": st.integers(1, 2),
            "seq": st.sampled_from([8, 16]),
            "seed": st.integers(0, 2**16),
        }
    )


# --------------------------------------------------------------------------------------------------


def run(config: dict, variant: str, ctx: dict) -> dict:
    measured.start(ctx)  # what really ran goes into the record's setup
    import tempfile

    import torch

    fixes = compat.parse_variant(variant, FIXES)
    device = ctx.get("device", "cpu")
    torch.manual_seed(config["seed"])
    with tempfile.TemporaryDirectory(dir=ctx.get("workdir")) as directory:
        save_pretrained_tiny(config, directory)
        model, path, metrics = qlora.load_base(config, directory, device, config.get("base", "4bit"))
    peft_model, prep = qlora.prepare(config, fixes, model)
    metrics.update(prep)
    metrics["order"] = config.get("order", "ckpt_then_peft")
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    metrics["n_trainable_tensors"] = len(trainable)
    metrics.update(qlora.train(peft_model, config, device, trainable, config["seed"]))
    checks.adapters_got_grads(metrics, len(trainable))
    return {"metrics": metrics, "path": path}
