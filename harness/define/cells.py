"""Expand a profile into cells: one isolated environment per version combination."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field

from packaging.version import Version

from harness.define.packages import AXIS_PACKAGES, short_name
from harness.define.profile import ABSENT, DATE_AXIS, LATEST, SYSTEM, Profile


@dataclass(frozen=True)
class Cell:
    """One version combination. `choices` are the profile's values; `requirements` what uv installs."""

    stack: str | None
    choices: tuple[tuple[str, str], ...]
    implied: tuple[tuple[str, str], ...]
    excluded_reason: str | None = None
    #: Packages the stack sets jointly; the stack's name stands for them in the id.
    stack_packages: frozenset[str] = field(default=frozenset(), compare=False)
    #: Ranks a distributed scenario runs with in this cell (the profile's world_size axis): an int, or
    #: "all-gpus" (whatever the node has). Single-process scenarios always run one rank.
    world_size: int | str = 2
    #: Whether the profile lists several world sizes: then the id says which ("..._ws-4").
    world_size_in_id: bool = field(default=False, compare=False)

    @property
    def pins(self) -> dict[str, str]:
        return dict(self.choices)

    @property
    def cell_id(self) -> str:
        """Readable and filesystem-safe: 'old_torch-2.13.0_ds-0.19.2_bnb-latest' (+ '_ws-4' on a world-size axis)."""
        return self.stack_id + (f"_ws-{self.world_size}" if self.world_size_in_id else "")

    @property
    def stack_id(self) -> str:
        """The id of what is installed: cells that differ only in world size share one environment."""
        parts = [self.stack] if self.stack else []
        for package, value in self.choices:
            if package not in self.stack_packages:
                parts.append(f"{short_name(package)}-{value}")
        return "_".join(parts)

    @property
    def date(self) -> str | None:
        """The install date of a cell on a date axis: every package as the index had it that day."""
        return self.pins.get(DATE_AXIS)

    def requirements(self) -> list[str]:
        """Requirement lines: exact pins, bare names for 'latest', nothing for 'none' or 'system'."""
        lines = []
        for package, value in self.choices:
            if value in (ABSENT, SYSTEM) or package == DATE_AXIS:
                continue
            lines.append(package if value == LATEST else f"{package}=={value}")
        lines.extend(f"{package}{spec}" for package, spec in self.implied)
        return lines

    def system_packages(self) -> list[str]:
        """Packages the cell takes from the node's own python (pin 'system')."""
        return [package for package, value in self.choices if value == SYSTEM]

    def env_key(self, python: str, extra: tuple[str, ...]) -> str:
        """Stable hash of everything that decides the environment's contents."""
        facts: dict[str, object] = {"python": python, "req": self.requirements(), "extra": list(extra)}
        if self.date:
            facts["date"] = self.date
        blob = json.dumps(facts, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def expand(profile: Profile) -> list[Cell]:
    """Full product of the axes and the stacks, with implied pins and exclusions applied."""
    order = (DATE_AXIS, *AXIS_PACKAGES)
    axis_names = [p for p in order if p in profile.axes]
    stack_names: list[str | None] = list(profile.stacks) or [None]
    stack_packages = frozenset(next(iter(profile.stacks.values()), {}))
    cells = []
    for stack in stack_names:
        stack_pins = profile.stacks.get(stack, {}) if stack else {}
        for values in itertools.product(*(profile.axes[a] for a in axis_names)):
            chosen = dict(zip(axis_names, values, strict=True)) | stack_pins
            ordered = tuple((p, chosen[p]) for p in order if p in chosen)
            for world_size in profile.world_sizes:
                cell = Cell(
                    stack=stack,
                    choices=ordered,
                    implied=_implied_pins(profile, chosen),
                    excluded_reason=_exclusion_reason(profile, stack, chosen),
                    stack_packages=stack_packages,
                    world_size=world_size,
                    world_size_in_id=len(profile.world_sizes) > 1,
                )
                cells.append(cell)
    return cells


def _matches(value: str, spec) -> bool:
    """'latest' and 'system' count as newer than any release; 'none' never matches."""
    if value == ABSENT:
        return False
    if value in (LATEST, SYSTEM):
        return spec.contains("99999", prereleases=True)
    return spec.contains(Version(value), prereleases=True)


def _implied_pins(profile: Profile, chosen: dict[str, str]) -> tuple[tuple[str, str], ...]:
    pins: dict[str, str] = {}
    for rule in profile.implied:
        if all(pkg in chosen and _matches(chosen[pkg], spec) for pkg, spec in rule.when.items()):
            pins.update(rule.pins)
    return tuple(sorted(pins.items()))


def _exclusion_reason(profile: Profile, stack: str | None, chosen: dict[str, str]) -> str | None:
    for rule in profile.exclusions:
        if all((stack == v) if axis == "stack" else (chosen.get(axis) == v) for axis, v in rule.when.items()):
            return rule.reason
    return None
