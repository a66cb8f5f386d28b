"""What sets a failure's configs apart from their scenario's usual config, in words a user can check: a condition on
the user's model or training arguments that a lockfile cannot show ("a modules_to_save head named 'lora_head' (its
name contains 'lora_')"). The judge then says "applies if ...", which fails the gate only under `--strict`.

A detail is a config key (or a key of a dict-valued one: `names.extra`) whose value every config of the failure shares
and most configs of its scenario do not. Its words come from the scenario's SPEC `details`: `"key=value"` for one
value, `"key"` for a template with `{value}`; a value with none is said as `key=value` only where it is a plain
scalar, never as a Python repr (a test holds every committed failure to this).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from harness.define import setup as vocabulary
from harness.knowledge.failures import KnownFailure

#: Config keys that are how a scenario draws its tiny model or its data, never a condition on the user's model.
INCIDENTAL = frozenset({"seed", "hidden", "vocab", "layers", "seq", "seq_len", "steps", "batch", "data_seed", "heads",
                        "kv_heads", "intermediate", "timing_steps"})  # fmt: skip


def details(
    failures: list[KnownFailure], configs: dict[tuple[str, str], list[dict[str, Any]]], specs: dict[str, dict[str, Any]]
) -> dict[str, tuple[str, str]]:
    """failure id -> (its condition on the user's model, in the scenario's declared words; what else its configs ran
    with): '' each where its configs are their scenario's usual ones. `configs`: (scenario, config id) -> the config
    once per record of it, so the usual value is what most records ran."""
    found = {}
    usual_of: dict[str, dict[str, str]] = {}  # per scenario: what most of its records ran
    for failure in failures:
        spec = specs.get(failure.scenario) or {}
        mine = [configs[(failure.scenario, c)][0] for c in failure.config_ids if (failure.scenario, c) in configs]
        # A key the scenario declares a condition is never incidental (S10's `heads` are modules_to_save heads, not a
        # tiny model's attention heads).
        keep = frozenset(k.split("=", 1)[0] for k in spec.get("details") or {})
        if failure.scenario not in usual_of:
            every = [c for (scenario, _), group in configs.items() if scenario == failure.scenario for c in group]
            usual_of[failure.scenario] = _usual(every, keep)
        usual = usual_of[failure.scenario]
        odd = _odd(mine, usual, keep)
        declared = [(k, v) for k, v in odd if _declared(k, v, spec)]
        rest = [(k, v) for k, v in odd if not _declared(k, v, spec)]
        if odd:
            found[failure.id] = (detail_words(declared, spec), detail_words(rest, spec))
        if len(mine) > 1:
            # Configs whose flips name the same releases, each with a condition of its own that they do not all
            # share (S10's `lora_q` target and its draws; two heads and three): it applies if the model holds one of
            # them, never unconditionally and never on the weaker part they share ("a modules_to_save head").
            each = [[(k, v) for k, v in _odd([c], usual, keep) if _declared(k, v, spec)] for c in mine]
            if all(each) and any(sorted(map(repr, e)) != sorted(map(repr, declared)) for e in each):
                words = sorted({detail_words(e, spec) for e in each})
                either = f"one of {len(words)} models: " + " — or — ".join(words) if len(words) > 1 else words[0]
                found[failure.id] = (either, found.get(failure.id, ("", ""))[1])
    return found


def _declared(key: str, value: Any, spec: dict[str, Any]) -> bool:
    """Whether the scenario declares the key (or the key and this value) a condition on the user's model."""
    words = spec.get("details") or {}
    return key in words or f"{key}={_plain(value)}" in words


def _flat(config: dict[str, Any], keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if (key in INCIDENTAL and key not in keep) or vocabulary.is_setup_key(key):
            continue
        if isinstance(value, dict):
            flat |= {f"{key}.{sub}": v for sub, v in value.items()}
        else:
            flat[key] = value
    return flat


def _usual(every: list[dict[str, Any]], keep: frozenset[str] = frozenset()) -> dict[str, str]:
    """key -> the value (as JSON) most of `every` have."""
    everyone = [_flat(c, keep) for c in every]
    usual = {}
    for key in set().union(*everyone):
        counts = Counter(json.dumps(f.get(key), sort_keys=True) for f in everyone)
        usual[key] = max(sorted(counts), key=counts.__getitem__)  # a tie goes the same way in every process
    return usual


def _odd(
    mine: list[dict[str, Any]], usual: dict[str, str], keep: frozenset[str] = frozenset()
) -> list[tuple[str, Any]]:
    """(key, value) every one of `mine` shares that differs from the usual value (`_usual`)."""
    if not mine:
        return []
    flats = [_flat(c, keep) for c in mine]
    odd = []
    for key in sorted(set(flats[0])):
        values = {json.dumps(f.get(key), sort_keys=True) for f in flats}
        if len(values) == 1 and values != {usual.get(key)}:
            odd.append((key, flats[0][key]))
    return odd


def detail_words(odd: list[tuple[str, Any]], spec: dict[str, Any]) -> str:
    """The details in the scenario's words; '' where there are none."""
    words = spec.get("details") or {}
    said = []
    for key, value in odd:
        exact = words.get(f"{key}={_plain(value)}")
        if exact is not None:
            said.append(exact)
        elif key in words:
            said.append(words[key].format(value=_value_words(value, spec)))
        elif isinstance(value, str | int | float | bool) or value is None:
            said.append(f"{key}={_plain(value)}")
        else:
            said.append(f"{key} as in the failing configs")
    return "; ".join(s for s in said if s)


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _value_words(value: Any, spec: dict[str, Any]) -> str:
    """'lora_head' (its name contains 'lora_'); lists as "'a' and 'a_b' (one name a prefix of another)"."""
    reserved = list(spec.get("reserved_words") or [])
    if isinstance(value, list):
        names = [str(v) for v in value]
        prefix = any(a != b and b.startswith(a) for a in names for b in names)
        return " and ".join(f"'{n}'" for n in names) + (" (one name a prefix of another)" if prefix else "")
    if not isinstance(value, str):
        return _plain(value)
    text = str(value)
    inside = [w for w in reserved if w in text]
    return f"'{text}'" + (f" (its name contains {' and '.join(repr(w) for w in inside)})" if inside else "")
