"""Draw each scenario's configs once per run, from a recorded seed, so every cell gets the same ones.

All Hypothesis use goes through `explore`: drawing, replaying remembered failures, and shrinking run
the same property function, so they share one example-database key (namespaced per scenario). That
is what lets a failure shrunk in one run be drawn first in the next.
"""

from __future__ import annotations

import hashlib
import json
import unittest
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, ReadOnlyDatabase

#: Hypothesis settings profiles a matrix profile (or --hypothesis-profile) chooses between.
#: `draw_factor` multiplies the examples drawn; the shrink budget bounds each failure's search.
HYPOTHESIS_PROFILES: dict[str, dict[str, float]] = {
    "ci": {"draw_factor": 1, "shrink_seconds": 90, "shrink_calls": 60},
    "explore": {"draw_factor": 10, "shrink_seconds": 900, "shrink_calls": 1000},
}
#: How many remembered failures per scenario a run tries first.
REMEMBERED_LIMIT = 4


@dataclass(frozen=True)
class DrawPlan:
    """Everything needed to draw a scenario's configs again, identically (the shrinker needs that)."""

    seed: int
    max_examples: int
    count: int


def config_id(config: dict[str, Any]) -> str:
    """Stable id of a config: sha1 of its canonical JSON."""
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]


def scenario_seed(base_seed: int, scenario_id: str) -> int:
    """Per-scenario seed that does not depend on which other scenarios a run selects."""
    return base_seed + int(hashlib.sha1(scenario_id.encode()).hexdigest()[:6], 16)


def draw_plan(base_seed: int, scenario_id: str, count: int) -> DrawPlan:
    return DrawPlan(scenario_seed(base_seed, scenario_id), max(count * 4, 1), count)


class ScenarioDatabase(ExampleDatabase):
    """One directory database shared by all scenarios, with each scenario's keys kept apart."""

    def __init__(self, path: Path, scenario_id: str) -> None:
        super().__init__()
        self.inner = DirectoryBasedExampleDatabase(str(path))
        self.prefix = scenario_id.encode() + b"\0"

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.prefix + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        yield from self.inner.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self.prefix + src, self.prefix + dest, value)


def explore(
    strategy: Any,
    body: Callable[[dict[str, Any]], None],
    plan: DrawPlan,
    phases: list[Phase],
    database: ExampleDatabase | None,
) -> None:
    """Run `body` over the strategy's examples with Hypothesis; exceptions from body propagate."""

    def scenario_property(config: dict[str, Any]) -> None:
        body(config)

    test = settings(
        max_examples=plan.max_examples,
        database=database,
        deadline=None,
        phases=phases,
        derandomize=False,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )(seed(plan.seed)(given(strategy)(scenario_property)))
    try:
        test()
    except unittest.SkipTest:
        pass  # "told to run no examples": an empty database in the reuse phase


def draw_configs(strategy: Any, plan: DrawPlan) -> list[dict[str, Any]]:
    """Up to `plan.count` distinct configs, deterministic for the plan's seed."""
    drawn: list[dict[str, Any]] = []
    if plan.count <= 0:
        return drawn
    ids: set[str] = set()

    def collect(config: dict[str, Any]) -> None:
        if len(drawn) < plan.count and config_id(config) not in ids:
            ids.add(config_id(config))
            drawn.append(config)

    explore(strategy, collect, plan, [Phase.generate], None)
    return drawn


def remembered_configs(
    strategy: Any, plan: DrawPlan, database_path: Path | None, scenario_id: str
) -> list[dict[str, Any]]:
    """Failing configs earlier runs saved (minimal ones first), replayed read-only from the database."""
    if database_path is None or not database_path.is_dir():
        return []
    found: list[dict[str, Any]] = []

    def collect(config: dict[str, Any]) -> None:
        if len(found) < REMEMBERED_LIMIT and all(config_id(config) != config_id(c) for c in found):
            found.append(config)

    database = ReadOnlyDatabase(ScenarioDatabase(database_path, scenario_id))
    explore(strategy, collect, plan, [Phase.reuse], database)
    return found


def plan_configs(
    examples: list[dict[str, Any]],
    profile_configs: list[dict[str, Any]],
    strategy: Any,
    plan: DrawPlan,
    remembered: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Explicit examples first (they always run), then profile configs, remembered failures, and drawn ones.

    A drawn config equal to an explicit one is listed once, with both sources, so the table can say
    that Hypothesis reached it too.
    """
    planned: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    sources = [("example", c) for c in examples] + [("profile", c) for c in profile_configs]
    sources += [("memory", c) for c in remembered or []]
    sources += [("hypothesis", c) for c in draw_configs(strategy, plan)]
    for source, config in sources:
        cid = config_id(config)
        if cid in by_id:
            first = by_id[cid]
            if source != first["source"] and source not in first.get("also_from", []):
                first.setdefault("also_from", []).append(source)
            continue
        entry = {"config": config, "config_id": cid, "source": source}
        by_id[cid] = entry
        planned.append(entry)
    return planned


def is_drawn(planned: dict[str, Any]) -> bool:
    """Drawn (or remembered) configs run the baseline first; fixes run only where it fails."""
    return planned["source"] in ("hypothesis", "memory")
