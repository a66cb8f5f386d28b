"""Shrink a failing drawn config to a minimal one that fails with the same signature, in its cell.

Hypothesis does the shrinking: the draw is replayed from its seed (every earlier example counts as
passing, exactly as when it was drawn), so generation reaches the same config; from there the body
runs each candidate in the cell's warm worker and fails only on the same signature. A budget in
seconds and in runs bounds the search; once it is spent, untried candidates count as passing and
the smallest failure seen so far is the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Phase
from hypothesis.database import ExampleDatabase

from harness.execution.phases import CLOCK
from harness.planning.draws import DrawPlan, config_id, explore


@dataclass
class ShrinkResult:
    """The minimal config found, and what the search cost."""

    original: dict[str, Any]
    minimal: dict[str, Any]
    runs: int = 0
    seconds: float = 0.0
    budget_spent: bool = False
    #: False if replaying the draw never reached the original (the strategy changed since it was drawn).
    reached: bool = True
    tried: list[str] = field(default_factory=list)

    def as_record(self) -> dict[str, Any]:
        return {
            "minimal_config": self.minimal,
            "minimal_config_id": config_id(self.minimal),
            "shrink": {
                "runs": self.runs,
                "seconds": round(self.seconds, 2),
                "budget_spent": self.budget_spent,
                "reached": self.reached,
            },
        }


class _SameFailure(Exception):
    """Raised inside the property when a candidate fails with the target signature."""


def shrink(
    strategy: Any,
    plan: DrawPlan,
    original: dict[str, Any],
    signature: str,
    observe: Callable[[dict[str, Any]], str | None],
    *,
    max_seconds: float,
    max_runs: int,
    database: ExampleDatabase | None = None,
) -> ShrinkResult:
    """`observe(config)` runs one candidate in the cell and returns its failure signature (None if it passed)."""
    target = config_id(original)
    result = ShrinkResult(original, original)
    seen: dict[str, str | None] = {target: signature}
    state = {"reached": False}
    started = time.monotonic()

    def body(config: dict[str, Any]) -> None:
        cid = config_id(config)
        if not state["reached"]:
            if cid != target:
                return  # before the original: passes, as it did while drawing
            state["reached"] = True
        if cid not in seen:
            if result.runs >= max_runs or time.monotonic() - started >= max_seconds:
                result.budget_spent = True
                return
            result.runs += 1
            seen[cid] = observe(config)
            result.tried.append(cid)
        if seen[cid] == signature:
            # The shrinker only tries candidates smaller than its current best, so the latest is the smallest.
            result.minimal = config
            raise _SameFailure(cid)

    try:
        explore(strategy, body, plan, [Phase.generate, Phase.shrink], database)
    except _SameFailure:
        pass
    except Exception:  # Hypothesis' own complaints (Flaky, ...): the best result so far stands
        pass
    result.reached = state["reached"]
    result.seconds = time.monotonic() - started
    CLOCK.add("shrinking", result.seconds)
    return result
