"""S9 (I0): one Trainer step on one batch applies the token mean's update.

The Trainer's loss for a causal LM should be the summed cross-entropy over the predicted tokens (after the causal
shift) divided by their number. From transformers 4.46 the Trainer counts the batch's label tokens itself
(`num_items_in_batch`) and the model divides by that count; measured by hand (torch 2.13, tiny Llama, SGD lr 1, one
step, rows of 16, 4, 10 and 2 label tokens), 4.53.0 counted the labels before the shift, one token per row that
is never predicted: the update is off by exactly 4/32 = 0.125 of itself, with or without an adapter, while
4.45.0, 4.46.0, 4.47.0 and 5.24.0 land at the round-off floor (~3e-7 of the update). Every other identity of the
family (accumulation, world size) builds on this one, so a stack that fails here fails them for the same reason:
they name that case apart, and this column is where it shows.

The reference is computed by hand in float64 from the same weights and rows (`scenarios/kit/identities.py`); the
record carries the discrepancy, the update's size, the round-off floor and the ratio. A full fine-tune (no adapter)
is the control of PEFT's part. The workaround `mask_first_label` labels each row's first token -100: it is never
predicted, so the loss is the same, and a count made before the shift is then right.
"""

from __future__ import annotations

from typing import Any

from scenarios.compat import parse_variant
from scenarios.kit import identities, measured, strategies

SPEC = {
    "id": "S9-identity-batch-loss",
    "title": "Training identity, one batch: the Trainer's update is the token mean's, against a float64 hand reference",
    "known_issues": ["huggingface/transformers#46204"],
    "world_size": 1,
    "setup": {"loop": "trainer"},
    "device": "any",
    "requires": ["torch", "transformers", "peft"],
    "target": ["check-identity-batch"],
    "controls": [{"mask_first": True}],
    "variants": {
        "baseline": ("baseline", "the Trainer's own loss on one batch, as a user runs it"),
        "mask_first_label": (
            "fix",
            "label the first token of every row -100 (never predicted): a label count made before the shift is right",
        ),
    },
    "in_step_failures": ["check:identity-"],
    "table_metrics": ["off_by"],
    # Each config is a code path of its own (the Trainer, a loop by hand, label smoothing): flips are named per config.
    "flips_per_config": True,
}

FIXES = ("mask_first_label",)

SEED = {
    "adapter": "lora",
    "smoothing": 0.0,
    "mask_first": False,
    "targets": "qv",
    "r": 8,
    "alpha": 8,
    "data_seed": 1,
}


def strategy() -> Any:
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "adapter": strategies.axis(SEED, "adapter", "none", "dora"),
            "smoothing": strategies.axis(SEED, "smoothing", 0.1),
            "mask_first": strategies.axis(SEED, "mask_first", True),
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
    strategies.seed_config(SEED, mask_first=True),
]


def run(config: dict[str, Any], variant: str, ctx: dict[str, Any]) -> dict[str, Any]:
    measured.start(ctx)
    fixes = parse_variant(variant, FIXES)
    batch = identities.rows(config, mask_first=config["mask_first"] or "mask_first_label" in fixes)
    model = identities.build_model(config)
    reference = identities.sgd_reference(model, batch, config["smoothing"], "float64")
    rounded = identities.sgd_reference(model, batch, config["smoothing"], "float32")
    update, _ = identities.trainer_sgd_update(model, batch, ctx, per_device=len(batch), smoothing=config["smoothing"])
    one = identities.compare(update, reference, rounded, reference)
    metrics = identities.rounded(one)
    measured.note(rows=len(batch), per_device=len(batch), accumulation=1, optimizer="SGD lr 1, one step")
    if not identities.holds(one):
        identities.fail("identity-batch", one, "one Trainer step on one batch", metrics)
    return {"metrics": metrics, "path": "trainer"}
