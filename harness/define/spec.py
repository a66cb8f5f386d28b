"""A scenario's SPEC as one typed value, every key declared once: its type, its default and what it means, checked when
the scenario is found (a key no table here names is a typo: refused, one line naming the module and key). The
harness reads a scenario's properties through `ScenarioSpec`; the dict stays what the scenario module wrote (the
cell side, which never imports the harness, reads it as it is).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from harness.errors import UsageError

#: What a variant is, as the table shows it. `fix`: same setup, a flag or code change a user adds.
#: `workaround`: it changes the setup (another ZeRO stage, other dtypes, another FSDP version), at a cost.
#: `measurement`: not a fix at all, another condition measured (S3's gradient accumulation, ...).
VARIANT_KINDS = ("baseline", "fix", "workaround", "measurement")
DEVICES = ("any", "cpu", "cuda")


@dataclass(frozen=True)
class ScenarioSpec:
    """Every key a scenario's SPEC may hold (docs/scenario-contract.md), typed, with its default."""

    id: str
    title: str
    #: Signature globs of the failure the scenario reproduces (empty only for a measurement scenario).
    target: tuple[str, ...]
    #: Config tables expected to pass (may be empty).
    controls: tuple[Mapping[str, Any], ...]
    #: Variant name -> (kind, one-line description); the first is the baseline.
    variants: Mapping[str, tuple[str, str]]
    #: Upstream threads ("owner/repo#N") about the failure.
    known_issues: tuple[str, ...] = ()
    world_size: int = 1
    device: str = "any"
    #: The packages the scenario imports (the judge's `depends` start here).
    requires: tuple[str, ...] = ()
    #: The setup every config shares, in the vocabulary's keys (harness/define/setup.py).
    setup: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Variant -> the setting a user's config can already hold that the variant is (audit clears with it).
    variant_setup: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    #: Signature prefixes a rank can fail with while the others go on (no peer is waited for).
    in_step_failures: tuple[str, ...] = ()
    #: Metrics the table shows beside an entry (S9's off_by).
    table_metrics: tuple[str, ...] = ()
    #: Flips are named per config: each config is a feature of its own (S9, S10).
    flips_per_config: bool = False
    #: A failure poisons the worker: restart it after one.
    restart_after_failure: bool = True
    #: Config key (or key=value) -> the condition on a user's model it stands for (the judge's "applies if").
    details: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Config key=value -> why a config fails on every release (a pitfall of the user's own code).
    own_code: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Words peft writes into its keys: a module name that contains one is said to.
    reserved_words: tuple[str, ...] = ()
    #: Which drawn configs run the fixes: "failing" (default) or another rule the scenario run knows.
    drawn_variants: str = "failing"
    #: Each job in a process of its own.
    one_job_per_process: bool = False
    #: "scenario": the scenario starts its own process group (the worker starts none).
    process_group: str | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


#: The type each key must have in a SPEC dict (a tuple field may be written as a list).
_TYPES: Mapping[str, tuple[type, ...]] = MappingProxyType(
    {
        "id": (str,), "title": (str,), "target": (list, tuple), "controls": (list, tuple), "variants": (dict,),
        "known_issues": (list, tuple), "world_size": (int,), "device": (str,), "requires": (list, tuple),
        "setup": (dict,), "variant_setup": (dict,), "in_step_failures": (list, tuple), "table_metrics": (list, tuple),
        "flips_per_config": (bool,), "restart_after_failure": (bool,), "details": (dict,), "own_code": (dict,),
        "reserved_words": (list, tuple), "drawn_variants": (str,), "one_job_per_process": (bool,),
        "process_group": (str, type(None)),
    }
)  # fmt: skip


def typed_spec(module_name: str, spec: Any) -> ScenarioSpec:
    """The SPEC dict as a `ScenarioSpec`: every key known and of its type, the contract's rules held; else one line
    naming the module and the key."""

    def bad(key: str, problem: str) -> UsageError:
        return UsageError(f"{module_name}: SPEC.{key}: {problem}")

    if not isinstance(spec, dict):
        raise UsageError(f"{module_name}: SPEC must be a dict")
    known = {f.name for f in fields(ScenarioSpec)}
    for key, value in spec.items():
        if key not in known:
            raise bad(key, f"no such key (known: {', '.join(sorted(known))})")
        if not isinstance(value, _TYPES[key]) or (isinstance(value, bool) and bool not in _TYPES[key]):
            names = " or ".join(t.__name__ for t in _TYPES[key])
            raise bad(key, f"must be a {names}, not {type(value).__name__}")
    for key in ("id", "title"):
        if not spec.get(key):
            raise bad(key, "must be a non-empty string")
    if spec.get("device", "any") not in DEVICES:
        raise bad("device", f"must be one of {', '.join(DEVICES)}")
    if spec.get("world_size", 1) < 1:
        raise bad("world_size", "must be at least 1")
    _check_lists(spec, bad)
    _check_variants(spec, bad)
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}
    for key in ("setup", "variant_setup", "details", "own_code", "variants"):
        if key in values:
            values[key] = MappingProxyType(dict(values[key]))
    return ScenarioSpec(**values)


def _check_lists(spec: dict[str, Any], bad: Any) -> None:
    target = spec.get("target")
    if target is None or not all(isinstance(t, str) and t for t in target):
        raise bad("target", "must be a list of signature globs (empty only for a measurement scenario)")
    controls = spec.get("controls")
    if controls is None or not all(isinstance(c, dict) and c for c in controls):
        raise bad("controls", "must be a list of non-empty {config key: value} tables (may be empty)")
    for key in ("known_issues", "requires", "in_step_failures", "table_metrics", "reserved_words"):
        if not all(isinstance(x, str) and x for x in spec.get(key, ())):
            raise bad(key, "must be a list of non-empty strings")


def _check_variants(spec: dict[str, Any], bad: Any) -> None:
    variants = spec.get("variants")
    if not variants:
        raise bad("variants", "must be a table: variant name -> (kind, one-line description)")
    names = list(variants)
    if names[0] != "baseline" or variants["baseline"][0] != "baseline":
        raise bad("variants", "the first variant must be baseline, of kind baseline")
    for name, value in variants.items():
        if not (isinstance(value, tuple | list) and len(value) == 2 and value[0] in VARIANT_KINDS):
            raise bad(f"variants.{name}", f"must be (kind, description) with kind one of {', '.join(VARIANT_KINDS)}")
        if not isinstance(value[1], str) or not value[1].strip() or "\n" in value[1]:
            raise bad(f"variants.{name}", "the description must be one non-empty line")
        if value[0] == "baseline" and name != "baseline":
            raise bad(f"variants.{name}", "only the baseline is of kind baseline")
    if not spec.get("target") and any(v[0] in ("fix", "workaround") for v in variants.values()):
        raise bad("target", "a scenario with fixes must name the failure they fix")
    for name in spec.get("variant_setup", {}):
        if name not in variants:
            raise bad(f"variant_setup.{name}", "names no variant of the scenario")
