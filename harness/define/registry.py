"""Find scenario modules and read their specs without importing the ML stack."""

from __future__ import annotations

import fnmatch
import importlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from harness.define.packages import import_name
from harness.define.spec import ScenarioSpec, typed_spec
from harness.errors import OptionError, UsageError
from harness.paths import SCENARIO_DIR


def validate_spec(module_name: str, spec: Any) -> ScenarioSpec:
    """The scenario contract (docs/scenario-contract.md), checked when the scenario is found: every key known and
    typed (`define/spec.py`), its target naming a known failure; one line naming the module and key, never a
    half-read spec."""
    typed = typed_spec(module_name, spec)
    from scenarios.failure_names import KNOWN_ISSUES

    for name in typed.target:
        family = name.rstrip("*").removeprefix("check-")
        if not any(known.startswith(family) or family.startswith(known) for known in KNOWN_ISSUES):
            raise UsageError(f"{module_name}: SPEC.target: {name!r} names no failure in scenarios/failure_names.py "
                             "(a typo?)")  # fmt: skip
    return typed


@dataclass(frozen=True)
class Scenario:
    """A scenario found: its module, the SPEC as the module wrote it (`spec`, what the cell side reads) and as the
    harness reads it (`typed`, validated)."""

    id: str
    module_name: str
    module: ModuleType
    spec: dict[str, Any]
    typed: ScenarioSpec

    @property
    def distributed(self) -> bool:
        return self.typed.distributed

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.typed.variants)

    def variant_kind(self, variant: str) -> str:
        return str(self.typed.variants[variant][0])

    def variant_description(self, variant: str) -> str:
        return str(self.typed.variants[variant][1])

    @property
    def requires(self) -> tuple[str, ...]:
        return self.typed.requires

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
        found.append(Scenario(spec["id"], name, module, spec, validate_spec(name, spec)))
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
