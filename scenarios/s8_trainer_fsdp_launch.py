"""S8: a QLoRA (or LoRA) fine-tune through HF Trainer + FSDP at world size 2, started the way training scripts
start: the script's own `init_process_group("nccl")`, the Trainer's, `accelerate launch`, `deepspeed.init_distributed`.

Reported (issue 34 of this project, 2026-11-25, two H100s, torch 2.11 + transformers 5.24 + peft 0.21.2 +
bitsandbytes 0.50.2): such a run **hung at its first step** when the script started the process group itself, in
`all_gather_into_tensor` under accelerate's `gather` under `Trainer._get_num_items_in_batch`, and passed when the
Trainer started it. Upstream, the same gather of the step's token count fails loudly where the count is a CPU
tensor and the group has only NCCL: transformers#39896 ("Tensors must be CUDA and dense", 4.54.1) and #38035; it
became reachable by default when `average_tokens_across_devices` turned True (4.54.0) and transformers PR #40773
moved the count to the device first (4.57.0). The harness's own worker starts a `cpu:gloo,cuda:nccl` group, which
hides exactly this, so this scenario starts no group through the runtime (`"process_group": "scenario"`): each job
starts it as its config says and ends it.

The target is the run not getting past its first step because of how it was started, in the ways measured: the
reported hang in the first step's token-count gather (`timeout-in-token-count-gather`: the job's timeout, with every
rank's Python stack and the collective each waits in; a hang elsewhere is named by its place and is not the target);
the NCCL refusal of the gather; and, found on two H100s with the 2025-11-14 stack, `qlora-weights-on-another-device`:
a script that loads the 4-bit model before any device is set quantizes every rank's weights onto cuda:0, accelerate
refuses on rank 1 ("loaded in 8-bit or 4-bit precision on a different device", accelerate#1515) while rank 0, whose
weights are on its own GPU, goes on and waits for rank 1 until the job's time limit: a hang from one rank's error (the
reporter's rank 0 waited in the first step's token-count gather). torch's FSDP refuses the same misplacement with its
own words on some stacks (`fsdp-weights-on-another-device`, 2026-04-15). The config space is what users vary on this
path (`scenarios/kit/trainer_launch.py`): who starts the group, model before or after the TrainingArguments, QLoRA or
a bf16 LoRA base, LoRA or DoRA, targets as a list or `all-linear`, `task_type`, batch size, a list of dicts or a torch
Dataset, gradient checkpointing (off, the release's default, reentrant, non-reentrant), peft's wrap of the decoder
layers or transformers' default, `cpu_ram_efficient_loading` (with `sync_module_states`), `use_orig_params`, model
width, GQA and vocabulary. GPU only: on CPU accelerate applies no FSDP.
"""

from __future__ import annotations

from scenarios import compat
from scenarios.kit import checks, measured, strategies
from scenarios.kit import trainer_launch as launch

SPEC = {
    "id": "S8-trainer-fsdp-launch",
    "title": "QLoRA + FSDP through Trainer on several ranks, started as scripts start: a first step hangs or fails",
    "known_issues": [
        "huggingface/transformers#39896",
        "huggingface/transformers#38035",
        "huggingface/transformers#28791",
        "huggingface/transformers#25686",
    ],
    "world_size": 2,
    # accelerate applies FSDP only on an accelerator (on CPU it refuses, or a Trainer wraps DDP instead): a CPU run
    # would say nothing about this path, so CPU profiles skip it, saying why.
    "device": "cuda",
    # What every config of this scenario is, where a config does not say (the setup an advisory applies to).
    "setup": {"engine": "fsdp1", "loop": "trainer"},
    # bitsandbytes only for the 4-bit configs (they end as not applicable where it is missing): a day whose
    # bitsandbytes cannot load still runs the LoRA configs.
    "requires": ["torch", "transformers", "peft", "accelerate"],
    # The runtime starts no process group: the job starts it as the config's script does.
    "process_group": "scenario",
    # And each job runs in processes of its own, as a script does (the runtime's default for such a scenario, said
    # here because S8's outcomes depend on it): on 2 x H200 every hang of S8's jobs in a reused pair of processes
    # came at its second to fifth job, and whether the device was already set decided the device refusals.
    "one_job_per_process": True,
    # A hang is named by where its ranks wait (scenarios/failure_names.py HANG_PLACES): the target is the reported
    # one, in the first step's token-count gather; a hang creating the group or broadcasting weights at wrap time is
    # another failure, counted apart.
    "target": [
        "qlora-weights-on-another-device",
        "fsdp-weights-on-another-device",
        "gather-cpu-tensor-over-nccl",
        "timeout-in-token-count-gather",
    ],
    "controls": [{"launch": "trainer"}],
    "variants": {
        "baseline": ("baseline", "the config as drawn: what a user of this stack writes by default"),
        "trainer_starts_group": ("fix", "no init_process_group of the script's own: the Trainer starts the group"),
        "gloo_beside_nccl": ("fix", "init_process_group('cpu:gloo,cuda:nccl'): a CPU backend beside NCCL"),
        "set_device_first": ("fix", "torch.cuda.set_device(local_rank) and device_id= before init_process_group"),
        "device_map_local": ("fix", "from_pretrained(device_map={'': local_rank}): each rank loads onto its own GPU"),
        "no_token_averaging": ("fix", "TrainingArguments(average_tokens_across_devices=False): no token-count gather"),
        "use_orig_params": ("workaround", "fsdp_config use_orig_params=True"),
    },
}

#: The reported script: the peft docs' FSDP-QLoRA recipe with the script's own NCCL group, at a tiny size.
SEED = {
    "launch": "script_nccl",
    "order": "model_first",
    "quant": "4bit",
    "adapter": "lora",
    "targets": "all-linear",
    "task_type": "CAUSAL_LM",
    "batch": 1,
    "dataset": "torch_dataset",
    "ckpt": "reentrant",
    "wrap": "decoder_layer",
    "cpu_ram_efficient_loading": True,
    "use_orig_params": False,
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "kv_heads": 4,
    "vocab": 128,
    "steps": 2,
}

EXAMPLES: list[dict] = [
    dict(SEED),
    dict(SEED, launch="trainer"),  # the control: the same script without its own init
    dict(SEED, quant="none"),  # LoRA on a bf16 base: no bitsandbytes needed (older GPU days)
    dict(SEED, launch="accelerate_launch", order="args_first"),
]


def strategy():
    from hypothesis import strategies as st

    axis = strategies.axis
    return st.fixed_dictionaries(
        {
            "launch": axis(SEED, "launch", *[x for x in launch.LAUNCHES if x != SEED["launch"]]),
            "order": axis(SEED, "order", "args_first"),
            "quant": axis(SEED, "quant", "none"),
            "adapter": axis(SEED, "adapter", "dora"),
            "targets": axis(SEED, "targets", "qv"),
            "task_type": axis(SEED, "task_type", None),
            "batch": axis(SEED, "batch", 2),
            "dataset": axis(SEED, "dataset", "list"),
            "ckpt": axis(SEED, "ckpt", "off", "default", "non_reentrant"),
            "wrap": axis(SEED, "wrap", "default"),
            "cpu_ram_efficient_loading": axis(SEED, "cpu_ram_efficient_loading", False),
            "use_orig_params": axis(SEED, "use_orig_params", True),
            "hidden": axis(SEED, "hidden", 128),
            "layers": axis(SEED, "layers", 1),
            "heads": axis(SEED, "heads", 8),
            "kv_heads": axis(SEED, "kv_heads", 2),
            "vocab": axis(SEED, "vocab", 256),
            "steps": st.just(2),
        }
    )


def _apply_variant(cfg: dict, variant: str) -> tuple[dict, dict]:
    """The config and the extra TrainingArguments a variant runs with; a fix that changes nothing here is not
    applicable (it would only repeat the baseline)."""
    cfg, extra = dict(cfg), {}
    for fix in compat.parse_variant(variant, list(SPEC["variants"])[1:]):
        if fix == "trainer_starts_group":
            measured.require(cfg["launch"] != "trainer", "the Trainer starts the group in this config already")
            cfg["launch"] = "trainer"
        elif fix == "gloo_beside_nccl":
            measured.require(cfg["launch"] in ("script_nccl", "script_device"), "the script starts no group here")
            cfg["launch"] = "script_gloo_nccl"
        elif fix == "set_device_first":
            measured.require(cfg["launch"] == "script_nccl", "the script starts no device-less group here")
            cfg["launch"] = "script_device"
        elif fix == "device_map_local":
            cfg["device_map_local"] = True
        elif fix == "no_token_averaging":
            from dataclasses import fields

            from transformers import TrainingArguments

            names = {f.name for f in fields(TrainingArguments)}
            measured.require("average_tokens_across_devices" in names, "this Trainer does not average tokens")
            extra["average_tokens_across_devices"] = False
        elif fix == "use_orig_params":
            measured.require(not cfg["use_orig_params"], "use_orig_params is on in this config already")
            cfg["use_orig_params"] = True
    return cfg, extra


def run(config: dict, variant: str, ctx: dict) -> dict:
    measured.start(ctx)
    cfg, extra = _apply_variant(config, variant)
    measured.note(launch=cfg["launch"], order=cfg["order"])
    metrics = launch.train(cfg, ctx, extra)
    checks.finite_loss(metrics["losses"], metrics)
    checks.all_steps_ran(metrics["global_step"], cfg["steps"], metrics)
    return {"metrics": metrics, "path": f"trainer-{cfg['launch']}"}
