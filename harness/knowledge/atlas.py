"""The atlas: the one model every answer is handed (like Hypothesis's `ConjectureData`, one object through every
step). It reads the records once (`selection.py`), judges each as evidence (`evidence.py`), reads the flips with their
masking decided once (`flips.py`), finds the pitfalls, builds the known failures (`failures.py`) and compiles the
judge's tables (`tables.py`). The glance, `lookup`, `check`, `audit`, the advisories and the page ask it; none of them
walks the records again.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.define import setup as vocabulary
from harness.define.packages import AXIS_PACKAGES, public_version, short_name
from harness.define.profile import DATE_AXIS
from harness.knowledge import flips as flip_model
from harness.knowledge.broken import broken_stacks
from harness.knowledge.entries import Entry, Row, entry_of
from harness.knowledge.evidence import OTHER, SHOWS, depends_of, device_class, stack_of, state, world_size
from harness.knowledge.failures import KnownFailure, Observation, known_failures, observations
from harness.knowledge.fixes import FixObservation, fix_observations
from harness.knowledge.flips import fullest_versions
from harness.knowledge.judge import Query, evaluate
from harness.knowledge.pitfalls import Pitfall, pitfalls, without_pitfalls
from harness.knowledge.selection import Selection, select_runs, selected_flip_runs
from harness.knowledge.store import Store
from harness.knowledge.tables import compile_tables
from harness.paths import DECLARED_FILE
from harness.recording.flip import Flip
from harness.recording.verdicts import Verdict, verdict
from harness.versions.declared import read_declared


@dataclass(frozen=True)
class Day:
    """An install day of an atlas: its date, device and stack (what `lookup --measure` moves releases onto)."""

    date: str
    device: str
    versions: dict[str, str]
    source: str = "table"


class Atlas:
    """What the records show, read once. `run_ids` narrows the table to named runs (the probes and flips stay the
    selected runs')."""

    def __init__(
        self,
        results_dir: Path,
        specs: dict[str, dict[str, Any]] | None = None,
        run_ids: list[str] | None = None,
        selection: Selection | None = None,
        store: Store | None = None,
    ) -> None:
        self.results_dir = results_dir
        self.run_ids = run_ids
        #: The one reader of the results folder: every file this atlas and its views need, read once.
        self.store = store or Store(results_dir)
        if specs is None:
            from harness.define.registry import discover

            specs = {s.id: s.spec for s in discover()}
        self.specs = specs
        if selection is not None:
            self.__dict__["selection"] = selection

    @classmethod
    def of(cls, selection: Selection, specs: dict[str, dict[str, Any]] | None = None) -> Atlas:
        """The atlas of runs already selected (the flips and findings read from beside them)."""
        return cls(selection.results_dir or Path("results"), specs, selection=selection)

    def with_records(self, records: list[dict[str, Any]]) -> Atlas:
        """This atlas with more records in its table (`check`'s own runs of this environment): the same model built
        again over them, so the judge answers from them as from any record."""
        selection = self.selection
        grown = Selection(
            selection.run_ids, [*selection.records, *records], selection.metas, selection.conflicting,
            selection.probes, selection.results_dir,
        )  # fmt: skip
        return Atlas(self.results_dir, self.specs, self.run_ids, grown, self.store)

    @cached_property
    def selection(self) -> Selection:
        return select_runs(self.results_dir, self.run_ids, self.store)

    @cached_property
    def table(self) -> list[dict[str, Any]]:
        """The table's records: the newest per key of the selected runs."""
        return self.selection.latest()[0]

    def records_of_profile(self, profile: str) -> list[dict[str, Any]]:
        """The table's records of one profile's runs (the dated atlas's days: what `matrix --grow` compares)."""
        mine = {m["run_id"] for m in self.selection.metas if m.get("profile") == profile}
        return [r for r in self.table if r.get("run_id") in mine]

    @cached_property
    def probes(self) -> list[dict[str, Any]]:
        return list(self.selection.probes)

    @cached_property
    def pitfalls(self) -> dict[tuple[str, str], Pitfall]:
        return pitfalls(self.table, self.specs, self.probes)

    def counted(self, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[str]]:
        """The records that count (not of a pitfall config), and the pitfall configs left out."""
        return without_pitfalls(records, self.pitfalls)

    @cached_property
    def flips(self) -> list[Flip]:
        """The flips of the dated runs that are evidence and of the release watch, masking decided once. A run whose
        records a newer run hides entirely is not in the table, so its flips are not either (the table's flips
        section reads the same runs)."""
        runs = selected_flip_runs(self.store)
        if self.run_ids is None:  # (an atlas narrowed to named runs keeps every selected run's flips)
            shown = set(self.selection.run_ids)
            runs = [r for r in runs if r in shown]
        found = flip_model.flips_of_runs(self.store, runs)
        found += flip_model.watched_flips(self.store)
        return flip_model.with_masking(found, self.table, self.specs)

    @cached_property
    def changes(self) -> list[flip_model.Change]:
        """Every release the unmasked flips, sweeps and verified findings name."""
        atlas_of_run = flip_model.atlas_of_runs([*self.table, *self.probes])
        return flip_model.changes_for(self.flips, atlas_of_run) + flip_model.finding_changes(self.store.findings)

    @cached_property
    def observations(self) -> list[Observation]:
        return observations(self.table, self.probes, self.specs)

    @cached_property
    def failures(self) -> list[KnownFailure]:
        pitfall_configs = {(p.scenario, p.device, p.config_id) for p in self.pitfalls.values()}
        return known_failures(self.observations, self.changes, self.specs, pitfall_configs, self.fixes_of)

    @cached_property
    def fixes_of(self) -> dict[tuple[str, str, str], list[FixObservation]]:
        """(scenario, device, config id) -> every record of a fix variant where the config's baseline failed in the
        same cell, with what it showed there (`fixes.py`): what the judge weighs each fix by, as it weighs failures."""
        return fix_observations(self.table, self.probes, self.specs)

    @cached_property
    def coverage(self) -> dict[str, list[dict[str, str]]]:
        """'scenario@device' -> the setups its records measured there (a GPU answer is decided by GPU records where
        they exist)."""
        found: dict[str, set[tuple[tuple[str, str], ...]]] = defaultdict(set)
        for obs in self.observations:
            found[f"{obs.scenario}@{obs.device}"].add(obs.setup)
        return {k: [dict(s) for s in sorted(v)] for k, v in found.items()}

    @cached_property
    def broken(self) -> list[dict[str, Any]]:
        """The stacks measured not to run and the pairs whose APIs do not meet (`broken.py`): a way out never names
        one of them again."""
        return broken_stacks([*self.table, *self.probes])

    @cached_property
    def tables(self) -> dict[str, Any]:
        """The judge's tables (`tables.py`), compiled once."""
        return compile_tables(
            self.failures, list(self.pitfalls.values()), self.specs, self.coverage, self.details, self.broken,
            read_declared(DECLARED_FILE), self.store.measured_runs,
        )  # fmt: skip

    @cached_property
    def records_by_key(self) -> dict[tuple[str, str, str, str, str], dict[str, Any]]:
        """(run id, cell as the table names it, scenario, variant, config id) -> the record: what a reproducer of the
        report (results/repros/index.json) was made from, a shared cell named `<cell>@<profile>` as the table names
        it."""
        found: dict[tuple[str, str, str, str, str], dict[str, Any]] = {}
        for record in [*self.table, *self.selection.records, *self.probes]:
            key = (str(record.get("run_id")), str(record["cell"]), record["scenario"], record["variant"],
                   str(record["config_id"]))  # fmt: skip
            found.setdefault(key, record)
        return found

    @cached_property
    def bisect_verdicts(self) -> list[Flip]:
        """The `bisect` command's verdicts (results/bisect/*/verdict.json): the release a bisect named."""
        return flip_model.bisect_verdicts(self.store)

    @cached_property
    def configs(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(scenario, config id) -> the config its records ran (the table's, then the probes')."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for record in [*self.table, *self.probes]:
            found.setdefault((record["scenario"], record["config_id"]), record.get("config") or {})
        return found

    @cached_property
    def details(self) -> dict[str, tuple[str, str]]:
        """failure id -> (the condition on the user's model its configs share, in the scenario's words: the judge's
        "applies if"; what else sets them apart from the configs most records ran)."""
        from harness.knowledge.details import details
        from harness.recording.machine import cpu_condition_words

        configs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for record in [*self.table, *self.probes]:
            if record["variant"] == "baseline":
                configs[(record["scenario"], record["config_id"])].append(record.get("config") or {})
        found = details(self.failures, configs, self.specs)
        for failure in self.failures:  # a condition on the user's machine that a finding measured (bitsandbytes 0.49)
            flags = next((c.cpu_flags for c in failure.changes if c.cpu_flags), ())
            if flags:
                model, rest = found.get(failure.id, ("", ""))
                found[failure.id] = ("; ".join(w for w in (model, cpu_condition_words(flags)) if w), rest)
        return found

    @cached_property
    def rows(self) -> list[Row]:
        """The stacks that really ran, one row each: a cell's records split where they ran other versions (a later
        run of one day can have resolved a newer release), a record that lacks an optional package joining the row
        whose versions it agrees with; each with its device, world size (the GPUs of a GPU row, the most ranks of a
        CPU one) and day."""
        by_cell: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in self.table:
            by_cell[record["cell"]].append(record)
        found = []
        for cell, records in by_cell.items():
            for versions, mine in _split_by_versions(records):
                found.append(Row.of(cell, versions, mine))
        return found

    @cached_property
    def scenarios(self) -> list[str]:
        """The table's scenarios, by their number (S2 before S10)."""
        return sorted({r["scenario"] for r in self.table}, key=lambda s: (int(s[1:].split("-")[0]), s))

    @cached_property
    def entries(self) -> list[list[Entry]]:
        """Per row (`rows`' order), one entry per scenario (`scenarios`' order): the one fold of what the records
        show at a stack that ran (`entries.py`), read by the glance, matrix.json's entries and the summary."""
        found = []
        for row in self.rows:
            answers = self.judge(row.query())
            found.append([entry_of(self, row, s, [a for a in answers if a["scenario"] == s]) for s in self.scenarios])
        return found

    @cached_property
    def row_labels(self) -> list[str]:
        """Each row named by the versions its records ran and its day ('torch 2.9.1 ... (2026-11-27)'); two rows of
        one device and world size that read the same (two profiles that ran the same stack) told apart by profile."""
        labels = []
        for row in self.rows:
            named = " ".join(
                f"{short_name(p)} {public_version(str(row.versions[p]))}" for p in AXIS_PACKAGES if row.versions.get(p)
            )
            labels.append((named or row.cell) + (f" ({row.day})" if row.day else ""))
        groups = [(row.device, row.ranks) for row in self.rows]
        return [
            f"{label} [{row.cell.split('@', 1)[1]}]"
            if "@" in row.cell and sum(1 for i, other in enumerate(labels) if other == label and groups[i] == group) > 1
            else label
            for label, row, group in zip(labels, self.rows, groups, strict=True)
        ]

    def verdict_of(self, records: list[dict[str, Any]], scenario: str) -> Verdict | None:
        """The verdict of records a view holds of its own (`check`'s runs of this environment, a finding's flip
        day), by the same pitfall rule as every entry: None where nothing but pitfall configs ran."""
        counted = self.counted(records)[0]
        return verdict(counted, self.specs.get(scenario)) if counted else None

    def records_at(
        self, scenario: str, versions: dict[str, str], device: str | None, ranks: int | None = None,
        keep_pitfalls: bool = False,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """The records of a scenario (every variant; pitfall configs left out) at exactly `versions` of every package
        its config depends on, on `device` (a distributed scenario on GPUs at `ranks`): the table's and the probes',
        one per config and variant, the one that shows the target where one does (what the judge's points hold);
        `keep_pitfalls`: with the pitfall configs' records too."""
        spec = self.specs.get(scenario) or {}
        chosen: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
        for record in self._agreeing(scenario, versions):
            if device and device_class(record) != device:
                continue
            if ranks and device == "cuda" and int(spec.get("world_size") or 1) > 1 and world_size(record) != ranks:
                continue
            rank = _worst(record, spec)
            key = (record["config_id"], record["variant"])
            if key not in chosen or rank > chosen[key][0]:
                chosen[key] = (rank, record)
        found = [record for _, record in chosen.values()]
        return found if keep_pitfalls else self.counted(found)[0]

    def _agreeing(self, scenario: str, versions: dict[str, str]) -> list[dict[str, Any]]:
        """The scenario's records (table first, then probes) whose stack is `versions` on every package their config
        depends on that they have (a package a record lacks was not installed there): looked up, not scanned."""
        found: list[tuple[int, dict[str, Any]]] = []
        for present, by_stack in self._stack_index.get(scenario, {}).items():
            found += by_stack.get(tuple(versions.get(p) for p in present), [])
        return [record for _, record in sorted(found, key=lambda item: item[0])]

    @cached_property
    def _stack_index(self) -> dict[str, dict[tuple[str, ...], dict[tuple[str | None, ...], list[tuple[int, Any]]]]]:
        """scenario -> the packages a record's config depends on that it has -> their releases -> (its place, the
        record), for every record, table first: what `records_at` looks a stack up in."""
        index: dict[str, dict[tuple[str, ...], dict[tuple[str | None, ...], list[tuple[int, Any]]]]] = {}
        for place, record in enumerate([*self.table, *self.probes]):
            spec = self.specs.get(record["scenario"])  # (none: a scenario no spec describes depends on every package)
            stack = stack_of(record)
            present = tuple(p for p in depends_of(spec, vocabulary.setup_of(record.get("config"), spec)) if p in stack)
            by_present = index.setdefault(record["scenario"], {}).setdefault(present, {})
            by_present.setdefault(tuple(stack[p] for p in present), []).append((place, record))
        return index

    def days(self, device: str) -> list[Day]:
        """The install days of the device's atlas, each with its stack as its fullest record names it."""
        by_day: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in self.table:
            day = (record.get("pins") or {}).get(DATE_AXIS)
            if day and device_class(record) == device:
                by_day[str(day)].append(record)
        return [
            Day(day, device, stack_of({"versions": fullest_versions(found)})) for day, found in sorted(by_day.items())
        ]

    def judge(self, query: Query) -> list[dict[str, Any]]:
        return evaluate(self.tables, query)

    def failure(self, failure_id: str) -> KnownFailure:
        return next(f for f in self.failures if f.id == failure_id)

    def setup_of(self, record: dict[str, Any]) -> dict[str, str]:
        return vocabulary.narrowing(vocabulary.setup_of(record.get("config"), self.specs.get(record["scenario"])))


def _split_by_versions(records: list[dict[str, Any]]) -> list[tuple[dict[str, str], list[dict[str, Any]]]]:
    """The records of one cell by the versions they ran: a record that names fewer packages joins the one group whose
    versions agree with all it names (S7's GPU run without bitsandbytes joins the day's S2 run with it)."""
    groups: dict[tuple[tuple[str, str], ...], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[tuple(sorted(stack_of(record).items()))].append(record)
    fullest = sorted(groups, key=len, reverse=True)
    merged: dict[tuple[tuple[str, str], ...], list[dict[str, Any]]] = {}
    for versions in fullest:
        homes = [v for v in merged if len(v) > len(versions) and set(versions) <= set(v)]
        if len(homes) == 1:
            merged[homes[0]].extend(groups[versions])
        else:
            merged[versions] = list(groups[versions])
    return [(dict(v), found) for v, found in merged.items()]


def _worst(record: dict[str, Any], spec: dict[str, Any]) -> int:
    """Which record of a config speaks at a stack: one that shows the target, then another failure, then a pass."""
    found = state(record, spec)
    return {SHOWS: 3, OTHER: 2}.get(found, 1 if record["outcome"] == "pass" else 0)
