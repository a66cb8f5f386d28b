"""S9 (I1): gradient accumulation over k micro-batches applies the update of one batch of the same rows.

In October 2024 it was widely reported that the HF Trainer with gradient accumulation averaged per-micro-batch means
instead of taking the token mean of the whole batch, so rows with different numbers of label tokens got different
weights (huggingface/transformers#34191 and the blog "Fixing Gradient Accumulation"). Measured by hand before this
file was written (torch 2.13 CPU, tiny Llama + LoRA r 8, SGD lr 1, one step, rows of 16, 4, 10 and 2 label tokens,
float64 hand reference): transformers 4.41.2 and 4.45.0 are off by 0.39x the update at k = 2 and 1.9x at k = 4 (a full
fine-tune: 0.37x and 3.5x); 4.46.0 is right without label smoothing and off by 1.5x / 7.8x with it; 4.47.0 is off by
1.5x / 7.8x either way; 4.53.0 is right with accumulation except for label smoothing (its one-batch update is off by
0.125x, which S9-identity-batch-loss names); 5.24.0 is right everywhere.

Two paths: the Trainer (`gradient_accumulation_steps=k`, SGD lr 1, one step) and accelerate's `accumulate()` as its
docs' loop writes it (the model's loss, or `cross_entropy(label_smoothing=...)`, per micro-batch, through
`accelerator.backward`). Each config runs two legs from the same weights: one batch of all rows (k = 1) and k micro-
batches of the same rows; both are compared with the float64 hand reference. The failure is `check-identity-
accumulation` where the accumulated leg is off the reference and differs from the one-batch leg; where both are off by
the same, accumulation holds (k micro-batches apply one batch's update) and the one-batch leg's own discrepancy is
S9-identity-batch-loss's failure, kept here in the metrics (`one_batch`, `alike_one_batch`). Fixes:
`window_token_mean` divides the summed token loss by the window's token count (the Trainer: `compute_loss_func`, from
4.46; accelerate: the loop counts the window's tokens, as accelerate's guide to variable-size batches does);
`no_accumulation` (a workaround: one batch of all rows, more memory). Before 4.46 the Trainer offers no fix of its
own: `window_token_mean` is not applicable there, and the table says so.
"""

from __future__ import annotations

import os
from typing import Any

from scenarios.compat import NotApplicable
from scenarios.kit import identities, measured, strategies
from scenarios.kit import trainer as trainer_path

SPEC = {
    "id": "S9-identity-grad-accumulation",
    "title": "Training identity, gradient accumulation: k micro-batches apply one batch's update (float64 reference)",
    "known_issues": [
        "huggingface/transformers#34191",
        "huggingface/transformers#35121",
        "huggingface/transformers#46731",
    ],
    "world_size": 1,
    "device": "any",
    "requires": ["torch", "transformers", "peft", "accelerate"],
    "target": ["check-identity-accumulation"],
    "controls": [],
    # A config's difference that is a condition on the user's own Trainer arguments (the judge's "applies if").
    "details": {"smoothing": "label_smoothing_factor={value}", "accumulation": "gradient_accumulation_steps={value}"},
    # The fix a user's config can already hold, in the setup vocabulary (the judge clears the failure for it).
    "variant_setup": {"no_accumulation": {"accumulation": "none"}},
    "variants": {
        "baseline": ("baseline", "gradient accumulation as the path's users write it"),
        "window_token_mean": (
            "fix",
            "the summed token loss over the accumulation window's token count (Trainer: compute_loss_func, 4.46+)",
        ),
        "no_accumulation": ("workaround", "one batch of all the rows, no accumulation (more memory)"),
    },
    "in_step_failures": ["check:identity-"],
    "table_metrics": ["off_by"],
    # Each config is a code path of its own (the Trainer, a loop by hand, label smoothing): flips are named per config.
    "flips_per_config": True,
    # Why a config of a path the user writes fails on every release, where the records say it does (the table lists
    # such a config once, as a pitfall; the records decide, these words only explain).
    "own_code": {
        "path=accelerate": (
            "your own loop: accelerate's accumulate() with the model's own loss per micro-batch weighs each "
            "micro-batch's mean alike, whatever the release"
        ),
    },
}

FIXES = ("window_token_mean", "no_accumulation")

SEED = {
    "path": "trainer",
    "adapter": "lora",
    "accumulation": 2,
    "smoothing": 0.0,
    "targets": "qv",
    "r": 8,
    "alpha": 8,
    "data_seed": 1,
}


def strategy() -> Any:
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "path": strategies.axis(SEED, "path", "accelerate"),
            "adapter": strategies.axis(SEED, "adapter", "none", "dora"),
            "accumulation": strategies.axis(SEED, "accumulation", 4),
            "smoothing": strategies.axis(SEED, "smoothing", 0.1),
            "targets": strategies.axis(SEED, "targets", "all-linear"),
            "r": strategies.axis(SEED, "r", 4, 16),
            "alpha": strategies.axis(SEED, "alpha", 16),
            "data_seed": strategies.axis(SEED, "data_seed", 2, 3),
        }
    )


EXAMPLES = [
    SEED,
    strategies.seed_config(SEED, adapter="none"),
    strategies.seed_config(SEED, smoothing=0.1),
    strategies.seed_config(SEED, accumulation=4),
    strategies.seed_config(SEED, path="accelerate"),
]


def run(config: dict[str, Any], variant: str, ctx: dict[str, Any]) -> dict[str, Any]:
    return identities.trainer_job(_run, config, variant, FIXES, ctx)


def _run(config: dict[str, Any], fixes: set[str], ctx: dict[str, Any]) -> dict[str, Any]:
    smoothing = config["smoothing"]
    window_mean = "window_token_mean" in fixes
    if window_mean and config["path"] == "trainer":
        identities.require_transformers((4, 46), "Trainer compute_loss_func, and so no fix of its own")
    batch = identities.rows(config)
    k = 1 if "no_accumulation" in fixes else config["accumulation"]
    if len(batch) % k:
        raise NotApplicable(f"{len(batch)} rows do not split into {k} micro-batches")
    model = identities.build_model(config)
    reference = identities.sgd_reference(model, batch, smoothing, "float64")
    rounded = identities.sgd_reference(model, batch, smoothing, "float32")
    legs = {}
    environ = dict(os.environ)
    for name, steps in (("one_batch", 1), ("accumulated", k)):
        trainer_path.reset(environ)  # accelerate's state of the last leg (its accumulation steps) must not carry over
        fresh = identities.build_model(config)  # the same weights for each leg (seeded)
        if config["path"] == "trainer":
            loss_func = identities.window_token_mean_loss(smoothing) if window_mean else None
            update, _ = identities.trainer_sgd_update(
                fresh, batch, ctx, per_device=len(batch) // steps, accumulation=steps, smoothing=smoothing,
                loss_func=loss_func,
            )  # fmt: skip
        else:
            update = _accelerate_update(fresh, batch, ctx, steps, smoothing, window_mean)
        legs[name] = (update, identities.compare(update, reference, rounded, reference))
    one, accumulated = legs["one_batch"][1], legs["accumulated"][1]
    metrics = {
        **identities.rounded(accumulated),
        "one_batch": identities.rounded(one),
        "accumulated": identities.rounded(accumulated),
    }
    measured.note(rows=len(batch), accumulation=k, path=config["path"], optimizer="SGD lr 1, one step")
    if identities.holds(accumulated):
        return {"metrics": metrics, "path": config["path"]}
    if identities.agree(legs["one_batch"][0], legs["accumulated"][0], one):
        # Accumulation applies one batch's update; that both are off the reference is the one-batch failure.
        return {"metrics": metrics | {"alike_one_batch": True}, "path": config["path"]}
    identities.fail("identity-accumulation", accumulated, f"{k} accumulated micro-batches", metrics)
    raise AssertionError("unreachable")


def _accelerate_update(
    model: Any, batch: list[dict[str, Any]], ctx: dict[str, Any], steps: int, smoothing: float, window_mean: bool
) -> dict[str, Any]:
    """accelerate's documented accumulation loop over `steps` micro-batches: `with accelerator.accumulate(model)`,
    `accelerator.backward(loss)` (which divides by the steps), one optimizer step at the window's end."""
    import torch
    from accelerate import Accelerator
    from transformers import default_data_collator

    before = identities.trainable(model)
    accelerator = Accelerator(gradient_accumulation_steps=steps, cpu=ctx.get("device", "cpu") == "cpu")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=identities.SGD_LR)
    loader = torch.utils.data.DataLoader(
        identities.ListDataset(batch), batch_size=len(batch) // steps, shuffle=False, collate_fn=default_data_collator
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    window = sum(int(r["labels"][1:].ne(-100).sum()) for r in batch)  # the user counts the window's predicted tokens
    for micro in loader:
        with accelerator.accumulate(model):
            out = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"], labels=micro["labels"])
            if window_mean:
                total, _ = identities.token_loss_sum(out.logits.float(), micro["labels"], smoothing)
                loss = total / window * steps  # accelerator.backward divides by the steps again
            elif smoothing:
                logits = out.logits[:, :-1].float()
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), micro["labels"][:, 1:].reshape(-1), ignore_index=-100,
                    label_smoothing=smoothing,
                )  # fmt: skip
            else:
                loss = out.loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    measured.note(distributed_type=str(accelerator.distributed_type).rsplit(".", 1)[-1])
    return identities.difference(identities.trainable(accelerator.unwrap_model(model)), before)
