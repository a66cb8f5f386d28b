"""Find scenario modules and read their specs without importing the ML stack."""

from __future__ import annotations

import fnmatch
import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.errors import UsageError

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"
#: Distribution name -> import name, for preloading a scenario's requirements in the worker.
IMPORT_NAMES = {"huggingface-hub": "huggingface_hub"}


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

    @property
    def requires(self) -> tuple[str, ...]:
        return tuple(self.spec.get("requires", ()))

    @property
    def preload(self) -> tuple[str, ...]:
        return tuple(IMPORT_NAMES.get(r, r) for r in self.requires)

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
            raise UsageError(f"{where}: unknown scenario {pattern!r} (known: {known})")
        chosen.extend(h for h in hits if h not in chosen)
    return sorted(chosen, key=lambda s: (int(s.id[1:].split("-")[0]), s.id))
