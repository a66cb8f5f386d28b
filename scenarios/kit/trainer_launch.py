"""The HF Trainer + FSDP path as training scripts start it: who starts the process group, in which order the
model and the TrainingArguments are made, then a few Trainer steps under FSDP.

The runtime starts no process group for a scenario that declares `"process_group": "scenario"`: this module
starts it the way the config says (as a user's script does) and ends it after the job, so each job meets the
stack exactly as a fresh `torchrun script.py` would.

Launches (what users write at the top of a training script):

* ``trainer``: nothing; the Trainer (accelerate's PartialState, from the TrainingArguments) starts it.
* ``script_nccl``: ``torch.distributed.init_process_group("nccl")`` before anything else, no device set: NCCL
  only (gloo on CPU), the form most scripts copy.
* ``script_device``: ``torch.cuda.set_device(local_rank)`` and ``init_process_group(..., device_id=...)``.
* ``accelerate_launch``: the environment ``accelerate launch --use_fsdp ...`` gives the script (accelerate's own
  ``prepare_multi_gpu_env`` over its own launch parser), and no ``fsdp=`` in the TrainingArguments.
* ``deepspeed_init``: ``deepspeed.init_distributed()`` first (scripts shared between DeepSpeed and FSDP runs).
"""

from __future__ import annotations

import os
from typing import Any

from scenarios import compat
from scenarios.kit import measured
from scenarios.kit.adapters import target_modules
from scenarios.kit.models import dtype_kwarg, save_by_hand, tiny_llama
from scenarios.kit.trainer import QUIET, logged_losses, reset

LAUNCHES = ("script_nccl", "trainer", "script_device", "accelerate_launch", "deepspeed_init")
ORDERS = ("model_first", "args_first")
CHECKPOINTING = ("reentrant", "off", "default", "non_reentrant")
DATASETS = ("torch_dataset", "list")
WRAPS = ("decoder_layer", "default")


def start_process_group(launch: str, ctx: dict[str, Any]) -> None:
    """The script's own first lines, before TrainingArguments (`trainer` and `accelerate_launch` start none)."""
    import torch
    import torch.distributed as dist

    cuda = ctx.get("device") == "cuda"
    local_rank = int(ctx.get("local_rank", 0))
    if launch == "script_nccl":
        dist.init_process_group("nccl" if cuda else "gloo")
    elif launch == "script_device":
        if cuda:
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        else:
            dist.init_process_group("gloo")
    elif launch == "script_gloo_nccl":  # what this harness's own worker starts: a CPU backend beside NCCL
        if cuda:
            torch.cuda.set_device(local_rank)
            dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", local_rank))
        else:
            dist.init_process_group("gloo")
    elif launch == "deepspeed_init":
        measured.require(compat.version_of("deepspeed") is not None, "deepspeed is not installed in this cell")
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    elif launch == "accelerate_launch":
        os.environ.update(accelerate_launch_env(ctx))
    elif launch != "trainer":
        raise ValueError(f"unknown launch {launch!r}")


def end_process_group() -> None:
    """What the end of a script does to its process group: nothing is left for the next job of this worker."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def accelerate_launch_env(ctx: dict[str, Any]) -> dict[str, str]:
    """The ACCELERATE_*/FSDP_* variables `accelerate launch --use_fsdp ...` sets for the script, from accelerate's
    own launch parser and `prepare_multi_gpu_env` (torchrun already set RANK, WORLD_SIZE and MASTER_*)."""
    try:
        from accelerate.commands.launch import launch_command_parser
        from accelerate.utils.launch import prepare_multi_gpu_env
    except ImportError as exc:
        raise compat.NotApplicable(f"accelerate {compat.version_of('accelerate')} has no launch API: {exc}") from exc
    flags = [
        "--use_fsdp",
        "--num_processes", str(ctx.get("world_size", 2)),
        "--fsdp_sharding_strategy", "FULL_SHARD",
        "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
        "--fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer",
        "--fsdp_use_orig_params", "false",
        "--fsdp_cpu_ram_efficient_loading", "true",
        "--fsdp_sync_module_states", "true",
        "--mixed_precision", "bf16" if ctx.get("device") == "cuda" else "no",
        "script.py",
    ]  # fmt: skip
    try:
        args = launch_command_parser().parse_args(flags)
    except SystemExit as exc:
        raise compat.NotApplicable(f"accelerate {compat.version_of('accelerate')} launch takes other flags") from exc
    try:  # what `accelerate launch` does next: fill every default its config file would (none here)
        from accelerate.commands.launch import _validate_launch_command

        validated = _validate_launch_command(args)
        args = validated[0] if isinstance(validated, tuple) else args
    except ImportError:
        pass
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def fsdp_arguments(cfg: dict[str, Any]) -> dict[str, Any]:
    """`fsdp=` and `fsdp_config=` as the peft docs' FSDP-QLoRA recipe writes them (none under accelerate launch,
    where the launcher's environment configures FSDP)."""
    if cfg["launch"] == "accelerate_launch":
        return {}
    config: dict[str, Any] = {
        "use_orig_params": cfg["use_orig_params"],
        "cpu_ram_efficient_loading": cfg["cpu_ram_efficient_loading"],
        "sync_module_states": cfg["cpu_ram_efficient_loading"],  # accelerate requires it with the former
    }
    if cfg["wrap"] == "decoder_layer":
        config["transformer_layer_cls_to_wrap"] = ["LlamaDecoderLayer"]
    return {"fsdp": "full_shard auto_wrap", "fsdp_config": config}


def checkpointing_arguments(ckpt: str) -> dict[str, Any]:
    """Gradient checkpointing under this release's own argument names (late 5.x: `activation_checkpointing`)."""
    from dataclasses import fields

    from transformers import TrainingArguments

    if ckpt == "off":
        return {}
    names = {f.name for f in fields(TrainingArguments)}
    prefix = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    kwargs = {"reentrant": {"use_reentrant": True}, "non_reentrant": {"use_reentrant": False}}.get(ckpt)
    return {prefix: True, **({f"{prefix}_kwargs": kwargs} if kwargs else {})}


def training_arguments(cfg: dict[str, Any], ctx: dict[str, Any], extra: dict[str, Any]) -> Any:
    from transformers import TrainingArguments

    cuda = ctx.get("device") == "cuda"
    return TrainingArguments(
        output_dir=os.path.join(ctx["workdir"], "out"),
        **QUIET,
        max_steps=cfg["steps"],
        per_device_train_batch_size=cfg["batch"],
        learning_rate=1e-3,
        bf16=cuda,
        **({} if cuda else {"use_cpu": True}),
        **checkpointing_arguments(cfg["ckpt"]),
        **fsdp_arguments(cfg),
        **extra,
    )


def load_model(cfg: dict[str, Any], ctx: dict[str, Any]) -> Any:
    """The tiny base written to this rank's workdir (every rank its own identical copy, by hand: transformers 5.x
    `save_pretrained` writes on rank 0 only once a process group is up), loaded the user's way: 4-bit nf4 with
    `bnb_4bit_quant_storage` = the compute dtype (what FSDP needs to flatten it), or in bf16."""
    import torch
    from transformers import LlamaForCausalLM

    directory = os.path.join(ctx["workdir"], "base")
    model = tiny_llama(cfg["hidden"], cfg["layers"], cfg["vocab"], "float32", 0, heads=cfg["heads"],
                       kv_heads=cfg["kv_heads"])  # fmt: skip
    save_by_hand(model, directory)
    del model
    dtype = torch.bfloat16
    kwargs: dict[str, Any] = dict(dtype_kwarg(dtype))
    if cfg.get("device_map_local") and ctx.get("device") == "cuda":
        kwargs["device_map"] = {"": int(ctx.get("local_rank", 0))}  # the fix: each rank loads onto its own GPU
    if cfg["quant"] == "4bit":
        measured.require(compat.version_of("bitsandbytes") is not None, "bitsandbytes is not installed in this cell")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True,
            bnb_4bit_quant_storage=dtype,
        )  # fmt: skip
        try:
            model = LlamaForCausalLM.from_pretrained(directory, **kwargs)
        except (RuntimeError, ImportError, ValueError) as exc:
            if ctx.get("device") == "cuda":
                raise
            measured.require(False, f"transformers {compat.version_of('transformers')} refuses 4-bit loading on cpu")
            raise AssertionError("unreachable") from exc
        facts = measured.model(model)
        measured.require(facts["quantized_weights"] > 0, "bitsandbytes quantized no weight here (4-bit base)")
    else:
        model = LlamaForCausalLM.from_pretrained(directory, **kwargs)
    model.config.use_cache = False
    return model


def peft_model(cfg: dict[str, Any], model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    targets = "all-linear" if cfg["targets"] == "all-linear" else target_modules(cfg["targets"])
    extra: dict[str, Any] = {"use_dora": True} if cfg["adapter"] == "dora" else {}
    if cfg["task_type"]:
        extra["task_type"] = cfg["task_type"]
    config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0, **extra)
    return get_peft_model(model, config)


def dataset(cfg: dict[str, Any]) -> Any:
    """Token rows as a list of dicts of lists (what `datasets.Dataset.to_list()` gives) or a torch Dataset."""
    import torch

    count = cfg["batch"] * cfg["steps"] * int(os.environ.get("WORLD_SIZE", "1")) * 2
    tokens = [[(i * 7 + j) % cfg["vocab"] for j in range(16)] for i in range(count)]
    rows = [{"input_ids": ids, "labels": list(ids)} for ids in tokens]
    if cfg["dataset"] == "list":
        return rows

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {k: torch.tensor(v) for k, v in rows[index].items()}

    return Rows()


def train(cfg: dict[str, Any], ctx: dict[str, Any], extra_args: dict[str, Any]) -> dict[str, Any]:
    """One script's run: start, model and arguments in the config's order, Trainer steps under FSDP. Ends the
    job as not applicable where the Trainer wrapped the model in something other than FSDP (accelerate applies no
    FSDP without an accelerator): such a run says nothing about FSDP."""
    environ_before = dict(os.environ)
    try:
        metrics = _train(cfg, ctx, extra_args)
    except compat.NotApplicable:
        # Every rank finds the setup cannot run here at the same point: the group ends, the worker goes on.
        end_process_group()
        reset(environ_before)
        raise
    except BaseException:
        # A failed job leaves its process group to the worker's restart: ending it here could wait on a peer
        # that is still inside a collective.
        reset(environ_before)
        raise
    end_process_group()
    reset(environ_before)
    return metrics


def _train(cfg: dict[str, Any], ctx: dict[str, Any], extra_args: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist
    from transformers import Trainer, TrainerCallback

    start_process_group(cfg["launch"], ctx)
    if cfg["order"] == "args_first":
        args = training_arguments(cfg, ctx, extra_args)
    model = peft_model(cfg, load_model(cfg, ctx))
    measured.model(model)
    if cfg["order"] == "model_first":
        args = training_arguments(cfg, ctx, extra_args)
    trainer = None

    class SayWhatWrapped(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            from scenarios.kit.fsdp import fsdp_that_ran

            ran = fsdp_that_ran(getattr(trainer, "model_wrapped", None))
            measured.note(fsdp=ran if ran != "not-wrapped" else None,
                          wrapper=type(getattr(trainer, "model_wrapped", None)).__name__)  # fmt: skip
            if dist.is_initialized():
                measured.note(world_size=dist.get_world_size())
            measured.require(ran != "not-wrapped", f"fsdp was declared, {_wrapper(trainer)} wraps the model")

    trainer = Trainer(model=model, args=args, train_dataset=dataset(cfg), callbacks=[SayWhatWrapped()])
    measured.trainer(trainer)
    result = trainer.train()
    losses = logged_losses(trainer)
    return {
        "losses": [round(x, 5) for x in losses],
        "global_step": trainer.state.global_step,
        "train_loss": result.training_loss,
        "process_group_backend": str(dist.get_backend()) if dist.is_initialized() else None,
    }


def _wrapper(trainer: Any) -> str:
    return type(getattr(trainer, "model_wrapped", None)).__name__
