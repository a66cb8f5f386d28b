"""S3: LoRA with plain SGD, where the update "looks like lr * c * grad for an unknown c".

Upstream: huggingface/peft#1893 (closed as a usage question). The seed's user registered
`Tensor.register_hook` on every trainable parameter and compared the update with `lr * hook_grad`.
A hook sees the gradient *before* accumulation into `.grad` (pytorch#76464), and gradient
accumulation, clipping and GradScaler all change `.grad` between that hook and `optimizer.step()`.

The check is what must hold: the applied update equals `lr * .grad` read just before the step, the
LoRA scaling equals alpha/r (alpha/sqrt(r) with rsLoRA), and merged and unmerged forwards agree. The
factor `c` between the hook-observed gradient and the applied update is measured and reported, per
variant, so the table shows where the seed's "unknown c" comes from.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from scenarios import compat
from scenarios.compat import CheckFailed, parse_variant, torch_dtype
from scenarios.kit import measured
from scenarios.kit.adapters import ALL_LINEAR, lora_config
from scenarios.kit.models import tiny_llama

SPEC = {
    "id": "S3-lora-sgd-scaling",
    "title": "LoRA + SGD: applied update vs lr * grad, and the factor c a gradient hook sees",
    "known_issues": ["huggingface/peft#1893", "pytorch/pytorch#76464"],
    "world_size": 1,
    "setup": {"adapter": "lora", "loop": "hand"},
    "device": "any",
    "requires": ["torch", "transformers", "peft"],
    # Every variant is a measurement (not a fix), so drawn configs run them all, failing or not.
    "drawn_variants": "all",
    # A measurement, not a failure: the factor c between the gradient a hook sees and the applied update.
    "target": [],
    "controls": [],
    "variants": {
        "baseline": ("baseline", "the config as drawn: what a user of this stack writes by default"),
        "grad_accum": (
            "measurement",
            "gradients accumulated over 2 micro-batches of loss / 2 before optimizer.step(): each hook call sees "
            "1/2 of the applied gradient (c = 2 against the mean of the hook's gradients)",
        ),
        "grad_clip": ("measurement", "torch.nn.utils.clip_grad_norm_ before optimizer.step()"),
        "grad_scaler": ("measurement", "torch.amp.GradScaler: the hook sees scaled gradients"),
        "grad_accum+grad_clip": ("measurement", "accumulation and clipping together"),
    },
    # Metrics the table shows per variant.
    "table_metrics": ["c"],
}

FIXES = ("grad_accum", "grad_clip", "grad_scaler")
ACCUM_STEPS = 2
CLIP_NORM = 1e-3  # small enough that clipping always bites, so its c is visible
SCALER_INIT = 2.0**10


def strategy() -> st.SearchStrategy[dict[str, Any]]:
    """The config space: rank, alpha, rsLoRA, learning rate, dtype, targets, steps."""
    return st.fixed_dictionaries(
        {
            "r": st.sampled_from([1, 2, 4, 8, 16]),
            "lora_alpha": st.sampled_from([1, 8, 16, 32]),
            "use_rslora": st.booleans(),
            "lr": st.sampled_from([1.0, 0.1, 0.01]),
            "dtype": st.sampled_from(["float32", "bfloat16"]),
            "target_modules": st.lists(st.sampled_from(ALL_LINEAR), min_size=1, max_size=3, unique=True).map(sorted),
            "steps": st.integers(min_value=2, max_value=4),
            "hidden": st.sampled_from([32, 64]),
        }
    )


#: The seed's setting: rank = alpha = 16, lr = 1.0, so the expected scaling is exactly 1.
EXAMPLES = [
    {
        "r": 16,
        "lora_alpha": 16,
        "use_rslora": False,
        "lr": 1.0,
        "dtype": "float32",
        "target_modules": ["q_proj", "v_proj"],
        "steps": 3,
        "hidden": 64,
    },
]


def run(config: dict[str, Any], variant: str, ctx: dict[str, Any]) -> dict[str, Any]:
    measured.start(ctx)  # what really ran goes into the record's setup
    import torch
    from peft import get_peft_model

    fixes = parse_variant(variant, FIXES)
    device = torch.device(ctx["device"])
    dtype = torch_dtype(config["dtype"])
    model = tiny_llama(hidden=config["hidden"], dtype=config["dtype"], seed=0).to(device)
    lora = lora_config(
        config["r"], config["lora_alpha"], list(config["target_modules"]), use_rslora=config["use_rslora"]
    )
    model = get_peft_model(model, lora)
    model.train()

    expected_scaling = config["lora_alpha"] / (math.sqrt(config["r"]) if config["use_rslora"] else config["r"])
    scalings = _scalings(model)
    if not scalings or any(not math.isclose(s, expected_scaling, rel_tol=1e-6) for s in scalings):
        raise CheckFailed(
            "lora-scaling",
            f"expected {expected_scaling}, layers have {sorted(set(scalings))}",
            {"expected_scaling": expected_scaling, "scalings": sorted(set(scalings))},
        )

    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    # Every gradient each parameter's hook sees in a step, one per micro-batch: with accumulation the hook fires
    # once per backward, each time with the gradient of that micro-batch's loss / N (not only the last one).
    hook_grads: dict[str, list[torch.Tensor]] = {}
    handles = [p.register_hook(_saver(hook_grads, name)) for name, p in params.items()]  # the seed's hook
    optimizer = torch.optim.SGD(params.values(), lr=config["lr"])
    if "grad_scaler" in fixes and not hasattr(torch.amp, "GradScaler"):
        raise compat.NotApplicable(f"torch {torch.__version__} has no device-generic torch.amp.GradScaler (2.3+)")
    scaler = torch.amp.GradScaler(ctx["device"], init_scale=SCALER_INIT) if "grad_scaler" in fixes else None
    micro_batches = ACCUM_STEPS if "grad_accum" in fixes else 1
    generator = torch.Generator().manual_seed(1)

    c_per_step: list[float] = []
    worst_update_error = 0.0
    first_step_a_grad_zero = None
    for step in range(config["steps"]):
        optimizer.zero_grad(set_to_none=True)
        hook_grads.clear()
        for _ in range(micro_batches):
            ids = torch.randint(0, 128, (2, 8), generator=generator).to(device)
            loss = model(input_ids=ids, labels=ids).loss / micro_batches
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        if "grad_clip" in fixes:
            torch.nn.utils.clip_grad_norm_(params.values(), CLIP_NORM)
        before = {n: p.detach().clone() for n, p in params.items()}
        grads = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
        if step == 0:
            a_grads = [g for n, g in grads.items() if "lora_A" in n]
            first_step_a_grad_zero = bool(a_grads) and all(float(g.abs().max()) == 0.0 for g in a_grads)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        after = {n: p.detach() for n, p in params.items()}
        worst_update_error = max(worst_update_error, _update_error(before, after, grads, config["lr"]))
        updates = {n: before[n].float() - after[n].float() for n in params}
        c = _factor(updates, hook_grads, config["lr"])
        if c is not None:
            c_per_step.append(c)
        hooks_per_step = max((len(v) for v in hook_grads.values()), default=0)
    for handle in handles:
        handle.remove()

    tolerance = 1e-6
    merge_diff = _merge_difference(model, device)
    metrics = {
        "c": _summary(c_per_step),
        "c_per_step": [round(c, 6) for c in c_per_step],
        "expected_scaling": expected_scaling,
        "scaling": scalings[0],
        "max_update_error": worst_update_error,
        "merge_max_abs_diff": merge_diff,
        "lora_A_grad_zero_on_first_step": first_step_a_grad_zero,
        "micro_batches": micro_batches,
        "hook_calls_per_step": hooks_per_step,
    }
    measured.note(micro_batches=micro_batches, hook_calls_per_step=hooks_per_step, optimizer="SGD")
    if worst_update_error > tolerance:
        raise CheckFailed(
            "update-equals-lr-grad",
            f"max |applied - (before - lr*grad)| = {worst_update_error:.3g} relative to lr*|grad|",
            metrics,
        )
    merge_tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    if merge_diff > merge_tolerance:
        raise CheckFailed("merged-equals-unmerged", f"max |merged - unmerged| = {merge_diff:.3g}", metrics)
    return {"metrics": metrics, "path": "manual-loop"}


def _saver(store: dict[str, list[Any]], name: str):
    def hook(grad):
        store.setdefault(name, []).append(grad.detach().float().clone())

    return hook


def _scalings(model: Any) -> list[float]:
    values = []
    for module in model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and "default" in scaling:
            values.append(float(scaling["default"]))
    return values


def _update_error(before: dict[str, Any], after: dict[str, Any], grads: dict[str, Any], lr: float) -> float:
    """How far the applied step is from `param - lr * grad`, computed in the parameter's own dtype.

    Comparing `before - after` with `lr * grad` directly would measure the parameter's rounding, not
    the optimizer: a tiny update on a large weight rounds to zero. So replay the SGD step exactly.
    """
    worst = 0.0
    for name, grad in grads.items():
        expected = before[name].add(grad.to(before[name].dtype), alpha=-lr)
        scale = float((lr * grad.float()).abs().max())
        if scale == 0.0:
            continue
        worst = max(worst, float((after[name].float() - expected.float()).abs().max()) / scale)
    return worst


def _factor(updates: dict[str, Any], hook_grads: dict[str, list[Any]], lr: float) -> float | None:
    """Least-squares c in `update = lr * c * hook_grad` over all trainable parameters, where hook_grad is the mean
    of the gradients the hook saw in the step (one per micro-batch). Accumulating N micro-batches of loss / N
    applies their sum, so c = N there: each micro-batch's hook sees 1/N of the gradient that is applied."""
    num = den = 0.0
    for name, seen in hook_grads.items():
        h = sum(seen[1:], seen[0]) / len(seen)
        num += float((updates[name].double() * h.double()).sum())
        den += lr * float((h.double() * h.double()).sum())
    return num / den if den > 0 else None


def _summary(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[len(ordered) // 2], 6)


def _merge_difference(model: Any, device: Any) -> float:
    import torch

    model.eval()
    ids = torch.arange(16, device=device).reshape(2, 8) % 128
    with torch.no_grad():
        unmerged = model(input_ids=ids).logits.float()
        model.merge_adapter()
        merged = model(input_ids=ids).logits.float()
        model.unmerge_adapter()
    model.train()
    return float((merged - unmerged).abs().max())
