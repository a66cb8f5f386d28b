"""The judge's tables, compiled once from the model (`failures.py`, `pitfalls.py`): what `judge.evaluate` and the
page's `judge.js` look versions up in. Plain JSON, written beside the advisories (`results/advisories/judge.json`), so
`audit` answers from an installed wheel without the records.

Per failure: its setups (keys and words), the packages it depends on (its scenario's, those its setups bring, those a
release of which changed it), the points (every stack its configs were measured at over those packages, with the
setup, world size and what they showed), and per package the segments: the release line cut where the records decide
it (affected, clear), where they only measured it, and where nothing was measured (below the oldest release, above
the newest, and between a change's release and the release before it), each with its words and its records.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from harness.define import setup as vocabulary
from harness.define.packages import AXIS_PACKAGES
from harness.knowledge.evidence import OTHER, PASSES, SHOWS
from harness.knowledge.failures import Event, KnownFailure, segments
from harness.knowledge.judge import SCHEMA, key
from harness.knowledge.pitfalls import Pitfall
from scenarios.fix_words import fix_words


def compile_tables(
    failures: list[KnownFailure],
    pitfalls: list[Pitfall],
    specs: dict[str, dict[str, Any]],
    coverage: dict[str, list[dict[str, str]]],
    details: dict[str, tuple[str, str]] | None = None,
    broken: list[dict[str, Any]] | None = None,
    declared: dict[str, dict[str, dict[str, str]]] | None = None,
    measured_runs: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The tables every answer judges by (`details`: failure id -> (the condition on the user's model, what else
    its configs ran with), in words; `broken`: the stacks measured not to run, which no way out names; `declared`:
    what each measured release declares it needs of the others, so a way out installs; `measured_runs`: the runs of
    `lookup --measure` and `audit --fix --measure` they were compiled with, run id -> records, so an answer can tell
    a run measured since)."""
    releases = _releases(failures)
    return {
        "schema": SCHEMA,
        "packages": list(AXIS_PACKAGES),
        "narrowing": [k.name for k in vocabulary.KEYS if k.narrows],
        "failures": [_failure(f, specs.get(f.scenario) or {}, (details or {}).get(f.id)) for f in failures],
        "pitfalls": [_pitfall(p, specs.get(p.scenario) or {}) for p in pitfalls],
        "coverage": {k: sorted(v, key=lambda s: sorted(s.items())) for k, v in sorted(coverage.items())},
        "releases": releases,
        "broken": list(broken or []),
        "declared": {
            p: {
                v: dict(sorted(needs.items()))
                for v, needs in sorted((declared or {}).get(p, {}).items())
                if v in releases.get(p, [])
            }
            for p in sorted(declared or {})
        },
        "measured_runs": dict(sorted((measured_runs or {}).items())),
    }


def _failure(failure: KnownFailure, spec: dict[str, Any], detail: tuple[str, str] | None) -> dict[str, Any]:
    setups = [dict(s) for s in failure.setups]
    points, refs = _points(failure, setups)
    title = str(spec.get("title") or failure.scenario)
    return {
        "id": failure.id,
        "scenario": failure.scenario,
        "device": failure.device,
        "failure": failure.signature,
        "family": failure.family,
        "title": title.split(": ", 1)[-1],
        "what": title.split(": ", 1)[0],
        "setups": [{"keys": s, "words": vocabulary.words(s)} for s in setups],
        "detail": (detail or ("", ""))[0] or None,
        "measured_with": (detail or ("", ""))[1] or None,
        "depends": failure.depends,
        "conditions": [c.package for c in failure.conditions],
        "distributed": failure.distributed,
        "world_sizes": failure.world_sizes,
        "shape": failure.shape,
        "everywhere": _everywhere_words(failure),
        "segments": {p: segments(failure, p) for p in failure.depends},
        "points": points,
        "refs": refs,
        "events": {c.package: [_event_json(e) for e in c.events] for c in failure.conditions},
        "fixes": [_fix(fix, failure, setups, refs) for fix in failure.fixes],
    }


def _fix(fix: dict[str, Any], failure: KnownFailure, setups: list[dict[str, str]], refs: list[Any]) -> dict[str, Any]:
    """A fix of the failure with its points, as the failure's: [stack over `depends`, setup index, world size, what it
    showed there (PASSES: it fixes it; SHOWS: the failure again; OTHER: another failure; 'mixed'), the other failures'
    names, ref index] per (stack, setup, world size), one record cited (refs appended to the failure's)."""
    grouped: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for obs in sorted(fix["observed"], key=lambda o: (o.run_id, o.config_id)):
        stack = tuple(obs.release(p) for p in failure.depends)
        if None not in stack and dict(obs.setup) in setups:
            grouped[(stack, setups.index(dict(obs.setup)), obs.world_size)].append(obs)
    points = []
    for (stack, setup, size), found in sorted(grouped.items(), key=lambda kv: ([key(v) for v in kv[0][0]], kv[0][1:])):
        states = {o.state_for(failure.family) for o in found}
        others = sorted({str(o.signature) for o in found if o.state_for(failure.family) == OTHER})
        cited = next((o for o in found if o.state_for(failure.family) != PASSES), found[0])
        refs.append(cited.ref())
        points.append([list(stack), setup, size, point_state(states), others, len(refs) - 1])
    return {"variant": fix["variant"], "kind": fix["kind"], "words": fix_words(fix["variant"]), "points": points} | (
        {"setup": fix["setup"]} if fix.get("setup") else {}
    )


def _points(failure: KnownFailure, setups: list[dict[str, str]]) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """[stack over `depends`, setup index, world size, state, ref index] per (stack, setup, world size): what the
    records there show (the failure wherever one config shows it), with one record cited (a showing one first)."""
    grouped: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for obs in sorted(failure.observed, key=lambda o: (o.run_id, o.config_id)):
        stack = tuple(obs.release(p) for p in failure.depends)
        if None not in stack:  # a record without a package the failure depends on is no point of it
            grouped[(stack, setups.index(dict(obs.setup)), obs.world_size)].append(obs)
    points, refs = [], []
    for (stack, setup, size), found in sorted(grouped.items(), key=lambda kv: ([key(v) for v in kv[0][0]], kv[0][1:])):
        states = {failure.state(o) for o in found}
        refs.append(next((o for o in found if failure.state(o) == SHOWS), found[0]).ref())
        points.append([list(stack), setup, size, point_state(states), len(refs) - 1])
    return points, refs


def point_state(states: set[str]) -> str:
    """What the configs at one stack show together: the failure where one shows it; a pass where all passed;
    another failure where none passed; 'mixed' where some passed and others failed another way."""
    if SHOWS in states:
        return SHOWS
    if states == {PASSES}:
        return PASSES
    return OTHER if PASSES not in states else "mixed"


def _everywhere_words(failure: KnownFailure) -> str:
    shown = [o for o in failure.observed if failure.state(o) == SHOWS]
    days = sorted({o.day for o in shown if o.day})
    span = f", {days[0]} to {days[-1]}" if days else ""
    stacks = {o.stack for o in shown}
    return f"it shows on every stack its configs were measured on ({len(stacks)} stacks{span}); no release ends it"


def _event_json(event: Event) -> dict[str, Any]:
    return {
        "kind": event.kind, "release": event.release, "before": event.before, "bound": event.bound,
        "masked": event.masked, "finding": event.finding, "records": event.records,
        "before_records": event.before_records,
    }  # fmt: skip


def _pitfall(pitfall: Pitfall, spec: dict[str, Any]) -> dict[str, Any]:
    setup = vocabulary.narrowing(vocabulary.setup_of(pitfall.config, spec))
    return {
        "id": f"pitfall-{pitfall.scenario}-{pitfall.device}-{pitfall.config_id}",
        "scenario": pitfall.scenario,
        "device": pitfall.device,
        "setup": setup,
        "words": vocabulary.words(setup),
        "why": pitfall.words(spec),
        "measured": f"{pitfall.stacks} stacks, {pitfall.first_day} to {pitfall.last_day}",
        "way_out": [fix_words(v) for v in pitfall.fixes] or ["no measured change removes it"],
    }


def _declared(needs: dict[str, dict[str, str]], measured: list[str]) -> dict[str, dict[str, str]]:
    """What the measured releases of one package declare they need (the rest is not asked by any way out)."""
    return {v: dict(sorted(n.items())) for v, n in sorted(needs.items()) if v in measured}


def _releases(failures: list[KnownFailure]) -> dict[str, list[str]]:
    """Every release of each package the failures' records measured: what a loose range is judged over, and where a
    way out may move."""
    found: dict[str, set[str]] = defaultdict(set)
    for failure in failures:
        for package in failure.depends:
            found[package].update(failure.measured(package))
    return {p: sorted(found[p], key=key) for p in AXIS_PACKAGES if found.get(p)}
