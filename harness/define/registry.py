"""Find scenario modules and read their specs without importing the ML stack."""

from __future__ import annotations

import fnmatch
import importlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from harness.define.packages import import_name
from harness.errors import OptionError, UsageError
from harness.paths import SCENARIO_DIR

#: What a variant is, as the table shows it. `fix`: same setup, a flag or code change a user adds.
#: `workaround`: it changes the setup (another ZeRO stage, other dtypes, another FSDP version), at a cost.
#: `measurement`: not a fix at all, another condition measured (S3's gradient accumulation, ...).
VARIANT_KINDS = ("baseline", "fix", "workaround", "measurement")


def validate_spec(module_name: str, spec: Any) -> None:
    """The scenario contract (docs/scenario-contract.md), checked when the scenario is found: one line naming
    the module and key, never a half-read spec."""

    def bad(key: str, problem: str) -> UsageError:
        return UsageError(f"{module_name}: SPEC.{key}: {problem}")

    if not isinstance(spec, dict):
        raise UsageError(f"{module_name}: SPEC must be a dict")
    for key in ("id", "title"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise bad(key, "must be a non-empty string")
    target = spec.get("target")
    if not isinstance(target, list) or not all(isinstance(t, str) and t for t in target):
        raise bad("target", "must be a list of signature globs (empty only for a measurement scenario)")
    controls = spec.get("controls")
    if not isinstance(controls, list) or not all(isinstance(c, dict) and c for c in controls):
        raise bad("controls", "must be a list of non-empty {config key: value} tables (may be empty)")
    variants = spec.get("variants")
    if not isinstance(variants, dict) or not variants:
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
    if not target and any(v[0] in ("fix", "workaround") for v in variants.values()):
        raise bad("target", "a scenario with fixes must name the failure they fix")
    from scenarios.failure_names import KNOWN_ISSUES

    for name in target:
        family = name.rstrip("*").removeprefix("check-")
        if not any(known.startswith(family) or family.startswith(known) for known in KNOWN_ISSUES):
            raise bad("target", f"{name!r} names no failure in scenarios/failure_names.py (a typo?)")


@dataclass(frozen=True)
class Scenario:
    id: str
    module_name: str
    module: ModuleType
    spec: dict[str, Any]

    @property
    def distributed(self) -> bool:
        return int(self.spec.get("world_size", 1)) > 1

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.spec["variants"])

    def variant_kind(self, variant: str) -> str:
        return str(self.spec["variants"][variant][0])

    def variant_description(self, variant: str) -> str:
        return str(self.spec["variants"][variant][1])

    @property
    def requires(self) -> tuple[str, ...]:
        return tuple(self.spec.get("requires", ()))

    @property
    def preload(self) -> tuple[str, ...]:
        return tuple(import_name(r) for r in self.requires)

    def examples(self) -> list[dict[str, Any]]:
        return list(getattr(self.module, "EXAMPLES", []))

    def strategy(self) -> Any:
        return self.module.strategy()


#: Extra scenario modules (comma-separated import names, e.g. the fault-injection scenarios of the tests).
EXTRA_ENV = "COMPAT_MATRIX_EXTRA_SCENARIOS"


def discover() -> list[Scenario]:
    """Every `scenarios/s<N>_*.py` plus the modules named in $COMPAT_MATRIX_EXTRA_SCENARIOS, sorted by id."""
    found = []
    names = [f"scenarios.{path.stem}" for path in sorted(SCENARIO_DIR.glob("s[0-9]*_*.py"))]
    names += [n.strip() for n in os.environ.get(EXTRA_ENV, "").split(",") if n.strip()]
    for name in names:
        module = importlib.import_module(name)
        spec = module.SPEC
        validate_spec(name, spec)
        found.append(Scenario(spec["id"], name, module, spec))
    return sorted(found, key=lambda s: (int(s.id[1:].split("-")[0]), s.id))


def select(
    patterns: tuple[str, ...] | list[str], scenarios: list[Scenario] | None = None, where: str = "scenario"
) -> list[Scenario]:
    """Scenarios whose id matches any glob; a pattern matching nothing is a usage error naming `where` the
    pattern came from (a profile file and key, or a flag)."""
    scenarios = discover() if scenarios is None else scenarios
    chosen = []
    for pattern in patterns:
        hits = [s for s in scenarios if fnmatch.fnmatchcase(s.id, pattern) or s.id.split("-")[0] == pattern]
        if not hits:
            known = ", ".join(s.id for s in scenarios)
            raise OptionError(f"{where}: unknown scenario {pattern!r} (known: {known})")
        chosen.extend(h for h in hits if h not in chosen)
    return sorted(chosen, key=lambda s: (int(s.id[1:].split("-")[0]), s.id))
