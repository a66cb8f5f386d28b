"""Where the CPU atlas and the GPU atlas disagree, day by day and scenario by scenario, and why.

The two atlases install the same days' stacks, but not the same way: on CPU every package is the era's (torch
included) and some setups cannot run (the applicability rules set them aside); on a GPU node torch is fixed at
the node's build and the era's other packages are layered over it, so an old day's package may not load at all.
A disagreement is only worth a user's attention with its reason, so each row names one.
"""

from __future__ import annotations

from typing import Any

from harness.knowledge.flips import dated_verdicts
from harness.publishing.atlas import held_torch
from harness.textsafe import code, md

#: Verdict states that say nothing about the target on that side.
NO_EVIDENCE = ("skip", "env-broken", "install-failed", "empty", "no-baseline")


def side_state(found: Any) -> str:
    """One word per side: target, not-reproduced, or why there is no evidence."""
    if found is None:
        return "empty"
    if found.state in ("target", "failures"):
        return "target"
    if found.state in ("not-reproduced", "passes"):
        return "not-reproduced" if found.candidates else "no-evidence"
    return found.state


def reason(cpu: Any, gpu: Any, cpu_state: str, gpu_state: str, torch_cpu: str, torch_gpu: str) -> str:
    """Why the two sides differ, from what each side's verdict holds."""
    if gpu_state in ("env-broken", "install-failed"):
        return f"GPU: the day's packages cannot run over the node's torch ({gpu.first_signature or gpu_state})"
    if cpu_state in ("env-broken", "install-failed"):
        return f"CPU: the environment could not run ({cpu.first_signature or cpu_state})"
    if cpu_state in ("skip", "no-evidence") or (cpu_state == "not-reproduced" and cpu.inapplicable):
        why = ", ".join(sorted(cpu.inapplicable)) or "no config ran as declared"
        return f"masking on CPU: {why}"
    if gpu_state in ("skip", "no-evidence") or (gpu_state == "not-reproduced" and gpu.others):
        others = ", ".join(sorted(gpu.others)) or ", ".join(sorted(gpu.inapplicable)) or "no config ran"
        return f"masking on GPU: {others}"
    torch_note = f" (torch {torch_cpu} on CPU, {torch_gpu} on GPU)" if torch_cpu != torch_gpu else ""
    if cpu_state == "target":
        return "CPU-only failure" + torch_note
    return "GPU-only failure" + torch_note


def disagreements(
    cpu_records: list[dict[str, Any]], gpu_records: list[dict[str, Any]], specs: dict[str, dict[str, Any]]
) -> list[dict[str, str]]:
    """One row per (scenario, day both sides ran) whose target states differ."""
    _, cpu_stacks, cpu_verdicts = dated_verdicts(cpu_records, specs)
    _, gpu_stacks, gpu_verdicts = dated_verdicts(gpu_records, specs)
    rows = []
    for scenario in sorted(set(cpu_verdicts) & set(gpu_verdicts)):
        for day in sorted(set(cpu_verdicts[scenario]) & set(gpu_verdicts[scenario])):
            cpu, gpu = cpu_verdicts[scenario][day], gpu_verdicts[scenario][day]
            cpu_state, gpu_state = side_state(cpu), side_state(gpu)
            if cpu_state == gpu_state:
                continue
            torch_cpu = str(cpu_stacks.get(day, {}).get("torch", "?"))
            torch_gpu = str(gpu_stacks.get(day, {}).get("torch", "?"))
            rows.append(
                {
                    "scenario": scenario,
                    "day": day,
                    "cpu": _shown(cpu, cpu_state),
                    "gpu": _shown(gpu, gpu_state),
                    "reason": reason(cpu, gpu, cpu_state, gpu_state, torch_cpu, torch_gpu),
                }
            )
    return rows


def _shown(found: Any, state: str) -> str:
    if state == "target":
        return f"target {len(found.target_records)}/{found.candidates}"
    if state == "not-reproduced":
        return f"not reproduced 0/{found.candidates}"
    return state


def disagreements_markdown(
    cpu_records: list[dict[str, Any]],
    gpu_records: list[dict[str, Any]],
    specs: dict[str, dict[str, Any]],
    gpu_words: str = "on one GPU",
) -> str:
    """The side-by-side section, or nothing when either atlas is missing."""
    if not cpu_records or not gpu_records:
        return ""
    rows = disagreements(cpu_records, gpu_records, specs)
    fixed = held_torch(gpu_records) or "the node's"
    cpu_days = {(r.get("pins") or {}).get("date") for r in cpu_records}
    gpu_days = {(r.get("pins") or {}).get("date") for r in gpu_records}
    lines = [
        "",
        "## Where the CPU and GPU atlases disagree" + ("" if gpu_words == "on one GPU" else f" ({gpu_words})"),
        "",
        f"Same install days, two machines: on CPU every package is the era's (torch included); {gpu_words} torch is "
        f"fixed at {md(fixed)} and the day's other packages are layered over it. Each row is a scenario and day "
        "whose target outcome differs, with the reason. Days only one side ran: "
        + (", ".join(md(d) for d in sorted((cpu_days ^ gpu_days) - {None})) or "none")
        + ".",
        "",
    ]
    if not rows:
        return "\n".join([*lines, "They agree on every day both ran.", ""])
    lines += ["| scenario | day | CPU | GPU | why |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {md(row['scenario'])} | {md(row['day'])} | {md(row['cpu'])} | {md(row['gpu'])} | "
            f"{code(row['reason']) if row['reason'].startswith('bnb') else md(row['reason'])} |"
        )
    return "\n".join(lines) + "\n"
