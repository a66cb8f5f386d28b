"""Training identities (S9): what a training run must compute, against a reference computed by hand in float64.

A silent failure trains, logs a fine loss, and applies the wrong update. Each identity here compares what a run did
with the same quantity computed from the formulas (the summed cross-entropy over the predicted tokens, after the
causal shift, divided by their number; SGD's and AdamW's update rules), in float64, from the same starting weights and
the same rows, and every comparison carries three numbers:

- `discrepancy`: the largest absolute difference between the run and the reference;
- `update_scale`: the largest absolute entry of the reference's update (or of what the adapter changes, for outputs);
- `floor`: the same hand computation in float32 against float64, the round-off a correct run cannot avoid.

`off_by` is discrepancy / scale ("off by 0.39x the update"); the tolerance is FLOOR_MARGIN times the floor. Measured
on correct stacks, runs land at 0.5 to 2 floors; wrong ones at 0.125 to 16 times the update, 5 to 7 orders above.
The stack is imported inside functions only (the orchestrator imports scenarios to read their specs).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from scenarios import compat
from scenarios.compat import CheckFailed
from scenarios.kit import measured

#: A run is within the identity while its discrepancy is at most this many round-off floors.
FLOOR_MARGIN = 50.0
#: One SGD step of lr 1 makes the update the gradient itself (fp32, no momentum, no clipping, no decay).
SGD_LR = 1.0
#: Rows of different lengths, so a mean of per-micro-batch (or per-rank) means differs from the token mean.
LENGTHS = (16, 4, 10, 2)
SEQ = 16
PEFT_SEED = 5


def build_model(config: dict[str, Any]) -> Any:
    """The config's tiny Llama (fp32, seed 0) with a LoRA or DoRA adapter (`adapter`), or fully trainable
    (`adapter = "none"`, the full fine-tune control). The adapter's random init is seeded, so every process that
    builds the same config gets the same weights."""
    import torch
    from peft import get_peft_model

    from scenarios.kit.adapters import lora_config
    from scenarios.kit.models import tiny_llama

    model = tiny_llama(hidden=config.get("hidden", 64), layers=config.get("layers", 2), vocab=config.get("vocab", 128))
    if config["adapter"] == "none":
        measured.note(adapter="none (full fine-tune)")
        return model
    torch.manual_seed(PEFT_SEED)
    extra = {"use_rslora": True} if config.get("use_rslora") else {}  # only when asked: older peft has no such field
    lora = lora_config(config.get("r", 8), config.get("alpha", 8), config.get("targets", "qv"),
                       use_dora=config["adapter"] == "dora", **extra)  # fmt: skip
    model = get_peft_model(model, lora)
    model.train()
    measured.note(adapter=config["adapter"])
    return model


def rows(config: dict[str, Any], count: int | None = None, mask_first: bool = False) -> list[dict[str, Any]]:
    """Token rows with labels; a row of length L has L label tokens, then padding labelled -100 (attention mask 0).
    `mask_first`: the first label of every row is -100 too (it is never predicted: the causal shift drops it)."""
    import torch

    lengths = list(config.get("lengths", LENGTHS))
    if count is not None:
        lengths = (lengths * (count // len(lengths) + 1))[:count]
    vocab = config.get("vocab", 128)
    gen = torch.Generator().manual_seed(int(config.get("data_seed", 1)))
    out = []
    for length in lengths:
        ids = torch.randint(0, vocab, (SEQ,), generator=gen)
        labels = ids.clone()
        labels[length:] = -100
        if mask_first:
            labels[0] = -100
        mask = torch.ones(SEQ, dtype=torch.long)
        mask[length:] = 0
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def stacked(batch_rows: list[dict[str, Any]], device: Any = "cpu") -> dict[str, Any]:
    import torch

    return {k: torch.stack([r[k] for r in batch_rows]).to(device) for k in batch_rows[0]}


def token_loss_sum(logits: Any, labels: Any, smoothing: float = 0.0) -> tuple[Any, Any]:
    """(summed cross-entropy over the predicted tokens, their number): the hand formula. Position t predicts label
    t+1; a label of -100 is not predicted. With label smoothing e, a token's loss is (1 - e) * nll + e * the mean
    over the vocabulary of -log p (torch's and the Trainer's definition)."""
    import torch

    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    target = labels[:, 1:].to(logits.device)
    keep = target.ne(-100)
    nll = -log_probs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    per_token = (1.0 - smoothing) * nll + smoothing * (-log_probs.mean(dim=-1)) if smoothing else nll
    return per_token[keep].sum(), keep.sum()


def trainable(model: Any) -> dict[str, Any]:
    """fp32 CPU copies of the trainable parameters, by name (wrappers' name parts removed)."""
    from scenarios.kit.fsdp import clean_name

    return {clean_name(n): p.detach().float().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {name: after[name] - before[name] for name in before if name in after}


def sgd_reference(model: Any, batch_rows: list[dict[str, Any]], smoothing: float, dtype: str) -> dict[str, Any]:
    """The update one SGD step of lr SGD_LR makes on the token mean of `batch_rows`, computed by hand on a copy of
    `model` in `dtype` (CPU): -lr * d(summed token loss / token count)/d(param)."""
    import torch

    copy_ = copy.deepcopy(model).to("cpu", compat.torch_dtype(dtype))
    copy_.train()
    batch = stacked(batch_rows)
    logits = copy_(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    total, count = token_loss_sum(logits, batch["labels"], smoothing)
    (total / count).backward()
    with torch.no_grad():
        return {name: -SGD_LR * p.grad.detach().double().clone() for name, p in _named_trainable(copy_)}


def adamw_reference(model: Any, batch_rows: list[dict[str, Any]], steps: int, lr: float, dtype: str) -> dict[str, Any]:
    """The trainable parameters after `steps` full-batch AdamW steps (betas 0.9/0.999, eps 1e-8, no weight decay, no
    clipping) with the Trainer's linear schedule (no warmup: step t uses lr * (steps - t) / steps, t from 0) on the
    token mean of `batch_rows`, by hand in `dtype` on CPU."""
    import torch

    copy_ = copy.deepcopy(model).to("cpu", compat.torch_dtype(dtype))
    copy_.train()
    params = dict(_named_trainable(copy_))
    moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
    batch = stacked(batch_rows)
    for t in range(steps):
        copy_.zero_grad(set_to_none=True)
        logits = copy_(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        total, count = token_loss_sum(logits, batch["labels"])
        (total / count).backward()
        rate = lr * (steps - t) / steps
        with torch.no_grad():
            for name, param in params.items():
                m, v = moments[name]
                m.mul_(0.9).add_(param.grad, alpha=0.1)
                v.mul_(0.999).addcmul_(param.grad, param.grad, value=0.001)
                denom = (v.sqrt() / (1 - 0.999 ** (t + 1)) ** 0.5).add_(1e-8)
                param.addcdiv_(m, denom, value=-rate / (1 - 0.9 ** (t + 1)))
    return {name: p.detach().double().clone() for name, p in params.items()}


def train_adamw(model: Any, batch: list[dict[str, Any]], steps: int, lr: float) -> Any:
    """`steps` plain AdamW steps (no weight decay) on the whole of `batch`, then eval mode: what moves an adapter off
    its initial values before a merge is checked."""
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    every = stacked(batch)
    for _ in range(steps):
        optimizer.zero_grad()
        model(**every).loss.backward()
        optimizer.step()
    model.eval()
    return model


def _named_trainable(model: Any) -> list[tuple[str, Any]]:
    from scenarios.kit.fsdp import clean_name

    return [(clean_name(n), p) for n, p in model.named_parameters() if p.requires_grad]


def compare(
    run: dict[str, Any],
    reference: dict[str, Any],
    rounded: dict[str, Any],
    scale_of: dict[str, Any],
    rounded_of: dict[str, Any] | None = None,
    floor_at_least: float = 0.0,
) -> dict:
    """How far `run` is from the float64 `reference` (by name), against the round-off floor (`rounded`: the same hand
    computation in float32, or the float32 computation of `rounded_of` where that is what ran in float32; at least
    `floor_at_least` where the run rounded at another computation's scale too) and the size of what is compared
    (`scale_of`: the reference update, or the adapter's effect). Every name of the reference must be in the run: a
    missing one is a bug of the scenario, not a result."""
    missing = sorted(set(reference) - set(run))
    if missing:
        raise RuntimeError(f"the run has no {missing[:3]} ({len(missing)} of {len(reference)} compared tensors)")
    discrepancy = max(float((run[n].double() - reference[n]).abs().max()) for n in reference)
    exact = reference if rounded_of is None else rounded_of
    floor = max(floor_at_least, *(float((rounded[n].double() - exact[n]).abs().max()) for n in reference))
    scale = max(float(scale_of[n].double().abs().max()) for n in scale_of)
    if scale == 0.0:
        raise RuntimeError("the reference changes nothing: this identity cannot tell a right run from a wrong one")
    return {
        "discrepancy": discrepancy,
        "update_scale": scale,
        "floor": floor,
        "tolerance": FLOOR_MARGIN * max(floor, 1e-12 * scale),
        "off_by": discrepancy / scale,
    }


def holds(comparison: dict[str, Any]) -> bool:
    return comparison["discrepancy"] <= comparison["tolerance"]


def agree(a: dict[str, Any], b: dict[str, Any], comparison: dict[str, Any]) -> bool:
    """Two runs' results agree within the comparison's tolerance (the same failure, not two)."""
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a) <= comparison["tolerance"]


def describe(comparison: dict[str, Any], what: str, of: str = "the update") -> str:
    return (
        f"{what} is off the float64 hand reference by {comparison['off_by']:.3g}x {of} (max |diff| "
        f"{comparison['discrepancy']:.3g}, size {comparison['update_scale']:.3g}, round-off floor "
        f"{comparison['floor']:.3g}, tolerance {comparison['tolerance']:.3g})"
    )


def fail(check: str, comparison: dict[str, Any], what: str, metrics: dict[str, Any], of: str = "the update") -> None:
    """Raise the identity's failure with the numbers a reader needs; `metrics` carries every leg's comparison."""
    raise CheckFailed(check, describe(comparison, what, of), rounded({**metrics, **comparison}))


def rounded(metrics: dict[str, Any]) -> dict[str, Any]:
    """Comparisons made short for a record (4 significant digits)."""
    return {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in metrics.items()}


def trainer_job(body: Any, config: dict[str, Any], variant: str, fixes: tuple[str, ...], ctx: dict[str, Any]) -> Any:
    """A job of a Trainer scenario: measure what ran, read the variant's fixes, and put accelerate's state and the
    environment back afterwards, whatever happened (one warm worker runs many Trainer jobs)."""
    from scenarios.compat import parse_variant
    from scenarios.kit import trainer as trainer_path

    measured.start(ctx)
    chosen = parse_variant(variant, fixes)
    environ = dict(os.environ)
    try:
        return body(config, chosen, ctx)
    finally:
        trainer_path.reset(environ)


# --- the HF Trainer, one SGD step ----------------------------------------------------------------------------


class ListDataset:
    """A map-style dataset over prepared rows (no datasets package)."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


def trainer_arguments(output_dir: str, device: str, **kwargs: Any) -> Any:
    """TrainingArguments for an exact identity: the kit's quiet arguments, no clipping, no decay, seeded; CPU runs
    with `use_cpu=True` (under torchrun that is DDP over gloo, accelerate's MULTI_CPU)."""
    from scenarios.kit import trainer as trainer_path

    base = {"max_grad_norm": 0.0, "weight_decay": 0.0, "seed": 0}
    # On transformers 4.4x, use_cpu=True swaps DeepSpeed for DDP without a word; 5.x needs it on CPU and still runs
    # DeepSpeed (as S4 measured). The engine that ran is checked after training either way.
    old_deepspeed = "deepspeed" in kwargs and compat.version_tuple(compat.version_of("transformers")) < (5,)
    if device == "cpu" and not old_deepspeed:
        base["use_cpu"] = True
    return trainer_path.training_arguments(output_dir, **(base | kwargs))


def trainer_sgd_update(
    model: Any,
    batch_rows: list[dict[str, Any]],
    ctx: dict[str, Any],
    per_device: int,
    accumulation: int = 1,
    smoothing: float = 0.0,
    loss_func: Any = None,
    **extra: Any,
) -> tuple[dict[str, Any], Any]:
    """(the update one Trainer step applies, the trainer): SGD of lr SGD_LR, constant schedule, `max_steps=1` over
    exactly one global batch of `batch_rows`. `loss_func` goes to `compute_loss_func` (transformers 4.46+)."""
    from transformers import Trainer, default_data_collator

    before = trainable(model)
    args = trainer_arguments(
        os.path.join(ctx["workdir"], "trainer"), ctx.get("device", "cpu"),
        per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation, max_steps=1,
        learning_rate=SGD_LR, optim="sgd", lr_scheduler_type="constant", label_smoothing_factor=smoothing, **extra,
    )  # fmt: skip
    kwargs = {"compute_loss_func": loss_func} if loss_func is not None else {}
    trainer = Trainer(
        model=model, args=args, train_dataset=ListDataset(batch_rows), data_collator=default_data_collator, **kwargs
    )
    measured.trainer(trainer)
    trainer.train()
    return difference(trainable(model), before), trainer


def window_token_mean_loss(smoothing: float) -> Any:
    """A `compute_loss_func` that sums the token loss and divides by the Trainer's `num_items_in_batch` (the label
    tokens of the whole accumulation window, across ranks where the Trainer averages them): the Trainer's own hook
    for a loss of its user's making."""

    def loss_func(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
        total, count = token_loss_sum(outputs.logits.float(), labels, smoothing)
        denominator = num_items_in_batch if num_items_in_batch is not None else count
        return total / denominator

    return loss_func


def has_training_argument(name: str) -> bool:
    from dataclasses import fields

    from transformers import TrainingArguments

    return name in {f.name for f in fields(TrainingArguments)}


def require_transformers(minimum: tuple[int, ...], what: str) -> None:
    version = compat.version_of("transformers")
    if compat.version_tuple(version) < minimum:
        wanted = ".".join(map(str, minimum))
        raise compat.NotApplicable(f"transformers {version} has no {what} (it came in {wanted})")


# --- a leg in fresh processes ---------------------------------------------------------------------------------

#: What torchrun and accelerate put in a rank's environment: a fresh process group must not inherit them.
_LAUNCH_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)  # fmt: skip


def in_fresh_process(
    target: Any,
    payload: dict[str, Any],
    ctx: dict[str, Any],
    rank: int = 0,
    world: int = 1,
    store: str = "",
    timeout_s: float = 240.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run `target(payload, child_ctx)` in a new process (spawned: nothing of this one's stack state, accelerate
    state or process group), as rank `rank` of a new group of `world` processes that meet through the file `store`
    (a path no process has created yet, on a folder every rank sees; no port to race for), or with no group (world
    1), on this rank's device only; `env`: variables the new process starts with (PYTHONHASHSEED: a set's order).
    Returns what it returned; its exception comes back as a RuntimeError."""
    import multiprocessing

    os.makedirs(ctx["workdir"], exist_ok=True)
    result_path = os.path.join(ctx["workdir"], f"fresh-{os.getpid()}-{rank}-{len(os.listdir(ctx['workdir']))}.json")
    child_ctx = {"device": ctx.get("device", "cpu"), "rank": rank, "local_rank": 0, "world_size": world,
                 "workdir": os.path.join(ctx["workdir"], f"fresh-rank{rank}"), "store": store}  # fmt: skip
    saved = dict(os.environ)
    try:
        for name in _LAUNCH_VARIABLES:
            os.environ.pop(name, None)
        for name in [k for k in os.environ if k.startswith("ACCELERATE_") or k.startswith("FSDP_")]:
            os.environ.pop(name, None)
        if ctx.get("device") == "cuda":  # one GPU: a Trainer that sees several wraps the model in DataParallel
            visible = saved.get("CUDA_VISIBLE_DEVICES")
            devices = visible.split(",") if visible else [str(i) for i in range(64)]
            os.environ["CUDA_VISIBLE_DEVICES"] = devices[int(ctx.get("local_rank", 0))]
        if world > 1:  # what torchrun would set: accelerate and the Trainer read the ranks from the environment
            group = {"RANK": rank, "LOCAL_RANK": 0, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world}
            os.environ.update({k: str(v) for k, v in group.items()})
        os.environ.update(env or {})
        child = multiprocessing.get_context("spawn").Process(
            target=_child, args=(target, payload, child_ctx, result_path)
        )
        child.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    child.join(timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        raise RuntimeError(f"a fresh process (rank {rank} of {world}) did not finish in {timeout_s:.0f} s")
    if not os.path.isfile(result_path):
        raise RuntimeError(f"a fresh process (rank {rank} of {world}) died with exit code {child.exitcode}")
    with open(result_path) as handle:
        result = json.load(handle)
    if "error" in result:
        raise RuntimeError(f"in a fresh process (rank {rank} of {world}): {result['error']}")
    return result


def _child(target: Any, payload: dict[str, Any], ctx: dict[str, Any], result_path: str) -> None:
    import traceback

    try:
        os.makedirs(ctx["workdir"], exist_ok=True)
        if ctx["world_size"] > 1:
            _start_group(ctx)
        result = target(payload, ctx)
    except BaseException as exc:  # the parent names it
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        result = {"error": text[-1500:], "traceback": traceback.format_exc()[-3000:]}
    with open(result_path, "w") as handle:
        json.dump(result, handle)


def _start_group(ctx: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    meet = {"init_method": f"file://{ctx['store']}", "rank": ctx["rank"], "world_size": ctx["world_size"]}
    if ctx.get("device") == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", 0), **meet)
    else:
        dist.init_process_group("gloo", **meet)


def tensors_to_file(tensors: dict[str, Any], path: str) -> str:
    import torch

    torch.save({k: v.detach().cpu() for k, v in tensors.items()}, path)
    return path


def tensors_from_file(path: str) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=False)


# --- the Trainer's distributed engines ------------------------------------------------------------------------

ENGINES = ("ddp", "fsdp1", "fsdp2", "zero3")


def engine_arguments(engine: str, ctx: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments that ask for `engine` the way users ask: nothing for DDP (torchrun alone); `fsdp="full_shard
    auto_wrap"` with the decoder layer to wrap and the FSDP version (GPUs only: on CPU the Trainer ignores `fsdp=`);
    a ZeRO-3 config with the Trainer's "auto" values."""
    if engine == "ddp":
        return {}
    if engine in ("fsdp1", "fsdp2"):
        measured.require(ctx.get("device") == "cuda", "the Trainer runs FSDP on GPUs only (on CPU it trains with DDP)")
        config = {
            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
            "use_orig_params": True,
            "version": 2 if engine == "fsdp2" else 1,
        }
        return {"fsdp": "full_shard auto_wrap", "fsdp_config": config}
    if engine == "zero3":
        from scenarios.kit import zero

        return {"deepspeed": zero.ds_config(3, "float32", 0, trainer=True)}
    raise ValueError(f"unknown engine {engine!r}")


def require_engine(trainer: Any, engine: str) -> None:
    """The engine that really trained (after `train()`): a run on another one is no evidence (not applicable)."""
    from scenarios.kit import fsdp

    wrapped = getattr(trainer, "model_wrapped", None)
    if engine in ("fsdp1", "fsdp2"):
        ran = fsdp.fsdp_that_ran(wrapped)
        measured.note(fsdp=ran if ran != "not-wrapped" else None)
        measured.require(ran == engine, f"the config declared {engine}, {ran} ran")
    elif engine == "zero3":
        import deepspeed

        measured.require(isinstance(wrapped, deepspeed.DeepSpeedEngine), "the Trainer did not train with DeepSpeed")
        measured.note(zero_stage=int(wrapped.zero_optimization_stage()))
        measured.require(wrapped.zero_optimization_stage() == 3, "DeepSpeed ran another ZeRO stage than 3")
    else:
        kind = str(getattr(trainer.accelerator.state, "distributed_type", "")).rsplit(".", 1)[-1]
        measured.require(kind in ("MULTI_CPU", "MULTI_GPU"), f"the Trainer distributed as {kind}, not DDP")


def engine_snapshot(trainer: Any, engine: str) -> dict[str, Any]:
    """Full fp32 copies of the trainable parameters as the engine holds them after training (gathered from the
    shards under FSDP and ZeRO-3; a collective there: every rank calls it)."""
    from scenarios.kit import fsdp

    if engine in ("fsdp1", "fsdp2"):
        return {k: v.cpu() for k, v in fsdp.adapter_snapshot(trainer.model_wrapped, engine).items()}
    if engine == "zero3":
        from scenarios.kit import zero

        return zero.gathered_snapshot(
            [(fsdp.clean_name(n), p) for n, p in trainer.model.named_parameters() if p.requires_grad]
        )
    return trainable(trainer.model)


def broadcast_tensors(tensors: dict[str, Any] | None) -> dict[str, Any]:
    """Rank 0's tensors on every rank (CPU copies, through the object channel)."""
    import torch.distributed as dist

    holder = [tensors]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
