"""Every release of one package between two measured stacks that can change an outcome, measured: the sweep.

A flip between two install days used to get one move and a binary search, which assumes one change. Here the moved
package's releases between the two days' are swept (`flip_search.next_sweep`: every release where there are few,
else the first and last patch of every minor, then a search of each gap whose ends differ), each a real one-cell run
of the scenario's configs over the older day's stack with only that package moved (`bisection.probe_cell`, the same
probe as the bisect's). The sweep runs every config of the day pair that is asked about at once, so each config's
series (S9's flips are per config) is judged from the same runs; a probe run is reused wherever its pins and configs
match (a second series, an interrupted sweep resumed).

What it writes into the flip: `changes` (every change found, in order, each with the runs behind both of its
releases), `sweep` (the candidates, the points, the runs and their cost, the releases never measured) and, where the
flip's ends differ, `release` / `last_release_before` from the last change (the one after which the newer state holds
up to the newer day: the release a user must reach).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from harness.define.cells import Cell
from harness.define.profile import Profile
from harness.execution.options import MatrixOptions
from harness.recording.flip import Flip, changes_words
from harness.tools.release_search import bisection, flip_search
from harness.versions import releases

Probe = Callable[..., bisection.Probe]


def candidates_between(package: str, old: str, new: str, python: str | None) -> list[str]:
    """The installable final releases of `package` from `old` to `new`, both included, oldest first."""
    return [str(v) for v in releases.between(releases.releases(package, python), old, new)]


def yanked_between(package: str, old: str, new: str) -> list[str]:
    """Releases between `old` and `new` whose every file is yanked: no run can install them, and the sweep says so
    (transformers 4.46.0 lies between 4.45.2 and 4.46.1). Empty where the index cannot be read."""
    try:
        return [str(v) for v in releases.between(releases.yanked(package), old, new)]
    except OSError:
        return []


def cost_words(candidates: list[str]) -> str:
    """What a sweep of `candidates` will measure, said before it runs: '8 releases, all measured (8 or fewer); at most
    8 runs' or '23 releases; 14 sweep points (first and last patch of each minor); at most 20 runs'."""
    points = flip_search.sweep_points(candidates)
    bound = flip_search.sweep_bound(candidates)
    if len(points) == len(candidates):
        return f"{len(candidates)} releases, all measured ({flip_search.FEW_RELEASES} or fewer); at most {bound} runs"
    return (
        f"{len(candidates)} releases; {len(points)} sweep points (both ends, first and last patch of each minor); "
        f"at most {bound} runs"
    )


def sweep_flip(
    flip: Flip,
    held: Profile,
    package: str,
    old: str,
    new: str,
    options: MatrixOptions,
    out_dir: Path,
    *,
    run_ids: tuple[str, ...] = (),
    runs_dir: Path | None = None,
    candidates: list[str] | None = None,
    probe: Probe = bisection.probe_cell,
    say: Callable[[str], None] = print,
    fallback: Profile | None = None,
) -> Flip:
    """Sweep `package` from `old` to `new` over `held` (the older day's stack, the package allowed up to the newer
    day) for the flip's configs; every change found goes into the flip. `run_ids`: the configs each probe runs (the
    day pair's); `runs_dir`: where the probe runs are kept and found again (default `out_dir`; the day pair's shared
    folder, so the pair's other series judge the same runs). Each probe is judged on the flip's own configs.
    `candidates`: the releases (default: the index's, from `old` to `new`). `fallback`: the same stack with the
    dependencies as of the newer day, for a release that cannot install as of the older one (transformers 4.47.0 needs
    a tokenizers the older day did not have); each run says which it took."""
    runs_dir = runs_dir or out_dir
    if candidates is None:
        candidates = candidates_between(package, old, new, held.python)
    if not candidates or candidates[0] != old or candidates[-1] != new:
        found = ", ".join(candidates) or "none"
        flip.note = f"no sweep: the releases of {package} from {old} to {new} on the index are {found}"
        return flip
    base = Cell(stack=None, choices=tuple((k, v[0]) for k, v in held.axes.items()), implied=())
    judged_on = tuple(flip.config_ids)
    say(f"sweep {flip.scenario} {package} {old} .. {new}: {cost_words(candidates)}")
    runs: dict[str, dict[str, Any]] = {}
    known: dict[str, str] = {}
    started = time.monotonic()
    modes = [("older-dependencies", held, base)]
    if fallback is not None:
        modes.append(
            ("newer-dependencies", fallback, Cell(None, tuple((k, v[0]) for k, v in fallback.axes.items()), ()))
        )

    def measure(version: str) -> tuple[bisection.Probe, str]:
        """One release: every config of the day pair run once (the judgement reuses that run for this flip's
        configs), as of the older day, else as of the newer one."""
        for mode, stack, cell in modes:
            if run_ids and set(run_ids) != set(judged_on):
                ran = replace(options, config_ids=run_ids)
                probe(stack, cell, package, version, flip.scenario, "baseline", ran, runs_dir, flip.signature,
                      reuse_root=runs_dir)  # fmt: skip
            judged = replace(options, config_ids=judged_on or None)
            result = probe(stack, cell, package, version, flip.scenario, "baseline", judged, runs_dir, flip.signature,
                           reuse_root=runs_dir)  # fmt: skip
            if result.state != "unusable":
                return result, mode
        return result, mode

    while not (step := flip_search.next_sweep(candidates, known)).done:
        for version in step.probes:
            ran_at = time.monotonic()
            result, mode = measure(version)
            known[version] = result.state
            runs[version] = {**asdict(result), "dependencies": mode, "seconds": round(time.monotonic() - ran_at, 1)}
            say(f"  {package}=={version}: {result.state} {' '.join(result.signatures)} ({mode})".rstrip())
    flip.package = flip.package or package
    flip.changes = [
        {
            "package": package,
            **asdict(change),
            "direction": change.direction,
            "runs": [runs[change.last_before]["run_id"], runs[change.release]["run_id"]],
        }
        for change in step.changes
    ]
    flip.sweep = {
        "package": package,
        "candidates": candidates,
        "points": flip_search.sweep_points(candidates),
        "bound": flip_search.sweep_bound(candidates),
        "runs": [{"version": v, **r} for v, r in runs.items()],
        "stepped_over": step.stepped_over,
        "unmeasured": step.unmeasured,
        "yanked": yanked_between(package, old, new),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    flip.bisect = str(runs_dir)
    _name_from_changes(flip, known, old)
    say(f"  -> {changes_words(flip.changes) or 'no change'} ({len(runs)} runs, {flip.sweep['minutes']} min)")
    return flip


def _name_from_changes(flip: Flip, known: dict[str, str], old: str) -> None:
    """Where the flip's ends differ: the release after which the newer state holds (the last change), and a note where
    the sweep's old end was not the older day's state (the sweep then says nothing of this flip's cause)."""
    if flip.older_state == flip.newer_state:
        return  # a window: the ends agree, the changes inside are the whole answer
    wanted = flip_search.SHOWS if flip.older_state == "target" else flip_search.ABSENT
    if flip_search.evidence_state(known.get(old, "")) != wanted:
        flip.note = f"{flip.package} {old} did not show the older day's state in the sweep ({known.get(old)})"
        return
    if not flip.changes:
        return
    last = flip.changes[-1]
    if (last["direction"] == "started") == (flip.newer_state == "target"):
        flip.release, flip.last_release_before = last["release"], last["last_before"]
