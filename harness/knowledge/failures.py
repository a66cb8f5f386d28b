"""The known failures: each failure of one scenario on one device class, for the configs whose records share its
history, with the conditions it shows under and the records behind every bound.

A failure is made from the changes the flips, sweeps and verified findings name (`flips.Change`): the changes of one
failure family whose configs overlap are one failure (S4: torch 2.5.0 brings it, deepspeed 0.19.3 ends it, on the
same configs). A config that shows a failure no change names (present on every day measured, or on some days with no
release named between) is a failure too, one per setup. Pitfall configs are never part of one.

Each failure carries its observations: every baseline record of its configs on its device (the table's and the
probes'), as what it shows of this failure: it shows it, it passes, or it failed another way (no evidence either way).
The judge (`judge.py`) reads nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.define import setup as vocabulary
from harness.define.packages import AXIS_PACKAGES
from harness.knowledge.evidence import NONE, OTHER, PASSES, SHOWS, depends_of, device_class, stack_of, world_size
from harness.knowledge.evidence import state as record_state
from harness.knowledge.fixes import FixObservation, fixes_of_failure
from harness.knowledge.flips import Change
from harness.knowledge.judge import AFFECTED, CLEAR, MEASURED, UNMEASURED, key
from harness.versions.matching import release_key
from scenarios.failure_names import family as failure_family

#: OSV's prefix for a database of one's own (`x_`), and this project's name after it.
PREFIX = "x_COMPAT-MATRIX"


@dataclass(frozen=True)
class Observation:
    """One baseline record of a config, as evidence about its scenario's failures."""

    scenario: str
    config_id: str
    device: str
    world_size: int
    stack: tuple[tuple[str, str], ...]
    setup: tuple[tuple[str, str], ...]
    outcome: str
    signature: str | None
    run_id: str
    cell: str
    day: str | None
    source: str  # "table" | "probe"
    started_at: str
    off_by: float | None = None

    def release(self, package: str) -> str | None:
        return dict(self.stack).get(package)

    def state_for(self, family: str) -> str:
        """SHOWS this family, PASSES, or OTHER (failed another way, another family of the target included)."""
        if self.outcome == "pass":
            return PASSES
        if self.outcome == NONE:
            return NONE
        return SHOWS if self.signature and failure_family(self.signature) == family else OTHER

    def ref(self) -> dict[str, Any]:
        """What an answer cites: the run, the config, the cell, the outcome and the failure's name."""
        found = {"run_id": self.run_id, "config_id": self.config_id, "cell": self.cell, "outcome": self.outcome}
        return found | ({"signature": self.signature} if self.signature else {})


def observations(
    records: Iterable[dict[str, Any]], probes: Iterable[dict[str, Any]], specs: dict[str, dict[str, Any]]
) -> list[Observation]:
    """Every baseline record of a scenario with a SPEC as an observation; a record that is no evidence at all (not
    applicable here, could not run) is left out. Where the table and a probe hold the same config at the same stack,
    the table's record speaks."""
    seen: set[tuple[Any, ...]] = set()
    found = []
    for source, group in (("table", records), ("probe", probes)):
        for record in group:
            spec = specs.get(record["scenario"])
            if record["variant"] != "baseline" or spec is None:
                continue
            judged = record_state(record, spec)
            if judged == NONE:
                continue
            stack = tuple(sorted(stack_of(record).items()))
            key = (record["scenario"], record["config_id"], device_class(record), world_size(record), stack)
            if source == "probe" and key in seen:
                continue
            seen.add(key)
            off = (record.get("metrics") or {}).get("off_by")
            found.append(Observation(
                record["scenario"], record["config_id"], device_class(record), world_size(record), stack,
                tuple(vocabulary.narrowing(vocabulary.setup_of(record.get("config"), spec)).items()),
                "pass" if judged == PASSES else "fail" if judged in (SHOWS, OTHER) else NONE,
                record.get("signature"), str(record.get("run_id")), str(record["cell"]),
                (record.get("pins") or {}).get("date"), source, str(record.get("started_at") or ""),
                float(off) if isinstance(off, int | float) and not isinstance(off, bool) else None,
            ))  # fmt: skip
    return found


@dataclass
class Event:
    """A release that brought ('introduced') or ended ('fixed') a failure of a package, with the records at exactly
    that release and at the release before it, or the bound it is ('earliest measured')."""

    kind: str
    release: str
    before: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    before_records: list[dict[str, Any]] = field(default_factory=list)
    #: 'earliest measured': the failure already shows on the oldest release measured; no release before it was.
    bound: str | None = None
    #: Why the release before is no release measured good (it failed another way): the onset is masked below.
    masked: str | None = None
    finding: str | None = None


@dataclass
class Condition:
    package: str
    events: list[Event]


@dataclass
class KnownFailure:
    """One failure of one scenario on one device class, for configs that share its history."""

    id: str
    scenario: str
    device: str
    family: str
    signature: str
    config_ids: list[str]
    setups: list[dict[str, str]]
    conditions: list[Condition]
    observed: list[Observation]
    depends: list[str]
    distributed: bool
    #: What sets the configs apart from the scenario's usual one, in words a user can check ("applies if ...").
    detail: str | None = None
    fixes: list[dict[str, Any]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    def state(self, observation: Observation) -> str:
        return observation.state_for(self.family)

    @property
    def world_sizes(self) -> list[int]:
        return sorted({o.world_size for o in self.observed})

    def measured(self, package: str) -> list[str]:
        """The releases of `package` its configs' records showed it or passed on (the evidence, in order)."""
        found = {o.release(package) for o in self.observed if self.state(o) in (SHOWS, PASSES)}
        return sorted((v for v in found if v), key=release_key)

    @property
    def shape(self) -> str:
        """'events' (releases bound it), 'everywhere' (it shows on every stack its configs were measured on) or 'mixed'
        (it shows on some and passes on others, and no release is named between: only exact records decide)."""
        if self.conditions:
            return "events"
        return "mixed" if any(self.state(o) == PASSES for o in self.observed) else "everywhere"


def failure_id(scenario: str, device: str, family: str, configs: list[str]) -> str:
    digest = hashlib.sha256(json.dumps([scenario, device, family, configs]).encode()).hexdigest()
    return f"{PREFIX}-{scenario.split('-')[0]}-{device}-{digest[:10]}"


def known_failures(
    observed: list[Observation],
    changes: list[Change],
    specs: dict[str, dict[str, Any]],
    pitfall_configs: set[tuple[str, str, str]],
    fixes_of: dict[tuple[str, str, str], list[FixObservation]],
) -> list[KnownFailure]:
    """Every known failure: the changes' groups first, then each config that shows a failure no change names, by
    setup. `pitfall_configs`: (scenario, device, config id) of the pitfalls, never part of a failure; `fixes_of`:
    (scenario, device, config id) -> every fix record where its baseline failed (`fixes.fix_observations`)."""
    by_key: dict[tuple[str, str], list[Observation]] = defaultdict(list)
    for obs in observed:
        if (obs.scenario, obs.device, obs.config_id) not in pitfall_configs:
            by_key[(obs.scenario, obs.device)].append(obs)
    made: list[KnownFailure] = []
    claimed: set[tuple[str, str, str, str]] = set()
    for (scenario, device, configs, family), found in _grouped(changes, by_key).items():
        kept = set(configs)
        while kept:
            mine = [o for o in by_key[(scenario, device)] if o.config_id in kept]
            failure = _failure(scenario, device, family, sorted(kept), mine, found, specs, fixes_of)
            # A config whose own records contradict the releases the changes name (it passed where they say the
            # failure shows, or showed it where they say it ended) has another history: it leaves the failure and
            # is judged on its own records, never bracketed by a history it does not have.
            against = {o.config_id for o in mine if contradicts(failure, o)}
            if not against:
                made.append(failure)
                claimed |= {(scenario, device, family, c) for c in kept}
                break
            kept -= against
    showing: dict[tuple[str, str, str, tuple[tuple[str, str], ...]], set[str]] = defaultdict(set)
    for (scenario, device), mine in by_key.items():
        target = list((specs.get(scenario) or {}).get("target") or [])
        for obs in mine:
            family = failure_family(obs.signature) if obs.signature else ""
            if obs.outcome == "fail" and target and _is_target(obs.signature, target):
                if (scenario, device, family, obs.config_id) not in claimed:
                    # A scenario whose configs are features of their own (S9, S10: flips named per config) has a
                    # failure per config; the others, one per setup.
                    apart = (("config", obs.config_id),) if (specs.get(scenario) or {}).get("flips_per_config") else ()
                    showing[(scenario, device, family, obs.setup + apart)].add(obs.config_id)
    for (scenario, device, family, _), configs in sorted(showing.items()):
        mine = [o for o in by_key[(scenario, device)] if o.config_id in configs]
        made.append(_failure(scenario, device, family, sorted(configs), mine, [], specs, fixes_of))
    return sorted(made, key=lambda f: (_mode(f.scenario), f.scenario, f.device, f.family, f.id))


def contradicts(failure: KnownFailure, obs: Observation) -> bool:
    """Whether a record of one of the failure's configs says otherwise than its conditions: it showed the failure at
    releases they decide clear, or passed at releases they all decide affected (an unmeasured range decides nothing)."""
    state = failure.state(obs)
    if not failure.conditions or state not in (SHOWS, PASSES):
        return False
    from harness.knowledge.judge import _decide

    decided = []
    for condition in failure.conditions:
        release = obs.release(condition.package)
        if release is None:
            return False
        decided.append(_decide(segments(failure, condition.package), release, False)[0])
    return CLEAR in decided if state == SHOWS else all(d == AFFECTED for d in decided)


def _is_target(signature: str | None, target: list[str]) -> bool:
    from harness.recording.verdicts import matches

    return matches(signature, target)


def _mode(scenario: str) -> int:
    return int(scenario[1:].split("-")[0])


def _grouped(
    changes: list[Change], by_key: dict[tuple[str, str], list[Observation]]
) -> dict[tuple[str, str, frozenset[str], str], list[Change]]:
    """Changes of one failure whose configs overlap, as one group (S4: torch 2.5.0 brought it on some configs,
    deepspeed 0.19.3 ended it on them: one failure, never two that contradict). A change stored without its configs
    stands for the configs whose records show its failure on that device, once no change with configs took it in."""
    keyed = [(c.scenario, c.device, set(c.config_ids), failure_family(c.signature), c) for c in changes]
    groups: list[tuple[str, str, set[str], str, list[Change]]] = []
    for scenario, device, configs, family, change in keyed:
        joined = [g for g in groups if g[:2] == (scenario, device) and g[3] == family and g[2] & configs]
        union = (scenario, device, set(configs), family, [change])
        for group in joined:
            groups.remove(group)
            union[2].update(group[2])
            union[4].extend(group[4])
        groups.append(union)
    # Groups of one failure whose changes are the same releases are one failure too (several configs' flips, each
    # named alone, that tell one history).
    merged: dict[tuple[Any, ...], tuple[set[str], list[Change]]] = {}
    for scenario, device, configs, family, found in groups:
        events = frozenset((c.package, c.release, c.direction) for c in found)
        entry = merged.setdefault((scenario, device, family, events), (set(), []))
        entry[0].update(configs)
        entry[1].extend(found)
    grouped = {}
    for (scenario, device, family, _), (configs, found) in merged.items():
        # A change stored without its configs (a finding's reproducer) stands for those whose records show its failure.
        configs = configs or {
            o.config_id
            for o in by_key.get((scenario, device), [])
            if o.outcome == "fail" and o.signature and failure_family(o.signature) == family
        }
        if configs:
            grouped[(scenario, device, frozenset(configs), family)] = found
    return grouped


def _failure(
    scenario: str,
    device: str,
    family: str,
    configs: list[str],
    mine: list[Observation],
    changes: list[Change],
    specs: dict[str, dict[str, Any]],
    fixes_of: dict[tuple[str, str, str], list[FixObservation]],
) -> KnownFailure:
    spec = specs.get(scenario) or {}
    showing = [o for o in mine if o.state_for(family) == SHOWS]
    signature = next((c.signature for c in changes if c.signature), None) or (
        sorted({str(o.signature) for o in showing})[0] if showing else family
    )
    setups = sorted({o.setup for o in mine if o.config_id in configs})
    conditions = _conditions(changes, mine, family)
    wanted = {c.package for c in conditions}.union(*(depends_of(spec, dict(s)) for s in setups))
    depends = [p for p in AXIS_PACKAGES if p in wanted]
    return KnownFailure(
        failure_id(scenario, device, family, configs), scenario, device, family, str(signature), configs,
        [dict(s) for s in setups], conditions, mine, depends, int(spec.get("world_size") or 1) > 1,
        fixes=fixes_of_failure(scenario, device, family, configs, fixes_of, spec), changes=changes,
    )  # fmt: skip


def _conditions(changes: list[Change], mine: list[Observation], family: str) -> list[Condition]:
    """Per package the changes name: its events in order, each with the records at its release and at the release
    before; a failure that a package's first change ends already showed on the oldest release measured (a bound)."""
    by_package: dict[str, list[Change]] = defaultdict(list)
    for change in changes:
        by_package[change.package].append(change)
    conditions = []
    for package, found in sorted(by_package.items()):
        ordered = sorted(
            {(c.release, c.direction): c for c in found}.values(), key=lambda c: (release_key(c.release), c.direction)
        )
        events: list[Event] = []
        if ordered and ordered[0].direction == "ended":
            earliest = _earliest_showing(mine, package, family)
            if earliest and release_key(earliest) < release_key(ordered[0].release):
                events.append(Event("introduced", earliest, None, _at(mine, package, earliest, family, SHOWS),
                                    bound="earliest measured"))  # fmt: skip
        for change in ordered:
            kind = "introduced" if change.direction == "started" else "fixed"
            if events and events[-1].kind == kind:
                continue  # two configs' flips naming the same direction twice: the first stands
            claims, before_claims = (SHOWS, PASSES) if kind == "introduced" else (PASSES, SHOWS)
            # A flip named by a search that kept no release before: the newest release below it its records measured
            # in the older state (the last failing one before a fix, the last passing one before an onset).
            before = change.last_before or _newest_below(mine, package, change.release, family, before_claims)
            event = Event(kind, change.release, before, _at(mine, package, change.release, family, claims),
                          _at(mine, package, before, family, before_claims), finding=change.finding)  # fmt: skip
            if kind == "introduced" and (not change.before_measured or _only_other(event.before_records)):
                event.masked = "the release before it failed another way: no release measured good to pin"
            events.append(event)
        if events:
            conditions.append(Condition(package, events))
    return conditions


def _only_other(refs: list[dict[str, Any]]) -> bool:
    return bool(refs) and not any(r["outcome"] == "pass" for r in refs)


def _newest_below(mine: list[Observation], package: str, release: str, family: str, state: str) -> str | None:
    releases = {o.release(package) for o in mine if o.state_for(family) == state}
    below = [r for r in releases if r and release_key(r) < release_key(release)]
    return max(below, key=release_key) if below else None


def _earliest_showing(mine: list[Observation], package: str, family: str) -> str | None:
    releases = {o.release(package) for o in mine if o.state_for(family) == SHOWS}
    releases.discard(None)
    return min(releases, key=release_key) if releases else None  # type: ignore[arg-type]


def _at(mine: list[Observation], package: str, release: str | None, family: str, claims: str) -> list[dict[str, Any]]:
    """Up to three baseline records of these configs at exactly `release` of `package`, those showing what the event
    claims there (the failure, or a pass) first: the evidence."""
    if not release:
        return []
    found = [o for o in mine if o.release(package) == release]
    found.sort(key=lambda o: (o.state_for(family) != claims, o.run_id, o.config_id))
    return [o.ref() | {"state": o.state_for(family)} for o in found[:3]]


def segments(failure: KnownFailure, package: str) -> list[list[Any]]:
    """[low, low_in, high, high_in, state, why] covering every release of `package`, in order."""
    condition = next((c for c in failure.conditions if c.package == package), None)
    events = condition.events if condition else []
    known = failure.measured(package) + [r for e in events for r in (e.release, e.before) if r]
    if not known:
        return [[None, False, None, False, UNMEASURED, f"{package}: no release of it was measured for this failure"]]
    low, high = min(known, key=key), max(known, key=key)
    cut: list[list[Any]] = [[None, False, low, False, UNMEASURED,
                             f"{package} older than {low}, the oldest release measured for this failure"]]  # fmt: skip
    if not events:
        cut.append([low, True, high, True, MEASURED, f"{package} {low} to {high} measured"])
    else:
        cut += _event_segments(package, events, low, high, failure.measured(package))
    cut.append([high, False, None, False, UNMEASURED,
                f"{package} newer than {high}, the newest release measured for this failure"])  # fmt: skip
    return [s for s in cut if s[0] is None or s[2] is None or key(s[0]) < key(s[2]) or (s[1] and s[3])]


def _event_segments(package: str, events: list[Event], low: str, high: str, measured: list[str]) -> list[list[Any]]:
    """The segments between the oldest and the newest release measured, cut at each event and its release before."""
    cut: list[list[Any]] = []
    first = events[0]
    if first.kind == "fixed":
        before = first.before or _measured_below(measured, first.release)
        words = f"{package} {low} to {before or low} measured failing (before {first.release} ended it)"
        cut.append([low, True, before or low, True, AFFECTED, words])
    elif first.bound != "earliest measured":
        before = first.before or _measured_below(measured, first.release)
        if before and first.masked:
            cut.append([low, True, before, True, UNMEASURED,
                        f"{package} {before} and older failed another way: no evidence either way"])  # fmt: skip
        elif before:
            cut.append([low, True, before, True, CLEAR,
                        f"{package} {low} to {before} measured without it ({first.release} brought it)"])  # fmt: skip
    for index, event in enumerate(events):
        before = event.before or _measured_below(measured, event.release)
        if before and key(before) < key(event.release) and (index or first.kind == "fixed" or not first.bound):
            cut.append(
                [
                    before,
                    False,
                    event.release,
                    False,
                    UNMEASURED,
                    f"{package} between {before} and {event.release}, where the change was found: not measured",
                ]
            )
        following = events[index + 1] if index + 1 < len(events) else None
        end = (following.before or _measured_below(measured, following.release)) if following else high
        end = end or event.release
        state = AFFECTED if event.kind == "introduced" else CLEAR
        words = (f"{package} {event.release} to {end} measured failing" if state == AFFECTED
                 else f"{package} {event.release} to {end} measured clear ({event.release} ended it)")  # fmt: skip
        if event.bound == "earliest measured":
            words += " (the oldest release measured already fails)"
        cut.append([event.release, True, end, True, state, words])
    return cut


def _measured_below(measured: list[str], release: str) -> str | None:
    below = [v for v in measured if key(v) < key(release)]
    return below[-1] if below else None
