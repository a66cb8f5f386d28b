"""S9 (I2): the same global batch at 1 rank and at 2 ranks applies the same update, the token mean's.

Ranks that see different numbers of label tokens each average their own loss; DDP, FSDP and ZeRO then average the
gradients over ranks, so the update is a mean of per-rank means, not the token mean of the global batch, unless the
Trainer counts the tokens across ranks (`average_tokens_across_devices`, from transformers 4.46.2, on by default from
4.54.0). Measured by hand before this file was written (torch 2.13 CPU, torchrun at 2 ranks with gloo, the Trainer
under DDP, tiny Llama + LoRA, SGD lr 1, one step, rows of 16, 4, 10 and 2 label tokens, float64 hand reference):
4.46.0 is off by 0.39x the update (no such option); 4.47.0 by 0.39x with its default (off) and 1.5x with it on; 4.53.0
by 0.21x with it off and 0.125x with it on (its one-batch count, S9-identity-batch-loss); 5.24.0 is right by default
(on) and off by 0.39x with it off.

Each config runs the 2-rank leg in the job's own group and the 1-rank leg in a fresh process on rank 0's device (no
process group, one device: the Trainer alone, or the plain loop), from the same seeded weights and the same rows, and
compares both with the float64 hand reference. Paths: the Trainer with `engine` = ddp (CPU and GPU: torchrun alone),
fsdp1 or fsdp2 (`fsdp="full_shard auto_wrap"`, GPUs only) or zero3 (`deepspeed=` a ZeRO-3 config); and a loop by hand
(`path = "hand"`) under DDP, FSDP1 (peft's wrap policy for an adapter) or FSDP2, with the model's own loss per rank,
as such loops are written. The failure is `check-identity-world-size` where the 2-rank update is off the reference and
differs from the 1-rank update; where both are off by the same, the world size changes nothing (the identity holds)
and the 1-rank leg's own discrepancy is S9-identity-batch-loss's failure, kept in the metrics. Fixes:
`average_tokens_on` (the Trainer's switch, where the release has it); for a loop by hand `global_token_mean` (the
summed token loss over the token count all-reduced over ranks, times the world size, since the engines average
gradients over ranks). `average_tokens_off` measures the Trainer with the switch off.
"""

from __future__ import annotations

import os
from typing import Any

from scenarios.compat import NotApplicable
from scenarios.kit import identities, measured, strategies

SPEC = {
    "id": "S9-identity-world-size",
    "title": "Training identity, world size: 2 ranks apply 1 rank's update on one global batch (float64 reference)",
    "known_issues": ["huggingface/transformers#34242", "huggingface/transformers#39392"],
    "world_size": 2,
    "device": "any",
    "requires": ["torch", "transformers", "peft", "accelerate"],
    "target": ["check-identity-world-size"],
    "controls": [],
    # The fix a user's config can already hold, in the setup vocabulary (the judge clears the failure for it).
    "variant_setup": {"average_tokens_on": {"average_tokens": "true"}},
    "variants": {
        "baseline": ("baseline", "the path's defaults at 2 ranks, as its users run it"),
        "average_tokens_on": ("fix", "the Trainer: average_tokens_across_devices=True (where the release has it)"),
        "global_token_mean": (
            "fix",
            "a loop by hand: summed token loss / token count all-reduced over ranks, times the world size",
        ),
        "average_tokens_off": ("measurement", "the Trainer: average_tokens_across_devices=False"),
    },
    # Every rank compares the same gathered tensors with the same reference and raises the same check.
    "in_step_failures": ["check:identity-", "not-applicable"],
    "restart_after_failure": True,
    "table_metrics": ["off_by"],
    # Each config is a code path of its own (the Trainer, a loop by hand, label smoothing): flips are named per config.
    "flips_per_config": True,
    # Why a config of a path the user writes fails on every release, where the records say it does (the table lists
    # such a config once, as a pitfall; the records decide, these words only explain).
    "own_code": {
        "path=hand": "your own loop: each rank's own token mean, averaged over the ranks, whatever the release",
    },
}

FIXES = ("average_tokens_on", "global_token_mean", "average_tokens_off")
PER_DEVICE = 2

SEED = {
    "path": "trainer",
    "engine": "ddp",
    "adapter": "lora",
    "targets": "qv",
    "r": 8,
    "alpha": 8,
    "data_seed": 1,
}


def strategy() -> Any:
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "path": strategies.axis(SEED, "path", "hand"),
            "engine": strategies.axis(SEED, "engine", "fsdp1", "fsdp2"),
            "adapter": strategies.axis(SEED, "adapter", "none"),
            "targets": strategies.axis(SEED, "targets", "all-linear"),
            "r": strategies.axis(SEED, "r", 4, 16),
            "alpha": strategies.axis(SEED, "alpha", 16),
            "data_seed": strategies.axis(SEED, "data_seed", 2, 3),
        }
    )


#: The Trainer under DDP (LoRA and the full fine-tune control), loops by hand under FSDP1 and FSDP2, the Trainer under
#: ZeRO-3; the Trainer's FSDP1 and FSDP2 run on GPUs only (not applicable on CPU, where it ignores `fsdp=`).
EXAMPLES = [
    SEED,
    strategies.seed_config(SEED, adapter="none"),
    strategies.seed_config(SEED, path="hand", engine="fsdp1"),
    strategies.seed_config(SEED, path="hand", engine="fsdp2"),
    strategies.seed_config(SEED, engine="zero3"),
    strategies.seed_config(SEED, engine="fsdp1"),
    strategies.seed_config(SEED, engine="fsdp2"),
]


def run(config: dict[str, Any], variant: str, ctx: dict[str, Any]) -> dict[str, Any]:
    return identities.trainer_job(_run, config, variant, FIXES, ctx)


def _run(config: dict[str, Any], fixes: set[str], ctx: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    trainer = config["path"] == "trainer"
    if trainer and "global_token_mean" in fixes:
        raise NotApplicable("global_token_mean is a loop's own loss; the Trainer's switch is average_tokens_on")
    if not trainer and fixes & {"average_tokens_on", "average_tokens_off"}:
        raise NotApplicable("average_tokens_across_devices is a Trainer argument; a loop by hand has no such switch")
    switch = {"average_tokens_on": True, "average_tokens_off": False}
    extra = {}
    for fix in fixes & set(switch):
        if not identities.has_training_argument("average_tokens_across_devices"):
            from scenarios import compat

            version = compat.version_of("transformers")
            raise NotApplicable(f"transformers {version} has no average_tokens_across_devices (it came in 4.46.2)")
        extra["average_tokens_across_devices"] = switch[fix]
    world = dist.get_world_size()
    batch = identities.rows(config, count=PER_DEVICE * world)
    model = identities.build_model(config)
    reference = identities.sgd_reference(model, batch, 0.0, "float64")
    rounded = identities.sgd_reference(model, batch, 0.0, "float32")

    one_update = None
    if dist.get_rank() == 0:
        payload = {"config": config, "rows": len(batch), "path": config["path"]}
        result = identities.in_fresh_process(_one_rank_leg, payload, ctx)
        one_update = identities.tensors_from_file(result["update"])
    one_update = identities.broadcast_tensors(one_update)

    if trainer:
        two_update = _trainer_leg(model, batch, ctx, config["engine"], extra)
    else:
        two_update = _hand_leg(model, batch, ctx, config["engine"], "global_token_mean" in fixes)
    one = identities.compare(one_update, reference, rounded, reference)
    two = identities.compare(two_update, reference, rounded, reference)
    metrics = {**identities.rounded(two), "one_rank": identities.rounded(one), "two_ranks": identities.rounded(two)}
    measured.note(rows=len(batch), per_device=PER_DEVICE, engine=config["engine"], path=config["path"])
    path = f"{config['path']}-{config['engine']}"
    if identities.holds(two):
        return {"metrics": metrics, "path": path}
    if identities.agree(one_update, two_update, one):
        # 2 ranks apply 1 rank's update; that both are off the reference is the one-batch failure.
        return {"metrics": metrics | {"alike_one_rank": True}, "path": path}
    identities.fail("identity-world-size", two, f"{world} ranks", metrics)
    raise AssertionError("unreachable")


def _trainer_leg(model: Any, batch: list, ctx: dict[str, Any], engine: str, extra: dict[str, Any]) -> dict[str, Any]:
    """One Trainer step at the group's world size under `engine`, from `model` (every rank holds it whole)."""
    from transformers import Trainer, default_data_collator

    before = identities.trainable(model)
    args = identities.trainer_arguments(
        os.path.join(ctx["workdir"], "trainer"), ctx.get("device", "cpu"), per_device_train_batch_size=PER_DEVICE,
        max_steps=1, learning_rate=identities.SGD_LR, optim="sgd", lr_scheduler_type="constant",
        **identities.engine_arguments(engine, ctx), **extra,
    )  # fmt: skip
    trainer = Trainer(
        model=model, args=args, train_dataset=identities.ListDataset(batch), data_collator=default_data_collator
    )
    measured.trainer(trainer)
    measured.note(average_tokens_across_devices=getattr(args, "average_tokens_across_devices", None))
    trainer.train()
    identities.require_engine(trainer, engine)
    after = identities.engine_snapshot(trainer, engine)
    return identities.difference(after, before)


def _hand_leg(model: Any, batch: list, ctx: dict[str, Any], engine: str, global_mean: bool) -> dict[str, Any]:
    """One SGD step of a loop by hand at the group's world size: this rank's rows, the model's own loss (or, with
    `global_mean`, the summed token loss over the all-reduced token count, times the world size)."""
    import torch
    import torch.distributed as dist

    from scenarios.kit import fsdp
    from scenarios.kit.models import device_of

    device = device_of(ctx)
    rank, world = dist.get_rank(), dist.get_world_size()
    before = identities.trainable(model)
    model = model.to(device)
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        policy = fsdp.wrap_policy("peft", model) if hasattr(model, "peft_config") else _layer_policy(model)
        wrapped, _ = fsdp.shard(model, engine, device, policy)
    optimizer = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=identities.SGD_LR)
    mine = identities.stacked(batch[rank * PER_DEVICE : (rank + 1) * PER_DEVICE], device)
    out = wrapped(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"], labels=mine["labels"])
    if global_mean:
        total, count = identities.token_loss_sum(out.logits.float(), mine["labels"])
        count = count.detach().to(torch.float64).reshape(1).cpu()
        dist.all_reduce(count)
        loss = total / count.item() * world
    else:
        loss = out.loss
    loss.backward()
    optimizer.step()
    measured.note(fsdp=measured.fsdp_version(wrapped), hand_engine=engine)
    if engine == "ddp":
        after = identities.trainable(wrapped.module)
    else:
        after = {k: v.cpu() for k, v in fsdp.adapter_snapshot(wrapped, engine).items()}
    return identities.difference(after, before)


def _layer_policy(model: Any) -> Any:
    import functools

    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={type(model.model.layers[0])})


def _one_rank_leg(payload: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process with no group: the same rows as one batch, by the same path at one rank (the Trainer
    alone, or the plain loop with the model's own loss), from the same seeded weights."""
    import torch

    from scenarios.kit.models import device_of

    config = payload["config"]
    batch = identities.rows(config, count=payload["rows"])
    model = identities.build_model(config)
    if payload["path"] == "trainer":
        update, _ = identities.trainer_sgd_update(model, batch, ctx, per_device=len(batch))
    else:
        device = device_of(ctx)
        before = identities.trainable(model)
        model = model.to(device)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=identities.SGD_LR)
        every = identities.stacked(batch, device)
        model(**every).loss.backward()
        optimizer.step()
        update = identities.difference(identities.trainable(model), before)
    path = os.path.join(ctx["workdir"], "one-rank-update.pt")
    return {"update": identities.tensors_to_file(update, path)}
