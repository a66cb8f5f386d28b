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

Shims that live here (not in compat): ``_partial_hf_checkpointing`` (checkpoint only some decoder layers on
transformers 4.x, which has no per-layer switch), ``_get_peft_model`` (``autocast_adapter_dtype`` only exists
from peft 0.12; older releases get the adapter dtype set by hand), ``_wrap_policy`` (per-decoder-layer or peft's
``fsdp_auto_wrap_policy``), and the FSDP1/FSDP2 preparation.

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
    "requires": ["torch", "transformers", "peft"],
    # The failure this scenario exists for (peft#1910), as signature names ("name*": every name starting so).
    "target": ["checkpoint-recompute-dtype*"],
    # Configs expected to pass: the LoRA twin of the DoRA seed, and the seed without any checkpointing.
    "controls": [{"use_dora": False}, {"ckpt_impl": "none"}],
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

_TARGETS = {
    "q": ["q_proj"],
    "qv": ["q_proj", "v_proj"],
    "all-linear": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "mlp": ["gate_proj", "up_proj", "down_proj"],
}


def _cfg(**kw) -> dict:
    out = dict(DEFAULTS)
    out.update(kw)
    return out


def strategy():
    """Configs over the settings that decide whether S1 happens (small strategies composed).

    Every setting lists the seed's value first, so Hypothesis' simplest config is the seed's, and
    shrinking a failure puts back every setting it does not need: the minimal config reads as "the seed
    config, except ...".
    """

    def axis(name: str, *others):
        return st.sampled_from([DEFAULTS[name], *others])

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
            "targets": axis("targets", *[t for t in sorted(_TARGETS) if t != DEFAULTS["targets"]]),
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
    near_seed = st.tuples(anywhere, st.sets(st.sampled_from(_AXES), max_size=2)).map(
        lambda t: _cfg(**{k: t[0][k] for k in t[1]})
    )
    return st.one_of(near_seed, anywhere)


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


def _decoder_layers(peft_model):
    return peft_model.get_base_model().model.layers


def _wrap_policy(kind: str, peft_model):
    import functools

    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if kind == "peft":
        from peft.utils.other import fsdp_auto_wrap_policy

        return fsdp_auto_wrap_policy(peft_model)
    layer_cls = type(_decoder_layers(peft_model)[0])
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls})


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
    layers = _decoder_layers(peft_model)
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


def _get_peft_model(model, lora_config, cfg):
    """get_peft_model with adapters in fp32 (``adapter_fp32``) or in the model's dtype, on every peft release.

    peft >= 0.12 takes ``autocast_adapter_dtype`` (default True: adapters in fp32); older releases do not, so
    the adapter dtype is then set by hand to mean the same thing.
    """
    import inspect

    import torch
    from peft import get_peft_model

    if "autocast_adapter_dtype" in inspect.signature(get_peft_model).parameters:
        peft_model = get_peft_model(model, lora_config, autocast_adapter_dtype=bool(cfg["adapter_fp32"]))
    else:
        peft_model = get_peft_model(model, lora_config)
    want = torch.float32 if cfg["adapter_fp32"] else compat.torch_dtype(cfg["load_dtype"])
    for name, param in peft_model.named_parameters():
        if "lora_" in name and param.is_floating_point() and param.dtype != want:
            param.data = param.data.to(want)
    return peft_model


def _mixed_precision(cfg, fsdp_version: int):
    dt = compat.torch_dtype
    if cfg["mp_param"] is None:
        return None
    if fsdp_version == 1:
        from torch.distributed.fsdp import MixedPrecision

        return MixedPrecision(
            param_dtype=dt(cfg["mp_param"]),
            reduce_dtype=dt(cfg["mp_reduce"]) if cfg["mp_reduce"] else None,
            buffer_dtype=dt(cfg["mp_buffer"]) if cfg["mp_buffer"] else None,
            cast_forward_inputs=bool(cfg["cast_forward_inputs"]),
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=dt(cfg["mp_param"]),
        reduce_dtype=dt(cfg["mp_reduce"]) if cfg["mp_reduce"] else None,
        cast_forward_inputs=bool(cfg["cast_forward_inputs"]),
    )


def _prepare_fsdp1(model, cfg, device, policy):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    mp = _mixed_precision(cfg, 1)
    wrapped = FSDP(
        model,
        auto_wrap_policy=policy,
        mixed_precision=mp,
        use_orig_params=bool(cfg["use_orig_params"]),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=device,
        limit_all_gathers=True,
    )
    upcast = 0
    if mp is not None and cfg["accelerate_upcast"]:
        # accelerate.Accelerator.prepare_model: upcast low-precision trainable flat params to fp32.
        for module in FSDP.fsdp_modules(wrapped):
            if not module._has_params:
                continue
            param = module._flat_param
            if param.dtype != torch.float32 and param.requires_grad:
                param.data = param.data.to(torch.float32)
                module._handle._orig_param_dtype = torch.float32
                upcast += 1
    return wrapped, upcast


def _prepare_fsdp2(model, cfg, device, policy):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    mp = _mixed_precision(cfg, 2)
    kwargs = {"mesh": mesh}
    if mp is not None:
        kwargs["mp_policy"] = mp
    upcast = 0
    if mp is not None and cfg["accelerate_upcast"]:
        for param in model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.to(torch.float32)
                upcast += 1
    # FSDP2 groups need one dtype per group; bottom-up like accelerate's fsdp2_prepare_model.
    modules = list(model.modules())
    for module in reversed(modules[1:]):
        if _policy_selects(policy, module) and not isinstance(module, FSDPModule):
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model, upcast


def _policy_selects(policy, module) -> bool:
    return bool(policy(module=module, recurse=False, nonwrapped_numel=0))


def _fsdp_activation_checkpointing(model, cfg, policy, keep_layers):
    """accelerate's fsdp_activation_checkpointing: checkpoint_wrapper on every module the wrap policy selects."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    impl = CheckpointImpl.REENTRANT if cfg["use_reentrant"] else CheckpointImpl.NO_REENTRANT
    keep_ids = {id(layer) for layer in keep_layers}

    def check_fn(module):
        # Like accelerate, test the raw modules (FSDP1 wrappers are not selected), so the checkpoint sits
        # inside the FSDP unit.
        if cfg["ckpt_layers"] != "all":
            return id(module) in keep_ids
        return _policy_selects(policy, module)

    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=impl), check_fn=check_fn
    )


def _adapter_snapshot(model, fsdp: str) -> dict:
    """Full (unsharded) copies of every trainable tensor, by clean name. Collective: all ranks call it."""
    import torch

    out = {}
    if fsdp == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(model, writeback=False, rank0_only=False):
            for name, param in model.named_parameters():
                if param.requires_grad or "lora_" in name:
                    out[_clean(name)] = param.detach().float().clone()
        return out
    for name, param in model.named_parameters():
        if param.requires_grad or "lora_" in name:
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            out[_clean(name)] = full.detach().float().clone()
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def _clean(name: str) -> str:
    for junk in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(junk, "")
    return name


# -------------------------------------------------------------------------------------------------- run


def _amp(cfg, device):
    import contextlib

    import torch

    if cfg["autocast"]:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run(config: dict, variant: str, ctx: dict) -> dict:
    import gc

    import torch
    import torch.distributed as dist
    from peft import LoraConfig

    cfg = _apply_variant({**DEFAULTS, **config}, variant)
    if cfg["path"] == "trainer":
        return _run_trainer(cfg, variant, ctx)
    t0 = time.perf_counter()
    if ctx.get("device", "cpu") == "cuda":
        device = torch.device("cuda", ctx.get("local_rank", 0))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    rank = ctx.get("rank", 0)

    model = compat.tiny_llama(
        hidden=cfg["hidden"], layers=cfg["layers"], vocab=cfg["vocab"], dtype=cfg["load_dtype"], seed=0
    )
    model.config.use_cache = False
    model.to(device)
    ckpt_api = None
    if cfg["ckpt_impl"] == "hf":
        ckpt_api = compat.enable_checkpointing(model, cfg["use_reentrant"])
    if cfg["input_grads"]:
        model.enable_input_require_grads()

    layers_to_transform = None if cfg["adapter_layers"] == "all" else [cfg["layers"] - 1]
    lora_config = LoraConfig(
        r=cfg["r"],
        lora_alpha=cfg["alpha"],
        lora_dropout=0.0,
        target_modules=_TARGETS[cfg["targets"]],
        use_dora=cfg["use_dora"],
        task_type="CAUSAL_LM",
        layers_to_transform=layers_to_transform,
    )
    peft_model = _get_peft_model(model, lora_config, cfg)
    peft_model.train()
    layers = list(_decoder_layers(peft_model))
    keep = _selected_layers(layers, cfg["ckpt_layers"])
    partial_mode = None
    if cfg["ckpt_impl"] == "hf" and cfg["ckpt_layers"] != "all":
        partial_mode = _partial_hf_checkpointing(peft_model, keep)

    policy = _wrap_policy(cfg["wrap"], peft_model)
    if cfg["fsdp"] == "fsdp1":
        wrapped, upcast = _prepare_fsdp1(peft_model, cfg, device, policy)
    else:
        wrapped, upcast = _prepare_fsdp2(peft_model, cfg, device, policy)
    if cfg["ckpt_impl"] == "fsdp_ac":
        _fsdp_activation_checkpointing(wrapped, cfg, policy, [layers[i] for i in keep])
    wrapped.train()

    params = [p for p in wrapped.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=0.0)
    before = _adapter_snapshot(wrapped, cfg["fsdp"])
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
            out = wrapped(input_ids=ids, labels=ids)
        loss = out.loss.float()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step_times.append(round(time.perf_counter() - ts, 4))

    after = _adapter_snapshot(wrapped, cfg["fsdp"])
    changed = sorted(k for k in after if k in before and not torch.equal(before[k], after[k]))
    unchanged = sorted(k for k in after if k in before and k not in changed)
    trainable_dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params})
    loss_t = torch.tensor(losses, dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(loss_t)
        loss_t /= dist.get_world_size()
    metrics = {
        "losses": [round(x, 5) for x in loss_t.tolist()],
        "adapter_tensors": len(after),
        "adapter_tensors_changed": len(changed),
        "unchanged_sample": unchanged[:4],
        "fsdp_params_upcast": upcast,
        "trainable_dtypes": trainable_dtypes,
        "ckpt_api": ckpt_api or cfg["ckpt_impl"],
        "partial_mode": partial_mode,
        "step_s": step_times,
        "run_s": round(time.perf_counter() - t0, 3),
    }
    path = f"{cfg['fsdp']}-manual/{cfg['ckpt_impl']}"

    del optimizer, params, wrapped, peft_model, model, before, after
    gc.collect()

    if not all(torch.isfinite(loss_t).tolist()):
        raise compat.CheckFailed("loss_finite", f"losses {metrics['losses']}", metrics=metrics)
    if metrics["adapter_tensors"] == 0 or unchanged:
        raise compat.CheckFailed(
            "adapters_changed",
            f"{len(unchanged)} of {metrics['adapter_tensors']} adapter tensors unchanged after "
            f"{cfg['steps']} steps, e.g. {unchanged[:3]}",
            metrics=metrics,
        )
    return {"metrics": metrics, "path": path}


# ------------------------------------------------------------------------------------------ Trainer path

#: What the Trainer path can express: the rest are knobs accelerate sets for the user.
_TRAINER_FIXES = {"use_reentrant", "input_grads", "flip_use_orig_params", "fsdp2", "uniform_dtype"}


def _fsdp_that_ran(trainer) -> str:
    """Which FSDP the Trainer really used: transformers 5.x defaults to FSDP2, 4.4x ignores `version`."""
    import torch.distributed.fsdp as fsdp

    wrapped = getattr(trainer, "model_wrapped", None)
    if wrapped is None:
        return "not-wrapped"
    modules = list(wrapped.modules())
    if any(isinstance(m, fsdp.FullyShardedDataParallel) for m in modules):
        return "fsdp1"
    fsdp2_module = getattr(fsdp, "FSDPModule", None)
    if fsdp2_module is not None and any(isinstance(m, fsdp2_module) for m in modules):
        return "fsdp2"
    return "not-wrapped"


def _label_fsdp(exc: BaseException, trainer, cfg: dict) -> None:
    """A failed run still says which FSDP it ran; an FSDP2 request the stack ignored is not applicable."""
    ran = _fsdp_that_ran(trainer)
    if cfg["fsdp"] == "fsdp2" and ran == "fsdp1":
        raise compat.NotApplicable("this stack ignores fsdp_config version=2 and runs FSDP1") from exc
    try:
        exc.path = f"trainer-{ran}"
    except AttributeError:
        pass


class _TokenDataset:
    """Random token batches as a map-style dataset (no datasets package, no hub)."""

    def __init__(self, cfg: dict, size: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(1234)
        self.rows = [torch.randint(0, cfg["vocab"], (cfg["seq"],), generator=gen) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.rows[index], "labels": self.rows[index].clone()}


def _run_trainer(cfg: dict, variant: str, ctx: dict) -> dict:
    """HF Trainer + accelerate FSDP, as in peft#1910 (SFTTrainer is a Trainer subclass)."""
    import math
    import os

    import torch
    from peft import LoraConfig
    from transformers import Trainer, TrainingArguments

    if ctx.get("device") != "cuda":
        raise compat.NotApplicable("HF Trainer refuses FSDP without an accelerator")
    unsupported = set(variant.split("+")) - {"baseline"} - _TRAINER_FIXES
    if unsupported:
        raise compat.NotApplicable(f"the Trainer path has no knob for {', '.join(sorted(unsupported))}")
    before_env = dict(os.environ)
    model = compat.tiny_llama(
        hidden=cfg["hidden"], layers=cfg["layers"], vocab=cfg["vocab"], dtype=cfg["load_dtype"], seed=0
    )
    model.config.use_cache = False
    if cfg["input_grads"]:
        model.enable_input_require_grads()
    lora_config = LoraConfig(
        r=cfg["r"],
        lora_alpha=cfg["alpha"],
        lora_dropout=0.0,
        target_modules=_TARGETS[cfg["targets"]],
        use_dora=cfg["use_dora"],
        task_type="CAUSAL_LM",
    )
    peft_model = _get_peft_model(model, lora_config, cfg)
    fsdp_config = {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "use_orig_params": cfg["use_orig_params"]}
    if cfg["fsdp"] == "fsdp2":
        fsdp_config["version"] = 2
    kwargs = {} if cfg["use_reentrant"] is None else {"use_reentrant": cfg["use_reentrant"]}
    args = TrainingArguments(
        output_dir=ctx["workdir"],
        per_device_train_batch_size=cfg["batch"],
        max_steps=cfg["steps"],
        learning_rate=cfg["lr"],
        bf16=True,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs=kwargs,
        fsdp="full_shard auto_wrap",
        fsdp_config=fsdp_config,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = None
    try:
        trainer = Trainer(model=peft_model, args=args, train_dataset=_TokenDataset(cfg, cfg["batch"] * cfg["steps"]))
        try:
            result = trainer.train()
        except BaseException as exc:
            _label_fsdp(exc, trainer, cfg)
            raise
        ran = _fsdp_that_ran(trainer)
        if cfg["fsdp"] == "fsdp2" and ran != "fsdp2":
            raise compat.NotApplicable(f"this stack ignores fsdp_config version=2 and ran {ran}")
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        metrics = {
            "losses": [round(x, 5) for x in losses],
            "global_step": trainer.state.global_step,
            "train_loss": result.training_loss,
            "fsdp_that_ran": ran,
        }
        if not losses or not all(math.isfinite(x) for x in losses):
            raise compat.CheckFailed("finite_loss", f"losses {losses}", metrics)
        if trainer.state.global_step != cfg["steps"]:
            raise compat.CheckFailed("all_steps_ran", f"{trainer.state.global_step} of {cfg['steps']}", metrics)
        return {"metrics": metrics, "path": f"trainer-{ran}"}
    finally:
        # Trainer sets ACCELERATE_* variables and accelerate keeps process-wide state: undo both so the
        # next job in this worker starts clean.
        for key in set(os.environ) - set(before_env):
            del os.environ[key]
        try:
            from accelerate.state import AcceleratorState

            AcceleratorState._reset_state(True)
        except (ImportError, AttributeError):
            pass
        torch.cuda.empty_cache()
