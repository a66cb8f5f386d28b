"""What the run executes on, found without importing torch (nvidia-smi, /proc)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess


def visible_gpus() -> list[str]:
    """Names of the NVIDIA GPUs this process may use (honours CUDA_VISIBLE_DEVICES)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return []
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    names = [line.strip() for line in out.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        wanted = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        names = [names[i] for i in wanted if i < len(names)]
    return names


def resolve_device(requested: str) -> str:
    """'auto' becomes 'cuda' when a GPU is visible, else 'cpu'."""
    if requested == "auto":
        return "cuda" if visible_gpus() else "cpu"
    return requested


def describe(device: str) -> dict[str, object]:
    gpus = visible_gpus() if device == "cuda" else []
    return {
        "device": device,
        "gpu_name": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
        "host": platform.node(),
        "cpu_count": os.cpu_count() or 1,
    }
