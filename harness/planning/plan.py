"""What a run will do, decided before anything is built or written: `build_plan(profile, ...) -> RunPlan`.

Shared by `matrix` (which then executes the plan), `list cells`, `bisect` and `bench`, so they all see the same
scenarios, variants and cells for the same profile and options. Planning reads the package index (release
rules, pruning) but writes nothing.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.define.cells import Cell, expand
from harness.define.profile import Profile
from harness.define.registry import Scenario, discover, select
from harness.errors import OptionError, UsageError
from harness.planning import draws
from harness.versions import releases
from harness.versions.reduction import Reduction, reduce_cells


@dataclass(frozen=True)
class ScenarioPlan:
    """The scenarios a run covers, their variants, and how Hypothesis draws and shrinks for them."""

    scenarios: tuple[Scenario, ...]
    variants: dict[str, tuple[str, ...]]
    hypothesis: dict[str, float]
    #: scenario id -> digest of its source: which code produced the records.
    digests: dict[str, str]


@dataclass(frozen=True)
class RunPlan:
    """Scenarios x cells of one run (or one attempt's slice of it)."""

    #: With release rules resolved to versions.
    profile: Profile
    scenario_plan: ScenarioPlan
    cells: tuple[Cell, ...]
    reduction: Reduction
    resolved_axes: dict[str, list[str]]
    #: cell id -> why its exact pins cannot work together (from package metadata): skipped, never built.
    pruned: dict[str, str]

    @property
    def scenarios(self) -> tuple[Scenario, ...]:
        return self.scenario_plan.scenarios

    def selected(self, scenario: Scenario, cell: Cell) -> bool:
        """`[scenario."<id>"] cells = [globs]` limits a scenario to some cells. On a world-size axis a
        single-process scenario runs once per stack, in the cell of the first world size listed: in the others
        it would repeat the same one-rank job."""
        globs = self.profile.settings_for(scenario.id).cells
        if not scenario.distributed and cell.world_size != self.profile.world_sizes[0]:
            return False
        return globs is None or matches(cell.cell_id, globs)


def plan_scenarios(
    profile: Profile, patterns: tuple[str, ...] | None = None, hypothesis_profile: str | None = None
) -> ScenarioPlan:
    """The scenario half of a plan. Checks everything about scenarios a profile or the command line names, so
    a typo is an error before any run directory is touched."""
    where = "{scenarios}" if patterns else f"{profile.path}: profile.scenarios"
    scenarios = select(patterns or profile.scenarios, where=where)
    _check_scenario_sections(profile)
    return ScenarioPlan(
        scenarios=tuple(scenarios),
        variants={s.id: variants_for(profile, s) for s in scenarios},
        hypothesis=hypothesis_settings(profile, hypothesis_profile),
        digests={s.id: source_digest(s) for s in scenarios},
    )


def build_plan(
    profile: Profile,
    scenario_plan: ScenarioPlan | None = None,
    *,
    cell_patterns: tuple[str, ...] | None = None,
    shard: tuple[int, int] | None = None,
    world_sizes: tuple[int, ...] | None = None,
    reduce: str | None = None,
    prune: bool = True,
    wheelhouse: Path | None = None,
    resolved: dict[str, list[str]] | None = None,
) -> RunPlan:
    """Resolve release rules (or reuse `resolved`, a resumed run's), expand and reduce the cells, take the
    --cell/--shard slice, and prune cells whose pins contradict each other."""
    scenario_plan = scenario_plan or plan_scenarios(profile)
    profile, resolved_axes = releases.resolve_axes(profile, wheelhouse, resolved)
    cells, reduction = reduce_cells(expand(profile), reduce or profile.reduce)
    cells = _sliced(_of_world_sizes(cells, world_sizes, profile), cell_patterns, shard, profile)
    pruned = _prune(cells, profile, wheelhouse) if prune else {}
    return RunPlan(profile, scenario_plan, tuple(cells), reduction, resolved_axes, pruned)


def hypothesis_settings(profile: Profile, override: str | None = None) -> dict[str, float]:
    name = override or profile.hypothesis_profile
    if name not in draws.HYPOTHESIS_PROFILES:
        known = ", ".join(draws.HYPOTHESIS_PROFILES)
        where = "{hypothesis_profile}" if override else f"{profile.path}: profile.hypothesis_profile"
        raise OptionError(f"{where}: unknown hypothesis profile {name!r} (known: {known})")
    return draws.HYPOTHESIS_PROFILES[name]


def draw_configs(
    profile: Profile,
    scenarios: list[Scenario],
    hypothesis: dict[str, float],
    examples: int | None,
    example_db: Path | None,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, int]]]:
    """The configs each scenario runs in every cell of a run (drawn once, from the profile's seed), and how
    they were drawn (so the shrinker can replay the draw)."""
    factor = int(hypothesis["draw_factor"])
    planned, how = {}, {}
    for scenario in scenarios:
        settings = profile.settings_for(scenario.id)
        if examples is not None:
            count = examples
        else:
            count = (settings.examples if settings.examples is not None else profile.examples_per_scenario) * factor
        draw = draws.draw_plan(profile.hypothesis_seed, scenario.id, count)
        memory = example_db if profile.failure_memory else None
        remembered = draws.remembered_configs(scenario.strategy(), draw, memory, scenario.id)
        own = scenario.examples()
        if settings.seed_examples is not None:
            own = own[: settings.seed_examples]
        planned[scenario.id] = draws.plan_configs(own, list(settings.configs), scenario.strategy(), draw, remembered)
        how[scenario.id] = {"seed": draw.seed, "max_examples": draw.max_examples, "count": draw.count}
    return planned, how


def variants_for(profile: Profile, scenario: Scenario) -> tuple[str, ...]:
    """The scenario's variants, or the subset the profile names (an unknown name is a usage error)."""
    wanted = profile.settings_for(scenario.id).variants
    if wanted is None:
        return scenario.variants
    unknown = [v for v in wanted if v not in scenario.variants]
    if unknown:
        raise UsageError(
            f'{profile.path}: scenario."{scenario.id}".variants: unknown variant(s) {", ".join(unknown)} '
            f"(known: {', '.join(scenario.variants)})"
        )
    return tuple(wanted)


def source_digest(scenario: Scenario) -> str:
    return hashlib.sha1(Path(scenario.module.__file__ or "").read_bytes()).hexdigest()[:12]


def matches(cell_id: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(cell_id, p) for p in patterns)


def _check_scenario_sections(profile: Profile) -> None:
    """A `[scenario."<id>"]` section must name a real scenario: a typo would silently drop its settings."""
    known = {s.id for s in discover()}
    for scenario_id in profile.scenario_settings:
        if scenario_id not in known:
            raise UsageError(
                f'{profile.path}: scenario."{scenario_id}": unknown scenario (known: {", ".join(sorted(known))})'
            )


def _of_world_sizes(cells: list[Cell], wanted: tuple[int, ...] | None, profile: Profile) -> list[Cell]:
    """--world-size N: only the cells that run at N ranks (a runner with N GPUs takes those)."""
    if not wanted:
        return cells
    chosen = [c for c in cells if c.world_size in wanted]
    if not chosen:
        listed = ", ".join(map(str, profile.world_sizes))
        raise OptionError(f"{{world_sizes}} {' '.join(map(str, wanted))}: profile {profile.name} lists {listed}")
    return chosen


def _sliced(
    cells: list[Cell], patterns: tuple[str, ...] | None, shard: tuple[int, int] | None, profile: Profile
) -> list[Cell]:
    """The cells this attempt runs (--cell globs, --shard); a slice that selects nothing is bad input."""
    chosen = [c for c in cells if not patterns or matches(c.cell_id, patterns)]
    if patterns and not chosen:
        known = ", ".join(c.cell_id for c in cells)
        raise OptionError(
            f"{{cells}} {' '.join(patterns)}: matches no cell of profile {profile.name} (its cells: {known})"
        )
    if shard:
        index, count = shard
        chosen = [c for position, c in enumerate(chosen) if position % count == index - 1]
        if not chosen:
            raise OptionError(f"{{shard}} {index}/{count}: no cell falls into this shard")
    return chosen


def _prune(cells: list[Cell], profile: Profile, wheelhouse: Path | None) -> dict[str, str]:
    """Cells whose exact pins contradict each other's Requires-Dist (skipped with the reason, never built)."""
    from harness.planning.pruning import conflict

    found = {}
    for cell in cells:
        if cell.excluded_reason or profile.install_mode == "system":
            continue
        reason = conflict(cell, profile.python, wheelhouse)
        if reason:
            found[cell.cell_id] = reason
    return found
