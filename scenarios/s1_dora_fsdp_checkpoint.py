"""S1: DoRA + FSDP + gradient checkpointing -> CheckpointError (saved float32, recomputed bfloat16).

Known issue: huggingface/peft#1910 (peft 0.11.2.dev0, transformers 4.41.2, trl SFTTrainer through accelerate's
FSDP). Related: transformers#28499, pytorch#148831, pytorch#159359, peft#1737 / PR #1806 (DoRA under FSDP).

HF ``Trainer`` / accelerate refuse FSDP without an accelerator, so ``run`` drives FSDP by hand the way accelerate
does it (see accelerate ``Accelerator.prepare_model`` and ``utils/fsdp_utils.fsdp2_prepare_model``):

* FSDP1: ``FullyShardedDataParallel(model, auto_wrap_policy=..., mixed_precision=MixedPrecision(...),
  use_orig_params=..., device_id=...)``, then accelerate's upcast of low-precision trainable flat params to fp32
  when mixed precision is on; ``fsdp_activation_checkpointing`` = ``apply_activation_checkpointing`` with a
  NO_REENTRANT ``checkpoint_wrapper`` over the same wrap policy.
* FSDP2: ``fully_shard`` bottom-up on the modules the wrap policy selects, then on the root, after upcasting
  trainable params to fp32 when mixed precision is on.
* bf16 autocast around the forward: what accelerate does with ``mixed_precision="bf16"`` (``native_amp``).
* HF gradient checkpointing (``TrainingArguments.gradient_checkpointing``) through ``compat.enable_checkpointing``.

The FSDP1/FSDP2 preparation, wrap policies, adapter dtypes and the Trainer path are the kit's
(``scenarios/kit/``); the one shim that lives here is ``_partial_hf_checkpointing`` (checkpoint only some
decoder layers on transformers 4.x, which has no per-layer switch).

What was found on CPU/gloo (torch 2.13; details in the harness notes for S1): with peft's wrap policy each
lora_A/lora_B/magnitude module is its own FSDP1 unit, and DoRA reads ``lora_A.weight`` (dtype, shape) from
outside lora_A's unit. With ``use_orig_params=False`` that attribute has the fp32 storage dtype in the first
forward but the bf16 mixed-precision dtype afterwards, including in the backward recompute -> the seed's
CheckpointError on the first backward. With ``use_orig_params=True`` it is a 1-D shard -> IndexError.
From peft 0.14 on, DoRA calls lora_B(lora_A(eye)) before lora_B(lora_A(x)) and the FSDP1 grads of those units
stay bf16 on fp32 flat params -> RuntimeError in AdamW, with or without checkpointing; under FSDP2 without a
mixed-precision policy lora_A/lora_B get no grad on step 1 (caught by the adapters_changed check).
"""

from __future__ import annotations

import time

from hypothesis import strategies as st

from scenarios import compat
from scenarios.kit import checks, distributed, fsdp, measured, strategies
from scenarios.kit import trainer as trainer_path
from scenarios.kit.adapters import lora_config, peft_model_with_adapter_dtype
from scenarios.kit.models import decoder_layers, device_of, tiny_llama, token_rows
from scenarios.kit.strategies import seed_config

SPEC = {
    "id": "S1-dora-fsdp-checkpoint",
    "title": "DoRA + FSDP + gradient checkpointing: CheckpointError, saved float32 vs recomputed bfloat16",
    "known_issues": [
        "huggingface/peft#1910",
        "huggingface/transformers#28499",
        "huggingface/peft#1737",
        "pytorch/pytorch#148831",
        "pytorch/pytorch#159359",
    ],
    "world_size": 2,
    # Failures here are raised by every rank at the same point (backward / optimizer step), so the worker
    # re-synchronises and goes on instead of restarting the process group after each one.
    "restart_after_failure": False,
    "device": "any",
    # What every config of this scenario is, where a config does not say (the setup an advisory applies to).
    "setup": {"engine": "fsdp1", "adapter": "dora"},
    "requires": ["torch", "transformers", "peft"],
    # The failure this scenario exists for (peft#1910), as signature names ("name*": every name starting so).
    "target": ["checkpoint-recompute-dtype*"],
    # Configs expected to pass: the LoRA twin of the DoRA seed, and the seed without any checkpointing.
    "controls": [{"use_dora": False}, {"ckpt_impl": "none"}],
    # The fix a user's config can already hold, in the setup vocabulary (the judge clears the failure for it).
    "variant_setup": {"use_reentrant": {"use_reentrant": "true"}},
    "variants": {
        "baseline": ("baseline", "the config as drawn: what a user of this stack writes by default"),
        "use_reentrant": ("fix", "gradient_checkpointing_kwargs={'use_reentrant': True}"),
        "use_reentrant+input_grads": ("fix", "use_reentrant=True plus model.enable_input_require_grads()"),
        "cast_forward_inputs": ("fix", "FSDP MixedPrecision(cast_forward_inputs=True)"),
        "uniform_dtype": (
            "workaround",
            "one dtype everywhere: model and adapters in the compute dtype (autocast_adapter_dtype=False), no fp32 "
            "upcast of trainable FSDP params (not the same as only loading the model in bf16)",
        ),
        "no_autocast": ("workaround", "no torch.autocast around the forward (FSDP mixed precision alone)"),
        "eval_first": ("fix", "one no-grad forward before training (e.g. an evaluation before the first step)"),
        "flip_use_orig_params": ("fix", "FSDP use_orig_params set to the opposite of the config's value"),
        "flip_use_orig_params+decoder_layer_wrap": (
            "workaround",
            "use_orig_params flipped and one FSDP unit per decoder layer instead of peft's fsdp_auto_wrap_policy",
        ),
        "flip_use_orig_params+decoder_layer_wrap+uniform_dtype": (
            "workaround",
            "use_orig_params flipped, one FSDP unit per decoder layer, and one dtype everywhere (uniform_dtype)",
        ),
        "fsdp2": ("workaround", "FSDP2 (fully_shard) instead of FSDP1"),
        "fsdp2+use_reentrant": ("workaround", "FSDP2 instead of FSDP1, with use_reentrant=True"),
        "partial_checkpointing": ("workaround", "checkpoint only the first decoder layer (more activation memory)"),
        "use_reentrant+partial_checkpointing": (
            "workaround",
            "use_reentrant=True and checkpoint only the first decoder layer",
        ),
        "use_reentrant+input_grads+partial_checkpointing": (
            "workaround",
            "use_reentrant=True, enable_input_require_grads() and checkpoint only the first decoder layer",
        ),
    },
}

# Defaults: the seed-like setup (SFTTrainer + accelerate FSDP1, bf16 mixed precision, peft's wrap policy,
# HF checkpointing with use_reentrant=False, DoRA), scaled down to a tiny model.
DEFAULTS: dict = {
    "fsdp": "fsdp1",  # "fsdp1" | "fsdp2"
    "use_orig_params": False,  # FSDP1 only (accelerate's default)
    "wrap": "peft",  # "peft" (peft.utils.other.fsdp_auto_wrap_policy) | "decoder_layer"
    "mp_param": "bfloat16",  # None -> no MixedPrecision policy
    "mp_reduce": "bfloat16",
    "mp_buffer": "bfloat16",  # FSDP1 only
    "cast_forward_inputs": False,  # FSDP1 MixedPrecision default False; FSDP2 MixedPrecisionPolicy default True
    "autocast": True,  # accelerate's bf16 autocast around forward
    "load_dtype": "bfloat16",  # dtype the model is built in (from_pretrained(torch_dtype=...))
    "adapter_fp32": True,  # peft get_peft_model(autocast_adapter_dtype=...) (default True)
    "accelerate_upcast": True,  # accelerate upcasts low-precision trainable FSDP params to fp32 under mixed precision
    "use_dora": True,
    # "hf" (model.gradient_checkpointing_enable) | "fsdp_ac" (accelerate fsdp activation_checkpointing) | "none"
    "ckpt_impl": "hf",
    "use_reentrant": False,  # None -> the release's default
    "ckpt_layers": "all",  # "all" | "first" | "last"
    "input_grads": False,  # model.enable_input_require_grads()
    "eval_first": False,  # one no-grad forward before training (e.g. an evaluation before the first step)
    "r": 8,
    "alpha": 16,
    "targets": "qv",  # "qv" | "all-linear" | "mlp"
    "adapter_layers": "all",  # "all" | "last": decoder layers that get adapters (LoraConfig.layers_to_transform)
    "hidden": 64,
    "layers": 2,
    "vocab": 128,
    "seq": 16,
    "batch": 2,
    "steps": 3,
    "lr": 1e-2,
    # "manual": FSDP driven by hand the way accelerate does; "trainer": HF Trainer(fsdp="full_shard auto_wrap")
    # through accelerate, the user's path on GPU (Trainer refuses FSDP without an accelerator).
    "path": "manual",
}

#: The target-module sets S1's configs choose from (names in the kit's table).
_TARGET_NAMES = ("q", "qv", "all-linear", "mlp")


def _cfg(**kw) -> dict:
    return seed_config(DEFAULTS, **kw)


def strategy():
    """Configs over the settings that decide whether S1 happens (small strategies composed).

    Every setting lists the seed's value first, so Hypothesis' simplest config is the seed's, and
    shrinking a failure puts back every setting it does not need: the minimal config reads as "the seed
    config, except ...".
    """

    def axis(name: str, *others):
        return strategies.axis(DEFAULTS, name, *others)

    fsdp_part = st.fixed_dictionaries(
        {
            "fsdp": axis("fsdp", "fsdp2"),
            "use_orig_params": axis("use_orig_params", True),
            "wrap": axis("wrap", "decoder_layer"),
        }
    )
    mp_part = st.fixed_dictionaries(
        {
            "mp_param": axis("mp_param", None),
            "mp_reduce": axis("mp_reduce", "float32"),
            "mp_buffer": axis("mp_buffer", "float32"),
            "cast_forward_inputs": axis("cast_forward_inputs", True),
        }
    )
    model_part = st.fixed_dictionaries(
        {
            "load_dtype": axis("load_dtype", "float32"),
            "adapter_fp32": axis("adapter_fp32", False),
            "autocast": axis("autocast", False),
            "accelerate_upcast": axis("accelerate_upcast", False),
        }
    )
    adapter_part = st.fixed_dictionaries(
        {
            "use_dora": axis("use_dora", False),
            "r": axis("r", 4, 16),
            "alpha": axis("alpha", 8, 32),
            "targets": axis("targets", *[t for t in sorted(_TARGET_NAMES) if t != DEFAULTS["targets"]]),
            "adapter_layers": axis("adapter_layers", "last"),
        }
    )
    ckpt_part = st.fixed_dictionaries(
        {
            "ckpt_impl": axis("ckpt_impl", "fsdp_ac", "none"),
            "use_reentrant": axis("use_reentrant", None, True),
            "ckpt_layers": axis("ckpt_layers", "first", "last"),
            "input_grads": axis("input_grads", True),
            "eval_first": axis("eval_first", True),
        }
    )
    anywhere = st.tuples(fsdp_part, mp_part, model_part, adapter_part, ckpt_part).map(
        lambda parts: _cfg(**{k: v for part in parts for k, v in part.items()})
    )
    # The failure needs several settings at once (see EXAMPLES), so a uniform draw rarely lands on it: half of
    # the draws start from the seed-like defaults and change at most two settings.
    return st.one_of(strategies.near_seed(DEFAULTS, anywhere, _AXES, max_changes=2), anywhere)


_AXES = sorted(
    [
        "fsdp",
        "use_orig_params",
        "wrap",
        "mp_param",
        "mp_reduce",
        "mp_buffer",
        "cast_forward_inputs",
        "load_dtype",
        "adapter_fp32",
        "autocast",
        "accelerate_upcast",
        "use_dora",
        "r",
        "alpha",
        "targets",
        "adapter_layers",
        "ckpt_impl",
        "use_reentrant",
        "ckpt_layers",
        "input_grads",
        "eval_first",
    ]
)


EXAMPLES: list[dict] = [
    # Seed-like (peft#1910): DoRA, bf16 (accelerate mixed precision + autocast, model loaded in bf16, adapters
    # fp32), FSDP1 with peft's fsdp_auto_wrap_policy, use_orig_params=False, HF checkpointing with
    # use_reentrant=False. Fails with the seed's CheckpointError on every stack with peft >= 0.12 tried.
    _cfg(),
    # Minimal failing config found here: one layer, DoRA on q_proj only, r=4, no reduce/buffer dtype (fails in
    # the first backward; 2 steps so that lora_A can change at all when it passes).
    _cfg(layers=1, targets="q", r=4, alpha=8, steps=2, mp_reduce=None, mp_buffer=None),
    # Model loaded in fp32 (the Trainer default), everything else seed-like: fails the same way.
    _cfg(load_dtype="float32"),
    # Control: LoRA instead of DoRA (passes: only DoRA reads lora_A.weight outside lora_A's FSDP unit).
    _cfg(use_dora=False),
    # Control: no checkpointing at all (passes on peft <= 0.13; on peft >= 0.14 fails in optimizer.step).
    _cfg(ckpt_impl="none"),
    # accelerate's own fsdp_activation_checkpointing (NO_REENTRANT checkpoint_wrapper over the wrap policy).
    _cfg(ckpt_impl="fsdp_ac", use_reentrant=None),
    # DoRA only on the last layer, so "checkpoint only the first layer" leaves no DoRA inside a checkpoint.
    _cfg(adapter_layers="last"),
    # One FSDP1 unit per decoder layer, use_orig_params=True, adapters in the model dtype (known-good setup).
    _cfg(wrap="decoder_layer", use_orig_params=True, adapter_fp32=False),
    # FSDP2 without a mixed-precision policy (bf16 model, fp32 adapters, autocast).
    _cfg(fsdp="fsdp2", mp_param=None, mp_reduce=None, mp_buffer=None),
    # The seed's own path: HF Trainer with FSDP through accelerate, bf16, DoRA, non-reentrant checkpointing.
    # Runs where there is an accelerator; on CPU it is recorded as not applicable.
    _cfg(path="trainer", load_dtype="float32"),
]


# --------------------------------------------------------------------------------------------- variants


def _apply_variant(config: dict, variant: str) -> dict:
    cfg = dict(config)
    if variant == "baseline":
        return cfg
    for fix in variant.split("+"):
        if fix == "use_reentrant":
            cfg["use_reentrant"] = True
        elif fix == "input_grads":
            cfg["input_grads"] = True
        elif fix == "cast_forward_inputs":
            cfg["cast_forward_inputs"] = True
        elif fix == "uniform_dtype":
            # One storage dtype everywhere, equal to the compute dtype: model and adapters built in it
            # (autocast_adapter_dtype=False) and no fp32 master upcast of trainable FSDP params.
            compute = cfg.get("mp_param") or cfg["load_dtype"]
            cfg.update(load_dtype=compute, adapter_fp32=False, accelerate_upcast=False)
        elif fix == "no_autocast":
            cfg["autocast"] = False
        elif fix == "flip_use_orig_params":
            cfg["use_orig_params"] = not cfg["use_orig_params"]
        elif fix == "fsdp2":
            cfg["fsdp"] = "fsdp2"
        elif fix == "partial_checkpointing":
            cfg["ckpt_layers"] = "first"
        elif fix == "decoder_layer_wrap":
            cfg["wrap"] = "decoder_layer"
        elif fix == "eval_first":
            cfg["eval_first"] = True
        else:
            raise ValueError(f"unknown fix {fix!r} in variant {variant!r}")
    return cfg


# ------------------------------------------------------------------------------------------------ shims


def _selected_layers(layers, which: str) -> list:
    n = len(layers)
    if which == "all":
        return list(range(n))
    if which == "first":
        return [0]
    if which == "last":
        return [n - 1]
    raise ValueError(which)


def _partial_hf_checkpointing(peft_model, keep: list[int]) -> str:
    """Leave HF checkpointing on only for decoder layers ``keep`` (after compat.enable_checkpointing)."""
    layers = decoder_layers(peft_model)
    if hasattr(layers[0], "gradient_checkpointing"):  # transformers 5.x: per-layer GradientCheckpointingLayer flag
        for i, layer in enumerate(layers):
            if i not in keep:
                layer.gradient_checkpointing = False
        return "per-layer-flag"
    # transformers 4.x: LlamaModel.forward checkpoints every decoder_layer.__call__ through one function.
    inner = peft_model.get_base_model().model
    ckpt_func = inner._gradient_checkpointing_func
    keep_ids = {id(layers[i]) for i in keep}

    def maybe_checkpoint(fn, *args, **kwargs):
        owner = getattr(fn, "__self__", None)
        owner = getattr(owner, "_fsdp_wrapped_module", owner)  # FSDP1 wrapper around the layer
        if id(owner) in keep_ids:
            return ckpt_func(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    inner._gradient_checkpointing_func = maybe_checkpoint
    return "wrapped-checkpoint-func"


# -------------------------------------------------------------------------------------------------- run


def _amp(cfg, device):
    import contextlib

    import torch

    if cfg["autocast"]:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _autocast_on(device) -> bool:
    """Whether autocast is really on for this device type here (measured inside the context)."""
    import torch

    try:
        return bool(torch.is_autocast_enabled(device.type))
    except TypeError:  # torch < 2.4 takes no device type
        return bool(torch.is_autocast_cpu_enabled() if device.type == "cpu" else torch.is_autocast_enabled())


def run(config: dict, variant: str, ctx: dict) -> dict:
    measured.start(ctx)  # what really ran goes into the record's setup
    import gc

    import torch

    cfg = _apply_variant({**DEFAULTS, **config}, variant)
    if cfg["path"] == "trainer":
        return _run_trainer(cfg, variant, ctx)
    t0 = time.perf_counter()
    device = device_of(ctx)
    rank = ctx.get("rank", 0)

    model = tiny_llama(hidden=cfg["hidden"], layers=cfg["layers"], vocab=cfg["vocab"], dtype=cfg["load_dtype"], seed=0)
    model.config.use_cache = False
    model.to(device)
    ckpt_api = None
    if cfg["ckpt_impl"] == "hf":
        ckpt_api = compat.enable_checkpointing(model, cfg["use_reentrant"])
    if cfg["input_grads"]:
        model.enable_input_require_grads()

    peft_model = _peft_model(model, cfg, layers=None if cfg["adapter_layers"] == "all" else [cfg["layers"] - 1])
    peft_model.train()
    layers = list(decoder_layers(peft_model))
    keep = _selected_layers(layers, cfg["ckpt_layers"])
    partial_mode = None
    if cfg["ckpt_impl"] == "hf" and cfg["ckpt_layers"] != "all":
        partial_mode = _partial_hf_checkpointing(peft_model, keep)

    policy = fsdp.wrap_policy(cfg["wrap"], peft_model)
    version = 1 if cfg["fsdp"] == "fsdp1" else 2
    mp = fsdp.mixed_precision(
        version,
        cfg["mp_param"],
        cfg["mp_reduce"],
        cfg["mp_buffer"] if version == 1 else None,
        cfg["cast_forward_inputs"],
    )
    wrapped, upcast = fsdp.shard(
        peft_model,
        cfg["fsdp"],
        device,
        policy,
        mp,
        use_orig_params=cfg["use_orig_params"],
        upcast=cfg["accelerate_upcast"],
    )
    if cfg["ckpt_impl"] == "fsdp_ac":
        only = None if cfg["ckpt_layers"] == "all" else [layers[i] for i in keep]
        fsdp.activation_checkpointing(wrapped, policy, bool(cfg["use_reentrant"]), only)
    wrapped.train()

    params = [p for p in wrapped.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=0.0)
    before = fsdp.adapter_snapshot(wrapped, cfg["fsdp"])
    if cfg["eval_first"]:
        with torch.no_grad(), _amp(cfg, device):
            ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=torch.Generator().manual_seed(7))
            wrapped(input_ids=ids.to(device))

    gen = torch.Generator().manual_seed(1000 + rank)
    losses = []
    step_times = []
    for _ in range(cfg["steps"]):
        ts = time.perf_counter()
        ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=gen).to(device)
        with _amp(cfg, device):
            measured.note(autocast=_autocast_on(device))
            out = wrapped(input_ids=ids, labels=ids)
        loss = out.loss.float()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step_times.append(round(time.perf_counter() - ts, 4))

    after = fsdp.adapter_snapshot(wrapped, cfg["fsdp"])
    mean_losses = distributed.mean_over_ranks(losses)
    metrics = {
        "losses": [round(x, 5) for x in mean_losses],
        **checks.compare(before, after),
        "fsdp_params_upcast": upcast,
        "trainable_dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params}),
        "ckpt_api": ckpt_api or cfg["ckpt_impl"],
        "partial_mode": partial_mode,
        "step_s": step_times,
        "run_s": round(time.perf_counter() - t0, 3),
    }
    path = f"{cfg['fsdp']}-manual/{cfg['ckpt_impl']}"

    del optimizer, params, wrapped, peft_model, model, before, after
    gc.collect()

    checks.finite_loss(mean_losses, metrics)
    checks.adapters_changed(metrics, cfg["steps"])
    return {"metrics": metrics, "path": path}


def _peft_model(model, cfg: dict, layers: list[int] | None = None):
    """LoRA or DoRA on the config's targets, adapters in fp32 or the model's dtype (`adapter_fp32`)."""
    config = lora_config(cfg["r"], cfg["alpha"], cfg["targets"], use_dora=cfg["use_dora"], layers=layers)
    return peft_model_with_adapter_dtype(model, config, cfg["adapter_fp32"], cfg["load_dtype"])


# ------------------------------------------------------------------------------------------ Trainer path

#: What the Trainer path can express: the rest are knobs accelerate sets for the user.
_TRAINER_FIXES = {"use_reentrant", "input_grads", "flip_use_orig_params", "fsdp2", "uniform_dtype"}


def _label_fsdp(exc: BaseException, trainer, cfg: dict) -> None:
    """A failed run still says which FSDP it ran; an FSDP2 request the stack ignored is not applicable."""
    ran = fsdp.fsdp_that_ran(getattr(trainer, "model_wrapped", None))
    measured.note(fsdp_declared=cfg["fsdp"], fsdp=ran if ran != "not-wrapped" else None)
    if trainer is not None:
        measured.trainer(trainer)
    if cfg["fsdp"] == "fsdp2" and ran == "fsdp1":
        raise compat.NotApplicable("this stack ignores fsdp_config version=2 and runs FSDP1") from exc
    try:
        exc.path = f"trainer-{ran}"
    except AttributeError:
        pass


def _run_trainer(cfg: dict, variant: str, ctx: dict) -> dict:
    """HF Trainer + accelerate FSDP, as in peft#1910 (SFTTrainer is a Trainer subclass)."""
    import os

    from transformers import Trainer

    if ctx.get("device") != "cuda":
        raise compat.NotApplicable("HF Trainer refuses FSDP without an accelerator")
    unsupported = set(variant.split("+")) - {"baseline"} - _TRAINER_FIXES
    if unsupported:
        raise compat.NotApplicable(f"the Trainer path has no knob for {', '.join(sorted(unsupported))}")
    environ_before = dict(os.environ)
    model = tiny_llama(hidden=cfg["hidden"], layers=cfg["layers"], vocab=cfg["vocab"], dtype=cfg["load_dtype"], seed=0)
    model.config.use_cache = False
    if cfg["input_grads"]:
        model.enable_input_require_grads()
    peft_model = _peft_model(model, cfg)
    # The FSDP version is declared, not left to the release's default (transformers 5 defaults to FSDP2): the
    # record measures which one wrapped the model, and a stack that ran another one is not applicable.
    fsdp_config = {
        "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
        "use_orig_params": cfg["use_orig_params"],
        "version": 2 if cfg["fsdp"] == "fsdp2" else 1,
    }
    args = trainer_path.training_arguments(
        ctx["workdir"],
        per_device_train_batch_size=cfg["batch"],
        max_steps=cfg["steps"],
        learning_rate=cfg["lr"],
        bf16=True,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={} if cfg["use_reentrant"] is None else {"use_reentrant": cfg["use_reentrant"]},
        fsdp="full_shard auto_wrap",
        fsdp_config=fsdp_config,
    )
    trainer = None
    try:
        data = token_rows(cfg["vocab"], cfg["seq"], cfg["batch"] * cfg["steps"], seed=1234)
        trainer = Trainer(model=peft_model, args=args, train_dataset=data)
        try:
            result = trainer.train()
        except BaseException as exc:
            _label_fsdp(exc, trainer, cfg)
            raise
        ran = fsdp.fsdp_that_ran(trainer.model_wrapped)
        measured.note(fsdp_declared=cfg["fsdp"], fsdp=ran)
        measured.trainer(trainer)
        measured.require(ran == cfg["fsdp"], f"fsdp_config declared {cfg['fsdp']}, but {ran} wrapped the model")
        losses = trainer_path.logged_losses(trainer)
        metrics = {
            "losses": [round(x, 5) for x in losses],
            "global_step": trainer.state.global_step,
            "train_loss": result.training_loss,
            "fsdp_that_ran": ran,
        }
        checks.finite_loss(losses, metrics)
        checks.all_steps_ran(trainer.state.global_step, cfg["steps"], metrics)
        return {"metrics": metrics, "path": f"trainer-{ran}"}
    finally:
        # Trainer sets ACCELERATE_* variables and accelerate keeps process-wide state: undo both so the
        # next job in this worker starts clean.
        trainer_path.reset(environ_before)
