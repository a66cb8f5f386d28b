"""S4: LoRA + DeepSpeed ZeRO-3 + gradient checkpointing.

ZeRO-3 releases a parameter after use with ``param.data = torch.empty(0)``. Non-reentrant
``torch.utils.checkpoint`` saves the frozen parameters it sees without detaching them, so the
recompute in backward finds the released tensor and raises ``torch.utils.checkpoint.CheckpointError:
... Recomputed values for the following tensors have different metadata ... tensor at position 4:
saved metadata: {'shape': torch.Size([<hidden>]) ...} recomputed metadata: {'shape': torch.Size([0])``.
LoRA is what makes the base weights frozen. Reported as OpenRLHF/OpenRLHF#569 (Qwen2.5-7B, bf16, ZeRO-3,
LoRA rank 32, non-reentrant), explained in transformers#47254; DeepSpeed PR #8148 ("Z3: Support for
activation ckpt with frozen params") is said to fix it from 0.19.3 on. Workarounds: ``use_reentrant=True``
or ZeRO-2.

Baseline = what an OpenRLHF / transformers-5 user writes: ZeRO-3, checkpointing with
``use_reentrant=False`` passed explicitly (``ckpt_kwargs="use_reentrant=False"``, OpenRLHF) or no kwargs
at all (``"release_default"``: non-reentrant on transformers 5.x, reentrant on 4.x). Every path calls
``enable_input_require_grads()`` before ``get_peft_model`` (OpenRLHF and TRL do), so reentrant runs do not
fail with S2's "does not require grad" instead.

Config axes beyond the obvious ones:
* ``zero_init``: load the model with ``HfDeepSpeedConfig`` alive (loop path) or after
  ``TrainingArguments`` (trainer path), so ``from_pretrained`` runs under ``deepspeed.zero.Init``
  (only when the variant's stage is 3).
* ``adapter_dtype``: ``"peft_default"`` keeps peft's choice (peft >= 0.12 upcasts adapters to fp32,
  ``autocast_adapter_dtype=True``); ``"model"`` casts them to the model dtype as many scripts do.
  This matters: with zero.Init + bf16, DeepSpeed does not cast the (later added) fp32 adapters, and
  DeepSpeed 0.19.2 then all-gathers persistent ZeRO-3 params of mixed dtype into one-dtype buffers:
  ``RuntimeError: ProcessGroupGloo::allgather: invalid tensor type`` in ``engine.step()``. Non-reentrant
  runs die earlier (CheckpointError in backward), so this shows up under ``use_reentrant``. 0.19.8
  allocates per-param buffers and passes.
* ``path``: ``"loop"`` (``deepspeed.initialize`` + hand loop) or ``"trainer"``
  (``Trainer(args=TrainingArguments(deepspeed=<dict>, gradient_checkpointing=True))``). On CPU the
  trainer path passes ``use_cpu=True`` on transformers >= 5 (it refuses bf16 without it and still runs
  DeepSpeed) and nothing on 4.4x (where ``use_cpu=True`` silently trains with DDP, no DeepSpeed); a
  check fails if the Trainer did not end up with a ``DeepSpeedEngine``.

Checks: every loss is finite; every ``lora_B`` tensor changed (gathered across ZeRO-3 partitions);
the trainer path really ran DeepSpeed. Metrics carry the rank-averaged losses so variants can be
compared (a fixed ZeRO-3 run should track ZeRO-2 to bf16 rounding).
"""

from __future__ import annotations

import os
import time
from typing import Any

from scenarios import compat
from scenarios.kit import checks, distributed, measured, zero
from scenarios.kit import trainer as trainer_path
from scenarios.kit.adapters import cast_trainable, lora_config, named_trainable, trainable_dtypes
from scenarios.kit.models import load_llama, save_by_hand, tiny_llama, token_rows

SPEC = {
    "id": "S4-zero3-lora-checkpoint",
    "title": "LoRA + DeepSpeed ZeRO-3 + gradient checkpointing",
    "known_issues": [
        "OpenRLHF/OpenRLHF#569",
        "huggingface/transformers#47254",
        "deepspeedai/DeepSpeed#4332",
        "huggingface/trl#2514",
        "deepspeedai/DeepSpeed#8148",
    ],
    "world_size": 2,
    # The CheckpointError is raised by every rank in the same backward: re-synchronise and go on.
    # Measured on CPU/gloo (DeepSpeed 0.19.2/0.19.8, transformers 4.41.2/5.23.0): so are the other failures
    # seen here (the all-gather dtype error in step, the 4.41 Trainer's LR-scheduler ValueError), and the
    # next run in the same process gives the same outcome as in a fresh one.
    "restart_after_failure": False,
    "device": "any",
    # What every config of this scenario is, where a config does not say (the setup an advisory applies to).
    "setup": {"engine": "zero3"},
    "requires": ["torch", "transformers", "peft", "deepspeed"],
    "target": ["checkpoint-recompute-shape[0]"],
    "controls": [],
    # The fix a user's config can already hold, in the setup vocabulary (the judge clears the failure for it).
    "variant_setup": {"use_reentrant": {"use_reentrant": "true"}},
    "variants": {
        "baseline": ("baseline", "the config as drawn: what a user of this stack writes by default"),
        "use_reentrant": ("fix", "gradient_checkpointing_kwargs={'use_reentrant': True}"),
        "zero2": ("workaround", "DeepSpeed ZeRO stage 2 instead of 3: parameters are no longer sharded"),
        "use_reentrant+zero2": ("workaround", "ZeRO stage 2 instead of 3, with use_reentrant=True"),
    },
    "table_metrics": ["loss_last", "adapter_max_abs_delta"],
}

_FIXES = ("use_reentrant", "zero2")


def strategy():  # -> hypothesis.strategies.SearchStrategy[dict]
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "path": st.sampled_from(["loop", "trainer"]),
            "adapter": st.sampled_from(["lora", "dora"]),
            "zero_init": st.booleans(),
            "dtype": st.sampled_from(["bfloat16", "float32"]),
            "ckpt_kwargs": st.sampled_from(["use_reentrant=False", "release_default"]),
            "adapter_dtype": st.sampled_from(["peft_default", "model"]),
            "lora_r": st.sampled_from([4, 8, 16, 32]),
            "lora_alpha": st.sampled_from([8, 16, 32, 64]),
            "targets": st.sampled_from(["attn", "all"]),
            "hidden": st.sampled_from([64, 128, 256]),
            "layers": st.integers(min_value=1, max_value=3),
            "seq_len": st.sampled_from([16, 32]),
            "batch": st.sampled_from([1, 2]),
            "steps": st.integers(min_value=2, max_value=4),
            "lr": st.sampled_from([1e-3, 5e-3]),
            "seed": st.integers(min_value=0, max_value=2**16),
        }
    )


# The seed (OpenRLHF#569): bf16, ZeRO-3 with HfDeepSpeedConfig (zero.Init), LoRA r=32 alpha=16 on all
# linear layers, non-reentrant checkpointing passed explicitly; hidden scaled from 3584 down to 64.
_SEED = {
    "path": "loop",
    "adapter": "lora",
    "zero_init": True,
    "dtype": "bfloat16",
    "ckpt_kwargs": "use_reentrant=False",
    "adapter_dtype": "peft_default",
    "lora_r": 32,
    "lora_alpha": 16,
    "targets": "all",
    "hidden": 64,
    "layers": 2,
    "seq_len": 16,
    "batch": 2,
    "steps": 3,
    "lr": 1e-3,
    "seed": 0,
}

EXAMPLES: list[dict] = [
    _SEED,
    # The same user on the release's default kwargs, fp32, no zero.Init, DoRA.
    dict(
        _SEED,
        adapter="dora",
        zero_init=False,
        dtype="float32",
        ckpt_kwargs="release_default",
        lora_r=8,
        targets="attn",
        seed=1,
    ),
    # The seed again, with the adapters cast to the model dtype (bf16). peft >= 0.12 keeps adapters in
    # fp32 by default (autocast_adapter_dtype=True); under zero.Init + bf16 DeepSpeed does not cast them,
    # and ZeRO-3 0.19.2 then all-gathers persistent params of mixed dtype (see the module docstring).
    dict(_SEED, adapter_dtype="model"),
    # HF Trainer(deepspeed=dict) as trl#2514 / most HF users run it.
    dict(_SEED, path="trainer", lora_r=16, lora_alpha=32, seed=2),
]

_DEFAULTS = dict(_SEED)


# --------------------------------------------------------------------------------------------
# helpers (stack imported lazily)


def _release_default_reentrant() -> bool:
    """What `gradient_checkpointing_enable()` with no kwargs does: reentrant before transformers 5."""
    return compat.version_tuple(compat.version_of("transformers")) < (5,)


def _save_tiny(config: dict, ctx: dict) -> str:
    """Build the tiny Llama once per run in this rank's workdir (same seed on every rank)."""
    path = os.path.join(ctx["workdir"], f"s4_tiny_r{ctx['rank']}_{time.monotonic_ns()}")
    model = tiny_llama(
        hidden=config["hidden"], layers=config["layers"], vocab=128, dtype="float32", seed=config["seed"]
    )
    save_by_hand(model, path)
    del model
    return path


def _peft_model(base, config: dict):
    """LoRA or DoRA on the config's targets; adapter_dtype "model": the user casts the adapters to the model dtype."""
    from peft import get_peft_model

    model = get_peft_model(
        base,
        lora_config(config["lora_r"], config["lora_alpha"], config["targets"], use_dora=config["adapter"] == "dora"),
    )
    if config.get("adapter_dtype", "peft_default") == "model":
        cast_trainable(model, config["dtype"])
    elif config.get("adapter_dtype") != "peft_default":
        raise ValueError(f"unknown adapter_dtype {config.get('adapter_dtype')!r}")
    return model


def _check(metrics: dict, steps: int) -> None:
    checks.finite_loss(metrics.get("losses") or [], metrics)
    checks.adapters_changed(metrics, steps, only_lora_b=True)


def _batches(config: dict, ctx: dict, device):
    import torch

    g = torch.Generator().manual_seed(config["seed"] * 1000 + ctx["rank"])
    for _ in range(config["steps"]):
        ids = torch.randint(0, 128, (config["batch"], config["seq_len"]), generator=g)
        yield ids.to(device)


# --------------------------------------------------------------------------------------------
# the two code paths


def _run_loop(config: dict, stage: int, reentrant: bool | None, ctx: dict) -> dict:
    import deepspeed
    import torch

    ds_config = zero.ds_config(stage, config["dtype"], config["batch"], trainer=False)
    path = _save_tiny(config, ctx)
    dschf = None
    engine = None
    try:
        err = None
        try:
            if config["zero_init"]:
                # OpenRLHF: HfDeepSpeedConfig alive during from_pretrained -> zero.Init when stage 3.
                from transformers.integrations import HfDeepSpeedConfig

                dschf = HfDeepSpeedConfig(ds_config)
            base = load_llama(path, config["dtype"])
            from transformers.integrations import is_deepspeed_zero3_enabled

            zero_init_effective = bool(is_deepspeed_zero3_enabled()) and hasattr(next(base.parameters()), "ds_id")
            base.enable_input_require_grads()  # OpenRLHF does this before get_peft_model
            api = compat.enable_checkpointing(base, reentrant)
            model = _peft_model(base, config)
            adapter_dtypes = trainable_dtypes(model)
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=config["lr"], weight_decay=0.0)
        except Exception as exc:  # re-raised unchanged by setup_barrier
            err = exc
        distributed.setup_barrier(err)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        measured.note(zero_stage=int(engine.zero_optimization_stage()), zero_init=bool(zero_init_effective))
        measured.model(engine.module)
        named = named_trainable(engine.module)
        before = zero.gathered_snapshot(named)
        losses = []
        for ids in _batches(config, ctx, engine.device):
            out = engine(input_ids=ids, labels=ids)
            engine.backward(out.loss)
            engine.step()
            losses.append(float(out.loss.detach().float()))
        after = zero.gathered_snapshot(named)
        metrics = {
            "losses": distributed.mean_over_ranks(losses),
            "ckpt_api": api,
            "zero_init_effective": zero_init_effective,
            "adapter_dtypes": adapter_dtypes,
            **checks.compare(before, after),
        }
        return metrics
    finally:
        zero.cleanup(engine)
        del dschf
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def _run_trainer(config: dict, stage: int, reentrant: bool | None, ctx: dict) -> dict:
    from transformers import Trainer

    ds_config = zero.ds_config(stage, config["dtype"], config["batch"], trainer=True)
    path = _save_tiny(config, ctx)
    trainer = None
    try:
        kwargs: dict[str, Any] = dict(
            output_dir=os.path.join(ctx["workdir"], f"s4_trainer_r{ctx['rank']}"),
            per_device_train_batch_size=config["batch"],
            gradient_accumulation_steps=1,
            max_steps=config["steps"],
            learning_rate=config["lr"],
            weight_decay=0.0,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            remove_unused_columns=False,
            seed=config["seed"],
            bf16=config["dtype"] == "bfloat16",
            deepspeed=ds_config,
            gradient_checkpointing=True,
        )
        if reentrant is not None:
            kwargs["gradient_checkpointing_kwargs"] = {"use_reentrant": reentrant}
        cpu_flag = "none"
        if ctx["device"] == "cpu" and compat.version_tuple(compat.version_of("transformers")) >= (5,):
            # transformers 5.x refuses bf16 without an accelerator unless use_cpu=True, and with it
            # still runs DeepSpeed. On 4.4x (accelerate 0.x) use_cpu=True silently swaps DeepSpeed
            # for DDP, while no flag runs DeepSpeed on DS_ACCELERATOR=cpu. The engine check below
            # catches a wrong guess for releases in between.
            kwargs["use_cpu"] = True
            cpu_flag = "use_cpu=True"
        if config["zero_init"]:
            # HF docs: create TrainingArguments (-> HfDeepSpeedConfig) before loading for zero.Init.
            args = trainer_path.training_arguments(**kwargs)
            base = load_llama(path, config["dtype"])
        else:
            base = load_llama(path, config["dtype"])
            args = trainer_path.training_arguments(**kwargs)
        zero_init_effective = hasattr(next(base.parameters()), "ds_id")
        # As in the loop path (and as TRL / OpenRLHF do): without it, reentrant checkpointing on 4.4x,
        # where Trainer does not enable input grads for a get_peft_model model, fails with S2 instead.
        base.enable_input_require_grads()
        model = _peft_model(base, config)
        adapter_dtypes = trainable_dtypes(model)
        # adapter params are created after from_pretrained, outside zero.Init: still whole tensors here
        before = {n: p.detach().float().cpu().clone() for n, p in named_trainable(model)}
        data = token_rows(
            128, config["seq_len"], config["steps"] * config["batch"], config["seed"] * 1000 + ctx["rank"]
        )
        trainer = Trainer(model=model, args=args, train_dataset=data)
        measured.trainer(trainer)
        uses_ds = bool(getattr(trainer, "is_deepspeed_enabled", False))
        if not uses_ds:
            raise compat.CheckFailed(
                "trainer_uses_deepspeed",
                f"Trainer did not enable DeepSpeed (device {ctx['device']}, distributed_type "
                f"{trainer.accelerator.state.distributed_type}); it would train without ZeRO",
                metrics={"distributed_type": str(trainer.accelerator.state.distributed_type)},
            )
        trainer.train()
        engine = trainer.model_wrapped
        import deepspeed

        if isinstance(engine, deepspeed.DeepSpeedEngine):
            measured.note(zero_stage=int(engine.zero_optimization_stage()))
            measured.model(engine.module)

        if not isinstance(engine, deepspeed.DeepSpeedEngine):
            # transformers 4.4x + accelerate 0.x with use_cpu=True: is_deepspeed_enabled is True, but
            # accelerate's state is MULTI_CPU and the Trainer silently trains with plain DDP.
            raise compat.CheckFailed(
                "trainer_uses_deepspeed",
                f"Trainer trained with {type(engine).__name__}, not a DeepSpeedEngine (is_deepspeed_enabled="
                f"{uses_ds}, distributed_type {trainer.accelerator.state.distributed_type}); ZeRO never ran",
                metrics={
                    "engine": type(engine).__name__,
                    "distributed_type": str(trainer.accelerator.state.distributed_type),
                },
            )
        losses = trainer_path.logged_losses(trainer)
        after = zero.gathered_snapshot(named_trainable(engine.module if hasattr(engine, "module") else engine))
        before = {n: before[n] for n in after if n in before}
        metrics = {
            "losses": distributed.mean_over_ranks(losses),
            "ckpt_api": "TrainingArguments(gradient_checkpointing=True)",
            "trainer_cpu_flag": cpu_flag,
            "zero_init_effective": zero_init_effective,
            "adapter_dtypes": adapter_dtypes,
            **checks.compare(before, after),
        }
        return metrics
    finally:
        zero.cleanup(getattr(trainer, "model_wrapped", None) if trainer is not None else None)
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def run(config: dict, variant: str, ctx: dict) -> dict:
    measured.start(ctx)  # what really ran goes into the record's setup
    import deepspeed
    import torch

    config = {**_DEFAULTS, **config}
    fixes = compat.parse_variant(variant, _FIXES)
    stage = 2 if "zero2" in fixes else 3
    if "use_reentrant" in fixes:
        reentrant: bool | None = True
    elif config["ckpt_kwargs"] == "use_reentrant=False":
        reentrant = False
    elif config["ckpt_kwargs"] == "release_default":
        reentrant = None
    else:
        raise ValueError(f"unknown ckpt_kwargs {config['ckpt_kwargs']!r}")
    if ctx["device"] == "cuda":
        torch.cuda.set_device(ctx["local_rank"])
    deepspeed.init_distributed(dist_backend="nccl" if ctx["device"] == "cuda" else "gloo")

    t0 = time.perf_counter()
    runner = _run_trainer if config["path"] == "trainer" else _run_loop
    metrics = runner(config, stage, reentrant, ctx)
    losses = metrics.get("losses") or []
    metrics.update(
        {
            "loss_last": losses[-1] if losses else None,
            "zero_stage": stage,
            "use_reentrant": _release_default_reentrant() if reentrant is None else reentrant,
            "ckpt_kwargs_passed": "none" if reentrant is None else f"use_reentrant={reentrant}",
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
    _check(metrics, config["steps"])
    where = "Trainer(deepspeed=dict)" if config["path"] == "trainer" else "deepspeed.initialize+loop"
    return {"metrics": metrics, "path": f"{where}; zero{stage}; {metrics['ckpt_kwargs_passed']}"}
