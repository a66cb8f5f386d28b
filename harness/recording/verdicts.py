"""What one entry of the table says, for one cell and one scenario.

A scenario exists for one failure mode, its *target* (SPEC["target"]). The verdict answers the reader's
questions apart from each other: does the target reproduce, on k of the n configs that can show it; which
variants remove it on exactly those configs, each a fix or a workaround; which other failures turned up
(findings of their own, never folded into the target's count); how the controls did; and how it ran.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.recording.outcomes import BAD, UNUSABLE
from scenarios.fix_words import fix_words

#: Outcomes that count as "did not pass" (a failure, or a job that could not finish).


def matches(signature: str | None, patterns: list[str]) -> bool:
    """A target name matches exactly, or by prefix when it ends with `*` (names hold `[`, so no globs)."""
    if not signature:
        return False
    return any(signature.startswith(p[:-1]) if p.endswith("*") else signature == p for p in patterns)


def control_label(config: dict[str, Any] | None, controls: list[dict[str, Any]]) -> str:
    """The control a config is, as its spec entry reads ('use_dora=False')."""
    for control in controls:
        if all((config or {}).get(k) == v for k, v in control.items()):
            return ", ".join(f"{k}={v}" for k, v in control.items())
    return "?"


def is_control(config: dict[str, Any] | None, controls: list[dict[str, Any]]) -> bool:
    """A control config has every key/value of one of the scenario's control tables."""
    return any(all((config or {}).get(k) == v for k, v in control.items()) for control in controls)


@dataclass
class Verdict:
    #: "target" (the target reproduces), "not-reproduced", "failures" (no target declared, something failed),
    #: "passes" (no target declared, nothing failed), or a state of the whole entry: "skip", "install-failed",
    #: "env-broken", "no-baseline", "empty".
    state: str
    target_records: list[dict[str, Any]] = field(default_factory=list)
    #: Baseline configs that can show the target (not controls, not skipped).
    candidates: int = 0
    fixed: list[str] = field(default_factory=list)
    partly: list[tuple[str, int]] = field(default_factory=list)
    not_fixed: list[tuple[str, list[str]]] = field(default_factory=list)
    #: Variants that could not run on those configs here (skipped as not applicable).
    not_applicable: list[str] = field(default_factory=list)
    #: Other failures of the baseline: signature -> configs.
    others: dict[str, int] = field(default_factory=dict)
    #: The same per config: config id -> signature (a flip is masked only by failures on its own configs).
    other_ids: dict[str, str] = field(default_factory=dict)
    #: Every baseline config id of the entry (a flip's configs with no record here are no evidence here).
    config_ids: list[str] = field(default_factory=list)
    controls_total: int = 0
    #: (signature, which control) -> how many.
    controls_failed: dict[tuple[str, str], int] = field(default_factory=dict)
    ran: dict[str, Any] = field(default_factory=dict)
    first_signature: str | None = None
    #: Baseline configs that are not evidence here (not applicable: the machine could not run the declared
    #: setup, or another setup ran): reason -> configs. Never part of the target's count.
    inapplicable: dict[str, int] = field(default_factory=dict)
    #: Their config ids (a flip between two dates is only a flip on configs that ran on both).
    inapplicable_ids: dict[str, str] = field(default_factory=dict)
    #: Baseline configs whose environment could not run them (env-broken, install-failed): id -> signature.
    unusable_ids: dict[str, str] = field(default_factory=dict)
    #: No one change fixes every config that shows the target, but each of them has one that does (S7 on a day
    #: where the hand loop's ZeRO-3 save and the Trainer's each have their own fix).
    fixed_per_config: bool = False


def variant_kinds(spec: dict[str, Any] | None) -> dict[str, str]:
    """Each variant's kind from the scenario's spec: "fix", "workaround", ..."""
    return {name: value[0] for name, value in ((spec or {}).get("variants") or {}).items()}


def first_change(found: Verdict, spec: dict[str, Any] | None) -> tuple[str, str] | None:
    """The change a user should try first where the target shows: (variant, "fix" or "workaround"), the first
    the entry lists (real fixes come first), or None where no measured change removes it."""
    if not found.fixed:
        return None
    first = found.fixed[0]
    return first, "fix" if variant_kinds(spec).get(first) == "fix" else "workaround"


def verdict(records: list[dict[str, Any]], spec: dict[str, Any] | None) -> Verdict:
    """The verdict of one cell x scenario from its records (newest per key) and the scenario's spec."""
    if not records:
        return Verdict("empty")
    base = [r for r in records if r["variant"] == "baseline"]
    if not base:
        return Verdict("no-baseline")
    outcomes = {r["outcome"] for r in base}
    not_evidence = [r for r in base if r.get("signature") == "not-applicable"]
    inapplicable = dict(Counter(short_reason(r) for r in not_evidence))
    inapplicable_ids = {r["config_id"]: short_reason(r) for r in not_evidence}
    if outcomes == {"skip"}:
        return Verdict("skip", inapplicable=inapplicable, inapplicable_ids=inapplicable_ids)
    if outcomes <= {"install-failed"}:
        return Verdict("install-failed")
    if outcomes <= {"env-broken"}:
        return Verdict("env-broken", first_signature=base[0].get("signature"))
    target = list((spec or {}).get("target") or [])
    controls_spec = list((spec or {}).get("controls") or [])
    controls = [r for r in base if is_control(r.get("config"), controls_spec)]
    # A config whose environment could not run it (e.g. a 4-bit config where the day's bitsandbytes cannot load
    # over the node's torch) is no evidence about the target: not a candidate, but listed among the others.
    unusable = [r for r in base if r not in controls and r["outcome"] in UNUSABLE]
    candidates = [r for r in base if r not in controls and r["outcome"] != "skip" and r not in unusable]
    if target and not candidates and not unusable:
        # Nothing here can show the target: every config is not applicable, or a control that by the scenario's
        # own statement cannot show it. Not "not reproduced 0/0": nothing was tried.
        return Verdict(
            "skip", inapplicable=inapplicable, inapplicable_ids=inapplicable_ids,
            controls_total=len([r for r in controls if r["outcome"] not in ("skip", *UNUSABLE)]),
        )  # fmt: skip
    if target and not candidates:
        # Only configs whose environment could not run them: what stopped them is the entry, never a ✓ 0/0 that a
        # reader takes for "works" (bitsandbytes without a library for the node's CUDA, a stack that cannot start).
        broken = any(r["outcome"] == "env-broken" for r in unusable)
        return Verdict(
            "env-broken" if broken else "install-failed",
            first_signature=str(unusable[0].get("signature") or unusable[0]["outcome"]),
            others=dict(Counter(str(r.get("signature") or r["outcome"]) for r in unusable)),
            other_ids={r["config_id"]: str(r.get("signature") or r["outcome"]) for r in unusable},
            unusable_ids={r["config_id"]: str(r.get("signature") or r["outcome"]) for r in unusable},
            config_ids=sorted({r["config_id"] for r in base}),
            inapplicable=inapplicable,
            inapplicable_ids=inapplicable_ids,
        )
    failing = [r for r in candidates if r["outcome"] in BAD]
    hits = [r for r in failing if matches(r.get("signature"), target)] if target else failing
    result = Verdict(
        ("target" if hits else "not-reproduced") if target else ("failures" if hits else "passes"),
        target_records=hits,
        candidates=len(candidates),
        others=dict(Counter(r.get("signature") or r["outcome"] for r in [*failing, *unusable] if r not in hits)),
        other_ids={
            r["config_id"]: str(r.get("signature") or r["outcome"]) for r in [*failing, *unusable] if r not in hits
        },
        config_ids=sorted({r["config_id"] for r in base}),
        # A control whose environment could not run it (env-broken, install-failed) is no evidence either way.
        controls_total=len([r for r in controls if r["outcome"] != "skip" and r["outcome"] not in UNUSABLE]),
        controls_failed=dict(
            Counter(
                (str(r.get("signature") or r["outcome"]), control_label(r.get("config"), controls_spec))
                for r in controls
                if r["outcome"] in BAD and r["outcome"] not in UNUSABLE
            )
        ),
        ran=_how_it_ran(base),
        inapplicable=inapplicable,
        inapplicable_ids=inapplicable_ids,
        unusable_ids={r["config_id"]: str(r.get("signature") or r["outcome"]) for r in unusable},
    )
    hit_ids = {r["config_id"] for r in hits}
    result.fixed, result.partly, result.not_fixed = fix_verdicts(records, hit_ids)
    passed = {r["config_id"] for r in records if r["variant"] != "baseline" and r["outcome"] == "pass"}
    result.fixed_per_config = not result.fixed and bool(hit_ids) and hit_ids <= passed
    # Real fixes before workarounds: the first one listed is the one a user should try first.
    kinds = variant_kinds(spec)
    result.fixed.sort(key=lambda name: kinds.get(name) != "fix")
    result.not_applicable = [name for name, sigs in result.not_fixed if set(sigs) <= {"not-applicable"}]
    result.not_fixed = [(name, sigs) for name, sigs in result.not_fixed if name not in result.not_applicable]
    return result


Format = Callable[[object], str]


def headline(v: Verdict, spec: dict[str, Any] | None, code: Format = str, text: Format = str) -> list[str]:
    """The entry's lines, for the Markdown table (code spans, escaped text) or the site (plain text)."""
    simple = {"empty": "-", "no-baseline": "no baseline", "skip": "SKIP", "install-failed": "INSTALL-FAILED"}
    if v.state in simple:
        lines = [simple[v.state]] + (_inapplicable_line(v, text) if v.state == "skip" else [])
        if v.state == "skip" and v.controls_total:
            lines.append(f"controls (cannot show the target): {v.controls_total} ran")
        return lines
    if v.state == "env-broken":
        return [f"ENV-BROKEN {code(v.first_signature)}"]
    hits = v.target_records
    kinds = variant_kinds(spec)

    def named(variant: str, count: str = "") -> str:
        notes = [n for n in (count, "workaround" if kinds.get(variant) == "workaround" else "") if n]
        return text(fix_words(variant)) + (f" ({', '.join(notes)})" if notes else "")

    if v.state in ("target", "failures"):
        by_signature = Counter(r["signature"] for r in hits)
        label = "target " if v.state == "target" else ""
        head = ", ".join(
            f"{_word(hits, s)} {label}{code(s)}" for s, _ in sorted(by_signature.items(), key=lambda kv: -kv[1])
        )
        lines = [f"{head} ({len(hits)}/{v.candidates})" + _off_by(hits, spec)]
        if v.fixed:
            lines.append("fixed by: " + " · ".join(named(n) for n in v.fixed))
        if v.partly:
            lines.append("partly: " + " · ".join(named(n, f"{k}/{len(hits)}") for n, k in v.partly))
        if v.not_fixed:
            lines.append(
                "not fixed by: " + ", ".join(f"{text(fix_words(n))} [{text(', '.join(s))}]" for n, s in v.not_fixed)
            )
        if v.not_applicable:
            lines.append("not applicable here: " + ", ".join(text(fix_words(n)) for n in v.not_applicable))
    elif v.state == "not-reproduced":
        lines = [f"target not reproduced (0/{v.candidates})"]
    else:
        lines = [f"not reproduced ({v.candidates})"]
    if v.others:
        lines.append("other failures: " + ", ".join(f"{code(s)} ({n})" for s, n in _by_count(v.others)))
    lines += _inapplicable_line(v, text)
    if v.controls_total and v.controls_failed:
        target = list((spec or {}).get("target") or [])

        def said(key: tuple[str, str], count: int) -> str:
            signature, label = key
            mode = "the target" if target and matches(signature, target) else "not the target"
            return f"{code(signature)} on {text(label)} ({count}, {mode})"

        failed = ", ".join(said(key, n) for key, n in _by_count(v.controls_failed))
        lines.append(f"controls: FAIL {sum(v.controls_failed.values())}/{v.controls_total} {failed}")
    elif v.controls_total:
        lines.append(f"controls: pass {v.controls_total}/{v.controls_total}")
    lines.append("ran: " + text(_ran_text(v.ran)))
    return lines


def largest_off_by(hits: list[dict[str, Any]], spec: dict[str, Any] | None) -> float | None:
    """How far the target's records are from their hand reference at most, in units of what they compare (S9's
    `off_by`), for scenarios that measure it; None otherwise."""
    if "off_by" not in ((spec or {}).get("table_metrics") or ()):
        return None
    sizes = [(r.get("metrics") or {}).get("off_by") for r in hits]
    sizes = [float(x) for x in sizes if isinstance(x, int | float) and not isinstance(x, bool)]
    return max(sizes) if sizes else None


def _off_by(hits: list[dict[str, Any]], spec: dict[str, Any] | None) -> str:
    largest = largest_off_by(hits, spec)
    return f", off by up to {largest:.2g}x" if largest is not None else ""


def _inapplicable_line(v: Verdict, text: Format) -> list[str]:
    if not v.inapplicable:
        return []
    total = sum(v.inapplicable.values())
    reasons = "; ".join(text(r) for r, _ in _by_count(v.inapplicable)[:2])
    return [f"not applicable here: {total} config{'s' if total > 1 else ''} ({reasons})"]


def short_reason(record: dict[str, Any]) -> str:
    """A not-applicable record's reason, short enough for a table entry (the record keeps the whole text)."""
    why = str(record.get("not_applicable") or record.get("message") or "not applicable")
    first = why.splitlines()[0] if why.strip() else why
    # The rule's words without the quoted detail (the exception text after ": " or in parentheses).
    short = re.sub(r"\s*\(.*$", "", first.split(": ", 1)[0]) or first
    return short[:100]


def _word(records: list[dict[str, Any]], signature: str) -> str:
    return next(r["outcome"] for r in records if r["signature"] == signature).upper()


def _by_count(counts: dict[Any, int]) -> list[tuple[Any, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))


def _ran_text(ran: dict[str, Any]) -> str:
    device = "/".join(ran.get("device") or ["?"]) + (" " + "/".join(ran["gpu"]) if ran.get("gpu") else "")
    ranks = "/".join(str(n) for n in ran.get("world_size") or []) or "?"
    parts = [device, f"world size {ranks}"]
    parts += ["/".join(ran[key]) for key in ("fsdp", "zero", "quantized") if ran.get(key)]
    if ran.get("unmeasured"):
        parts.append(f"setup not measured ({ran['unmeasured']} config{'s' if ran['unmeasured'] > 1 else ''})")
    return ", ".join(parts)


def fix_verdicts(
    records: list[dict[str, Any]], failing_configs: set[str]
) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, list[str]]]]:
    """Variants on exactly the configs where the baseline showed the failure: those that passed on all of
    them, on some (how many), and on none (with what they got instead)."""
    by_variant: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        if r["variant"] != "baseline" and r["config_id"] in failing_configs:
            by_variant.setdefault(r["variant"], {})[r["config_id"]] = r
    fixed, partly, not_fixed = [], [], []
    for variant, results in sorted(by_variant.items()):
        # A variant that could not run on a config (not applicable there) says nothing about fixing it there.
        ran = [r for r in results.values() if r.get("signature") != "not-applicable"]
        if not ran:
            not_fixed.append((variant, ["not-applicable"]))
            continue
        passed = sum(1 for r in ran if r["outcome"] == "pass")
        if passed == len(failing_configs):
            fixed.append(variant)
        elif passed:
            partly.append((variant, passed))
        else:
            not_fixed.append((variant, sorted({r.get("signature") or r["outcome"] for r in ran})))
    return fixed, partly, not_fixed


_FSDP = re.compile(r"fsdp([12])")


def _how_it_ran(base: list[dict[str, Any]]) -> dict[str, Any]:
    """Device, world size, the FSDP version, ZeRO stage and 4-bit weights that really ran: measured facts (`setup`)
    only, never a config's declared path (a Trainer asked for FSDP1 ran FSDP2 on transformers 5); how many records
    measured nothing is said beside them ("setup not measured")."""
    ran = [r for r in base if r["outcome"] != "skip"]
    hardware = [r.get("hardware") or {} for r in ran]
    fsdp, zero, quantized, world = set(), set(), set(), set()
    unmeasured = 0
    for r in ran:
        setup = r.get("setup") or {}
        if not setup:
            unmeasured += 1
            continue
        found = _FSDP.search(str(setup.get("fsdp") or ""))
        if found:
            fsdp.add(f"FSDP{found.group(1)}")
        if setup.get("zero_stage"):
            zero.add(f"ZeRO-{setup['zero_stage']}")
        if setup.get("quantized_weights"):
            quantized.add("4-bit weights")
        if setup.get("world_size"):
            world.add(int(setup["world_size"]))
    if not world:  # records older than the measured setup
        world = {int(h["world_size"]) for h in hardware if h.get("world_size")}
    return {
        "device": sorted({str(h.get("device")) for h in hardware if h.get("device")}),
        "world_size": sorted(world),
        "gpu": sorted({str(h.get("gpu_name")) for h in hardware if h.get("gpu_name")}),
        "fsdp": sorted(fsdp),
        "zero": sorted(zero),
        "quantized": sorted(quantized),
        "unmeasured": unmeasured,
    }
