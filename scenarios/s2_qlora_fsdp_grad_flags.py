"""S2 under FSDP (world size 2): QLoRA grad flags with a sharded model.

Same user path, model paths and variants as ``s2_qlora_grad_flags`` (see its docstring), then the PEFT
model is wrapped by hand (HF Trainer / accelerate FSDP refuses to start without an accelerator, so on CPU
the scenario drives FSDP itself):

* ``fsdp="fsdp1"``: ``FullyShardedDataParallel(model, auto_wrap_policy=peft.utils.other.fsdp_auto_wrap_policy(model),
  use_orig_params=False, device_id=...)``, the upstream QLoRA + FSDP recipe (peft docs accelerate/fsdp.md:
  ``bnb_4bit_quant_storage`` = model dtype, ``use_orig_params=False``). On CPU ``device_id=torch.device("cpu")``
  and the process group is gloo.
* ``fsdp="fsdp2"``: ``fully_shard`` on every decoder layer and on the root, over a 1-D device mesh.
* ``path="trainer"``: the same model and fixes handed to ``Trainer(fsdp="full_shard auto_wrap",
  gradient_checkpointing=True)``, FSDP version declared in ``fsdp_config`` and measured (GPU only: the Trainer
  refuses FSDP without an accelerator).

Rank 0 writes the tiny model with ``save_pretrained`` (transformers 5.x writes only on rank 0 when a
process group is up) and broadcasts the directory to the other ranks.
"""

from __future__ import annotations

from scenarios import compat
from scenarios.kit import checks, distributed, fsdp, measured, qlora
from scenarios.kit import trainer as trainer_path
from scenarios.kit.models import device_of, save_pretrained_tiny, token_rows

SPEC = {
    "id": "S2-qlora-fsdp-grad-flags",
    "title": "QLoRA + FSDP + gradient checkpointing: frozen inputs and reentrant checkpointing",
    "known_issues": [
        "huggingface/peft#1577",
        "huggingface/peft#2125",
        "huggingface/transformers#33930",
        "huggingface/peft#1550",
    ],
    "world_size": 2,
    # Failures here are raised by every rank at the same point (backward / optimizer step), so the worker
    # re-synchronises and goes on instead of restarting the process group after each one.
    "restart_after_failure": False,
    "device": "any",
    # What every config of this scenario is, where a config does not say (the setup an advisory applies to).
    "setup": {"engine": "fsdp1", "adapter": "qlora"},
    "requires": ["torch", "transformers", "peft", "accelerate", "bitsandbytes"],
    "target": ["no-grad-element-0"],
    "controls": [],
    # The same fixes as S2 without FSDP, described once there.
    # The fix a user's config can already hold, in the setup vocabulary (the judge clears the failure for it).
    "variant_setup": {"use_reentrant_false": {"use_reentrant": "false"}},
    "variants": dict(qlora.VARIANTS),
}

# The single-process scenario's seed setup with two steps (each one an FSDP round trip); base and order vary.
_BASE = {k: v for k, v in qlora.SEED.items() if k not in ("base", "order")} | {"steps": 2}

EXAMPLES: list[dict] = [
    dict(_BASE, base="4bit", order="ckpt_then_peft", fsdp="fsdp1"),
    dict(_BASE, base="4bit", order="peft_then_ckpt", fsdp="fsdp1"),
    dict(_BASE, base="manual-4bit", order="ckpt_then_peft", fsdp="fsdp1"),
    dict(_BASE, base="4bit", order="ckpt_then_peft", fsdp="fsdp2"),
    # The same user path through HF Trainer(fsdp="full_shard auto_wrap"), as most users run it on GPUs (the
    # Trainer refuses FSDP without an accelerator: not applicable on CPU).
    dict(_BASE, base="4bit", order="peft_then_ckpt", fsdp="fsdp1", path="trainer"),
]


def strategy():
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "base": st.sampled_from(qlora.BASES),
            "order": st.sampled_from(qlora.ORDERS),
            "fsdp": st.sampled_from(["fsdp1", "fsdp2"]),
            "dtype": st.sampled_from(["bfloat16", "float32"]),
            "hidden": st.sampled_from([64, 128]),
            "layers": st.integers(1, 2),
            "vocab": st.sampled_from([128, 256]),
            "rank": st.sampled_from([4, 8]),
            "alpha": st.sampled_from([8, 16]),
            "targets": st.sampled_from(qlora.TARGET_SETS),
            "steps": st.just(2),
            "batch": st.integers(1, 2),
            "seq": st.sampled_from([8, 16]),
            "seed": st.integers(0, 2**16),
        }
    )


def run(config: dict, variant: str, ctx: dict) -> dict:
    measured.start(ctx)  # what really ran goes into the record's setup
    if config.get("path", "manual") == "trainer":
        return _run_trainer(config, variant, ctx)
    import shutil

    import torch
    import torch.distributed as dist

    fixes = compat.parse_variant(variant, qlora.FIXES)
    device = ctx.get("device", "cpu")
    kind = config.get("fsdp", "fsdp1")
    torch.manual_seed(config["seed"])
    directory = distributed.shared_directory(ctx, "s2fsdp-", lambda path: save_pretrained_tiny(config, path))
    try:
        model, path, metrics = qlora.load_base(config, directory, device, config.get("base", "4bit"))
    finally:
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(directory, ignore_errors=True)
    peft_model, prep = qlora.prepare(config, fixes, model)
    metrics.update(prep)
    metrics["order"] = config.get("order", "ckpt_then_peft")
    metrics["fsdp"] = kind
    metrics["param_dtypes_before_wrap"] = ",".join(
        sorted({str(p.dtype).replace("torch.", "") for p in peft_model.parameters()})
    )
    # No mixed precision, no upcast: peft's wrap policy under FSDP1, one unit per decoder layer under FSDP2.
    policy = fsdp.wrap_policy("peft" if kind == "fsdp1" else "decoder_layer", peft_model)
    wrapped, _ = fsdp.shard(peft_model, kind, device_of(ctx), policy)
    metrics["n_linear4bit_after_wrap"] = qlora.count_linear4bit(wrapped)
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    metrics["n_trainable_tensors"] = len(trainable)
    # different data per rank, as a data-parallel sampler would give
    metrics.update(qlora.train(wrapped, config, device, trainable, config["seed"] + 1000 * ctx.get("rank", 0)))
    checks.adapters_got_grads(metrics, len(trainable))
    return {"metrics": metrics, "path": path}


def _run_trainer(config: dict, variant: str, ctx: dict) -> dict:
    """The QLoRA user path through HF Trainer + accelerate FSDP: the model and fixes as above, then the Trainer
    with checkpointing on (the fix's `use_reentrant` passed on), over the runtime's process group."""
    import os
    import shutil

    import torch.distributed as dist
    from transformers import Trainer

    if ctx.get("device") != "cuda":
        raise compat.NotApplicable("HF Trainer refuses FSDP without an accelerator")
    fixes = compat.parse_variant(variant, qlora.FIXES)
    environ_before = dict(os.environ)
    kind = config.get("fsdp", "fsdp1")
    directory = distributed.shared_directory(ctx, "s2fsdp-", lambda path: save_pretrained_tiny(config, path))
    try:
        model, _, metrics = qlora.load_base(config, directory, "cuda", config.get("base", "4bit"))
    finally:
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(directory, ignore_errors=True)
    peft_model, prep = qlora.prepare(config, fixes, model)
    metrics.update(prep)
    args = trainer_path.training_arguments(
        ctx["workdir"],
        per_device_train_batch_size=config["batch"],
        max_steps=config["steps"],
        learning_rate=1e-3,
        bf16=config["dtype"] == "bfloat16",
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False} if "use_reentrant_false" in fixes else None,
        fsdp="full_shard auto_wrap",
        fsdp_config={
            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            "use_orig_params": False,
            "version": 2 if kind == "fsdp2" else 1,
        },
    )
    try:
        data = token_rows(config["vocab"], config["seq"], config["batch"] * config["steps"] * 2, seed=config["seed"])
        trainer = Trainer(model=peft_model, args=args, train_dataset=data)
        try:
            result = trainer.train()
        finally:
            measured.trainer(trainer)
            ran = fsdp.fsdp_that_ran(trainer.model_wrapped)
            measured.note(fsdp_declared=kind, fsdp=ran if ran != "not-wrapped" else None)
        measured.require(ran == kind, f"fsdp_config declared {kind}, but {ran} wrapped the model")
        losses = trainer_path.logged_losses(trainer)
        metrics |= {"losses": [round(x, 5) for x in losses], "global_step": trainer.state.global_step,
                    "train_loss": result.training_loss}  # fmt: skip
        checks.finite_loss(losses, metrics)
        checks.all_steps_ran(trainer.state.global_step, config["steps"], metrics)
        return {"metrics": metrics, "path": f"trainer-{ran}"}
    finally:
        trainer_path.reset(environ_before)
