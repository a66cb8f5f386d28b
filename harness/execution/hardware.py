"""What the run executes on, found without importing torch (nvidia-smi, /proc)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

from harness.recording.machine import CPU_FLAGS


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


def cpu_features(cpuinfo: str | None = None) -> dict[str, object]:
    """The CPU's model name and which of `CPU_FLAGS` it has, from /proc/cpuinfo (empty where there is none)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                cpuinfo = handle.read()
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "flags":
            flags |= set(value.split())
    return {"cpu_model": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags]}


def describe(device: str) -> dict[str, object]:
    gpus = visible_gpus() if device == "cuda" else []
    return {
        "device": device,
        "gpu_name": gpus[0] if gpus else None,
        "gpu_count": len(gpus),
        "host": platform.node(),
        "cpu_count": os.cpu_count() or 1,
        **cpu_features(),
    }
