"""The checks scenarios share, under one set of names. A violated check raises `compat.CheckFailed`; its
record's signature is `check-<name>`."""

from __future__ import annotations

import math
from typing import Any

from scenarios.compat import CheckFailed


def finite_loss(losses: list[float], metrics: dict[str, Any]) -> None:
    """Training produced losses, and every one is finite."""
    if not losses or not all(math.isfinite(v) for v in losses):
        raise CheckFailed("finite_loss", f"losses {losses}", metrics=metrics)


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """How full (gathered) copies of the adapter tensors changed over training, by name."""
    changed = [n for n in before if n in after and not bool((before[n] == after[n]).all())]
    lora_b = [n for n in before if "lora_B" in n]
    deltas = [float((after[n] - before[n]).abs().max()) for n in before if n in after] or [0.0]
    norm = math.sqrt(sum(float(after[n].double().pow(2).sum()) for n in after))
    return {
        "adapter_tensors": len(before),
        "adapter_changed": len(changed),
        "lora_B_tensors": len(lora_b),
        "lora_B_changed": sum(1 for n in lora_b if n in changed),
        "adapter_max_abs_delta": max(deltas),
        "adapter_norm_after": norm,
        "unchanged_examples": sorted(n for n in before if n not in changed)[:4],
    }


def adapters_changed(metrics: dict[str, Any], steps: int, only_lora_b: bool = False) -> None:
    """Training changed every adapter tensor (or every lora_B: under ZeRO-3, lora_A of a zero-initialised
    lora_B gets no gradient on the first step and may legitimately stay put over a short run)."""
    total, changed = (
        (metrics["lora_B_tensors"], metrics["lora_B_changed"])
        if only_lora_b
        else (metrics["adapter_tensors"], metrics["adapter_changed"])
    )
    if total == 0 or changed != total:
        which = "lora_B" if only_lora_b else "adapter"
        raise CheckFailed(
            "adapters_changed",
            f"{total - changed} of {total} {which} tensors unchanged after {steps} steps, "
            f"e.g. {metrics['unchanged_examples'][:3]}",
            metrics=metrics,
        )


def adapters_got_grads(metrics: dict[str, Any], n_trainable: int) -> None:
    """The model has trainable tensors and every one got a gradient (a silent no-op backward is a failure)."""
    if n_trainable == 0:
        raise CheckFailed("trainable_params", "the PEFT model has no trainable parameters", metrics=metrics)
    if metrics["trainable_without_grad"]:
        raise CheckFailed(
            "adapter_grads",
            f"{metrics['trainable_without_grad']} of {n_trainable} trainable tensors got no gradient "
            f"(silent: backward did not raise)",
            metrics=metrics,
        )


def all_steps_ran(done: int, wanted: int, metrics: dict[str, Any]) -> None:
    if done != wanted:
        raise CheckFailed("all_steps_ran", f"{done} of {wanted}", metrics)
