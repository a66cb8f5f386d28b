"""Draw each scenario's configs once per run, from a recorded seed, so every cell gets the same ones."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings


def config_id(config: dict[str, Any]) -> str:
    """Stable id of a config: sha1 of its canonical JSON."""
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]


def draw_configs(strategy: Any, count: int, draw_seed: int) -> list[dict[str, Any]]:
    """Up to `count` distinct configs from a Hypothesis strategy, deterministic for a given seed."""
    drawn: list[dict[str, Any]] = []
    if count <= 0:
        return drawn

    @settings(
        max_examples=count * 4,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @seed(draw_seed)
    @given(strategy)
    def collect(config: dict[str, Any]) -> None:
        if len(drawn) < count and all(config_id(config) != config_id(c) for c in drawn):
            drawn.append(config)

    collect()
    return drawn


def plan_configs(
    examples: list[dict[str, Any]], profile_configs: list[dict[str, Any]], strategy: Any, count: int, draw_seed: int
) -> list[dict[str, Any]]:
    """Explicit examples first (they always run), then profile configs, then `count` drawn ones."""
    planned: list[dict[str, Any]] = []
    seen: set[str] = set()
    sources = [("example", c) for c in examples] + [("profile", c) for c in profile_configs]
    sources += [("hypothesis", c) for c in draw_configs(strategy, count, draw_seed)]
    for source, config in sources:
        cid = config_id(config)
        if cid not in seen:
            seen.add(cid)
            planned.append({"config": config, "config_id": cid, "source": source})
    return planned
