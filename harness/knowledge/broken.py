"""Stacks and pairs of releases measured not to work together, so that no way out names them again.

Two kinds, both read from records (the table's, the probes' and every `--measure` run's):
- a stack that installed and did not run at all (every record of its cell env-broken: transformers 5.15.0 does not
  import with torch 2.4.1), with the packages its import failed between;
- a pair whose API does not meet: a call from one axis package into another that the callee refuses (an unexpected
  keyword argument, a name it does not export, an attribute it lacks), in any scenario. transformers 5.15.0's Trainer
  calls `Accelerator.unwrap_model(keep_torch_compile=...)`, which accelerate 1.2.0 refuses: every Trainer config fails
  there, whatever it tests. A way out names no newer caller with an older callee either, unless a record shows that
  pair running: advice is held to what was measured together, never to a guess that they meet.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from harness.define.packages import API_OWNERS, AXIS_PACKAGES
from harness.knowledge.evidence import device_class, stack_of
from harness.knowledge.judge import key

#: What an API that does not meet says, in the message of the exception that ended the job.
MISMATCH = re.compile(
    r"got an unexpected keyword argument|cannot import name|has no attribute|missing \d+ required (?:positional|"
    r"keyword-only) argument|takes \d+ positional arguments? but \d+ (?:was|were) given"
)


def broken_stacks(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every stack or pair measured not to run: {'versions': {package: release}, 'why', 'packages': the ones it
    failed between}, sorted. A GPU cell's import failure is left out (an old torch fails there on the node's driver,
    not with its neighbours); an API that does not meet counts on any device."""
    records = list(records)
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if device_class(record) == "cpu":
            cells[(record["run_id"], record["cell"])].append(record)
    found: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for mine in cells.values():
        if all(r["outcome"] == "env-broken" for r in mine):
            stack = stack_of(mine[0])
            why = str(mine[0].get("message") or mine[0].get("signature") or "").splitlines()[:1]
            found[tuple(sorted(stack.items()))] = {
                "versions": stack, "why": (why or ["env-broken"])[0], "packages": failed_through(mine[0]),
            }  # fmt: skip
    calls: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        call = mismatched_call(record)
        stack = stack_of(record)
        if call and all(p in stack for p in call):
            calls[(*call, tuple(sorted((p, stack[p]) for p in call)))].append(record)
    for (caller, callee, pair), failing in sorted(calls.items()):
        versions = dict(pair)
        configs = {(r["scenario"], r["config_id"]) for r in failing}
        found.setdefault(pair, {
            "versions": versions, "why": innermost_message(failing[0]), "packages": sorted(versions),
            "caller": caller, "callee": callee, "ran": ran_together(records, caller, callee, versions, configs),
        })  # fmt: skip
    return [found[k] for k in sorted(found)]


def innermost_message(record: dict[str, Any]) -> str:
    """The message of the exception that ended the job, without the wrapper a fresh process adds around it."""
    text = str(record.get("message") or "").splitlines()[0] if record.get("message") else ""
    return re.sub(r"^in a fresh process \(rank \d+ of \d+\): ", "", text)


def mismatched_call(record: dict[str, Any]) -> tuple[str, str] | None:
    """(caller, callee): the axis package whose code made a call (the deepest axis package in the traceback) and the
    one whose API refused it (the package the message names: its module, or a class it owns), or None where the
    record's failure is no such refusal or does not name two packages."""
    if record.get("outcome") not in ("fail", "error", "flaky", "env-broken"):
        return None
    message = innermost_message(record)
    if not MISMATCH.search(message):
        return None
    named = {p for p in AXIS_PACKAGES if re.search(rf"'{re.escape(p)}(?:\.[\w.]+)?'", message)}
    named |= {API_OWNERS[name] for name in re.findall(r"\b([A-Z]\w+)\.\w+\(\)", message) if name in API_OWNERS}
    traceback = str(record.get("cause") or record.get("traceback") or "")
    frames = [n for n in re.findall(r"site-packages/([A-Za-z0-9_]+)/", traceback) if n in AXIS_PACKAGES]
    if len(named) != 1 or not frames or frames[-1] in named:
        return None
    return frames[-1], next(iter(named))


def ran_together(
    records: list[dict[str, Any]],
    caller: str,
    callee: str,
    versions: Mapping[str, str],
    configs: set[tuple[str, str]],
) -> list[list[str]]:
    """[caller release, callee release] of every record of the configs that met the refusal (the code path that makes
    the call) that ran a newer-or-equal caller with an older-or-equal callee and did not fail this way: the pairs the
    records show meeting there, which a way out may still name."""
    found = set()
    for record in records:
        if (record["scenario"], record["config_id"]) not in configs:
            continue
        stack = stack_of(record)
        have, got = stack.get(caller), stack.get(callee)
        ran = record.get("outcome") in ("pass", "fail", "flaky") and record.get("signature") != "not-applicable"
        refused = record.get("outcome") != "pass" and MISMATCH.search(innermost_message(record))
        if have is None or got is None or not ran or refused:
            continue
        if key(have) >= key(versions[caller]) and key(got) <= key(versions[callee]):
            found.add((have, got))
    return [list(pair) for pair in sorted(found)]


def failed_through(record: dict[str, Any]) -> list[str]:
    """The axis packages an import failure is between: the last two its first exception went through (the cause
    a worker records apart, else the traceback) and any its message names ("module 'torch' has no attribute
    'float8_e8m0fnu'", raised in torch, called from transformers). A way out never names those releases together
    again, and may move the user's release of either."""
    text = str(record.get("cause") or record.get("traceback") or "")
    words = [*text.strip().splitlines()[-1:], str(record.get("message") or "")]
    found = {p for p in AXIS_PACKAGES if p in set(re.findall(r"'([A-Za-z0-9_]+)'", " ".join(words)))}
    deepest_first = [n for n in reversed(re.findall(r"site-packages/([A-Za-z0-9_]+)/", text)) if n in AXIS_PACKAGES]
    for depth, name in enumerate(deepest_first):
        if depth == 0 or len(found) < 2:  # where it was raised, then its callers until two packages are named
            found.add(name)
    return sorted(found)


def measured_broken(
    tables: Mapping[str, Any], versions: Mapping[str, str], moved: Mapping[str, str], involving: str | None = None
) -> bool:
    """Whether a way out must not name the stack after these moves: a broken stack or pair whose packages (every
    package where the record names none) hold the same releases here, one of them moved; or, for a call one package
    made that another's API refused, any release of the caller from that one on with any release of the callee up to
    that one (the caller kept calling it; the older callee lacked it), unless a record shows that pair running.
    `involving`: only the stacks and pairs that package is part of (a release being chosen for it)."""
    stack = dict(versions) | dict(moved)
    for broken in tables.get("broken", []):
        between = broken.get("packages") or sorted(broken["versions"])
        if not any(p in moved for p in between) or any(p not in stack for p in between):
            continue
        if involving is not None and involving not in between:
            continue
        if all(stack.get(p) == broken["versions"].get(p) for p in between):
            return True
        caller, callee = broken.get("caller"), broken.get("callee")
        if caller and callee and key(stack[caller]) >= key(broken["versions"][caller]):
            if (
                key(stack[callee]) <= key(broken["versions"][callee])
                and [stack[caller], stack[callee]] not in broken["ran"]
            ):
                return True
    return False
