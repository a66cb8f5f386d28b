"""`compat-matrix lookup transformers==4.46.3 --scenario S9-identity-grad-accumulation`: what the records say about a
user's exact releases, per setup, with the way out.

Exact records first: any record of the asked releases, whatever run holds it (the table's install days, the probes
of flips, sweeps and bisects, the release watch, an earlier `--measure`). Each scenario answers per setup (engine,
Trainer or a loop by hand, adapter: `knowledge.setup_of`), each setup with its state and its way out: a release that
ends the failure (an upgrade), the last good release before one that brought it (a pin), or a fix measured there. A
config that fails on every release is a pitfall, shown once as such, never as a failure of these versions. Where no
record has the exact releases, it says so plainly and shows the two atlas dates whose stacks bracket them (or the
nearest rows, marked as an extrapolation); `--measure` then builds that stack here and answers from its own row.

A version given as `2.4` matches every 2.4.x release (prefix on release components). Without `--device`, a scenario
that runs on CPU answers from CPU rows.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.define.packages import AXIS_PACKAGES, public_version
from harness.define.profile import DATE_AXIS
from harness.errors import UsageError
from harness.recording.verdicts import first_change, headline, largest_off_by, verdict
from harness.versions.matching import at_least as _at_least
from harness.versions.matching import at_most as _at_most
from harness.versions.matching import matches
from harness.versions.matching import release_key as _key
from scenarios.fix_words import fix_words

CASES = ("exact", "between atlas dates", "outside the atlas", "nearest only")


@dataclass
class Row:
    """One measured cell: its versions, device, date (atlas rows) and the records per scenario."""

    cell: str
    device: str
    versions: dict[str, str]
    date: str | None
    by_scenario: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: "table" (an install day or a profile's cell) or "probe" (a flip's move or sweep, a bisect, the watch, --measure).
    source: str = "table"
    run_ids: set[str] = field(default_factory=set)


@dataclass
class Answer:
    case: str
    rows: list[Row]
    #: package -> (wanted, found in the shown rows) where they differ.
    differs: dict[str, list[str]]


def parse_query(items: list[str]) -> dict[str, str]:
    """'torch==2.4' -> {'torch': '2.4'}; bad input is a usage error naming the item."""
    wanted: dict[str, str] = {}
    for item in items:
        name, sep, version = item.partition("==")
        name = canonicalize_name(name.strip())
        if not sep or name not in AXIS_PACKAGES:
            raise UsageError(f"{item!r}: expected PACKAGE==VERSION with PACKAGE one of {', '.join(AXIS_PACKAGES)}")
        try:
            Version(version)
        except InvalidVersion:
            raise UsageError(f"{item!r}: {version!r} is not a version") from None
        wanted[name] = version.strip()
    if not wanted:
        raise UsageError("give at least one PACKAGE==VERSION")
    return wanted


def rows_of(records: list[dict[str, Any]], source: str = "table") -> list[Row]:
    """The records as rows: one per cell and device (records of one cell share its versions; the first with versions
    speaks). Probe runs of one stack share a cell id: their records are one row, the newest per key."""
    rows: dict[tuple[str, str], Row] = {}
    for record in records:
        device = str((record.get("hardware") or {}).get("device") or "cpu")
        row = rows.get((record["cell"], device))
        if row is None:
            date = (record.get("pins") or {}).get(DATE_AXIS)
            row = rows[(record["cell"], device)] = Row(record["cell"], device, {}, date, source=source)
        if not row.versions and record.get("versions"):
            row.versions = {
                p: str(public_version(str(record["versions"][p]))) for p in AXIS_PACKAGES if record["versions"].get(p)
            }
        row.by_scenario.setdefault(record["scenario"], []).append(record)
        row.run_ids.add(str(record.get("run_id")))
    if source != "table":
        from harness.knowledge.selection import latest_by_key

        for row in rows.values():
            row.by_scenario = {s: latest_by_key(found)[0] for s, found in row.by_scenario.items()}
    return list(rows.values())


def answer(rows: list[Row], wanted: dict[str, str], device: str | None = None) -> Answer:
    """Exact rows; else the two atlas dates whose stacks bracket the versions; else the nearest rows."""
    pool = [r for r in rows if device is None or r.device == device]
    exact = [r for r in pool if all(matches(r.versions.get(p), v) for p, v in wanted.items())]
    if exact:
        return Answer("exact", exact, {})
    by_device: dict[str, list[Row]] = defaultdict(list)
    for row in pool:
        if row.date and row.source == "table":  # the atlas's own days bracket; a probe's stack is no install day
            by_device[row.device].append(row)
    for dated in by_device.values():
        dated.sort(key=lambda r: r.date or "")
        older = [r for r in dated if all(_at_most(r.versions.get(p), v) for p, v in wanted.items())]
        newer = [r for r in dated if all(_at_least(r.versions.get(p), v) for p, v in wanted.items())]
        if older and newer:
            shown = [older[-1], newer[0]]
            return Answer("between atlas dates", shown, _differs(shown, wanted))
    nearest = sorted(pool, key=lambda r: (_distance(r, wanted), r.cell))[:2]
    inside = any(_at_most(r.versions.get(p), v) for r in pool for p, v in wanted.items()) and any(
        _at_least(r.versions.get(p), v) for r in pool for p, v in wanted.items()
    )
    return Answer("nearest only" if inside else "outside the atlas", nearest, _differs(nearest, wanted))


def _distance(row: Row, wanted: dict[str, str]) -> tuple[int, int]:
    """(packages that differ, how far the first differing one is, in release components)."""
    off = [p for p, v in wanted.items() if not matches(row.versions.get(p), v)]
    gap = 0
    for package in off[:1]:
        have, want = _key(row.versions.get(package) or "0"), _key(wanted[package])
        gap = sum(abs(a - b) * 100 ** (2 - i) for i, (a, b) in enumerate(zip(have[:3], want[:3], strict=False)))
    return len(off), gap


def _differs(rows: list[Row], wanted: dict[str, str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for package, version in wanted.items():
        seen = sorted({r.versions.get(package) or "-" for r in rows})
        if not all(matches(r.versions.get(package), version) for r in rows):
            found[package] = [version, ", ".join(seen)]
    return found


def render(
    result: Answer,
    specs: dict[str, dict[str, Any]],
    scenarios: list[str] | None = None,
    context: Context | None = None,
) -> str:
    """The terminal answer: the case, the rows with their versions, and per scenario and setup the verdict and the
    way out (`context`: the pitfalls, the changes the flips name, the setup asked for)."""
    context = context or Context()
    notes = {
        "exact": "measured: records at exactly these releases",
        "between atlas dates": "NOT MEASURED at these releases; the two atlas dates whose stacks bracket them",
        "outside the atlas": "EXTRAPOLATING: these versions lie outside everything measured; the nearest rows",
        "nearest only": "EXTRAPOLATING: no row matches and no two atlas dates bracket them; the nearest rows",
    }
    lines = [f"{result.case}: {notes[result.case]}"]
    for package, (want, have) in result.differs.items():
        lines.append(f"  differs: {package} {want} asked, {have} measured")
    if result.case != "exact" and context.measure_hint:
        lines.append(f"  to measure them here: {context.measure_hint}")
    shown_pitfalls: set[tuple[str, str]] = set()
    for row in result.rows:
        stack = " ".join(f"{p} {row.versions[p]}" for p in AXIS_PACKAGES if p in row.versions)
        where = ", ".join(x for x in (row.device, row.date, _source_words(row, scenarios)) if x)
        lines.append(f"\n{row.cell} ({where}): {stack}")
        for scenario in sorted(row.by_scenario, key=lambda s: (int(s[1:].split("-")[0]), s)):
            if scenarios and not any(scenario.startswith(s) for s in scenarios):
                continue
            lines += scenario_lines(scenario, row, specs.get(scenario), context, shown_pitfalls)
        if scenarios and not any(s.startswith(tuple(scenarios)) for s in row.by_scenario):
            lines.append(f"  (no records of {', '.join(scenarios)} in this row)")
    return "\n".join(lines)


@dataclass
class Context:
    """What the answer needs beside a row's records: the pitfalls, every change the flips and sweeps name, the user's
    setup words (`--setup`), and how to measure the asked releases (`--measure`)."""

    pitfalls: dict[tuple[str, str], Any] = field(default_factory=dict)
    changes: list[Any] = field(default_factory=list)
    setup: tuple[str, ...] = ()
    measure_hint: str = ""


def _source_words(row: Row, scenarios: list[str] | None = None) -> str:
    """'probe run X, Y ...': the probe runs that hold the row's records of the scenarios asked about."""
    if row.source == "table":
        return ""
    shown = [s for s in row.by_scenario if not scenarios or s.startswith(tuple(scenarios))]
    runs = sorted({str(r.get("run_id")) for s in shown for r in row.by_scenario[s]}) or sorted(row.run_ids)
    return "probe run " + ", ".join(runs[:2]) + (f" and {len(runs) - 2} more" if len(runs) > 2 else "")


def scenario_lines(
    scenario: str, row: Row, spec: dict[str, Any] | None, context: Context, shown: set[tuple[str, str]]
) -> list[str]:
    """One scenario in one row: a line per setup (its state and way out), the pitfalls once, a single line where the
    scenario's configs are one setup."""
    from harness.define import setup as vocabulary
    from harness.knowledge import pitfalls as knowledge

    asked = vocabulary.parse_words(context.setup)
    records = row.by_scenario[scenario]
    if context.setup:
        records = [r for r in records if vocabulary.agrees(vocabulary.setup_of(r.get("config"), spec), asked)]
        if not records:
            return [f"  {scenario}: no config of this setup ({' '.join(context.setup)}) in this row"]
    counted, left_out = knowledge.without_pitfalls(records, context.pitfalls)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in counted:
        groups[vocabulary.config_words(record.get("config"), spec)].append(record)
    lines = []
    if len(groups) == 1 and not left_out:
        [(_, mine)] = groups.items()
        lines.append(f"  {scenario}: {setup_answer(mine, row, spec, context)}")
    else:
        lines.append(f"  {scenario}:")
        for words, mine in sorted(groups.items()):
            lines.append(f"    {words}: {setup_answer(mine, row, spec, context)}")
    # The scenario's pitfalls on this device that the row did not run are said too: they hold whatever the versions.
    known = [
        c for (sc, c), pitfall in context.pitfalls.items()
        if sc == f"{scenario}@{row.device.split('-')[0]}"
        and vocabulary.agrees(vocabulary.setup_of(pitfall.config, spec), asked)
    ]  # fmt: skip
    for config_id in sorted({*left_out, *known}):
        key = knowledge.pitfall_key(scenario, row.device, config_id)
        pitfall = context.pitfalls.get(key)
        if pitfall is None:
            continue
        again = " (as above)" if key in shown else ""
        shown.add(key)
        way = ", ".join(pitfall.fixes) or "no measured change removes it"
        lines.append(
            f"    {vocabulary.config_words(pitfall.config, spec)}: PITFALL, not a version failure{again}: "
            + ("" if again else f"{pitfall.words(spec)}; fails on every release measured ({pitfall.stacks} stacks, "
               f"{pitfall.first_day} to {pitfall.last_day}); way out: {way}")
        )  # fmt: skip
    return lines


def setup_answer(records: list[dict[str, Any]], row: Row, spec: dict[str, Any] | None, context: Context) -> str:
    """One setup's line: its verdict and first fix (`short_answer`), then the releases that change it after (or
    before) the row's: an upgrade that ends it, the last good release before the one that brought it."""
    found = verdict(records, spec)
    text = short_answer(found, spec)
    which = which_configs(records, {r["config_id"] for r in found.target_records})
    if which:
        text = text.replace(" configs", f" configs ({which})", 1)
    if row.source != "table" and not any(r["variant"] != "baseline" for r in records):
        text = text.replace("; no measured fix removes it", "; fixes not run in this probe")
    if found.state in ("target", "not-reproduced"):
        failing = {r["config_id"] for r in found.target_records}
        holding = {r["config_id"] for r in records if r["variant"] == "baseline"} - failing
        scenario = records[0]["scenario"]
        words = release_way_out(scenario, row, failing, True, context.changes) if failing else ""
        held = release_way_out(scenario, row, holding, False, context.changes) if holding else ""
        if words:
            text += "; " + words
        if held:
            text += "; " + ("the others: " if failing else "") + held
    return text


def which_configs(records: list[dict[str, Any]], failing: set[str]) -> str:
    """Where some configs of a setup fail and others hold: what sets the failing ones apart ('smoothing=0.1'), each
    key whose value differs from the one most of the setup's configs have."""
    configs = {r["config_id"]: r.get("config") or {} for r in records if r["variant"] == "baseline"}
    if not failing or len(failing) * 2 > len(configs):
        return ""  # most of the setup fails: what sets them apart is no help
    common = {}
    for key in {k for c in configs.values() for k in c}:
        values = [json.dumps(c.get(key), sort_keys=True) for c in configs.values()]
        common[key] = max(set(values), key=values.count)
    parts = []
    for config_id in sorted(failing):
        own = configs.get(config_id, {})
        odd = [f"{k}={own.get(k)}" for k in sorted(own) if json.dumps(own.get(k), sort_keys=True) != common.get(k)]
        parts.append(", ".join(odd) if 0 < len(odd) <= 3 else config_id)
    return "; ".join(parts)


def release_way_out(scenario: str, row: Row, config_ids: set[str], failing: bool, changes: list[Any]) -> str:
    """What the flips and sweeps measured for these configs around the row's releases: where it fails, the changes
    after the row's release ('upgrade transformers: ended with 4.47.1 · started again with 4.48.0 · ended again with
    4.48.1') or, where a release brought it and none ends it, the last good one to pin; where it holds, a later
    release that brings it. Only changes measured on the row's device class."""
    device = row.device.split("-")[0]
    mine = [
        c for c in changes
        if c.scenario == scenario and c.device == device and (not c.config_ids or set(c.config_ids) & config_ids)
    ]  # fmt: skip
    parts = []
    for package in sorted({c.package for c in mine}):
        have = row.versions.get(package)
        if not have:
            continue
        ordered = _unique(sorted((c for c in mine if c.package == package), key=lambda c: _key(c.release)))
        later = [c for c in ordered if _key(c.release) > _key(have)]
        earlier = [c for c in ordered if _key(c.release) <= _key(have)]
        if failing and later:
            parts.append(f"after {package} {have}: {_timeline(later, package)} (measured)")
        elif failing and earlier and earlier[-1].direction == "started" and earlier[-1].last_before:
            start = earlier[-1]
            if start.before_measured:
                pin = f"pin {package} {start.last_before} (last good, measured)"
            else:
                pin = f"before it {package} {start.last_before} failed another way: no release measured good to pin"
            parts.append(f"started with {package} {start.release}, no measured release ends it: {pin}")
        elif not failing and later and later[0].direction == "started":
            parts.append(f"holds until {package} {later[0].release}: {_timeline(later, package)} (measured)")
    return "; ".join(parts)


def _unique(changes: list[Any]) -> list[Any]:
    """One change per (release, direction): several configs' flips name the same release."""
    seen, found = set(), []
    for change in changes:
        if (change.release, change.direction) not in seen:
            seen.add((change.release, change.direction))
            found.append(change)
    return found


def _timeline(changes: list[Any], package: str) -> str:
    seen: set[str] = set()
    words = []
    for change in changes:
        again = " again" if change.direction in seen else ""
        seen.add(change.direction)
        words.append(f"{change.direction}{again} with {package} {change.release}")
    return " · ".join(words)


def short_answer(found: Any, spec: dict[str, Any] | None) -> str:
    """One line: the verdict, and the first change to try (a real fix before a workaround)."""
    if found.state in ("target", "failures"):
        signatures = sorted({str(r.get("signature")) for r in found.target_records})
        head = f"FAILS ({', '.join(signatures)}) on {len(found.target_records)}/{found.candidates} configs"
        off = largest_off_by(found.target_records, spec)
        head += f", off by up to {off:.2g}x" if off is not None else ""
        change = first_change(found, spec)
        return head + (f"; try: {fix_words(change[0])} ({change[1]})" if change else "; no measured fix removes it")
    if found.state in ("not-reproduced", "passes"):
        others = f"; other failures: {', '.join(sorted(found.others))}" if found.others else ""
        return f"target not reproduced (0/{found.candidates}){others}"
    return " | ".join(headline(found, spec))


def scenario_device(scenario: str, rows: list[Row], spec: dict[str, Any] | None) -> str | None:
    """Where a scenario answers without --device: CPU where it runs there and a CPU row holds its records, else
    wherever its records are."""
    if (spec or {}).get("device", "any") != "cuda" and any(
        r.device == "cpu" and scenario in r.by_scenario for r in rows
    ):
        return "cpu"
    return None


def lookup(
    results_dir: Path,
    items: list[str],
    scenarios: list[str] | None,
    device: str | None,
    setup: list[str] | None = None,
    measure: bool = False,
) -> str:
    """The answer for `items` (PACKAGE==VERSION); with `measure`, where no record holds them, the stack built and
    the scenarios run here first (`tools/measure.py`), then the answer from that row."""
    from harness.define.registry import discover
    from harness.knowledge import flips as knowledge
    from harness.knowledge.selection import select_runs, selected_flip_runs

    wanted = parse_query(items)
    if measure and (not scenarios or device == "cuda"):
        raise UsageError("--measure runs here on CPU: name the scenarios to run with --scenario (and no --device cuda)")
    selection = select_runs(results_dir)
    table = selection.latest()[0]
    rows = rows_of(table) + rows_of(list(selection.probes), source="probe")
    if not rows:
        raise UsageError(f"no records under {results_dir / 'runs'}")
    if measure:
        asked = [
            r for r in rows if r.device == "cpu" and any(s.startswith(tuple(scenarios or [])) for s in r.by_scenario)
        ]
        if answer(asked, wanted, "cpu").case != "exact":
            from harness.tools.measure import measure as measure_here

            names = [s.id for s in discover() if s.id.startswith(tuple(scenarios or []))]
            run_dir = measure_here(results_dir, rows, wanted, names)
            print(f"recorded: {run_dir}\n", flush=True)
            selection = select_runs(results_dir)
            rows = rows_of(table) + rows_of(list(selection.probes), source="probe")
    specs = {s.id: s.spec for s in discover()}
    words = tuple(w.strip().lower() for item in setup or [] for w in item.replace(",", " ").split() if w.strip())
    context = Context(
        pitfalls=selection.pitfalls(specs),
        changes=knowledge.changes_for(
            knowledge.with_masking(knowledge.flips_of_runs(results_dir, selected_flip_runs(results_dir)), table, specs),
            knowledge.atlas_of_runs(table),
        )
        + knowledge.finding_changes(results_dir),
        setup=words,
        measure_hint="compat-matrix lookup " + " ".join(items) + " --measure"
        + "".join(f" --scenario {s}" for s in scenarios or []),
    )  # fmt: skip
    if scenarios:
        holding = [r for r in rows if any(s.startswith(tuple(scenarios)) for s in r.by_scenario)]
        rows = holding or rows  # rows without a record of the scenarios asked about answer nothing
    if device is None and scenarios:
        chosen = {scenario_device(s.id, rows, s.spec) for s in discover() if any(s.id.startswith(p) for p in scenarios)}
        device = chosen.pop() if len(chosen) == 1 else None
    result = answer(rows, wanted, device)
    return render(result, specs, scenarios, context)
