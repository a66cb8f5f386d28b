"""When a record is not evidence about the stack: the machine could not run the declared setup, or something
other than the declared setup ran. Such a record is `not-applicable` (outcome skip, signature not-applicable,
with the reason), never a pass and never a fail: it leaves a target's denominator and a fix's verdict.

Two kinds of rule, both judged from what a record holds, so the harness applies them when it writes a record and
again when it makes the table (older records are judged by today's rules, like failure names):
- **machine limits**: an exception that says this machine cannot run the setup (FSDP2's CUDA streams on a CPU
  machine, bitsandbytes 4-bit on CPU before it had a CPU backend, a Trainer that refuses bf16 without a GPU);
- **declared vs measured**: the setup measured while the job ran (`setup`, written by `scenarios/kit/measured.py`,
  or for older records the path and metrics the scenario returned) differs from what the config declares.

Scenarios raise `compat.NotApplicable` themselves where they can tell at run time (the preferred way); these
rules catch what only shows as an exception or in the facts afterwards. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scenarios.compat import version_tuple
from scenarios.failure_names import innermost_in

#: Outcomes a rule may turn into not-applicable: what a job that ran reported.
JUDGED = ("pass", "fail", "flaky")

_FSDP2_NEEDS_CUDA = (
    "CUDA driver version is insufficient",
    "FSDP requires CUDA for streams",
    "'Stream' object has no attribute 'record_event'",
    "Found no NVIDIA driver on your system",
    "Torch not compiled with CUDA enabled",
)
_BF16_NEEDS_GPU = "Your setup doesn't support bf16/gpu"
#: accelerate's FSDP plugin on a machine without an accelerator (CUDA, XPU, ...).
_NO_ACCELERATOR = "There are currently no available devices found"
#: bitsandbytes gained a CPU backend for 4-bit (quantize, dequantize, matmul) in 0.46.0.
BNB_CPU_4BIT = (0, 46)
_QUANTIZED_BASES = ("4bit", "manual-4bit")


#: Checks a scenario no longer makes, and why: a record that failed one was stopped before today's check ran, so it
#: says nothing about today's target, either way.
RETIRED_CHECKS = {
    "check-dora_output_dtype": (
        "S5's retired check of DoRA's inner arithmetic dtype (fp32 inside the layer is by design from peft 0.12); "
        "the job stopped there, before today's check of the dtype a DoRA layer hands on"
    ),
}


def reason(record: Mapping[str, Any]) -> str | None:
    """Why this record is not evidence about the stack, or None when it is."""
    if record.get("outcome") not in JUDGED:
        return None
    if record.get("outcome") != "pass" and record.get("signature") in RETIRED_CHECKS:
        return RETIRED_CHECKS[record["signature"]]
    if record.get("outcome") != "pass":
        limit = machine_limit(record)
        if limit:
            return limit
    return setup_mismatch(record)


def machine_limit(record: Mapping[str, Any]) -> str | None:
    """An exception that says the machine, not the stack, cannot run this setup."""
    device = (record.get("hardware") or {}).get("device") or record.get("device")
    if device != "cpu":
        return None
    message = record.get("message") or ""
    traceback = record.get("traceback") or ""
    versions = record.get("versions") or {}
    if any(marker in message for marker in _FSDP2_NEEDS_CUDA):
        where = "FSDP2" if "fsdp" in traceback.lower() or "fsdp" in message.lower() else "this code path"
        torch = versions.get("torch", "?")
        return f"{where} in torch {torch} needs CUDA, and this machine has no GPU ({_first(message)})"
    if _NO_ACCELERATOR in message:
        return f"accelerate {versions.get('accelerate', '?')} applies FSDP only on an accelerator ({_first(message)})"
    if _BF16_NEEDS_GPU in message:
        return f"the Trainer of transformers {versions.get('transformers', '?')} refuses bf16 without a GPU"
    if "Blockwise 4bit dequantization on CPU only supports uint8 storage" in message:
        storage = (record.get("config") or {}).get("dtype", "a non-uint8")
        return (
            f"bitsandbytes {versions.get('bitsandbytes', '?')} on CPU dequantizes only uint8 4-bit storage "
            f"(the config declares {storage} storage: quant_storage = compute dtype, as FSDP-QLoRA needs)"
        )
    bnb = versions.get("bitsandbytes")
    if bnb and version_tuple(bnb) < BNB_CPU_4BIT and innermost_in(traceback, "bitsandbytes"):
        return f"bitsandbytes {bnb} has no 4-bit on CPU (it came with 0.46.0): {_first(message) or 'an empty assert'}"
    return None


def setup_mismatch(record: Mapping[str, Any]) -> str | None:
    """The declared setup did not run: a quantized base that was not quantized, another FSDP than declared."""
    config = record.get("config") or {}
    metrics = record.get("metrics") or {}
    setup = record.get("setup") or {}
    declared_base = config.get("base")
    if declared_base in _QUANTIZED_BASES:
        ran = record.get("path") or metrics.get("path")
        # A Trainer path names the FSDP that wrapped the model ('trainer-fsdp1'), not a base: the measured
        # quantized weights below say which base ran.
        if ran and ran != declared_base and ran not in _QUANTIZED_BASES and not str(ran).startswith("trainer-"):
            why = metrics.get("fallback_reason") or "the loader returned an unquantized model"
            return f"declared a {declared_base} base, but a {ran} base ran ({why})"
        quantized = setup.get("quantized_weights")
        if quantized == 0:
            return f"declared a {declared_base} base, but no weight was quantized"
    declared_fsdp = setup.get("fsdp_declared") or _declared_fsdp(record)
    measured_fsdp = setup.get("fsdp") or _fsdp_in(metrics.get("fsdp_that_ran")) or _fsdp_in(record.get("path"))
    if declared_fsdp and measured_fsdp and declared_fsdp != measured_fsdp:
        return f"declared {declared_fsdp}, but {measured_fsdp} wrapped the model"
    return unmeasured_trainer_fsdp(record, declared_fsdp)


#: transformers 5.0 made FSDP2 the Trainer's default: `TrainingArguments(fsdp=...)` runs FSDP2 unless
#: `fsdp_config["version"]` is 1.
TRAINER_FSDP2_DEFAULT = (5, 0)


def unmeasured_trainer_fsdp(record: Mapping[str, Any], declared_fsdp: str | None) -> str | None:
    """A Trainer record that declared FSDP1 on transformers 5 and measured neither which FSDP wrapped the model nor
    anything else of its setup: its path only repeats the declaration (S1's first GPU runs, before the scenario asked
    for version 1 and measured what ran), so whether FSDP1 ran at all is not known."""
    config = record.get("config") or {}
    through_trainer = config.get("path") == "trainer" or config.get("loop") == "trainer"
    transformers = (record.get("versions") or {}).get("transformers")
    if declared_fsdp != "fsdp1" or not through_trainer or not transformers or record.get("setup"):
        return None
    if (record.get("metrics") or {}).get("fsdp_that_ran") or version_tuple(transformers) < TRAINER_FSDP2_DEFAULT:
        return None
    return (
        f"declared fsdp1 through the Trainer of transformers {transformers}, which runs FSDP2 unless told version 1; "
        "this record did not measure which FSDP wrapped the model"
    )


def _declared_fsdp(record: Mapping[str, Any]) -> str | None:
    """The FSDP version a record's config declares (S1: the `fsdp` key, or its `fsdp2` variant)."""
    declared = (record.get("config") or {}).get("fsdp")
    if declared not in ("fsdp1", "fsdp2"):
        return None
    return "fsdp2" if "fsdp2" in str(record.get("variant", "")).split("+") else declared


def _fsdp_in(text: Any) -> str | None:
    """'fsdp1' / 'fsdp2' where a path or metric names the FSDP that ran ('trainer-fsdp2', 'fsdp1-manual/hf')."""
    found = re.match(r"^(?:trainer-)?(fsdp[12])\b", str(text or ""))
    return found.group(1) if found else None


def from_siblings(records: list[Mapping[str, Any]]) -> dict[int, str]:
    """Reasons for records that cannot show on their own which base ran (a job that failed before the scenario
    returned its path), from the other jobs of the same config in the same cell: loading the base does not depend
    on the variant, so when they ran an unquantized base for a quantized config, so did this one. {index: reason}."""

    def config_in_cell(record: Mapping[str, Any]) -> tuple[str, ...]:
        return tuple(str(record.get(k)) for k in ("cell", "scenario", "config_id"))

    ran_as: dict[tuple[str, ...], tuple[str, str]] = {}
    for record in records:
        config = record.get("config") or {}
        path = record.get("path")
        trainer_path = str(path or "").startswith("trainer-")
        if config.get("base") in _QUANTIZED_BASES and path and path not in _QUANTIZED_BASES and not trainer_path:
            key = config_in_cell(record)
            why = (record.get("metrics") or {}).get("fallback_reason") or "the loader returned an unquantized model"
            ran_as.setdefault(key, (path, why))
    found = {}
    for index, record in enumerate(records):
        key = config_in_cell(record)
        if key in ran_as and not record.get("path") and record.get("outcome") in JUDGED:
            path, why = ran_as[key]
            base = (record.get("config") or {}).get("base")
            found[index] = f"declared a {base} base; this config's other jobs in the cell ran a {path} base ({why})"
    return found


def _first(message: str) -> str:
    return message.strip().splitlines()[0][:160] if message.strip() else ""
