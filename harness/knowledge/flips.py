"""Flips as evidence, read once: the flips of the dated runs that are still evidence and of the release watch, each
with its masking decided here (another failure on the side where the target does not show hides it: a target that
"ends" because another failure comes first is masked, not fixed), and every release they name as a `Change` of a
scenario's configs (a sweep's changes each on its own, a verified finding's release beside them).

The dated verdicts a masking is judged against are made here too (`dated_verdicts`): one verdict per scenario and
install day of an atlas, over the day's stack as its fullest record names it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.define.packages import AXIS_PACKAGES
from harness.define.profile import DATE_AXIS
from harness.knowledge.evidence import atlas_of
from harness.recording.flip import Flip
from harness.recording.verdicts import verdict
from scenarios.failure_names import family as failure_family

if TYPE_CHECKING:
    from harness.knowledge.findings import Finding
    from harness.knowledge.store import Store


def fullest_versions(cell_records: list[dict[str, Any]]) -> dict[str, Any]:
    """The versions of the cell's record that names the most axis packages: a later run may have left an optional
    package out (S7's GPU run installed no bitsandbytes), which must not drop it from a cell its other scenarios
    ran with."""
    with_versions = [r["versions"] for r in cell_records if r.get("versions")]
    return max(with_versions, key=lambda v: sum(1 for p in AXIS_PACKAGES if v.get(p)), default={})


def dated_by_device(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The dated records of each atlas: "cpu", "cuda" (one GPU) and "cuda-ws<N>" (N GPUs of one node). A CPU atlas
    and a GPU atlas are two atlases, never one (their stacks differ: the era's torch on CPU, the node's fixed torch
    on a GPU), and so are one GPU and several: a profile whose distributed scenarios ran at N ranks on N GPUs."""
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if (record.get("pins") or {}).get(DATE_AXIS):
            found[atlas_of(record)].append(record)
    return dict(sorted(found.items()))


def dated_verdicts(
    records: list[dict[str, Any]], specs: dict[str, dict[str, Any]]
) -> tuple[list[str], dict[str, dict[str, Any]], dict[str, Any]]:
    """(dates, {date: versions}, {scenario: {date: Verdict}}) of the records that carry a date pin."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    by_date: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        date = (record.get("pins") or {}).get(DATE_AXIS)
        if not date:
            continue
        grouped[(record["scenario"], date)].append(record)
        by_date[date].append(record)
    # As the glance does: a run that left an optional package out does not drop it from the day's stack.
    stacks = {date: versions for date, day in by_date.items() if (versions := fullest_versions(day))}
    verdicts: dict[str, dict[str, Any]] = defaultdict(dict)
    for (scenario, date), group in grouped.items():
        verdicts[scenario][date] = verdict(group, specs.get(scenario))
    return sorted({d for _, d in grouped}), stacks, dict(verdicts)


def masking(flip: Flip, verdicts: dict[str, Any]) -> list[str]:
    """Other failures of the baseline on the side of a flip where the target does not show (`verdicts`: the
    third part of dated_verdicts): a target that 'ends' because another failure comes first is masked, not
    fixed, and the table says so."""
    side = flip.older if flip.older_state != "target" else flip.newer
    other_side = flip.newer if side == flip.older else flip.older
    by_date = verdicts.get(flip.scenario, {})
    found, shown = by_date.get(side), by_date.get(other_side)
    if found is None:
        return []
    # Another failure hides a target that ends (it may still be there); before an onset it is the history the
    # onset is judged against (e.g. DoRA under FSDP failing otherwise before peft 0.12), so it masks nothing. Only a
    # failure on the configs that showed the target hides it: where they ran and passed, the target did end (S7's
    # ZeRO-3 save on 2 GPUs, 2025-03-20, beside other configs' failures). A flip stored without its configs is
    # judged by every other failure of the day, as before.
    mine = set(flip.config_ids or ())
    hiding = {sig for cid, sig in found.other_ids.items() if cid in mine} if mine else set(found.others)
    masked = sorted(hiding) if flip.newer_state != "target" else []
    # The configs that showed the target on the other side could not run on this side: not a flip of the stack.
    showed = {r["config_id"] for r in (shown.target_records if shown is not None else [])}
    reasons = sorted({why for cid, why in found.inapplicable_ids.items() if cid in showed})
    # ... or could not run at all there (the day's packages could not load them): no evidence either way.
    broken = sorted({why for cid, why in found.unusable_ids.items() if cid in showed})
    # ... or have no baseline record there at all (a day measured with other configs): no evidence either.
    absent = sorted((mine or showed) - set(found.config_ids)) if found.config_ids else []
    return (
        masked
        + [f"not applicable: {why}" for why in reasons]
        + [f"could not run: {why}" for why in broken]
        + [f"did not run: {cid}" for cid in absent]
    )


#: A series of one config (SPEC "flips_per_config"): its family name is this prefix and the config id.
CONFIG_SERIES = "config-"


def family_state(found: Any, family: str | None, shows: set[str]) -> tuple[str, list[dict[str, Any]]]:
    """A date's target state for one failure family of its scenario, and the records that show it (flaky ones
    define no state). Where only another family showed, on a config that shows this family on some date
    (`shows`), this family's state is not known that day: "masked". A config series (`config-<id>`) is that one
    config's state."""
    if family and family.startswith(CONFIG_SERIES):
        return config_state(found, family[len(CONFIG_SERIES) :])
    hits = [r for r in found.target_records if r["outcome"] != "flaky"]
    if family is not None:
        hits = [r for r in hits if failure_family(r["signature"]) == family]
    state = found.state
    if state == "target" and not hits:
        others = {r["config_id"] for r in found.target_records if r["outcome"] != "flaky"}
        state = "masked" if others & shows else "not-reproduced"
    return state, hits


def config_state(found: Any, config_id: str) -> tuple[str, list[dict[str, Any]]]:
    """One config's target state on a date: it showed the target; it failed another way ("masked": not known); it
    could not run or did not run ("skip": no evidence); a flaky target defines no state ("skip"); else it passed."""
    mine = [r for r in found.target_records if r["config_id"] == config_id]
    if any(r["outcome"] == "flaky" for r in mine):
        return "skip", []
    if mine:
        return "target", mine
    if config_id in found.other_ids:
        return "masked", []
    if config_id in found.inapplicable_ids or config_id in found.unusable_ids or config_id not in found.config_ids:
        return "skip", []
    return "not-reproduced", []


def flips_of_runs(store: Store, run_ids: list[str]) -> list[Flip]:
    """The named flips of the given dated runs (results/flips/<run-id>/flips.json), each with its run id."""
    return [
        Flip.from_json(flip | {"run_id": run_id}) for run_id in run_ids for flip in store.flip_files.get(run_id, [])
    ]


def watched_flips(store: Store) -> list[Flip]:
    """The release watch's named flips (results/watch/<day>/flips.json, and a GPU profile's watch in
    results/watch/<day>/<profile>/flips.json): each release that changed a target alone."""
    return [Flip.from_json(entry) for entry in store.watch_flip_entries]


def with_masking(flips: list[Flip], records: list[dict[str, Any]], specs: dict[str, dict[str, Any]]) -> list[Flip]:
    """The flips with `masked_by` decided once, against the dated verdicts of the atlas each flip's run belongs to
    (a flip of the watch or of a run the table does not hold is judged on the CPU atlas, where the watch runs)."""
    dated = dated_by_device(records)
    verdicts = {device: dated_verdicts(found, specs)[2] for device, found in dated.items()}
    run_device = {r["run_id"]: device for device, found in dated.items() for r in found}
    for flip in flips:
        flip.masked_by = masking(flip, verdicts.get(run_device.get(flip.run_id or "", "cpu"), {}))
    return flips


@dataclass(frozen=True)
class Change:
    """A release that changed a scenario's outcome on some configs, as a flip or a sweep measured it."""

    scenario: str
    package: str
    release: str
    last_before: str | None
    direction: str  # "started" | "ended"
    config_ids: tuple[str, ...]
    device: str
    run_id: str | None
    #: Whether `last_before` was measured in the older state (a pass before an onset): False where it failed another
    #: way (a bisect's "first shows; before it ..."), so it is no release to pin.
    before_measured: bool = True
    #: The failure's name (the flip's or the finding's).
    signature: str | None = None
    #: The verified finding that measured this change (its reproducer at both releases), where one did.
    finding: str | None = None
    #: The CPU flags the finding flipped with and did not without (`Finding.cpu_condition`): a condition on the
    #: user's machine.
    cpu_flags: tuple[str, ...] = ()


def changes_for(flips: list[Flip], atlas_of_run: dict[str, str]) -> list[Change]:
    """Every change the unmasked flips name, each sweep change on its own (in order), else the flip's named release
    (its release before: the one named, else the older side's release of the package, which the move alone from it
    reproduced)."""
    found = []
    for flip in flips:
        if flip.masked_by:
            continue
        device = atlas_of_run.get(flip.run_id or "", "cpu").split("-")[0]
        ids = tuple(flip.config_ids)
        if flip.changes:
            for change in flip.changes:
                found.append(Change(str(flip.scenario), change["package"], change["release"],
                                    change.get("last_before"), change["direction"], ids, device, flip.run_id,
                                    signature=flip.signature))  # fmt: skip
        elif flip.package and flip.release:
            sides = flip.changed.get(flip.package) or [None, None]
            # Named by the move alone (the newer side's release): the older side's release is the one before it.
            before = flip.last_release_before or (sides[0] if flip.release == sides[-1] else None)
            # A bisect's note says the release before the named one was no evidence (another failure came first).
            found.append(Change(str(flip.scenario), flip.package, flip.release, before,
                                flip.direction, ids, device, flip.run_id, before_measured=not flip.note,
                                signature=flip.signature))  # fmt: skip
    return found


def finding_changes(findings: list[Finding]) -> list[Change]:
    """The release each verified finding names, as a change of its scenario's configs: its reproducer flipped at
    both releases with every other pin held (`findings --verify`), the evidence a masked flip could not give."""
    found = []
    for finding in findings:
        if not finding.verified:
            continue
        family = str(finding.flip.get("family") or "")
        config = finding.probe.get("config") or (family.removeprefix("config-") if family.startswith("config-") else "")
        starts = finding.direction == "starts"
        found.append(Change(
            finding.scenario, finding.package, finding.bad if starts else finding.good,
            finding.good if starts else finding.bad, "started" if starts else "ended",
            (config,) if config else (), "cuda" if finding.gpus else "cpu", None, signature=finding.signature,
            finding=finding.id, cpu_flags=finding.cpu_condition,
        ))  # fmt: skip
    return found


def atlas_of_runs(records: list[dict[str, Any]]) -> dict[str, str]:
    """run id -> its atlas ('cpu', 'cuda', 'cuda-ws2'), from the records."""
    found: dict[str, str] = {}
    for record in records:
        found.setdefault(str(record.get("run_id")), atlas_of(record))
    return found


def named_packages(targets: list[str]) -> set[str]:
    """The packages the upstream record names for a scenario's target failures (any direction): where a release of
    one can change the outcome, so two install days that agree are still swept over its releases between them."""
    from scenarios.failure_names import upstream_packages

    return set().union(*(upstream_packages(t) for t in targets)) if targets else set()


def bisect_verdicts(store: Store) -> list[Flip]:
    """Each `compat-matrix bisect` verdict (results/bisect/<name>/verdict.json), in its folders' order."""
    return [Flip.from_json(entry) for entry in store.bisect_verdict_entries]
