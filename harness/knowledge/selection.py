"""Which runs are evidence, chosen once for every answer: the newest evidence per profile and GPU count, each run
giving the (cell, scenario) pairs no newer run of its group covers; superseded and withdrawn runs left out; cells one
id shared by two profiles told apart; and the probe records (flips' moves and sweeps, bisects, the release watch,
`lookup --measure`) of the runs that are still evidence. The table, the glance, `lookup`, `check`, the advisories and
`audit` read the same selection through the knowledge model (`knowledge/atlas.py`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.knowledge.store import Store
from harness.recording.records import record_key


@dataclass(frozen=True)
class Selection:
    run_ids: list[str]
    records: list[dict[str, Any]]
    metas: list[dict[str, Any]]
    #: Keys whose outcome in an older run of the same profile differs from the one shown: marked flaky.
    conflicting: frozenset[tuple[str, ...]] = frozenset()
    #: The records of the probe runs (flips' moves and sweeps, bisects, the watch) beside the table's: evidence at
    #: exact releases (a config that passed in one is no pitfall). Read for the default table only.
    probes: tuple[dict[str, Any], ...] = ()
    #: Where the runs were read from (the flips and findings beside them belong to the same atlas).
    results_dir: Path | None = None

    def pitfalls(self, specs: dict[str, dict[str, Any]]) -> dict[tuple[str, str], Any]:
        """The configs that fail on every release measured (`knowledge.pitfalls`), from the table and the probes."""
        from harness.knowledge.pitfalls import pitfalls

        return pitfalls(self.latest()[0], specs, self.probes)

    def latest(self) -> tuple[list[dict[str, Any]], set[tuple[str, ...]]]:
        records, flaky = latest_by_key(self.records)
        return records, flaky | set(self.conflicting)


def select_runs(results_dir: Path, run_ids: Iterable[str] | None = None, store: Store | None = None) -> Selection:
    """The named runs (all their records), or by default the newest evidence per profile and GPU count
    (`evidence_group`): runs of a group newest first, each contributing the (cell, scenario) pairs no newer run of
    that group covers. A run that re-checks one scenario on one cell then updates that entry without hiding the
    rest. Retired runs (`retired`) are left out. Files are read through `store` (one per atlas), once each."""
    store = store or Store(results_dir)
    metas = store.metas
    if run_ids:
        chosen = list(run_ids)
        unknown = [r for r in chosen if r not in metas]
        if unknown:
            from harness.errors import UsageError

            raise UsageError(f"unknown run id(s): {', '.join(unknown)} (known: {', '.join(metas) or 'none'})")
        records = [rec for r in chosen for rec in store.run_records(r)]
        return Selection(
            chosen, qualify_shared_cells(records, metas), [metas[r] for r in chosen], results_dir=results_dir
        )
    by_profile: dict[str, list[str]] = defaultdict(list)
    for run_id, meta in metas.items():
        if not retired(meta):
            by_profile[evidence_group(run_id, metas)].append(run_id)
    chosen, records = [], []
    disagreeing: set[tuple[str, tuple[str, ...]]] = set()
    for profile in sorted(by_profile):
        shown: dict[tuple[str, ...], str] = {}
        shown_by: dict[tuple[str, ...], Evidence] = {}
        newest_first = sorted(by_profile[profile], key=lambda r: metas[r].get("started_at", ""), reverse=True)
        runs = ((r, store.run_records(r)) for r in newest_first)
        for run_id, fresh, hidden in newest_per_pair(runs, config_slices(metas)):
            for rec in hidden:
                if record_key(rec) in shown and shown[record_key(rec)] != rec["outcome"]:
                    if same_code((metas[run_id], rec), shown_by[record_key(rec)]):
                        disagreeing.add((profile, record_key(rec)))  # an older run disagrees: flaky, never hidden
            if fresh:
                chosen.append(run_id)
                records.extend(fresh)
                shown |= {record_key(rec): rec["outcome"] for rec in fresh}
                shown_by |= {record_key(rec): (metas[run_id], rec) for rec in fresh}
    chosen.sort()
    shared = shared_cells(records, metas)
    records = qualify_shared_cells(records, metas, shared)
    # A flaky key of a shared cell follows its cell to the qualified id.
    conflicting = {(_shown_cell(key[0], profile, shared), *key[1:]) for profile, key in disagreeing}
    probes = tuple(probe_records(store))
    return Selection(chosen, records, [metas[r] for r in chosen], frozenset(conflicting), probes, results_dir)


def newest_per_pair(
    runs: Iterable[tuple[str, list[dict[str, Any]]]],
    config_slices: frozenset[str] = frozenset(),
) -> Iterator[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]:
    """(run id, fresh, hidden) for runs given newest first: a run gives the (cell, scenario) pairs no newer run
    covers (fresh); its records of pairs a newer run covers are hidden. A run that re-checks one scenario on one
    cell updates that entry without hiding the rest, and a run of `config_slices` (made with `--config`) covers only
    the configs it ran: a new config on every day never hides the configs the days ran before."""
    covered: set[tuple[str, ...]] = set()

    def hidden_by_newer(record: dict[str, Any]) -> bool:
        pair = (record["cell"], record["scenario"])
        return pair in covered or (*pair, str(record.get("config_id"))) in covered

    for run_id, run_records in runs:
        fresh = [r for r in run_records if not hidden_by_newer(r)]
        hidden = [r for r in run_records if hidden_by_newer(r)]
        if run_id in config_slices:
            covered |= {(r["cell"], r["scenario"], str(r.get("config_id"))) for r in fresh}
        else:
            covered |= {(r["cell"], r["scenario"]) for r in fresh}
        yield run_id, fresh, hidden


def config_slices(metas: dict[str, dict[str, Any]]) -> frozenset[str]:
    """Runs every attempt of which ran only chosen configs (`matrix --config`): evidence of those configs only."""
    return frozenset(
        run_id
        for run_id, meta in metas.items()
        if meta.get("attempts") and all((a.get("slice") or {}).get("config_ids") for a in meta["attempts"])
    )


def retired(meta: dict[str, Any]) -> bool:
    """A run that is no evidence any more: `superseded_by` (newer runs measured the same again) or `withdrawn` (its
    method was found wrong and nothing re-measured it; the reason stays in its meta.json and NOTES)."""
    return bool(meta.get("superseded_by") or meta.get("withdrawn"))


def evidence_group(run_id: str, metas: dict[str, dict[str, Any]]) -> str:
    """What a run is evidence of: its profile, on as many GPUs as it ran on. A newer run of a group hides an older
    one's entries only within the group: a profile run on 4 GPUs never hides what it found on 2. The GPU count is
    named only where a profile's runs differ in it (`gpu-2gpus`, `gpu-4gpus`)."""
    meta = metas.get(run_id, {})
    profile = str(meta.get("profile", run_id))
    counts = {_gpus(m) for m in metas.values() if m.get("profile") == profile and not retired(m)}
    return profile if len(counts) <= 1 else f"{profile}-{_gpus(meta)}gpus"


def _gpus(meta: dict[str, Any]) -> int:
    return int((meta.get("hardware") or {}).get("gpu_count") or 0)


def _profile_of(record: dict[str, Any], metas: dict[str, dict[str, Any]]) -> str:
    return evidence_group(record["run_id"], metas) if record["run_id"] in metas else str(record["run_id"])


def shared_cells(records: list[dict[str, Any]], metas: dict[str, dict[str, Any]]) -> set[str]:
    """Cell ids that records of more than one profile carry."""
    profiles: dict[str, set[str]] = defaultdict(set)
    for record in records:
        profiles[record["cell"]].add(_profile_of(record, metas))
    return {cell for cell, names in profiles.items() if len(names) > 1}


def _shown_cell(cell: str, profile: str, shared: set[str]) -> str:
    return f"{cell}@{profile}" if cell in shared else cell


def qualify_shared_cells(
    records: list[dict[str, Any]], metas: dict[str, dict[str, Any]], shared: set[str] | None = None
) -> list[dict[str, Any]]:
    """Cells of one id in two profiles (the CPU history's `era_date-2024-02-29` and the GPU history's) are two
    cells: each is shown as `<cell>@<profile>` (the recorded id kept in `cell_at_run`), so neither's records
    replace the other's in the table, the reproducers or the atlas."""
    shared = shared_cells(records, metas) if shared is None else shared
    qualified = []
    for record in records:
        if record["cell"] in shared:
            shown = _shown_cell(record["cell"], _profile_of(record, metas), shared)
            record = record | {"cell": shown, "cell_at_run": record["cell"]}
        qualified.append(record)
    return qualified


Evidence = tuple[dict[str, Any], dict[str, Any]]  # (run meta, record)


def same_code(older: Evidence, newer: Evidence) -> bool:
    """Whether two records were made by the same scenario code (each record's own digest, else its run's);
    unknown (runs before digests were recorded) counts as the same, so a disagreement is shown rather than
    explained away."""

    def digest(evidence: Evidence) -> str | None:
        meta, record = evidence
        return record.get("scenario_digest") or (meta.get("scenario_digests") or {}).get(record["scenario"])

    a, b = digest(older), digest(newer)
    return a is None or b is None or a == b


def latest_by_key(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[tuple[str, ...]]]:
    """One record per key (the newest); keys whose outcomes disagree across runs are returned as flaky."""
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_key[record_key(record)].append(record)
    chosen, flaky = [], set()
    for key, group in by_key.items():
        group.sort(key=lambda r: r.get("started_at", ""))
        if len({r["outcome"] for r in group}) > 1:
            flaky.add(key)
        chosen.append(group[-1])
    return chosen, flaky


def probe_records(store: Store) -> list[dict[str, Any]]:
    """Every record of every probe run (flips' moves and sweeps, bisects, the release watch, `lookup --measure`),
    named by today's rules: evidence at exact releases beside the table's install days. The probes of a dated run that
    is no evidence any more (`results/flips/<run>/`, the run superseded or withdrawn) are left out with it."""
    found = []
    for folder, dirs in store.probe_run_dirs.items():
        for run_dir in dirs:
            owner = _dated_run_of(run_dir, store.results_dir / folder) if folder == "flips" else None
            if owner and retired(store.metas.get(owner, {})):
                continue
            found += store.records_in(run_dir, warn=False)
    return found


def _dated_run_of(run_dir: Path, root: Path) -> str | None:
    """The dated run a probe run under `results/flips/<run>/...` belongs to."""
    try:
        return run_dir.relative_to(root).parts[0]
    except (ValueError, IndexError):
        return None


def selected_flip_runs(store: Store) -> list[str]:
    """The dated runs whose flips are evidence: every run with a flips.json that is not superseded or withdrawn."""
    return [run_id for run_id in store.flip_files if not retired(store.metas.get(run_id, {}))]
