"""Bisect one package's releases to the first one where a scenario's outcome flips.

Every other pin stays as in a base cell of the profile. Each probe is a real one-cell matrix run of the
scenario's explicit examples (and profile configs) under one variant, recorded under
`results/bisect/<id>/`. The old end is probed first; then a binary search over the releases after it,
with "beyond the new end" as a virtual candidate, so n releases take at most ceil(log2 n) + 1 cell runs
(`flip_search`, the search every bisector shares). A probe that is `install-failed` or `env-broken` is stepped
over (its neighbour is tried) and the verdict says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from harness.define.cells import Cell
from harness.define.packages import AXIS_PACKAGES
from harness.define.profile import Profile, ScenarioSettings
from harness.define.registry import select
from harness.errors import UsageError, stopped_by
from harness.execution.matrix import run_matrix
from harness.execution.options import MatrixOptions
from harness.recording import runs
from harness.recording.flip import Flip
from harness.recording.outcomes import FAILING, UNUSABLE
from harness.recording.records import read_records
from harness.tools import flip_search
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
) -> Flip:
    """Find the first release of `package` after `old` whose outcome differs from `old`'s: a flip whose sides are
    the two ends' releases, its search runs the probes (the older end first)."""
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
        result = probe_cell(profile, base, package, version, scenario.id, variant, options, out_dir, signature)
        verdict.bisect_runs.append(result.__dict__)
        print(f"bisect: {package}=={version}: {result.state} {' '.join(result.signatures)}", flush=True)
        return result

    first = probe(candidates[0])
    if first.state == "unusable":
        raise UsageError(f"{package}=={old} cannot be installed or imported here; choose another --bad/--good bound")
    verdict.older_state = first.state
    newer_state = verdict.newer_state = "pass" if first.state == "fail" else "fail"
    known = {first.version: first.state}
    step = flip_search.next_step(candidates, known, first.state, newer_state)
    while not step.done:
        result = probe(step.probes[0])
        known[result.version] = result.state
        step = flip_search.next_step(candidates, known, first.state, newer_state)
    verdict.stepped_over = step.stepped_over  # could not run: not the answer, and listed
    verdict.release, verdict.last_release_before = step.first, step.last_before
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "verdict.json").write_text(json.dumps(verdict.as_bisect_json(), indent=1) + "\n")
    return verdict


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
) -> Probe:
    """One real one-cell run: the base cell's pins, `package` at `version`, explicit configs only."""
    pins = base.pins | {package: version}
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
    records = read_records(summary.run_dir / "records.jsonl")
    state, signatures = probe_state(records, signature)
    return Probe(version, state, signatures, summary.run_id, len(records))


def probe_state(records: list[dict[str, Any]], signature: str | None) -> tuple[str, list[str]]:
    """A probe's state from its records: 'unusable' (nothing could install or run), 'fail' (the failure asked
    about, or any failure when none is named), else 'pass'; with the signatures behind it."""
    if records and all(r["outcome"] in UNUSABLE for r in records):
        return "unusable", sorted({r["signature"] for r in records})
    failing = [r for r in records if r["outcome"] in FAILING and (signature is None or r["signature"] == signature)]
    return ("fail" if failing else "pass"), sorted({r["signature"] for r in failing})
