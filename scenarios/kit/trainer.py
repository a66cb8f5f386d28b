"""The HF `Trainer` path, as users run it, with the cleanup that lets one warm worker run many jobs."""

from __future__ import annotations

import os
from typing import Any

#: What every scenario's TrainingArguments share: no reporting, no saving, a loss logged every step.
QUIET = {
    "report_to": [],
    "save_strategy": "no",
    "logging_steps": 1,
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
}


def training_arguments(output_dir: str, **kwargs: Any) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=output_dir, **(QUIET | kwargs))  # a caller may override a quiet default


def logged_losses(trainer: Any) -> list[float]:
    return [float(e["loss"]) for e in trainer.state.log_history if "loss" in e]


def reset(environ_before: dict[str, str]) -> None:
    """Undo what a Trainer run leaves behind in this process: accelerate's singleton state (it would hand the
    next job this job's distributed and mixed-precision setup) and the environment variables it sets."""
    try:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(True)
    except Exception:
        pass
    for key in set(os.environ) - set(environ_before):
        os.environ.pop(key, None)
    os.environ.update(environ_before)
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass
