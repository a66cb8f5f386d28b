"""The atlas: the one model every answer is handed (like Hypothesis's `ConjectureData`, one object through every
step). It reads the records once (`selection.py`), judges each as evidence (`evidence.py`), reads the flips with their
masking decided once (`flips.py`), finds the pitfalls, builds the known failures (`failures.py`) and compiles the
judge's tables (`tables.py`). The glance, `lookup`, `check`, `audit`, the advisories and the page ask it; none of them
walks the records again.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.define import setup as vocabulary
from harness.knowledge import flips as flip_model
from harness.knowledge.evidence import device_class
from harness.knowledge.failures import KnownFailure, Observation, known_failures, observations
from harness.knowledge.judge import Query, evaluate
from harness.knowledge.pitfalls import Pitfall, pitfalls, without_pitfalls
from harness.knowledge.selection import Selection, select_runs, selected_flip_runs
from harness.knowledge.tables import compile_tables
from harness.recording.flip import Flip
from harness.recording.verdicts import matches, variant_kinds


class Atlas:
    """What the records show, read once. `run_ids` narrows the table to named runs (the probes and flips stay the
    selected runs')."""

    def __init__(
        self, results_dir: Path, specs: dict[str, dict[str, Any]] | None = None, run_ids: list[str] | None = None
    ) -> None:
        self.results_dir = results_dir
        self.run_ids = run_ids
        if specs is None:
            from harness.define.registry import discover

            specs = {s.id: s.spec for s in discover()}
        self.specs = specs

    @cached_property
    def selection(self) -> Selection:
        return select_runs(self.results_dir, self.run_ids)

    @cached_property
    def table(self) -> list[dict[str, Any]]:
        """The table's records: the newest per key of the selected runs."""
        return self.selection.latest()[0]

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
        """The flips of the dated runs that are evidence and of the release watch, masking decided once."""
        found = flip_model.flips_of_runs(self.results_dir, selected_flip_runs(self.results_dir))
        found += flip_model.watched_flips(self.results_dir)
        return flip_model.with_masking(found, self.table, self.specs)

    @cached_property
    def changes(self) -> list[flip_model.Change]:
        """Every release the unmasked flips, sweeps and verified findings name."""
        atlas_of_run = flip_model.atlas_of_runs([*self.table, *self.probes])
        return flip_model.changes_for(self.flips, atlas_of_run) + flip_model.finding_changes(self.results_dir)

    @cached_property
    def observations(self) -> list[Observation]:
        return observations(self.table, self.probes, self.specs)

    @cached_property
    def failures(self) -> list[KnownFailure]:
        pitfall_configs = {(p.scenario, p.device, p.config_id) for p in self.pitfalls.values()}
        return known_failures(self.observations, self.changes, self.specs, pitfall_configs, self.fixes_of)

    @cached_property
    def fixes_of(self) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
        """(scenario, device, config id) -> each change measured passing on a cell where its baseline showed the
        target there: kind and the setting a user's config can already hold (SPEC `variant_setup`)."""
        failing = set()
        for record in self.table:
            spec = self.specs.get(record["scenario"]) or {}
            if record["variant"] == "baseline" and record["outcome"] != "pass":
                if matches(record.get("signature"), list(spec.get("target") or [])):
                    failing.add((record["cell"], record["scenario"], record["config_id"]))
        found: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
        for record in self.table:
            if record["variant"] == "baseline" or record["outcome"] != "pass":
                continue
            if (record["cell"], record["scenario"], record["config_id"]) not in failing:
                continue
            spec = self.specs.get(record["scenario"]) or {}
            name = record["variant"]
            setting = (spec.get("variant_setup") or {}).get(name)
            found[(record["scenario"], device_class(record), record["config_id"])][name] = {
                "variant": name,
                "kind": variant_kinds(spec).get(name, "fix"),
            } | ({"setup": dict(setting)} if setting else {})
        return {k: list(v.values()) for k, v in found.items()}

    @cached_property
    def coverage(self) -> dict[str, list[dict[str, str]]]:
        """'scenario@device' -> the setups its records measured there (a GPU answer is decided by GPU records where
        they exist)."""
        found: dict[str, set[tuple[tuple[str, str], ...]]] = defaultdict(set)
        for obs in self.observations:
            found[f"{obs.scenario}@{obs.device}"].add(obs.setup)
        return {k: [dict(s) for s in sorted(v)] for k, v in found.items()}

    @cached_property
    def tables(self) -> dict[str, Any]:
        """The judge's tables (`tables.py`), compiled once."""
        return compile_tables(
            self.failures, list(self.pitfalls.values()), self.specs, self.coverage, self.details
        )  # fmt: skip

    @cached_property
    def details(self) -> dict[str, tuple[str, str]]:
        """failure id -> (the condition on the user's model its configs share, in the scenario's words: the judge's
        "applies if"; what else sets them apart from the configs most records ran)."""
        from harness.knowledge.details import details

        configs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for record in [*self.table, *self.probes]:
            if record["variant"] == "baseline":
                configs[(record["scenario"], record["config_id"])].append(record.get("config") or {})
        return details(self.failures, configs, self.specs)

    def judge(self, query: Query) -> list[dict[str, Any]]:
        return evaluate(self.tables, query)

    def failure(self, failure_id: str) -> KnownFailure:
        return next(f for f in self.failures if f.id == failure_id)

    def setup_of(self, record: dict[str, Any]) -> dict[str, str]:
        return vocabulary.narrowing(vocabulary.setup_of(record.get("config"), self.specs.get(record["scenario"])))
