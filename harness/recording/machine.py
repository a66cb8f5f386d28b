"""What a record says of the machine it ran on, beyond its GPUs: the CPU features a library may choose another code
path by (bitsandbytes 0.49 packs 4-bit weights for the CPU kernels only where the CPU has avx512_bf16), and how they
read in a sentence. `execution/hardware.py` measures them; findings and blames say where they flipped with them."""

from __future__ import annotations

from typing import Any

#: The CPU flags a record keeps (the others of /proc/cpuinfo are left out).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def describe_machine(machine: dict[str, Any] | None) -> str:
    """'Intel(R) Xeon(R) Processor, avx2 avx512f, no avx512_bf16 amx_bf16' or 'machine not recorded'."""
    if not machine or "cpu_flags" not in machine:
        return "machine not recorded"
    has, lacks = list(machine["cpu_flags"]), [f for f in CPU_FLAGS if f not in machine["cpu_flags"]]
    gpu = f"{machine['gpu_count']} x {machine['gpu_name']}, " if machine.get("gpu_count") else ""
    return f"{gpu}{machine.get('cpu_model')}, {' '.join(has) or 'none of ' + ' '.join(CPU_FLAGS)}" + (
        f", no {' '.join(lacks)}" if lacks and has else ""
    )


def cpu_condition_words(flags: tuple[str, ...]) -> str:
    """A failure's condition on the user's CPU, as the verifications measured it ('' where there is none)."""
    if not flags:
        return ""
    named = " and ".join(flags) if len(flags) < 3 else ", ".join(flags[:-1]) + f" and {flags[-1]}"
    return f"your CPU has {named} (it flipped on a CPU with them and not at the same releases on one without)"
