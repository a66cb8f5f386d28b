"""FSDP1 and FSDP2 the way accelerate prepares them (accelerate `Accelerator.prepare_model`,
`utils/fsdp_utils.fsdp2_prepare_model`), mixed precision, activation checkpointing, gathered snapshots."""

from __future__ import annotations

from typing import Any

from scenarios import compat
from scenarios.kit import measured


def wrap_policy(kind: str, peft_model: Any) -> Any:
    """'peft': peft's fsdp_auto_wrap_policy (a unit per adapter module); 'decoder_layer': one unit per layer."""
    import functools

    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if kind == "peft":
        from peft.utils.other import fsdp_auto_wrap_policy

        return fsdp_auto_wrap_policy(peft_model)
    if kind != "decoder_layer":
        raise ValueError(f"unknown wrap policy {kind!r}")
    layer_cls = type(peft_model.get_base_model().model.layers[0])
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls})


def policy_selects(policy: Any, module: Any) -> bool:
    return bool(policy(module=module, recurse=False, nonwrapped_numel=0))


def mixed_precision(
    version: int, param: str | None, reduce: str | None, buffer: str | None, cast_forward_inputs: bool
) -> Any:
    """FSDP1 MixedPrecision or FSDP2 MixedPrecisionPolicy; None without a param dtype."""
    dt = compat.torch_dtype
    if param is None:
        return None
    if version == 1:
        from torch.distributed.fsdp import MixedPrecision

        return MixedPrecision(
            param_dtype=dt(param),
            reduce_dtype=dt(reduce) if reduce else None,
            buffer_dtype=dt(buffer) if buffer else None,
            cast_forward_inputs=bool(cast_forward_inputs),
        )
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy
    except ImportError:  # torch 2.4, 2.5
        fsdp2_api()
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=dt(param),
        reduce_dtype=dt(reduce) if reduce else None,
        cast_forward_inputs=bool(cast_forward_inputs),
    )


def shard(
    model: Any,
    kind: str,
    device: Any,
    policy: Any,
    mp: Any = None,
    use_orig_params: bool = False,
    upcast: bool = False,
) -> tuple[Any, int]:
    """(the sharded model, how many trainable params accelerate's fp32 upcast touched). `upcast`: accelerate
    upcasts low-precision trainable params to fp32 when mixed precision is on."""
    if kind not in ("fsdp1", "fsdp2"):
        raise ValueError(f"unknown fsdp kind {kind!r}")
    measured.note(fsdp_declared=kind, use_orig_params=bool(use_orig_params) if kind == "fsdp1" else None)
    if kind == "fsdp1":
        wrapped, count = _fsdp1(model, device, policy, mp, use_orig_params, upcast)
    else:
        wrapped, count = _fsdp2(model, device, policy, mp, upcast)
    # The FSDP that really wraps the model, and the dtypes FSDP holds. Quantization is measured where the base is
    # loaded (FSDP1 flattens the 4-bit weights into FlatParameter views; bitsandbytes restores their state from the
    # module at forward), so the sharded facts get their own prefix and never replace the load-time count.
    measured.note(fsdp=measured.fsdp_version(wrapped))
    measured.model(wrapped, prefix="sharded_")
    return wrapped, count


def _fsdp1(model: Any, device: Any, policy: Any, mp: Any, use_orig_params: bool, upcast: bool) -> tuple[Any, int]:
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    wrapped = FSDP(
        model,
        auto_wrap_policy=policy,
        mixed_precision=mp,
        use_orig_params=bool(use_orig_params),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=device,
        limit_all_gathers=True,
    )
    count = 0
    if mp is not None and upcast:
        for module in FSDP.fsdp_modules(wrapped):
            if not module._has_params:
                continue
            param = module._flat_param
            if param.dtype != torch.float32 and param.requires_grad:
                param.data = param.data.to(torch.float32)
                module._handle._orig_param_dtype = torch.float32
                count += 1
    return wrapped, count


def fsdp2_api() -> tuple[Any, Any]:
    """(FSDPModule, fully_shard) where this torch has them; FSDP2 does not exist before torch 2.4, so a
    variant that asks for it is not applicable there (a skip with the reason, not a failure)."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError:
        try:  # torch 2.4, 2.5
            from torch.distributed._composable.fsdp import FSDPModule, fully_shard
        except ImportError:
            import torch

            raise compat.NotApplicable(f"FSDP2 (fully_shard) needs torch >= 2.4, this is {torch.__version__}") from None
    return FSDPModule, fully_shard


def _fsdp2(model: Any, device: Any, policy: Any, mp: Any, upcast: bool) -> tuple[Any, int]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    FSDPModule, fully_shard = fsdp2_api()

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mp is not None:
        kwargs["mp_policy"] = mp
    count = 0
    if mp is not None and upcast:
        for param in model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.to(torch.float32)
                count += 1
    # FSDP2 groups need one dtype per group; bottom-up like accelerate's fsdp2_prepare_model.
    modules = list(model.modules())
    for module in reversed(modules[1:]):
        if policy_selects(policy, module) and not isinstance(module, FSDPModule):
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model, count


def activation_checkpointing(model: Any, policy: Any, reentrant: bool, only: list[Any] | None = None) -> None:
    """accelerate's fsdp_activation_checkpointing: a checkpoint_wrapper on every module the wrap policy selects
    (or on the raw modules in `only`), inside the FSDP unit."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    keep_ids = {id(layer) for layer in only or []}

    def check_fn(module: Any) -> bool:
        # Like accelerate, test the raw modules (FSDP1 wrappers are not selected).
        if only is not None:
            return id(module) in keep_ids
        return policy_selects(policy, module)

    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=impl), check_fn=check_fn
    )


def adapter_snapshot(model: Any, kind: str) -> dict[str, Any]:
    """Full (unsharded) fp32 copies of every trainable or adapter tensor, by clean name. Collective: every
    rank calls it."""
    import torch

    out = {}
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(model, writeback=False, rank0_only=False):
            for name, param in model.named_parameters():
                if param.requires_grad or "lora_" in name:
                    out[clean_name(name)] = param.detach().float().clone()
        return out
    for name, param in model.named_parameters():
        if param.requires_grad or "lora_" in name:
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            out[clean_name(name)] = full.detach().float().clone()
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def clean_name(name: str) -> str:
    """A parameter's name without the wrappers FSDP, checkpointing and torch.compile put around modules."""
    for junk in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(junk, "")
    return name


def fsdp_that_ran(wrapped: Any) -> str:
    """Which FSDP really wraps a model: transformers 5.x defaults to FSDP2, 4.4x ignores `version`."""
    return (measured.fsdp_version(wrapped) if wrapped is not None else None) or "not-wrapped"
