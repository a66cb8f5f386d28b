"""Bisect one package's releases to the first one where a scenario's outcome flips.

Every other pin stays as in a base cell of the profile. Each probe is a real one-cell matrix run of the
scenario's explicit examples (and profile configs) under one variant, recorded under
`results/bisect/<id>/`. The old end is probed first; then a binary search over the releases after it,
with "beyond the new end" as a virtual candidate, so n releases take at most ceil(log2 n) + 1 cell runs
(`flip_search`, the search every bisector shares). A probe is judged by the one rule (`probe_state`): only the
failure asked about, or a pass of every config that showed it, is evidence; a probe that could not install, timed
out or failed another way is stepped over (its neighbour is tried) and the verdict lists it. Where the old end
itself is no evidence (another failure comes first there), the search looks for the first release that shows
the failure, and the verdict says what came before it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import Version

from harness.define.cells import Cell
from harness.define.packages import AXIS_PACKAGES
from harness.define.profile import Profile, ScenarioSettings
from harness.define.registry import select
from harness.errors import UsageError, stopped_by
from harness.execution.matrix import run_matrix
from harness.execution.options import MatrixOptions
from harness.paths import records_file
from harness.recording import runs
from harness.recording.flip import Flip
from harness.recording.outcomes import FAILING, NAMED
from harness.recording.packing import run_dirs
from harness.recording.record import Record
from harness.recording.records import read_records
from harness.recording.signatures import rename_all
from harness.tools.release_search import flip_search
from harness.versions import releases


@dataclass
class Probe:
    version: str
    state: str  # "fail" | "pass" | "unusable"
    signatures: list[str]
    run_id: str
    records: int


def bisect(
    profile: Profile,
    package: str,
    scenario_id: str,
    variant: str,
    options: MatrixOptions,
    *,
    old: str | None = None,
    new: str | None = None,
    cell_glob: str | None = None,
    signature: str | None = None,
    out_root: Path,
    older_state: str | None = None,
    reuse_root: Path | None = None,
) -> Flip:
    """Find the first release of `package` after `old` whose outcome differs from `old`'s: a flip whose sides are
    the two ends' releases, its search runs the probes (the older end first). `older_state`: the state the old
    end must have for the search to mean anything (a flip whose failure ends needs it to fail); where it has
    another, the verdict holds that one probe and names no release. `reuse_root`: where earlier probe runs may be
    judged again instead of run twice (`probe_cell`)."""
    if package not in AXIS_PACKAGES:
        raise UsageError(f"--package {package!r}: not one of {', '.join(AXIS_PACKAGES)}")
    scenario = select([scenario_id])[0]
    if variant not in scenario.variants:
        raise UsageError(f"--variant {variant!r}: {scenario.id} has {', '.join(scenario.variants)}")
    profile, _ = releases.resolve_axes(profile, options.install.wheelhouse if options.install.offline else None)
    base = _base_cell(profile, cell_glob)
    wheelhouse = options.install.wheelhouse if options.install.offline else None
    available = releases.releases(package, profile.python, wheelhouse)
    if not available:
        raise UsageError(f"no releases of {package} found")
    old = old or _oldest_pinned(profile, package) or str(available[0])
    new = new or str(available[-1])
    candidates = [str(v) for v in releases.between(available, old, new)]
    if len(candidates) < 2 or candidates[0] != str(Version(old)):
        raise UsageError(f"{package}: need at least two releases from {old} to {new}, found {candidates}")

    bisect_id = f"{package}-{scenario.id.split('-')[0]}-{variant}-{runs.now_iso().replace(':', '')}"
    out_dir = out_root / bisect_id
    verdict = Flip(
        candidates[0], candidates[-1], "", "", {package: [candidates[0], candidates[-1]]}, scenario=scenario.id,
        package=package, candidates=candidates, variant=variant, base_cell=base.cell_id,
    )  # fmt: skip

    def probe(version: str) -> Probe:
        result = probe_cell(
            profile, base, package, version, scenario.id, variant, options, out_dir, signature, reuse_root=reuse_root
        )
        verdict.bisect_runs.append(result.__dict__)
        print(f"bisect: {package}=={version}: {result.state} {' '.join(result.signatures)}", flush=True)
        return result

    first = probe(candidates[0])
    if first.state == "unusable":
        raise UsageError(f"{package}=={old} cannot be installed or imported here; choose another --bad/--good bound")
    verdict.older_state = first.state
    newer_state = verdict.newer_state = "pass" if first.state == "fail" else "fail"
    if older_state is not None and first.state != older_state:
        _write(out_dir, verdict)
        return verdict
    known = {first.version: first.state}
    step = flip_search.next_step(candidates, known, first.state, newer_state)
    while not step.done:
        result = probe(step.probes[0])
        known[result.version] = result.state
        step = flip_search.next_step(candidates, known, first.state, newer_state)
    verdict.stepped_over = step.stepped_over  # could not run: not the answer, and listed
    verdict.release, verdict.last_release_before = step.first, step.last_before
    before = next((p for p in verdict.bisect_runs if p["version"] == step.last_before), None)
    if first.state == "no-evidence" and verdict.release and before is not None:
        # The failure first shows at the release; before it another outcome came first, so whether the failure
        # was absent there is not known.
        verdict.note = f"first shows; before it, {before['version']}: {', '.join(before['signatures'])}"
    _write(out_dir, verdict)
    return verdict


def _write(out_dir: Path, verdict: Flip) -> None:
    verdict.bisect = str(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "verdict.json").write_text(json.dumps(verdict.as_bisect_json(), indent=1) + "\n")


def _base_cell(profile: Profile, cell_glob: str | None) -> Cell:
    """The first runnable cell of the profile's plan (the --cell slice), which the probes vary."""
    from harness.planning.plan import build_plan

    plan = build_plan(profile, cell_patterns=(cell_glob,) if cell_glob else None, prune=False)
    cells = [c for c in plan.cells if not c.excluded_reason]
    if not cells:
        raise UsageError(f"no cell of profile {profile.name} matches {cell_glob!r}")
    return cells[0]


def _oldest_pinned(profile: Profile, package: str) -> str | None:
    values = [v for v in profile.axes.get(package, ()) if v[0].isdigit()]
    return min(values, key=Version) if values else None


def probe_cell(
    profile: Profile,
    base: Cell,
    package: str,
    version: str,
    scenario_id: str,
    variant: str,
    options: MatrixOptions,
    out_dir: Path,
    signature: str | None,
    *,
    reuse_root: Path | None = None,
) -> Probe:
    """One real one-cell run: the base cell's pins, `package` at `version`, explicit configs only. Where an
    earlier complete run of the same probe lies under `reuse_root` (a flip probed again, or an interrupted one
    resumed), its records are judged again instead of running it twice."""
    pins = base.pins | {package: version}
    earlier = None
    for root in (out_dir, reuse_root) if reuse_root else ():  # its own earlier run first, then any of the flip's
        earlier = earlier or earlier_probe(root, pins, scenario_id, variant, options.config_ids)
    if earlier is not None:
        records = rename_all(read_records(records_file(earlier)))
        state, signatures = probe_state(records, signature, options.config_ids or ())
        print(f"  (judged again from the earlier run {earlier.name})", flush=True)
        return Probe(version, state, signatures, earlier.name, len(records))
    settings = profile.settings_for(scenario_id)
    single = replace(
        profile,
        name=f"bisect-{package}-{version}",
        axes={p: (v,) for p, v in pins.items()},
        stacks={},
        exclusions=(),
        scenario_settings={scenario_id: replace(settings, cells=None, variants=(variant,), examples=0)}
        if settings
        else {scenario_id: ScenarioSettings(variants=(variant,), examples=0)},
    )
    probe_options = replace(
        options,
        results_dir=out_dir / version,
        fresh=True,
        scenario_patterns=(scenario_id,),
        examples=0,
        example_db=None,
        cell_patterns=None,
    )
    summary = run_matrix(single, probe_options)
    if summary.interrupted:
        # Ctrl-C or SIGTERM stopped the probe's run (which keeps its records): the search stops with it, and an
        # unfinished probe is no evidence.
        raise stopped_by(summary.signal)
    records = rename_all(read_records(records_file(summary.run_dir)))  # named by today's rules, as the table
    state, signatures = probe_state(records, signature, options.config_ids or ())
    return Probe(version, state, signatures, summary.run_id, len(records))


def earlier_probe(
    root: Path, pins: dict[str, str], scenario_id: str, variant: str, config_ids: tuple[str, ...] | None
) -> Path | None:
    """The newest complete probe run under `root` of exactly these pins (the date among them, so a probe resolved
    as of the older and one as of the newer day are two probes), this scenario and variant, that holds a record of
    every config asked for (of the whole explicit set where none is named)."""
    found = []
    for run_dir in run_dirs(root):
        meta = runs.read_meta(run_dir)
        attempts = meta.get("attempts") or []
        if not attempts or attempts[-1].get("status") != "complete":
            continue
        cells = list((meta.get("cells") or {}).values())
        if len(cells) != 1 or cells[0].get("pins") != pins:
            continue
        if any((a.get("slice") or {}).get("config_ids") and not config_ids for a in attempts):
            continue
        wanted = (scenario_id, variant)
        records = [r for r in read_records(records_file(run_dir)) if (r["scenario"], r["variant"]) == wanted]
        have = {r["config_id"] for r in records}
        if records and (not config_ids or set(config_ids) <= have):
            found.append((str(meta.get("started_at") or attempts[-1].get("started_at") or ""), run_dir))
    return max(found)[1] if found else None


def probe_state(records: list[Record], signature: str | None, config_ids: Iterable[str] = ()) -> tuple[str, list[str]]:
    """A probe's state from the records of the configs that showed the failure (`config_ids`; every config that
    could run when none are named), by the one rule (`flip_search.run_evidence`):
    - 'fail': the failure asked about (any named failure when none is) shows on one of them;
    - 'pass': every one of them ran and passed;
    - 'unusable': nothing could install or import;
    - 'no-evidence': anything else (a timeout, a crash, another failure, a config that did not run), which says
      nothing about the failure, so no flip is named from it.
    Returns the state and what is behind it: the target's signatures, or the reasons it is no evidence."""
    wanted = set(config_ids)
    considered = [r for r in records if not wanted or r.get("config_id") in wanted]
    judged = [(r, flip_search.run_evidence(r["outcome"], _is_target(r, signature))) for r in considered]
    shown = sorted({str(r["signature"]) for r, state in judged if state == flip_search.SHOWS})
    if shown:
        return "fail", shown
    if considered and all(state == flip_search.UNUSABLE for _, state in judged):
        return "unusable", sorted({str(r["signature"]) for r in considered})
    # A config that is not applicable by its scenario's own statement (a skip) is no candidate when the probe
    # names none; a config that showed the failure must have run.
    judged = [(r, state) for r, state in judged if wanted or r["outcome"] != "skip"]
    missing = sorted(wanted - {r.get("config_id") for r in considered})
    if judged and not missing and all(state == flip_search.ABSENT for _, state in judged):
        return "pass", []
    reasons = {_reason(r) for r, state in judged if state != flip_search.ABSENT}
    others = sorted(r.removeprefix(_OTHER) for r in reasons if r.startswith(_OTHER))
    reasons = {r for r in reasons if not r.startswith(_OTHER)} | ({_OTHER + ", ".join(others)} if others else set())
    reasons |= {f"did not run: {config_id}" for config_id in missing}
    return "no-evidence", sorted(reasons) or ["no record"]


_OTHER = "another failure: "


def _is_target(record: Record, signature: str | None) -> bool:
    if signature is None:
        return record["outcome"] in NAMED  # no failure named: any failure of the stack's own
    return record["outcome"] in FAILING and record.get("signature") == signature


def _reason(record: Record) -> str:
    """Why a record is no evidence, in a few words: 'timeout', 'another failure: <name>', 'skip: <name>'."""
    outcome, signature = record["outcome"], record.get("signature") or ""
    if outcome in NAMED:
        return _OTHER + signature
    return outcome if outcome in (signature, "") or not signature else f"{outcome}: {signature}"
