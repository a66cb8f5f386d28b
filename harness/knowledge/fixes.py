"""A fix as evidence, judged like a failure: every record of a fix variant run where its config's baseline showed a
failure, with what it showed there (it passed: the fix holds there; the failure again: it does not fix it; another
failure: it ends it and brings that one), its stack, setup and world size.

The judge (`judge.fix_answer`) looks a user's releases up in these points as it does a failure's: a record at exactly
those releases, setup and world size (exact), measured points on both sides that agree (bracketed), or neither
(unmeasured: where it was measured, and the command that measures it here). A fix measured only on one GPU, or only
at other releases, is never a plain "fix" for another world size or stack.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness.define import setup as vocabulary
from harness.knowledge.evidence import NONE, OTHER, PASSES, SHOWS, device_class, stack_of, world_size
from harness.knowledge.evidence import state as record_state
from harness.recording.verdicts import variant_kinds
from scenarios.failure_names import family as failure_family


@dataclass(frozen=True)
class FixObservation:
    """One record of a fix variant where the same config's baseline, in the same cell, showed `baseline_family`."""

    scenario: str
    config_id: str
    device: str
    world_size: int
    stack: tuple[tuple[str, str], ...]
    setup: tuple[tuple[str, str], ...]
    variant: str
    outcome: str  # "pass" | "fail"
    signature: str | None
    baseline_family: str
    run_id: str
    cell: str

    def release(self, package: str) -> str | None:
        return dict(self.stack).get(package)

    def state_for(self, family: str) -> str:
        """PASSES (it fixes it here), SHOWS (the failure again) or OTHER (it failed another way)."""
        if self.outcome == "pass":
            return PASSES
        return SHOWS if self.signature and failure_family(self.signature) == family else OTHER

    def ref(self) -> dict[str, Any]:
        found = {"run_id": self.run_id, "config_id": self.config_id, "cell": self.cell, "variant": self.variant,
                 "outcome": self.outcome}  # fmt: skip
        return found | ({"signature": self.signature} if self.signature else {})


def fix_observations(
    table: Iterable[dict[str, Any]], probes: Iterable[dict[str, Any]], specs: dict[str, dict[str, Any]]
) -> dict[tuple[str, str, str], list[FixObservation]]:
    """(scenario, device, config id) -> every fix record that is evidence (it passed or failed; a skip, a record that
    is not applicable and a crash are none), paired with its config's baseline in the same cell (the table's newest
    records by cell; a probe's by its own run) that failed there."""
    table, probes = list(table), list(probes)
    baseline: dict[tuple[str, ...], str] = {}
    for source, group in (("table", table), ("probe", probes)):
        for record in group:
            spec = specs.get(record["scenario"])
            if record["variant"] != "baseline" or spec is None or record_state(record, spec) not in (SHOWS, OTHER):
                continue
            baseline[_pairing(source, record)] = failure_family(record.get("signature"))
    found: dict[tuple[str, str, str], list[FixObservation]] = defaultdict(list)
    for source, group in (("table", table), ("probe", probes)):
        for record in group:
            spec = specs.get(record["scenario"])
            if record["variant"] == "baseline" or spec is None:
                continue
            family = baseline.get(_pairing(source, record))
            judged = record_state(record, spec)
            if family is None or judged == NONE:
                continue
            device = device_class(record)
            setup = vocabulary.narrowing(vocabulary.setup_of(record.get("config"), spec))
            found[(record["scenario"], device, record["config_id"])].append(
                FixObservation(
                    scenario=record["scenario"],
                    config_id=record["config_id"],
                    device=device,
                    world_size=world_size(record),
                    stack=tuple(sorted(stack_of(record).items())),
                    setup=tuple(setup.items()),
                    variant=record["variant"],
                    outcome="pass" if judged == PASSES else "fail",
                    signature=record.get("signature"),
                    baseline_family=family,
                    run_id=str(record.get("run_id")),
                    cell=str(record["cell"]),
                )
            )
    return dict(found)


def _pairing(source: str, record: dict[str, Any]) -> tuple[str, ...]:
    """Which baseline a fix record is paired with: the table's by cell (its newest records), a probe's by its run."""
    run = str(record.get("run_id")) if source == "probe" else ""
    return (source, run, str(record["cell"]), record["scenario"], str(record["config_id"]))


def fixes_of_failure(
    scenario: str,
    device: str,
    family: str,
    configs: list[str],
    observed: dict[tuple[str, str, str], list[FixObservation]],
    spec: dict[str, Any],
) -> list[dict[str, Any]]:
    """The fixes measured for one failure: each variant run where one of its configs showed it, with every such
    record (`observed`), its kind and the setting a user's config can already hold (SPEC `variant_setup`); real fixes
    first. A variant that never passed where the failure showed is no fix of it anywhere and is left out (the table's
    entries say per cell what each variant did)."""
    kinds = variant_kinds(spec)
    settings = spec.get("variant_setup") or {}
    by_variant: dict[str, list[FixObservation]] = defaultdict(list)
    for config in configs:
        for obs in observed.get((scenario, device, config), []):
            if obs.baseline_family == family:
                by_variant[obs.variant].append(obs)
    fixes = []
    for name, found in by_variant.items():
        if not any(o.state_for(family) == PASSES for o in found):
            continue
        setting = settings.get(name)
        fixes.append(
            {"variant": name, "kind": kinds.get(name, "fix"), "observed": found}
            | ({"setup": dict(setting)} if setting else {})
        )
    return sorted(fixes, key=lambda f: (f["kind"] != "fix", f["variant"]))
