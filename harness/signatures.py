"""Turn what a job did into an outcome and a stable error signature, mapped to upstream issues.

A signature is a short name that stays the same across runs, versions and machines for the same
failure: numbers, addresses and paths are normalised away. Unknown failures still get a signature
(`unclassified-...`) so they are never dropped or merged into a known one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Exception types that, raised from our own scenario or harness code, mean a bug of ours.
PROGRAMMING_ERRORS = {
    "NameError",
    "SyntaxError",
    "TypeError",
    "AttributeError",
    "KeyError",
    "IndexError",
    "UnboundLocalError",
    "ImportError",
    "ModuleNotFoundError",
}

KNOWN_ISSUES: dict[str, list[str]] = {
    "checkpoint-recompute-dtype": [
        "huggingface/peft#1910",
        "huggingface/transformers#28499",
        "pytorch/pytorch#148831",
        "pytorch/pytorch#159359",
    ],
    "checkpoint-recompute-shape[0]": [
        "OpenRLHF/OpenRLHF#569",
        "huggingface/transformers#47254",
        "deepspeedai/DeepSpeed#4332",
        "huggingface/trl#2514",
        "deepspeedai/DeepSpeed#8148",
    ],
    "no-grad-element-0": [
        "huggingface/peft#1577",
        "huggingface/peft#2125",
        "huggingface/transformers#33930",
        "huggingface/peft#137",
        "huggingface/transformers#42489",
    ],
    "input-weight-not-parameter": ["huggingface/peft#1737", "huggingface/peft#1806"],
    "dora-output-dtype-upcast": ["huggingface/peft#1692"],
    # Found by this harness: peft >= 0.14 DoRA under FSDP1 with fp32 adapters gives bf16 grads to fp32 params.
    "optimizer-bf16-grad-on-fp32-param": ["huggingface/transformers#34702"],
    "fsdp-flatten-mixed-dtype": ["huggingface/peft#1737"],
    "fsdp-flatten-mixed-requires-grad": ["huggingface/peft#1737"],
    "dora-reads-sharded-lora-weight": ["huggingface/peft#1737"],
    "lora-update-scale": ["huggingface/peft#1893", "pytorch/pytorch#76464"],
}

_METADATA = re.compile(r"saved metadata: \{(?P<saved>[^}]*)\}\s*recomputed metadata: \{(?P<recomputed>[^}]*)\}", re.S)
_SHAPE = re.compile(r"'shape': torch\.Size\(\[(?P<dims>[^\]]*)\]\)")
_DTYPE = re.compile(r"'dtype': torch\.(?P<dtype>\w+)")


@dataclass(frozen=True)
class Classified:
    outcome: str
    signature: str | None
    known_issue: list[str] = field(default_factory=list)
    classified: bool = True


#: Which rule set named a failure: a digest of this file. Records carry it; the report names every failure
#: again with today's rules and shows where a name changed.
RULES_DIGEST = hashlib.sha1(Path(__file__).read_bytes()).hexdigest()[:12]


def rename(record: dict[str, Any]) -> dict[str, Any]:
    """The record as today's rules name it. Only failures of the stack are named again (fail, flaky), from the
    exception type, message and traceback the record kept; a violated check and anything the launcher decided
    (timeout, crash, skip) keep their names. A changed name keeps the old one in `signature_at_run`."""
    if record.get("outcome") not in ("fail", "flaky") or not record.get("exc_type") or record.get("check"):
        return record
    detail = {k: record.get(k) or "" for k in ("exc_type", "message", "traceback")}
    verdict = classify("exception", detail)
    if verdict.signature == record.get("signature"):
        return record
    renamed = record | {"signature": verdict.signature, "known_issue": verdict.known_issue,
                        "classified": verdict.classified, "signature_at_run": record.get("signature")}  # fmt: skip
    if record["outcome"] == "fail" and verdict.outcome != "skip":
        renamed["outcome"] = verdict.outcome  # e.g. a failure today's rules know as our own setup's (error)
    return renamed


def classify(status: str, detail: dict[str, Any], repo_root: str | None = None) -> Classified:
    """Map a launcher status plus the worker's detail to outcome, signature and known issues."""
    if status == "pass":
        return Classified("pass", None)
    if status == "timeout":
        return Classified("timeout", "timeout")
    if status == "crash":
        return Classified("crash", crash_signature(detail))
    if status == "env-broken":
        return Classified("env-broken", "env-broken-" + _short_type(detail.get("exc_type", "")))
    if status != "exception":
        return Classified("error", f"harness-unknown-status-{status}", classified=False)
    if detail.get("exc_type", "").endswith(".NotApplicable"):
        return Classified("skip", "not-applicable")
    if detail.get("check"):
        name = f"check-{detail['check']}"
        return Classified("fail", name, KNOWN_ISSUES.get(detail["check"], []))
    if "No backend type associated with device type" in detail.get("message", ""):
        # The worker's process group lacked a backend for that device: our setup, not the stack's failure.
        return Classified("error", "harness-process-group-backend", classified=False)
    if _is_oom(detail):
        # Out of memory is a resource fault of this machine, not a verdict on the stack.
        return Classified("crash", "crash-oom")
    if _is_our_bug(detail, repo_root):
        return Classified("error", "scenario-bug-" + _short_type(detail.get("exc_type", "")), classified=False)
    signature = exception_signature(detail.get("exc_type", ""), detail.get("message", ""), detail.get("traceback", ""))
    family = signature.split("[")[0] if signature.startswith("checkpoint-recompute-dtype") else signature
    known = KNOWN_ISSUES.get(family, [])
    return Classified("fail", signature, known, classified=not signature.startswith("unclassified-"))


def exception_signature(exc_type: str, message: str, traceback: str = "") -> str:
    """Stable name for an exception from the stack (the traceback tells apart generic messages)."""
    short = _short_type(exc_type)
    if "different metadata than during the forward pass" in message or short == "CheckpointError":
        return _checkpoint_signature(message)
    if "element 0 of tensors does not require grad" in message:
        return "no-grad-element-0"
    if "Input weight should be of type nn.Parameter" in message or "should be of type nn.Parameter" in message:
        return "input-weight-not-parameter"
    if "Must flatten tensors with uniform dtype" in message:
        return "fsdp-flatten-mixed-dtype"
    if "Must flatten tensors with uniform `requires_grad`" in message:
        return "fsdp-flatten-mixed-requires-grad"
    if "No backend type associated with device type" in message:
        return "harness-process-group-backend"
    if "ProcessGroupGloo::allgather: invalid tensor type" in message or (
        "output tensor must have the same type as input tensor" in message  # the same, through NCCL
    ):
        return "zero3-allgather-mixed-dtype"  # deepspeed 0.19.2: fp32 adapters next to bf16 persistent params
    if "zip() argument 2 is longer than argument 1" in message:
        return "zip-length-mismatch"  # transformers 4.41 Trainer + deepspeed 0.19 + torch 2.13 scheduler step
    if "expected dtype float for `end` but got dtype c10::BFloat16" in message or (
        "Tensors of the same index must be on the same device and the same dtype" in message
    ):
        return "optimizer-bf16-grad-on-fp32-param"
    if re.search(r"expected (m1 and m2|mat1 and mat2) to have the same dtype", message):
        return "matmul-dtype-mismatch"  # CPU and CUDA wordings
    if short == "IndexError" and "dora.py" in traceback and "lora_A.weight.shape" in traceback:
        # DoRA reads lora_A.weight outside lora_A's FSDP unit; with use_orig_params it is a flat 1-D shard.
        return "dora-reads-sharded-lora-weight"
    if "setStorage:" in message and "storage of size 0" in message and "checkpoint" in traceback:
        # Recomputation in backward touches a parameter FSDP has already freed (resharded) after forward.
        return "recompute-uses-freed-fsdp-param"
    return f"unclassified-{short}-{_digest(normalise_message(message))}"


def _checkpoint_signature(message: str) -> str:
    pairs = _METADATA.findall(message)
    if not pairs:
        return "checkpoint-recompute-other"
    for _saved, recomputed in pairs:
        shape = _SHAPE.search(recomputed)
        if shape and shape.group("dims").strip() == "0":
            return "checkpoint-recompute-shape[0]"
    dtype_changes = []
    for saved, recomputed in pairs:
        a, b = _DTYPE.search(saved), _DTYPE.search(recomputed)
        if a and b and a.group("dtype") != b.group("dtype"):
            change = f"{a.group('dtype')}->{b.group('dtype')}"
            if change not in dtype_changes:
                dtype_changes.append(change)
    if dtype_changes:
        return f"checkpoint-recompute-dtype[{','.join(sorted(dtype_changes))}]"
    return "checkpoint-recompute-shape"


OOM_MARKERS = ("MemoryError", "out of memory", "cannot allocate memory", "can't allocate memory", "std::bad_alloc")


def _is_oom(detail: dict[str, Any]) -> bool:
    text = f"{detail.get('exc_type', '')}\n{detail.get('message', '')}".lower()
    return any(marker.lower() in text for marker in OOM_MARKERS)


def crash_signature(detail: dict[str, Any]) -> str:
    text = f"{detail.get('message', '')}\n{detail.get('stderr_tail', '')}"
    if any(marker.lower() in text.lower() for marker in OOM_MARKERS):
        return "crash-oom"
    # torchrun lists every rank it stopped; the "Root Cause" section names the rank that died first.
    root = text.rsplit("Root Cause", 1)[-1] if "Root Cause" in text else text
    match = re.search(r"Signal \d+ \((SIG[A-Z]+)\)", root) or re.search(r"signal (SIG[A-Z]+)", text)
    if match:
        return f"crash-{match.group(1)}"
    match = re.search(r"exit code (-?\d+)", text)
    return f"crash-exit-{match.group(1)}" if match else "crash"


def normalise_message(message: str) -> str:
    """First line of a message with volatile parts (numbers, addresses, paths, quotes) replaced."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r"0x[0-9a-fA-F]+", "<addr>", first)
    first = re.sub(r"(/[\w.\-]+)+", "<path>", first)
    first = re.sub(r"\d+(\.\d+)?", "<n>", first)
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "<q>", first)
    return re.sub(r"\s+", " ", first).strip()


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _short_type(exc_type: str) -> str:
    return exc_type.rsplit(".", 1)[-1] or "Unknown"


def _is_our_bug(detail: dict[str, Any], repo_root: str | None) -> bool:
    origin = detail.get("origin") or ""
    if repo_root is None or not origin.startswith(repo_root):
        return False
    return _short_type(detail.get("exc_type", "")) in PROGRAMMING_ERRORS
