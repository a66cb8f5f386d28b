"""Every flip of a dated (history) run, named: which package changed a scenario's target outcome, and which
release of it.

Between two neighbouring dates where a scenario's target outcome changes, each package that differs is moved
alone from the older date's release to the newer one's: every other axis package stays at the older date's
release and every dependency resolves as of the older date (uv's per-package --exclude-newer). A probe is a
real one-cell run of the scenario's seed configs, baseline only. A package whose move alone reproduces the
newer outcome changed it; the existing bisect then finds its first release that does. Everything a flip ran
is kept under `results/flips/<run-id>/`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from harness.define.cells import Cell
from harness.define.packages import AXIS_PACKAGES, public_version
from harness.define.profile import DATE_AXIS, Profile
from harness.define.registry import discover
from harness.errors import UsageError
from harness.execution.options import MatrixOptions
from harness.knowledge import pitfalls as knowledge
from harness.knowledge.flips import CONFIG_SERIES, dated_verdicts, family_state, named_packages
from harness.paths import BISECT_FOLDER, FLIPS_FILE, FLIPS_FOLDER, REPO_ROOT, RESULTS_DIR
from harness.publishing.atlas import upstream_verdict
from harness.recording.flip import Flip
from harness.recording.record import Record
from harness.tools.release_search import bisection, flip_search, release_sweep
from harness.tools.release_search.dated_runs import run_records
from scenarios.failure_names import family as failure_family

#: Target states that say something about the target (not a skip, not a broken environment).
KNOWN_STATES = ("target", "not-reproduced")


def dated_states(records: list[Record], specs: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """scenario -> [{date, state, signature, family, versions, ...}] in date order, from a dated run's records.

    A scenario whose target shows as several failures (S7: zero-size tensors from the hand loop's ZeRO-3 save, an
    empty file from the Trainer's) gets one row series per failure family, each with its own target state: one
    saving path healing while another still fails is a flip of the first. A flaky target record defines no state
    (it showed once and not again)."""
    _, stacks, verdicts = dated_verdicts(records, specs)
    states: dict[str, list[dict[str, Any]]] = {}
    for scenario, by_date in verdicts.items():
        hits = [r for found in by_date.values() for r in found.target_records if r["outcome"] != "flaky"]
        families = sorted({failure_family(r["signature"]) for r in hits})
        series: list[str | None] = families if len(families) > 1 else [None]
        if (specs.get(scenario) or {}).get("flips_per_config"):
            # Each config is its own series (S9: the Trainer's accumulation heals while a hand loop's never does).
            series = [f"{CONFIG_SERIES}{c}" for c in sorted({r["config_id"] for r in hits})]
        shows = {
            family: {r["config_id"] for r in hits if failure_family(r["signature"]) == family} for family in families
        }
        states[scenario] = [
            _row(date, found, family, stacks.get(date, {}), shows.get(family or "", set()))
            for family in series
            for date, found in sorted(by_date.items())
        ]
    return states


def _row(date: str, found: Any, family: str | None, versions: dict[str, Any], shows: set[str]) -> dict[str, Any]:
    """One date of one family's series; `shows`: the configs that show this family on some date."""
    state, hits = family_state(found, family, shows)
    return {
        "date": date,
        "state": state,
        "family": family,
        "signature": next((r["signature"] for r in hits), None),
        "versions": versions,
        "target_ids": sorted({r["config_id"] for r in hits}),
        "no_evidence_ids": sorted({*found.inapplicable_ids, *found.unusable_ids}),
    }


def flips_in(states: dict[str, list[dict[str, Any]]]) -> list[Flip]:
    """Neighbouring dates (among those where the target outcome is known) whose target outcome differs, per
    failure family where a scenario has several."""
    found = []
    for scenario, all_rows in sorted(states.items()):
        families = list(dict.fromkeys(r.get("family") for r in all_rows))
        for family in families:
            rows = [r for r in all_rows if r.get("family") == family]
            found += _flips_of(scenario, rows)
    return found


def _flips_of(scenario: str, rows: list[dict[str, Any]]) -> list[Flip]:
    found = []
    # A masked day (another family showed on this family's configs) ends the series there: no flip spans it.
    known = [r for r in rows if r["state"] in (*KNOWN_STATES, "masked")]
    for older, newer in itertools.pairwise(known):
        if "masked" in (older["state"], newer["state"]):
            continue
        if older["state"] == newer["state"] or _no_evidence_across(older, newer):
            continue
        changed = {
            p: [public_version(older["versions"].get(p)), public_version(newer["versions"].get(p))]
            for p in AXIS_PACKAGES
            if public_version(older["versions"].get(p)) != public_version(newer["versions"].get(p))
        }
        signature = older["signature"] or newer["signature"]
        target_side = older if older["state"] == "target" else newer
        flip = Flip(
            older["date"],
            newer["date"],
            older["state"],
            newer["state"],
            changed,
            scenario=scenario,
            signature=signature,
        )
        flip.config_ids = list(target_side["target_ids"])
        flip.family = older.get("family")
        found.append(flip)
    return found


def _no_evidence_across(older: dict[str, Any], newer: dict[str, Any]) -> bool:
    """Every config that shows the target on one side could not run (or was not applicable) on the other: the
    day changed whether the config can run, not whether the stack fails it (S7's ZeRO-3 config: deepspeed 0.14
    runs on CPU from 2024-05-17, 0.13 did not). Probing such a pair would bisect the wrong change."""
    side, other = (older, newer) if older["state"] == "target" else (newer, older)
    shown = set(side.get("target_ids") or [])
    return bool(shown) and shown <= set(other.get("no_evidence_ids") or [])


Probe = Callable[..., bisection.Probe]


def name_flip(
    flip: Flip,
    history: Profile,
    older_versions: dict[str, str],
    options: MatrixOptions,
    out_dir: Path,
    probe: Probe = bisection.probe_cell,
    bisector: Callable[..., Flip] | None = None,
    run_ids: tuple[str, ...] = (),
    runs_dir: Path | None = None,
) -> Flip:
    """Move each changed package alone; sweep the releases of the one whose move reproduces the newer outcome (every
    change between the two days, `release_sweep`), or bisect them where a `bisector` is given (one change assumed).
    The probes judge only the configs that showed the target (a config that never showed it says nothing about the
    change); a sweep runs `run_ids` (the day pair's configs) in `runs_dir` (the pair's shared folder) so the pair's
    other series judge the same runs."""
    sweep_options = options
    if flip.config_ids:
        options = replace(options, config_ids=tuple(flip.config_ids))
    held_for: dict[str, Profile] = {}
    for package, (_, new) in flip.changed.items():
        if new is None:
            continue
        # First everything else as of the older date; where the newer release cannot install that way (it
        # needs newer dependencies, as torch needs its CUDA libraries), the other axis packages stay held
        # and the dependencies resolve as of the newer date: the probe says which.
        for mode, day in (("older-dependencies", flip.older), ("newer-dependencies", flip.newer)):
            held = _moving(_held_profile(history, older_versions, flip, day), package, flip.newer)
            base = Cell(stack=None, choices=tuple((k, v[0]) for k, v in held.axes.items()), implied=())
            result = probe(
                held, base, package, new, flip.scenario, "baseline", options, out_dir / package, flip.signature,
                reuse_root=out_dir,
            )  # fmt: skip
            flip.moves.append({"package": package, "version": new, "dependencies": mode, **asdict(result)})
            if result.state != "unusable":
                held_for[package] = held
                break
        if flip_search.reproduces(result.state, flip.newer_state):
            flip.reproducing.append(package)
    if len(flip.reproducing) != 1:
        return flip  # not named: none alone, or several alone (Flip.why_not_named says which, from the moves)
    flip.package = flip.reproducing[0]
    old, new = flip.changed[flip.package]
    for superseded in (out_dir / BISECT_FOLDER).glob("*/verdict.json"):
        superseded.unlink()  # an earlier bisect of this flip: its runs stay, judged again by this one or the sweep
        if not any(superseded.parent.iterdir()):
            superseded.parent.rmdir()
    if bisector is None:
        swept = release_sweep.sweep_flip(
            flip, held_for[flip.package], flip.package, old, new, sweep_options, out_dir / "sweep", run_ids=run_ids,
            runs_dir=(runs_dir / flip.package) if runs_dir else None, probe=probe,
        )  # fmt: skip
        swept.bisect = _shown_path(Path(swept.bisect or out_dir))
        return swept
    verdict_ = bisector(
        held_for[flip.package],
        flip.package,
        flip.scenario,
        "baseline",
        options,
        old=old,
        new=new,
        signature=flip.signature,
        out_root=out_dir / BISECT_FOLDER,
        # A failure that ends: the old end must show it, or the search would look for something else.
        older_state="fail" if flip.newer_state != "target" else None,
        reuse_root=out_dir,
    )
    flip.bisect = _shown_path(Path(verdict_.bisect) if verdict_.bisect else out_dir / BISECT_FOLDER)
    name_release(flip, verdict_)
    return flip


def _shown_path(path: Path) -> str:
    """A path as flips.json keeps it: from the checkout's root where it lies inside (the same on every clone)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def name_release(flip: Flip, bisected: Flip) -> None:
    """The release a bisect names, where its old end is evidence for this flip: a failure that ends needs the old
    end to show it. One that starts may first show after releases that were no evidence (another failure came
    first there): the bisect's note says so, and the flip carries it."""
    if flip.newer_state != "target" and bisected.older_state != "fail":
        first = bisected.bisect_runs[0] if bisected.bisect_runs else {}
        reasons = ", ".join(str(r) for r in first.get("signatures") or []) or "no record"
        flip.note = f"{flip.package} {first.get('version')} did not show the failure in the bisect ({reasons})"
        return
    flip.release, flip.last_release_before, flip.note = bisected.release, bisected.last_release_before, bisected.note


def find_flips(
    run_dirs: list[Path],
    history: Profile,
    options: MatrixOptions,
    out_root: Path,
    scenarios: list[str] | None = None,
    again: bool = False,
    span: tuple[str | None, str | None] = (None, None),
    windows: bool = False,
    sweep: bool = True,
) -> list[Flip]:
    """Every flip of the run (or of several runs of one profile read as the table reads them: a later run that
    measured some configs again), named where a probe could name it; written to `out_root/<first run-id>/flips.json`.
    A flip an
    earlier invocation named (same dates, states and failure) is taken from flips.json unless `again`; an earlier
    entry that is no flip of the run's records any more (the records or today's rules changed) is dropped.

    `span`: only day pairs inside these dates. `windows`: also sweep day pairs whose states agree, for the packages
    the scenario's upstream record or its earlier flips name (a fix and the break after it inside one interval).
    `sweep`: a named package's releases are swept (every change); without it, bisected (one change assumed)."""
    # Judged by today's rules, as the table judges them: a flip the table does not show is not probed.
    run_dir = run_dirs[0]
    records = run_records(run_dirs)
    if not records:
        raise UsageError(f"{run_dir}: no records")
    specs = {s.id: s.spec for s in discover()}
    states = dated_states(records, specs)
    if not states:
        raise UsageError(f"{run_dir}: not a dated run (no record has a {DATE_AXIS!r} pin)")
    named = []
    drawn = drawn_configs(records, history)
    out_dir = out_root / run_dir.name
    # Flips named by an earlier invocation (e.g. of other scenarios) stay in flips.json unless named again.
    earlier = json.loads((out_dir / FLIPS_FILE).read_text()) if (out_dir / FLIPS_FILE).is_file() else []
    found = flips_in(states)
    # A config that fails on every day (a pitfall of its setup) has no window to look inside.
    pitfalls = {config_id for _, config_id in knowledge.pitfalls(records, specs)}
    found_windows = [w for w in windows_in(states, specs, earlier) if not set(w.config_ids) <= pitfalls]
    current = [*found, *found_windows]
    by_key = {_key(e): e for e in earlier}
    todo = [*found, *(found_windows if windows else [])]
    for flip in todo:
        if scenarios and not any(flip.scenario.startswith(s) for s in scenarios):
            continue
        if (span[0] and flip.older < span[0]) or (span[1] and flip.newer > span[1]):
            continue
        previous = by_key.get(_key(flip.as_atlas_json()))
        same = ("older_state", "newer_state", "signature")
        if previous and not again and all(previous.get(k) == getattr(flip, k) for k in same):
            print(
                f"named by an earlier invocation (--again probes it again): {describe(Flip.from_json(previous))}",
                flush=True,
            )
            continue
        older = next(r["versions"] for r in states[flip.scenario] if r["date"] == flip.older)
        older_versions = {p: public_version(older.get(p)) for p in AXIS_PACKAGES}
        # The mode's number names the folder, or the full id where a mode has two scenarios (S2).
        mode = flip.scenario.split("-")[0]
        label = mode if len({f.scenario for f in current if f.scenario.split("-")[0] == mode}) == 1 else flip.scenario
        where = out_dir / "-".join(p for p in (label, flip.family, flip.older, flip.newer) if p)
        run_ids = pair_configs(flip, current)
        shared = out_dir / "-".join((label, flip.older, flip.newer, "sweeps"))  # every series of the pair reads it
        # A drawn config is no explicit example: its probes carry it, or they would not run it at all.
        probed = with_configs(history, flip.scenario, [drawn[(flip.scenario, c)] for c in run_ids
                                                       if (flip.scenario, c) in drawn])  # fmt: skip
        if flip.older_state == flip.newer_state:
            flip = sweep_window(flip, probed, older_versions, options, where, run_ids, runs_dir=shared)
        else:
            bisector = None if sweep else bisection.bisect
            flip = name_flip(flip, probed, older_versions, options, where, bisector=bisector, run_ids=run_ids,
                             runs_dir=shared)  # fmt: skip
        flip.upstream = upstream_verdict(flip)
        named.append(flip)
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_flips(out_dir, earlier, named, current)
    if earlier and not named:
        _write_flips(out_dir, earlier, named, current)  # only to drop what is no flip any more
    return named


def windows_in(
    states: dict[str, list[dict[str, Any]]], specs: dict[str, dict[str, Any]], earlier: list[dict[str, Any]]
) -> list[Flip]:
    """Neighbouring dates of a series whose target states agree (both known) while a package that the scenario's
    upstream record or its earlier flips name changed between them: the day pairs a sweep must look inside, since
    a fix and the break after it (or the other way round) leave the two days alike. Each is a Flip whose sides agree;
    `changed` holds only the named packages."""
    found = []
    for scenario, all_rows in sorted(states.items()):
        named = named_packages((specs.get(scenario) or {}).get("target") or [])
        named |= {str(e["package"]) for e in earlier if e.get("scenario") == scenario and e.get("package")}
        for family in dict.fromkeys(r.get("family") for r in all_rows):
            rows = [r for r in all_rows if r.get("family") == family and r["state"] in KNOWN_STATES]
            signature = next((r["signature"] for r in all_rows if r.get("family") == family and r["signature"]), None)
            shows = sorted({c for r in all_rows if r.get("family") == family for c in r["target_ids"]})
            for older, newer in itertools.pairwise(rows):
                if older["state"] != newer["state"]:
                    continue
                changed = {
                    p: [public_version(older["versions"].get(p)), public_version(newer["versions"].get(p))]
                    for p in sorted(named)
                    if public_version(older["versions"].get(p)) != public_version(newer["versions"].get(p))
                }
                if not all(changed.values()) or not changed or any(None in v for v in changed.values()):
                    continue
                window = Flip(older["date"], newer["date"], older["state"], newer["state"], changed,
                              scenario=scenario, signature=signature)  # fmt: skip
                window.family = family
                mine = family[len(CONFIG_SERIES) :] if (family or "").startswith(CONFIG_SERIES) else None
                window.config_ids = [mine] if mine else shows
                found.append(window)
    return found


def _end_note(sweep: dict[str, Any], flip: Flip, package: str, new: str) -> str:
    """Where the sweep's newest release, on the older day's stack, is not in the newer day's state: the newer day's
    state then comes from another package's change, which this sweep did not move. Said, never hidden."""
    last = next((r for r in sweep.get("runs", []) if r["version"] == new), None)
    if last is None:
        return ""
    wanted = flip_search.SHOWS if flip.newer_state == "target" else flip_search.ABSENT
    state = flip_search.evidence_state(last["state"])
    if state in (wanted, flip_search.NO_EVIDENCE):
        return ""
    shown = "shows the failure" if state == flip_search.SHOWS else "passes"
    return (
        f"{package} {new} on the {flip.older} stack {shown}, unlike the {flip.newer} day: another package's "
        f"change between the days brings the {flip.newer} state (not swept)"
    )


def drawn_configs(records: list[Record], history: Profile) -> dict[tuple[str, str], dict[str, Any]]:
    """(scenario, config id) -> config, for every config the records ran that is neither one of its scenario's
    explicit examples nor one of the profile's configs (a Hypothesis draw): a probe runs explicit configs only."""
    from harness.planning.draws import config_id

    explicit = {
        s.id: {config_id(c) for c in [*getattr(s.module, "EXAMPLES", ()), *history.settings_for(s.id).configs]}
        for s in discover()
    }
    return {
        (r["scenario"], r["config_id"]): r["config"]
        for r in records
        if r["variant"] == "baseline" and isinstance(r.get("config"), dict)
        and r["config_id"] not in explicit.get(r["scenario"], set())
    }  # fmt: skip


def with_configs(history: Profile, scenario: str, configs: list[dict[str, Any]]) -> Profile:
    """`history` whose `scenario` also runs these configs (the drawn configs a probe must carry)."""
    if not configs:
        return history
    settings = history.settings_for(scenario)
    grown = replace(settings, configs=(*settings.configs, *configs))
    return replace(history, scenario_settings={**history.scenario_settings, scenario: grown})


def pair_configs(flip: Flip, current: list[Flip]) -> tuple[str, ...]:
    """The configs a probe of this day pair runs: every config of the scenario's flips and windows over the same two
    days (S9's series are per config: one run of all of them serves each series' judgement)."""
    same = [f for f in current if (f.scenario, f.older, f.newer) == (flip.scenario, flip.older, flip.newer)]
    return tuple(sorted({c for f in same for c in f.config_ids}))


def sweep_window(
    flip: Flip,
    history: Profile,
    older_versions: dict[str, str],
    options: MatrixOptions,
    out_dir: Path,
    run_ids: tuple[str, ...] = (),
    probe: Probe = bisection.probe_cell,
    runs_dir: Path | None = None,
) -> Flip:
    """Sweep each named package that changed between two days that agree, over the older day's stack (everything
    else as of the older day; releases that cannot install so are stepped over and listed): every change found.
    `runs_dir`: the day pair's shared folder of probe runs (one subfolder per package)."""
    changes: list[dict[str, Any]] = []
    sweeps = []
    for package, (old, new) in flip.changed.items():
        held = _moving(_held_profile(history, older_versions, flip, flip.older), package, flip.newer)
        fallback = _moving(_held_profile(history, older_versions, flip, flip.newer), package, flip.newer)
        swept = release_sweep.sweep_flip(
            replace(flip, changes=[], sweep=None, package=None), held, package, old, new, options,
            out_dir / f"sweep-{package}", run_ids=run_ids, probe=probe,
            runs_dir=(runs_dir / package) if runs_dir else None, fallback=fallback,
        )  # fmt: skip
        changes += swept.changes
        if swept.sweep:
            sweeps.append(swept.sweep)
            flip.note = "; ".join(x for x in (flip.note, _end_note(swept.sweep, flip, package, new)) if x)
        elif swept.note:
            flip.note = swept.note
    flip.changes = changes
    flip.package = next((c["package"] for c in changes), None)
    flip.sweep = sweeps[0] if len(sweeps) == 1 else ({"packages": sweeps} if sweeps else None)
    flip.bisect = _shown_path(out_dir)
    return flip


def _key(flip: dict[str, Any]) -> tuple[Any, ...]:
    return flip["scenario"], flip.get("family"), flip["older"], flip["newer"]


def _write_flips(out_dir: Path, earlier: list[dict[str, Any]], named: list[Flip], found: list[Flip]) -> None:
    """flips.json: what this invocation named, and each earlier entry that is still a flip (or window) of the records
    with the same states; an entry whose day pair now reads otherwise (a flip whose days now agree) is dropped."""
    fresh = {_key(f.as_atlas_json()) for f in named}
    current = {_key(f.as_atlas_json()): (f.older_state, f.newer_state) for f in found}

    def still(entry: dict[str, Any]) -> bool:
        return current.get(_key(entry)) == (entry.get("older_state"), entry.get("newer_state"))

    kept = [e for e in earlier if still(e) and _key(e) not in fresh]
    for gone in (e for e in earlier if not still(e)):
        _withdraw_bisect(gone)
    (out_dir / FLIPS_FILE).write_text(json.dumps([*kept, *(f.as_atlas_json() for f in named)], indent=1) + "\n")


def _withdraw_bisect(entry: dict[str, Any]) -> None:
    """A flip that is no flip of the run any more takes its bisect's verdict with it (its probe runs stay): no
    verdict is left behind that names a release for a change the records no longer show."""
    shown = str(entry.get("bisect") or "")
    if f"results/{FLIPS_FOLDER}/" not in shown:
        return  # a node's bisect is described in words, not a folder
    folder = RESULTS_DIR / FLIPS_FOLDER / shown.split(f"results/{FLIPS_FOLDER}/", 1)[1]
    for verdict in [folder / "verdict.json", *folder.glob("*/verdict.json")]:
        if verdict.is_file():
            verdict.unlink()


def _held_profile(history: Profile, versions: dict[str, str], flip: Flip, day: str) -> Profile:
    """One cell: every axis package at the older date's release, everything else resolved as of `day`."""
    return held_stack(history, versions, day, f"flip-{flip.scenario.split('-')[0]}")


def held_stack(history: Profile, versions: dict[str, str], day: str, name: str) -> Profile:
    """One cell of `history`: every axis package at its release in `versions`, everything else as of `day`."""
    axes: dict[str, tuple[str, ...]] = {DATE_AXIS: (day,)}
    axes |= {p: (v,) for p, v in versions.items() if v and p in AXIS_PACKAGES}
    return replace(history, name=name, axes=axes, stacks={}, exclusions=())


def moving(held: Profile, package: str, newer: str) -> Profile:
    """The held cell with `package` allowed up to `newer` (uv's --exclude-newer-package) and nothing else."""
    return _moving(held, package, newer)


def _moving(held: Profile, package: str, newer: str) -> Profile:
    """The held cell with one package allowed up to the newer date (uv's --exclude-newer-package): its other
    dependencies stay as of the older date, so the probe moves that package and nothing else."""
    return replace(held, outside_era=(package,), outside_era_day=newer)


def describe(flip: Flip) -> str:
    """'S4 checkpoint-recompute-shape[0]: target -> not-reproduced between 2026-04-15 and 2026-07-29, by
    deepspeed 0.19.3 (bisected)'."""
    change = f"{flip.older_state} -> {flip.newer_state} between {flip.older} and {flip.newer}"
    if flip.older_state == flip.newer_state:
        swept = flip.changes_words() or ("no change found by the sweep" if flip.sweep else "not swept")
        note = f" ({flip.note})" if flip.note else ""
        where = f"{flip.older_state} on {flip.older} and {flip.newer}"
        return f"{flip.scenario.split('-')[0]} {flip.signature} {flip.family or ''}: {where}: {swept}{note}"
    if flip.changes:
        return f"{flip.scenario.split('-')[0]} {flip.signature} {flip.family or ''}: {change}: {flip.changes_words()}"
    if flip.package and flip.release:
        by = f"{flip.package} {flip.release_words()}"
    elif flip.package:
        by = f"{flip.package} (release not named{': ' + flip.note if flip.note else ''})"
    else:
        by = f"not named: {flip.why_not_named()}"
    return f"{flip.scenario.split('-')[0]} {flip.signature}: {change}, by {by}"
