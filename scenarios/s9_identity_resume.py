"""S9 (I3): a run stopped at a checkpoint and resumed in new processes ends where the uninterrupted run ends.

Resuming a PEFT run from a Trainer checkpoint has restored only part of the adapter on some releases (under FSDP2
with FULL_STATE_DICT every rank's adapter shard but rank 0's went back to its initial value, accelerate#4206; LoRA
checkpoints under FSDP would not load, transformers#28320, #31892; under ZeRO-3 a PeftModel checkpoint did not load,
transformers#28746, fixed in 4.38.0): the run goes on, its loss looks fine, and it ends somewhere else.

At 2 ranks, from the same seeded weights and rows: the uninterrupted run (`max_steps = 4`, AdamW lr 1e-2, the
Trainer's linear schedule, no clipping, no decay) in the job's own group; the same run saving a checkpoint at step 2
and stopping there; then the resume, `trainer.train(resume_from_checkpoint=...)`, in two new processes that form a
new group (nothing of the first run's memory survives: the user's restart). Each global batch is the whole dataset
(one step per epoch; every row of full length, so the ranks see equal token counts and the world-size identity does
not enter), so the float64 hand replay of 4 AdamW steps (`identities.adamw_reference`) is the reference whatever the
sampler's order. Both ends are compared with it, and with each other; the resumed run's `global_step` and its
optimizer's step count must be 4. Measured by hand (torch 2.13 CPU, gloo, the Trainer under DDP, LoRA): transformers
5.24.0 resumes to within 1.3e-6 of the reference (floor 2.3e-6 of an update of 0.025: AdamW's round-off is larger than
SGD's), the same as the uninterrupted run; 4.45.0 over torch 2.13 fails to read its own RNG state ("don't know how to
restore data location of torch.storage.UntypedStorage"), a pairing no history day has.

Engines: the Trainer under DDP (CPU and GPU), FSDP1, FSDP2 (GPUs: on CPU the Trainer ignores `fsdp=`) and ZeRO-3. The
failure is `check-identity-resume` where the resumed end is off the reference (or its step counts are wrong) while the
uninterrupted end is not; where both are off alike it is `check-identity-trajectory`, not resume's. Not covered: a
checkpoint in the middle of an epoch (the Trainer's skipping of seen batches); the fix `full_state_dict_checkpoint`
saves checkpoints with FSDP's FULL_STATE_DICT (accelerate's `fsdp_state_dict_type`), `sharded_state_dict_checkpoint`
with SHARDED_STATE_DICT, the two settings users switch between when a resume goes wrong.
"""

from __future__ import annotations

import os
from typing import Any

from scenarios.compat import NotApplicable
from scenarios.kit import identities, measured, strategies
from scenarios.kit import trainer as trainer_path

SPEC = {
    "id": "S9-identity-resume",
    "title": "Training identity, resume: stopped at a checkpoint, resumed in new processes, it ends where it should",
    "known_issues": ["huggingface/accelerate#4206", "huggingface/transformers#28320", "huggingface/transformers#28746"],
    "world_size": 2,
    "setup": {"loop": "trainer"},
    "device": "any",
    "requires": ["torch", "transformers", "peft", "accelerate"],
    "target": ["check-identity-resume"],
    "controls": [],
    "variants": {
        "baseline": ("baseline", "the engine's default checkpoints, resumed with resume_from_checkpoint"),
        "full_state_dict_checkpoint": ("fix", "FSDP: checkpoints with FULL_STATE_DICT (fsdp_state_dict_type)"),
        "sharded_state_dict_checkpoint": ("fix", "FSDP: checkpoints with SHARDED_STATE_DICT (fsdp_state_dict_type)"),
    },
    "in_step_failures": ["check:identity-", "not-applicable"],
    "restart_after_failure": True,
    "table_metrics": ["off_by"],
    # Each config is a code path of its own (the Trainer, a loop by hand, label smoothing): flips are named per config.
    "flips_per_config": True,
    # The fixes are settings of a user's accelerate config (fsdp_state_dict_type): `audit` clears the advisory for a
    # setup that already has the one the records show passing.
    "variant_setup": {
        "full_state_dict_checkpoint": {"state_dict": "full_state_dict"},
        "sharded_state_dict_checkpoint": {"state_dict": "sharded_state_dict"},
    },
}

FIXES = ("full_state_dict_checkpoint", "sharded_state_dict_checkpoint")
STATE_DICT = {"full_state_dict_checkpoint": "FULL_STATE_DICT", "sharded_state_dict_checkpoint": "SHARDED_STATE_DICT"}
PER_DEVICE = 2
STEPS = 4
STOP_AT = 2
LR = 1e-2

SEED = {
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
            "engine": strategies.axis(SEED, "engine", "fsdp1", "fsdp2", "zero3"),
            "adapter": strategies.axis(SEED, "adapter", "none", "dora"),
            "targets": strategies.axis(SEED, "targets", "all-linear"),
            "r": strategies.axis(SEED, "r", 4, 16),
            "alpha": strategies.axis(SEED, "alpha", 16),
            "data_seed": strategies.axis(SEED, "data_seed", 2, 3),
        }
    )


#: The Trainer under DDP (LoRA and the full fine-tune control) and ZeRO-3; under FSDP1 and FSDP2 on GPUs only (not
#: applicable on CPU, where the Trainer ignores `fsdp=`).
EXAMPLES = [
    SEED,
    strategies.seed_config(SEED, adapter="none"),
    strategies.seed_config(SEED, engine="zero3"),
    strategies.seed_config(SEED, engine="fsdp1"),
    strategies.seed_config(SEED, engine="fsdp2"),
]


def run(config: dict[str, Any], variant: str, ctx: dict[str, Any]) -> dict[str, Any]:
    return identities.trainer_job(_run, config, variant, FIXES, ctx)


def _run(config: dict[str, Any], fixes: set[str], ctx: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from scenarios.kit import distributed

    if fixes and config["engine"] not in ("fsdp1", "fsdp2"):
        raise NotApplicable(f"{sorted(fixes)[0]} is an FSDP setting; this config trains under {config['engine']}")
    world = dist.get_world_size()
    payload = {"config": config, "rows": PER_DEVICE * world, "state_dict": STATE_DICT.get(next(iter(fixes), ""))}
    batch = _rows(payload)
    model = identities.build_model(config)
    start = identities.trainable(model)
    reference = identities.adamw_reference(model, batch, STEPS, LR, "float64")
    rounded = identities.adamw_reference(model, batch, STEPS, LR, "float32")
    scale = identities.difference(
        {k: v.double() for k, v in reference.items()}, {k: v.double() for k, v in start.items()}
    )

    whole = _train(model, payload, ctx, os.path.join(ctx["workdir"], "uninterrupted"), stop=False)
    environ = dict(os.environ)
    trainer_path.reset(environ)
    shared = distributed.shared_directory(ctx, "resume-", lambda path: None)
    payload["output_dir"] = shared
    _train(identities.build_model(config), payload, ctx, shared, stop=True)
    trainer_path.reset(environ)

    store = os.path.join(distributed.shared_directory(ctx, "group-", lambda path: None), "store")
    resumed = identities.in_fresh_process(_resumed_leg, payload, ctx, rank=dist.get_rank(), world=world, store=store)
    resumed_end = identities.tensors_from_file(resumed["end"])
    dist.barrier()

    straight = identities.compare(whole["end"], reference, rounded, scale)
    again = identities.compare(resumed_end, reference, rounded, scale)
    between = max(float((resumed_end[n] - whole["end"][n]).abs().max()) for n in reference)
    metrics = {
        **identities.rounded(again),
        "uninterrupted": identities.rounded(straight),
        "resumed": identities.rounded(again),
        "resumed_vs_uninterrupted": float(f"{between:.4g}"),
        "global_step": {"uninterrupted": whole["global_step"], "resumed": resumed["global_step"]},
        "optimizer_steps": {"uninterrupted": whole["optimizer_steps"], "resumed": resumed["optimizer_steps"]},
        "stopped_at": STOP_AT,
    }
    measured.note(steps=STEPS, stopped_at=STOP_AT, engine=config["engine"], resumed_in="new processes, a new group")
    steps_wrong = resumed["global_step"] != STEPS or (resumed["optimizer_steps"] not in (None, [STEPS]))
    if identities.holds(again) and not steps_wrong:
        return {"metrics": metrics, "path": f"trainer-{config['engine']}"}
    if not identities.holds(straight) and identities.agree(whole["end"], resumed_end, straight):
        identities.fail("identity-trajectory", straight, f"{STEPS} AdamW steps (uninterrupted and resumed alike)",
                        metrics, of="the change")  # fmt: skip
    if identities.holds(again):
        from scenarios.compat import CheckFailed

        said = f"the resumed run counts {resumed['global_step']} steps, its optimizer {resumed['optimizer_steps']}"
        raise CheckFailed("identity-resume", f"{said} (the run had {STEPS})", metrics)
    identities.fail("identity-resume", again, f"the run resumed at step {STOP_AT} in new processes", metrics,
                    of="the change")  # fmt: skip
    raise AssertionError("unreachable")


def _rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    config = {**payload["config"], "lengths": [identities.SEQ]}  # every row whole: equal tokens on every rank
    return identities.rows(config, count=payload["rows"])


def _train(model: Any, payload: dict[str, Any], ctx: dict[str, Any], output_dir: str, stop: bool,
           resume: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The Trainer under the config's engine for up to STEPS steps from `model`: saving a checkpoint at STOP_AT and
    stopping there (`stop`), or resuming from `resume`, or straight through. Returns the gathered end and the step
    counts."""
    from transformers import Trainer, TrainerCallback, default_data_collator

    engine = payload["config"]["engine"]

    class StopAtCheckpoint(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if state.global_step >= STOP_AT:
                control.should_training_stop = True
            return control

    if payload.get("state_dict"):
        os.environ["FSDP_STATE_DICT_TYPE"] = payload["state_dict"]  # what accelerate launch's flag exports
    extra = identities.engine_arguments(engine, ctx)
    if payload.get("state_dict") and "fsdp_config" in extra:
        extra["fsdp_config"]["state_dict_type"] = payload["state_dict"]
    saving = {"save_strategy": "steps", "save_steps": STOP_AT} if stop or resume else {}
    args = identities.trainer_arguments(
        output_dir, ctx.get("device", "cpu"), per_device_train_batch_size=PER_DEVICE, max_steps=STEPS,
        learning_rate=LR, optim="adamw_torch", lr_scheduler_type="linear", **saving, **extra,
    )  # fmt: skip
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=identities.ListDataset(_rows(payload)),
        data_collator=default_data_collator,
        callbacks=[StopAtCheckpoint()] if stop else [],
    )
    measured.trainer(trainer)
    trainer.train(resume_from_checkpoint=resume)
    identities.require_engine(trainer, engine)
    return {
        "end": identities.engine_snapshot(trainer, engine),
        "global_step": int(trainer.state.global_step),
        "optimizer_steps": _optimizer_steps(trainer),
    }


def _optimizer_steps(trainer: Any) -> list[int] | None:
    """The distinct step counts the optimizer's state holds (AdamW keeps one per parameter), or None where the engine's
    optimizer keeps them elsewhere."""
    optimizer = trainer.optimizer
    for _ in range(3):
        state = getattr(optimizer, "state", None)
        if isinstance(state, dict) and state:
            steps = {int(float(s["step"])) for s in state.values() if isinstance(s, dict) and "step" in s}
            return sorted(steps) or None
        optimizer = getattr(optimizer, "optimizer", None)
        if optimizer is None:
            return None
    return None


def _resumed_leg(payload: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """In a new process of a new group: the Trainer resumes from the checkpoint at STOP_AT and runs to STEPS."""
    checkpoint = os.path.join(payload["output_dir"], f"checkpoint-{STOP_AT}")
    if not os.path.isdir(checkpoint):
        raise FileNotFoundError(f"no checkpoint at {checkpoint}: {sorted(os.listdir(payload['output_dir']))}")
    ctx["local_rank"] = 0
    result = _train(identities.build_model(payload["config"]), payload, ctx, payload["output_dir"], stop=False,
                    resume=checkpoint)  # fmt: skip
    path = os.path.join(ctx["workdir"], "resumed-end.pt")
    identities.tensors_to_file(result.pop("end"), path)
    return {**result, "end": path}
