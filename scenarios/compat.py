"""Stack-side shims over APIs that moved between releases.

Scenarios use these instead of calling moving APIs directly, so one scenario file runs on
transformers 4.4x and 5.x, peft 0.10 to 0.21, and torch 2.x. This module imports only the
standard library at import time: the orchestrator imports scenario modules to read their
specs and strategies, and it must never import torch.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any


class CheckFailed(AssertionError):
    """The scenario's own check was violated (as opposed to an exception from the stack)."""

    def __init__(self, check: str, detail: str, metrics: dict[str, Any] | None = None) -> None:
        super().__init__(f"check {check} violated: {detail}")
        self.check = check
        self.metrics = metrics or {}


class NotApplicable(Exception):
    """The variant cannot be expressed on this stack (an API it needs does not exist yet): a skip, not a failure."""


def parse_variant(variant: str, fixes: tuple[str, ...] | list[str]) -> set[str]:
    """'baseline' -> no fixes; 'a+b' -> {'a', 'b'}; a name the scenario does not know is an error."""
    if variant == "baseline":
        return set()
    chosen = set(variant.split("+"))
    unknown = chosen - set(fixes)
    if unknown:
        raise ValueError(f"unknown fix(es) {sorted(unknown)} in variant {variant!r}; known: {list(fixes)}")
    return chosen


def version_of(package: str) -> str | None:
    """Installed version of a distribution, or None when it is absent."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_tuple(version: str | None) -> tuple[int, ...]:
    """'4.41.2' -> (4, 41, 2); local labels and pre-release tails are dropped."""
    if not version:
        return ()
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts)


def torch_dtype(name: str) -> Any:
    """'bfloat16' -> torch.bfloat16 (imports torch lazily)."""
    import torch

    return getattr(torch, name)


def enable_checkpointing(model: Any, use_reentrant: bool | None) -> str:
    """Turn on HF gradient checkpointing with the release's own entry point.

    ``use_reentrant=None`` means "the release's default", which is what a user who passes no
    kwargs gets (reentrant in 4.x, non-reentrant in 5.x). Returns the API name that ran.
    """
    kwargs = None if use_reentrant is None else {"use_reentrant": use_reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        return "activation_checkpointing_enable"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return "gradient_checkpointing_enable"
