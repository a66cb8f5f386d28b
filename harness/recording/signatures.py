"""Turn what a job did into an outcome and a stable error signature, mapped to upstream issues.

A signature is a short name that stays the same across runs, versions and machines for the same
failure: numbers, addresses and paths are normalised away. Unknown failures still get a signature
(`unclassified-...`) so they are never dropped or merged into a known one.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.recording.outcomes import NAMED
from scenarios import applicability, failure_names

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


@dataclass(frozen=True)
class Classified:
    outcome: str
    signature: str | None
    known_issue: list[str] = field(default_factory=list)
    classified: bool = True


#: Which rule set named a failure: a digest of this file. Records carry it; the report names every failure
#: again with today's rules and shows where a name changed.
RULES_DIGEST = hashlib.sha1(
    b"".join(Path(m.__file__ or "").read_bytes() for m in (sys.modules[__name__], failure_names, applicability))
).hexdigest()[:12]


def rename(record: dict[str, Any]) -> dict[str, Any]:
    """The record as today's rules judge it: a failure of the stack named again (from the exception type, message
    and traceback the record kept), then the applicability rules (`scenarios/applicability.py`): a record that is
    not evidence about the stack becomes not-applicable, and one that earlier rules set aside is judged again from
    the job's own report. What changed keeps its old value in `signature_at_run` and `outcome_at_run`."""
    today = judged(held(_renamed(_as_reported(record))))
    if today.get("outcome") != record.get("outcome"):
        today["outcome_at_run"] = record.get("outcome")
    if today.get("signature") != record.get("signature"):
        today.setdefault("signature_at_run", record.get("signature"))
    return today


def rename_all(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rename` for the records of one run, plus what only the run's other records show: a job that failed before
    it could say which base it loaded is judged by the jobs of the same config in the same cell."""
    today = [rename(r) for r in records]
    for index, why in applicability.from_siblings(today).items():
        at_run = {"outcome_at_run": records[index].get("outcome"), "signature_at_run": records[index].get("signature")}
        today[index] = set_aside(today[index], why) | at_run
    return today


def _as_reported(record: dict[str, Any]) -> dict[str, Any]:
    """A record the applicability rules set aside, as the job reported it (rules may judge it otherwise today);
    a record a scenario itself declared not applicable (no `reported_outcome`) stays as it is."""
    if record.get("outcome") != "skip" or not record.get("reported_outcome"):
        return record
    reported = {
        k: v for k, v in record.items() if k not in ("not_applicable", "reported_outcome", "reported_signature")
    }
    return reported | {"outcome": record["reported_outcome"], "signature": record.get("reported_signature")}


def timeout_signature(rank_stacks: object) -> str:
    """A hang named by where its ranks wait (`timeout-in-<place>`, scenarios/failure_names.py), else `timeout`."""
    place = failure_names.hang_place(rank_stacks) if rank_stacks else None
    return f"timeout-in-{place}" if place else "timeout"


def _renamed(record: dict[str, Any]) -> dict[str, Any]:
    """A failure of the stack (fail, flaky) named again, a hang placed again from its ranks' stacks; a violated
    check and what else the launcher decided (crash, skip) keep their names."""
    if str(record.get("signature") or "").startswith("timeout") and record.get("rank_stacks"):
        placed = timeout_signature(record["rank_stacks"])
        if placed == record["signature"]:
            return record
        return record | {"signature": placed, "signature_at_run": record.get("signature")}
    if record.get("outcome") not in (*NAMED, "env-broken") or not record.get("exc_type") or record.get("check"):
        return record
    detail = {k: record.get(k) or "" for k in ("exc_type", "message", "traceback")}
    verdict = classify("env-broken" if record["outcome"] == "env-broken" else "exception", detail)
    if verdict.signature == record.get("signature"):
        return record
    renamed = record | {
        "signature": verdict.signature,
        "known_issue": verdict.known_issue,
        "classified": verdict.classified,
        "signature_at_run": record.get("signature"),
    }
    if record["outcome"] == "fail" and verdict.outcome != "skip":
        renamed["outcome"] = verdict.outcome  # e.g. a failure today's rules know as our own setup's (error)
    return renamed


def held(record: dict[str, Any]) -> dict[str, Any]:
    """A record today's scenario counts as a pass (`failure_names.HOLDS_IN_TODAYS_SCENARIO`): its identity held, and
    the failure it once reported is another scenario's. The job's own report stays in `reported_outcome` and
    `reported_signature`."""
    if record.get("outcome") != "fail" or failure_names.HOLDS_IN_TODAYS_SCENARIO.get(
        record.get("scenario", "")
    ) != record.get("signature"):
        return record
    return dict(record) | {
        "outcome": "pass",
        "signature": None,
        "known_issue": [],
        "reported_outcome": record.get("outcome"),
        "reported_signature": record.get("signature"),
    }


def judged(record: dict[str, Any]) -> dict[str, Any]:
    """Not-applicable when the applicability rules say the record is not evidence about the stack (the machine
    could not run the declared setup, or another setup ran). The job's own report stays in `reported_outcome`
    and `reported_signature`; `not_applicable` says why."""
    why = applicability.reason(record)
    return set_aside(record, why) if why else record


def set_aside(record: dict[str, Any], why: str) -> dict[str, Any]:
    """The record as not-applicable, saying why, with the job's own report kept."""
    return dict(record) | {
        "outcome": "skip",
        "signature": "not-applicable",
        "known_issue": [],
        "not_applicable": why,
        "reported_outcome": record.get("outcome"),
        "reported_signature": record.get("signature"),
    }


def classify(status: str, detail: dict[str, Any], repo_root: str | None = None) -> Classified:
    """Map a launcher status plus the worker's detail to outcome, signature and known issues."""
    if status == "pass":
        return Classified("pass", None)
    if status == "timeout":
        return Classified("timeout", timeout_signature(detail.get("rank_stacks")))
    if status == "crash":
        return Classified("crash", crash_signature(detail))
    if status == "env-broken":
        named = failure_names.name(detail.get("exc_type", ""), detail.get("message", ""), detail.get("traceback", ""))
        if named in failure_names.CANNOT_RUN_HERE:
            return Classified("env-broken", named)
        missing = re.search(r"No module named '([\w.]+)'", detail.get("message", ""))
        module = f"[{missing.group(1)}]" if missing else ""  # which module: the user can install just that one
        return Classified("env-broken", "env-broken-" + _short_type(detail.get("exc_type", "")) + module)
    if status != "exception":
        return Classified("error", f"harness-unknown-status-{status}", classified=False)
    if detail.get("exc_type", "").endswith(".NotApplicable"):
        return Classified("skip", "not-applicable")
    if detail.get("check"):
        name = f"check-{detail['check']}"
        return Classified("fail", name, failure_names.upstream(detail["check"]))
    if "No backend type associated with device type" in detail.get("message", "") and not failure_names.name(
        detail.get("exc_type", ""), detail.get("message", ""), detail.get("traceback", "")
    ):
        # The worker's process group lacked a backend for that device: our setup, not the stack's failure (a
        # scenario that starts its own group, as a user's script does, names the stack's failure instead).
        return Classified("error", "harness-process-group-backend", classified=False)
    if _is_oom(detail):
        # Out of memory is a resource fault of this machine, not a verdict on the stack.
        return Classified("crash", "crash-oom")
    if _is_our_bug(detail, repo_root):
        return Classified("error", "scenario-bug-" + _short_type(detail.get("exc_type", "")), classified=False)
    signature = exception_signature(detail.get("exc_type", ""), detail.get("message", ""), detail.get("traceback", ""))
    known = failure_names.upstream(signature)
    if cannot_run_here(signature):
        # The stack cannot load over this torch (or on this machine): the environment is broken, not the
        # scenario's failure mode.
        return Classified("env-broken", signature, known)
    return Classified("fail", signature, known, classified=not signature.startswith("unclassified-"))


def cannot_run_here(signature: str | None, error: str | None = None, text: str = "") -> bool:
    """Whether a failure says the stack cannot run over this torch or on this machine at all (an environment
    that is broken, whatever was about to be tested): by its signature, or by its error line ('Type: message')
    and the text around it (an exception whose message runs over many lines names its cause below the first)."""
    if signature in failure_names.CANNOT_RUN_HERE:
        return True
    if not error:
        return False
    exc_type, _, message = error.partition(": ")
    return failure_names.name(exc_type, message, text) in failure_names.CANNOT_RUN_HERE


def exception_signature(exc_type: str, message: str, traceback: str = "") -> str:
    """Stable name for an exception from the stack: the scenarios' failure names first, then our own setup's,
    else `unclassified-<Type>-<hash>` (never dropped, never merged) over the normalised message, or, for an
    empty message, over the innermost frames of the traceback (module and function, no line numbers)."""
    named = failure_names.name(exc_type, message, traceback)
    if named:
        return named
    if "No backend type associated with device type" in message:
        return "harness-process-group-backend"
    text = normalise_message(message) or "frames: " + " < ".join(innermost_frames(traceback))
    return f"unclassified-{_short_type(exc_type)}-{_digest(text)}"


def machine_limits(text: str) -> list[str]:
    """What this machine could not load, from a run's tracebacks, in words: 'bitsandbytes could not load its native
    library here (GLIBCXX_3.4.32)'. The package is the site-packages folder the failing frame lies in."""
    found: list[str] = []
    for block in text.split("Traceback (most recent call last):")[1:]:
        hit = failure_names.NATIVE_LOAD.search(block)
        if not hit:
            continue
        packages = re.findall(r"site-packages/([A-Za-z0-9_]+)/", block)
        package = packages[-1] if packages else "a native library"
        what = hit.group("needs") or hit.group("missing") or "another ABI"
        words = f"{package} could not load its native library here ({what})"
        if words not in found:
            found.append(words)
    return found


def plain_exit_signature(code: int | None, last_line: str | None) -> str:
    """A script's non-zero exit with no traceback: `exit-<code>-<hash>` over its normalised last line of output (what
    the user saw), `crash-exit-<code>` where it printed nothing."""
    text = normalise_message(last_line or "")
    return f"exit-{code}-{_digest(text)}" if text else f"crash-exit-{code}"


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<function>[^\n]+)')


def innermost_frames(traceback: str, count: int = 2) -> list[str]:
    """`package/module.py:function` of the innermost frames (the site-packages or checkout prefix dropped)."""
    frames = []
    for match in _FRAME.finditer(traceback):
        path = match.group("file")
        path = path.split("site-packages/", 1)[1] if "site-packages/" in path else "/".join(path.split("/")[-2:])
        frames.append(f"{path}:{match.group('function').strip()}")
    return frames[::-1][:count]


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
    """First line of a message with volatile parts replaced (addresses, paths, numbers) and printed sets put in
    order; quoted identifiers are kept (`'Stream' object has no attribute 'record_event'` and `'Tensor' object has
    no attribute 'quant_state'` are different failures)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r"0x[0-9a-fA-F]+", "<addr>", first)
    first = re.sub(r"(/[\w.\-]+)+", "<path>", first)
    first = re.sub(r"\d+(\.\d+)?", "<n>", first)
    first = re.sub(
        r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(p.strip() for p in m.group(1).split(","))) + "}", first
    )
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
