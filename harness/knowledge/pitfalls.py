"""Pitfalls: a config that shows its scenario's target on every install day it ran on a device class (at least
`PITFALL_STACKS` different stacks), never failing another way there and never passing in any record of that device
(probes and sweeps included). It is a property of the setup, not of a version: listed once, apart, and never counted
in a stack's k/n, in a flip, in "what changed lately", in an advisory or in `check`'s exit code. The records decide; a
scenario's SPEC `own_code` only words why (S9's loops written by hand: off on every release, by their own
arithmetic)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.define.profile import DATE_AXIS
from harness.knowledge.evidence import OTHER, PASSES, SHOWS, device_class, stack_of, state
from scenarios.failure_names import family as failure_family

#: A pitfall needs the failure on at least this many different stacks (one stack twice is one release).
PITFALL_STACKS = 3


@dataclass
class Pitfall:
    """A config that fails on every release measured on a device class."""

    scenario: str
    config_id: str
    device: str
    config: dict[str, Any]
    family: str
    stacks: int
    first_day: str
    last_day: str
    #: The smallest and largest discrepancy (S9's off_by), where the scenario measures one.
    off_by: tuple[float, float] | None = None
    #: The variants that passed on this config on its newest day (the way out).
    fixes: list[str] = field(default_factory=list)

    def words(self, spec: dict[str, Any] | None) -> str:
        """Why it fails on every release: the scenario's own words for this setup (SPEC own_code), else neutral."""
        for condition, text in ((spec or {}).get("own_code") or {}).items():
            key, _, value = condition.partition("=")
            if str(self.config.get(key)) == value:
                return text
        return "fails on every release measured: a pitfall of this setup, not of a version"


def pitfalls(
    records: list[dict[str, Any]], specs: dict[str, dict[str, Any]], probes: Iterable[dict[str, Any]] = ()
) -> dict[tuple[str, str], Pitfall]:
    """Each pitfall, keyed by `pitfall_key` (scenario and device class, config id). The table's records (`records`,
    the newest evidence per key) decide on the atlas days; any record of the config that passes, among them or among
    the `probes` (flips' moves and sweeps, bisects, the watch), rules it out."""
    baseline: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record["variant"] == "baseline" and record["scenario"] in specs:
            baseline[(record["scenario"], device_class(record), record["config_id"])].append(record)
    passed = {
        (r["scenario"], device_class(r), r["config_id"])
        for r in probes
        if r["variant"] == "baseline" and r["outcome"] == "pass"
    }
    found: dict[tuple[str, str], Pitfall] = {}
    for (scenario, device, config_id), mine in baseline.items():
        spec = specs.get(scenario)
        judged = [(r, state(r, spec)) for r in mine]
        if (scenario, device, config_id) in passed or any(e == PASSES for _, e in judged):
            continue
        dated = [(r, e) for r, e in judged if (r.get("pins") or {}).get(DATE_AXIS)]
        if any(e == OTHER for _, e in dated):
            continue  # failed another way on some day: the failure's history is a version's, not the setup's
        shown = [r for r, e in dated if e == SHOWS]
        stacks = {tuple(sorted(stack_of(r).items())) for r in shown}
        families = {failure_family(r.get("signature")) for r in shown}
        if len(stacks) < PITFALL_STACKS or len(families) != 1:
            continue
        days = sorted(str(r["pins"][DATE_AXIS]) for r in shown)
        sizes = [float(x) for r in shown if isinstance(x := (r.get("metrics") or {}).get("off_by"), int | float)]
        newest = max(shown, key=lambda r: r["pins"][DATE_AXIS])
        found[pitfall_key(scenario, device, config_id)] = Pitfall(
            scenario, config_id, device, dict(newest.get("config") or {}), families.pop(), len(stacks), days[0],
            days[-1], (min(sizes), max(sizes)) if sizes else None, _passing_fixes(records, newest),
        )  # fmt: skip
    return found


def pitfall_key(scenario: str, device: str, config_id: str) -> tuple[str, str]:
    return (f"{scenario}@{device}", config_id)


def is_pitfall(record: dict[str, Any], found: dict[tuple[str, str], Pitfall]) -> bool:
    return pitfall_key(record["scenario"], device_class(record), record["config_id"]) in found


def without_pitfalls(
    records: list[dict[str, Any]], found: dict[tuple[str, str], Pitfall]
) -> tuple[list[dict[str, Any]], set[str]]:
    """The records that are not of a pitfall config (every variant of it), and the pitfall configs left out."""
    kept, left_out = [], set()
    for record in records:
        if is_pitfall(record, found):
            left_out.add(record["config_id"])
        else:
            kept.append(record)
    return kept, left_out


def _passing_fixes(records: list[dict[str, Any]], newest: dict[str, Any]) -> list[str]:
    """The variants that passed on the config in the newest day's cell."""
    return sorted(
        {
            r["variant"]
            for r in records
            if r["cell"] == newest["cell"] and r["config_id"] == newest["config_id"]
            and r["scenario"] == newest["scenario"] and r["variant"] != "baseline" and r["outcome"] == "pass"
        }
    )  # fmt: skip
