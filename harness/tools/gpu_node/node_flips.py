"""Flips of a GPU history run, named with the same method as on CPU (`release_search/flip_naming.py`), in rounds that
fit an air-gapped node.

On CPU a flip's probes run at once: each changed package moved alone, then a bisection of the one that
reproduces. A GPU node has no index, so each round is planned here and run there:
1. `compat-matrix flips --run <gpu run>` finds the run's flips (the same `flips_in`, masked ones set aside),
   reads the probe records it has, and plans the probes still missing: first each changed era package moved
   alone (the older day's stack, that package at the newer day's release), then, for the one package that
   alone reproduces the newer outcome, up to `PER_ROUND` releases inside the bracket not yet probed. It writes
   those probe days into the probe profile's era lock (`<profile>-probes`: resolved like the days, dependencies
   as of the older day where they allow, else the newer day) and the probe profile's day list.
2. The probe profile runs on the node like any era-locked profile; its records are imported under
   `results/flips/<run>/probes/`.
3. Again from 1 until nothing is missing: flips.json then names the package and its first release.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from packaging.version import Version

from harness.define.profile import PROBE_DAY, Profile
from harness.define.registry import discover
from harness.paths import FLIPS_FILE, PROBES_FOLDER, records_file
from harness.recording.flip import Flip
from harness.recording.packing import run_dirs
from harness.recording.record import Record
from harness.recording.records import read_records
from harness.recording.signatures import rename_all
from harness.tools.release_search import flip_search
from harness.tools.release_search.bisection import probe_state
from harness.tools.release_search.dated_runs import run_records
from harness.tools.release_search.flip_naming import dated_states, flips_in
from harness.versions import lock as era_lock
from harness.versions import lock_file
from harness.versions.releases import between, index_url, releases

#: Releases probed per bisection round (one device call carries their wheels).
PER_ROUND = 4


def probe_day(day: str, package: str, version: str) -> str:
    """The probe day of `day`'s stack with `package` moved to `version` ('2025-11-14+transformers-5.0.0')."""
    return f"{day}+{package}-{version}"


def probe_records(probe_root: Path) -> dict[str, dict[str, list[Record]]]:
    """scenario -> probe day -> every record of it (every variant), from every probe run recorded so far: read once
    per round, for both the probes' states and their cost."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run_dir in run_dirs(probe_root):
        for record in rename_all(read_records(records_file(run_dir))):
            day = (record.get("pins") or {}).get("date", "")
            if PROBE_DAY.match(day):
                grouped.setdefault(record["scenario"], {}).setdefault(day, []).append(record)
    return grouped


def probe_states(
    probes: dict[str, list[dict[str, Any]]], signature: str | None, config_ids: list[str] | None = None
) -> dict[str, str]:
    """probe day -> 'fail' (the flip's failure), 'pass', 'unusable' or 'no-evidence' (`bisection.probe_state`,
    over the baseline records of the configs that showed the failure); `probes`: one scenario's probe days."""
    states = {}
    for day, records in probes.items():
        baseline = [r for r in records if r["variant"] == "baseline"]
        if baseline:
            states[day] = probe_state(baseline, signature, config_ids or ())[0]
    return states


def probe_costs(
    probes: dict[str, list[dict[str, Any]]], config_ids: list[str] | None = None
) -> dict[str, tuple[int, float]]:
    """probe day -> (records, seconds of jobs) of the flip's configs (or every config), every variant the node ran:
    what each probe cost on the node, for the flip's own bill; `probes`: one scenario's probe days."""
    wanted = set(config_ids or ())
    costs: dict[str, tuple[int, float]] = {}
    for day, records in probes.items():
        mine = [r for r in records if not wanted or r.get("config_id") in wanted]
        if mine:
            costs[day] = (len(mine), sum(float(r.get("duration_s") or 0.0) for r in mine))
    return costs


def node_cost(flip: Flip, costs: dict[str, tuple[int, float]]) -> dict[str, Any]:
    """What naming `flip` cost on the node: the probe days it read (its moves and its sweep's releases over the older
    day), their records and seconds of jobs (every variant the node ran for them, fixes included)."""
    days = sorted({m["probe_day"] for m in flip.moves if m.get("probe_day")} | {
        probe_day(flip.older, package, version)
        for package in ([flip.package] if flip.package else list(flip.changed))
        for version in ((flip.sweep or {}).get("candidates") or [])
    })  # fmt: skip
    found = [costs[d] for d in days if d in costs]
    return {"probe_days": len(found), "records": sum(c for c, _ in found),
            "job_seconds": round(sum(s for _, s in found), 1)}  # fmt: skip


def step(flip: Flip, states: dict[str, str], release_list: list[str], search: str = "bisect") -> list[str]:
    """Advance one flip with the probe states known so far; returns the probe days still needed (none: done).
    Fills `flip.moves`, `flip.reproducing`, `flip.package` and `flip.release` as far as the states allow.
    `release_list`: the reproducing package's releases from the older day's to the newer day's, oldest first
    (empty until the package is known). `search`: "bisect" (PER_ROUND probes a round, one change assumed: how the
    committed GPU flips were named) or "sweep" (every change: the sweep's points in one round, then each gap)."""
    newer_fails = flip.newer_state == "target"
    moves = {p: new for p, (_, new) in flip.changed.items() if new}
    flip.moves = [
        {
            "package": p,
            "version": v,
            "probe_day": probe_day(flip.older, p, v),
            "state": states[probe_day(flip.older, p, v)],
        }
        for p, v in moves.items()
        if probe_day(flip.older, p, v) in states
    ]
    needed = [probe_day(flip.older, p, v) for p, v in moves.items() if probe_day(flip.older, p, v) not in states]
    if needed:
        return needed
    flip.reproducing = [p["package"] for p in flip.moves if flip_search.reproduces(p["state"], flip.newer_state)]
    if len(flip.reproducing) != 1 or not release_list:
        return []  # none alone (a combination did it) or several (the probes say which), or not bisected yet
    package = flip.package = flip.reproducing[0]
    old, new = flip.changed[package]
    before, after = ("pass", "fail") if newer_fails else ("fail", "pass")
    known = {
        v: states[probe_day(flip.older, package, v)]
        for v in release_list
        if probe_day(flip.older, package, v) in states
    }
    known |= {old: before, new: after}
    flip.moves += [
        {"package": package, "version": v, "probe_day": probe_day(flip.older, package, v), "state": state}
        for v, state in known.items()
        if v not in (old, new)
    ]
    # The two days' own releases bound the bracket even where the index list lacks them (yanked, or filtered
    # by Requires-Python): the run itself measured them.
    bounded = sorted({*release_list, old, new}, key=Version)
    if search == "sweep":
        return _sweep_step(flip, package, bounded, known)
    found = flip_search.next_step(bounded, known, before, after, per_round=PER_ROUND)
    if found.done:
        flip.release = found.first
        flip.bisect = f"{len(known) - 2} release(s) of {package} probed between {old} and {new} on the node"
        return []
    return [probe_day(flip.older, package, v) for v in found.probes]


def _sweep_step(flip: Flip, package: str, bounded: list[str], known: dict[str, str]) -> list[str]:
    """The sweep over the reproducing package's releases on the node: every sweep point still missing in one round,
    then each gap whose ends differ; done, every change goes into the flip and the last names its release."""
    found = flip_search.next_sweep(bounded, known)
    if not found.done:
        return [probe_day(flip.older, package, v) for v in found.probes]
    flip.changes = [
        {"package": package, **asdict(c), "direction": c.direction,
         "probe_days": [probe_day(flip.older, package, c.last_before), probe_day(flip.older, package, c.release)]}
        for c in found.changes
    ]  # fmt: skip
    flip.sweep = {
        "package": package, "candidates": bounded, "points": flip_search.sweep_points(bounded),
        "bound": flip_search.sweep_bound(bounded), "stepped_over": found.stepped_over, "unmeasured": found.unmeasured,
    }  # fmt: skip
    last = found.changes[-1] if found.changes else None
    if last is not None and (last.direction == "started") == (flip.newer_state == "target"):
        flip.release, flip.last_release_before = last.release, last.last_before
    flip.bisect = f"{len(known) - 2} release(s) of {package} swept between {bounded[0]} and {bounded[-1]} on the node"
    return []


def window_step(window: Flip, states: dict[str, str], release_lists: dict[str, list[str]]) -> list[str]:
    """Advance a window (two days whose states agree, `flips.windows_in`) with the probe states so far: each named
    package that changed is swept over the older day's stack (the older day itself is its oldest release: that
    probe is the day's own run), every sweep point in one round, then each gap whose ends differ. Returns the probe
    days still needed; done, `window.changes` holds every change found (none: the interval holds no change of these
    packages at these points) and `window.sweep` what was measured."""
    before = "fail" if window.older_state == "target" else "pass"
    needed: list[str] = []
    changes: list[dict[str, Any]] = []
    sweeps: list[dict[str, Any]] = []
    for package, (old, new) in window.changed.items():
        bounded = sorted({*release_lists.get(package, []), old, new}, key=Version)
        known = {v: states[probe_day(window.older, package, v)] for v in bounded
                 if probe_day(window.older, package, v) in states}  # fmt: skip
        known.setdefault(old, before)  # the older day's stack with its own release: the day's own records
        found = flip_search.next_sweep(bounded, known)
        if not found.done:
            needed += [probe_day(window.older, package, v) for v in found.probes]
            continue
        changes += [
            {"package": package, **asdict(c), "direction": c.direction,
             "probe_days": [window.older if c.last_before == old else probe_day(window.older, package, c.last_before),
                            probe_day(window.older, package, c.release)]}
            for c in found.changes
        ]  # fmt: skip
        sweeps.append({
            "package": package, "candidates": bounded, "points": flip_search.sweep_points(bounded),
            "bound": flip_search.sweep_bound(bounded), "stepped_over": found.stepped_over,
            "unmeasured": found.unmeasured,
            "probes": {v: known[v] for v in bounded if v in known and v != old},
        })  # fmt: skip
    if needed:
        return needed
    window.changes = changes
    window.package = next((c["package"] for c in changes), None)
    window.sweep = sweeps[0] if len(sweeps) == 1 else ({"packages": sweeps} if sweeps else None)
    swept = ", ".join(f"{len(w['probes'])} release(s) of {w['package']}" for w in sweeps)
    window.bisect = f"window swept on the node: {swept}"
    return []


def plan_round(
    run_dirs: list[Path],
    profile: Profile,
    out_root: Path,
    scenarios: list[str] | None = None,
    search: str = "sweep",
    windows: bool = False,
) -> tuple[list[Flip], dict[str, list[str]]]:
    """Every flip of the GPU runs (one run, or several runs of one profile read together) advanced as far as its
    probe records allow (written to flips.json under the first run). Returns (flips, the probe days still needed
    per scenario). `scenarios`: only these (the others' flips are neither planned nor written). `windows`: also
    the day pairs whose states agree, swept over the packages the upstream record or the flips name
    (`window_step`)."""
    from harness.knowledge.flips import dated_verdicts, masking
    from harness.tools.release_search.flip_naming import windows_in

    run_dir = run_dirs[0]
    records = [r for r in run_records(run_dirs) if not scenarios or r["scenario"] in scenarios]
    specs = {s.id: s.spec for s in discover()}
    verdicts = dated_verdicts(records, specs)[2]
    probes = probe_records(out_root / run_dir.name / PROBES_FOLDER)
    flips: list[Flip] = []
    needed: dict[str, list[str]] = {}
    for flip in flips_in(dated_states(records, specs)):
        hidden_by = masking(flip, verdicts)
        if hidden_by:  # another failure, or configs that could not run, hide the target: no cause to name
            flip.note = "masked by " + ", ".join(hidden_by)
            flips.append(flip)
            continue
        states = probe_states(probes.get(flip.scenario, {}), flip.signature, flip.config_ids)
        needed_now = step(flip, states, [])
        if not needed_now and len(flip.reproducing) == 1:
            old, new = flip.changed[flip.reproducing[0]]
            release_list = [str(v) for v in between(releases(flip.reproducing[0], profile.python), old, new)]
            needed_now = step(flip, states, release_list, search)
        if needed_now:
            needed.setdefault(flip.scenario, []).extend(needed_now)
        if flip.moves:
            flip.node_cost = node_cost(flip, probe_costs(probes.get(flip.scenario, {}), flip.config_ids))
        flips.append(flip)
    if windows:
        earlier = [f.as_atlas_json() for f in flips if f.package]
        for window in windows_in(dated_states(records, specs), specs, earlier):
            states = probe_states(probes.get(window.scenario, {}), window.signature, window.config_ids)
            lists = {p: [str(v) for v in between(releases(p, profile.python), old, new)]
                     for p, (old, new) in window.changed.items()}  # fmt: skip
            needed_now = window_step(window, states, lists)
            if needed_now:
                needed.setdefault(window.scenario, []).extend(needed_now)
            if window.sweep:
                window.node_cost = node_cost(window, probe_costs(probes.get(window.scenario, {}), window.config_ids))
            flips.append(window)
    out_dir = out_root / run_dir.name
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FLIPS_FILE
    # A round over some scenarios keeps the flips of the others that an earlier round filed here.
    kept = (
        [e for e in json.loads(path.read_text()) if e.get("scenario") not in scenarios]
        if scenarios and path.is_file()
        else []
    )
    path.write_text(json.dumps([*kept, *(f.as_atlas_json() for f in flips)], indent=1) + "\n")
    return flips, needed


def release_day(days: dict[str, Any], older: str, package: str, version: str) -> str:
    """The first lock day after `older` whose stack holds `package` at `version` or later: the day whose index a
    probe that moves it resolves its other dependencies against, where the older day's cannot hold it. Not simply
    the next lock day: a flip may span days a GPU profile did not run (S7 at 2 ranks: 2024-09-26 .. 2025-03-20),
    and a day before the release cannot install it. A release no lock day holds (newer than the newest: the watch's)
    resolves as of the day after its upload."""
    later = sorted(d for d in days if d > older)
    for day in later:
        found = (days[day].get("resolved") or {}).get(package)
        if found and Version(found) >= Version(version):
            return day
    # No lock day holds it: a release newer than the newest day (the release watch). The day after its upload is
    # the first index that can install it.
    from harness.versions.releases import release_day as uploaded_day

    uploaded = uploaded_day(package, version)
    if uploaded and uploaded > (later[-1] if later else older):
        return uploaded
    return later[-1] if later else older


def probe_world_size(profile: Profile) -> int:
    """The probes run at the world size of the flips they probe (a profile at 2 ranks flips at 2 ranks)."""
    sizes = [size for size in profile.world_sizes if isinstance(size, int)]
    if len(sizes) != 1 or len(profile.world_sizes) != 1:
        raise ValueError(f"{profile.name}: probes need one fixed world size, not {list(profile.world_sizes)}")
    return sizes[0]


def write_probe_profile(profile: Profile, needed: list[str], scenarios: list[str], matrix_dir: Path) -> Path:
    """The probe profile (`<profile>-probes.toml`, every probe day so far) and its era lock, with the needed
    days resolved: the older day's era packages with one moved (harness/versions/lock.py)."""
    import tomllib

    from harness.environments.envs import uv_binary
    from harness.tools.gpu_node.locking import node_image

    world_size = probe_world_size(profile)  # checked before any day is resolved
    name = f"{profile.name}-probes"
    earlier = matrix_dir / f"{name}.toml"
    if earlier.is_file():  # a round for some scenarios keeps the others' sections: their probe days stay runnable
        scenarios = sorted({*scenarios, *tomllib.loads(earlier.read_text())["profile"].get("scenarios", [])})
    config_rows = {scenario: [toml_inline(c) for c in profile.settings_for(scenario).configs] for scenario in scenarios}
    main_lock = lock_file.read_lock(lock_file.lock_path(matrix_dir, profile.name))
    target = lock_file.lock_path(matrix_dir, name)
    lock = lock_file.read_lock(target) if target.is_file() else dict(main_lock, days={})
    image = node_image(matrix_dir, profile)
    axis = [p for p in profile.era_packages if p in main_lock["requirements"]]
    uv, requires = uv_binary(), era_lock.index_requires(index_url())  # one metadata cache for every probe day
    for day in needed:
        match = PROBE_DAY.match(day)
        assert match is not None
        if (lock["days"].get(day) or {}).get("resolved"):
            continue  # resolved by an earlier round (the index's past does not change): its wheels may be packed
        older = main_lock["days"][match["day"]]["resolved"]
        newer_day = release_day(main_lock["days"], match["day"], match["package"], match["version"])
        pins = {p: older[p] for p in axis if p in older}
        held = {"torch": image["torch"]}
        try:
            resolved, way = era_lock.resolve_probe(
                uv, pins, match["day"], newer_day, match["package"], match["version"], profile.python, held
            )
        except era_lock.ResolutionFailed as exc:
            lock["days"][day] = era_lock.unresolved_entry(f"probe {day}", image, exc)
            continue
        entry = era_lock.lock_entry(resolved, list(profile.era_packages), image, requires)
        lock["days"][day] = entry | {"dependencies": way}
        print(
            f"  probe {day}: dependencies as of the {way.split('-')[0]} day; overlay {len(entry['overlay'])} packages"
        )
    lock["days"] = dict(sorted(lock["days"].items()))
    target.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
    days = list(lock["days"])
    stack = profile.stacks.get("era", next(iter(profile.stacks.values()), {}))
    text = [
        f"# Generated by `compat-matrix flips --profile {profile.name} --run RUN` "
        "(harness/tools/gpu_node/node_flips.py):",
        f"# the probe days of {profile.name}'s flips, each the older day's stack with one package moved. Do not edit.",
        "[profile]",
        f"description = {json.dumps('Probes of ' + profile.name + ' flips: one era package moved per probe day')}",
        f'python = "{profile.python}"',
        f'device = "{profile.device}"',
        f"world_size = {world_size}",
        f"scenarios = {json.dumps(sorted(scenarios))}",
        "examples_per_scenario = 0",
        f"hypothesis_seed = {profile.hypothesis_seed}",
        f'hypothesis_profile = "{profile.hypothesis_profile}"',
        "",
        "[axes]",
        f"date = {json.dumps(days)}",
        "",
        "[stacks.era]",
        *(f'{package} = "{value}"' for package, value in stack.items()),
        "",
        "[install]",
        'mode = "system"',
        f'node_image = "{profile.node_image}"',
        f"era_packages = {json.dumps(list(profile.era_packages))}",
        *([f"optional = {json.dumps(list(profile.optional))}"] if profile.optional else []),
        "",
        "[timeouts]",
        f"install_s = {int(profile.install_timeout_s)}",
        f"job_s = {int(profile.job_timeout_s)}",
        f"worker_start_s = {int(profile.worker_start_timeout_s)}",
    ]
    for scenario in sorted(scenarios):
        text += ["", f'[scenario."{scenario}"]', 'variants = ["baseline"]']
        settings = profile.settings_for(scenario)
        if settings.job_timeout_s:  # a probe is judged like the day it moves from: the same job timeout
            text.append(f"job_timeout_s = {int(settings.job_timeout_s)}")
        # The same drawn configs as the runs it probes (draws are seeded by the profile's seed and the scenario):
        # a flip may be on a drawn config, and a probe is judged on the flip's own configs.
        for key in ("examples", "seed_examples"):
            if getattr(settings, key) is not None:
                text.append(f"{key} = {int(getattr(settings, key))}")
        if settings.single_rank:
            text.append("single_rank = true")
        if settings.configs:  # the profile's own configs beside the seed ones: a flip may be on one of them
            text += ["configs = [", *(f"  {row}," for row in config_rows[scenario]), "]"]
    path = matrix_dir / f"{name}.toml"
    path.write_text("\n".join(text) + "\n")
    return path


def toml_inline(config: dict[str, Any]) -> str:
    """A config as a TOML inline table that reads back as the same config (the same config id), or ValueError:
    TOML has no null, and a bare dotted key would nest."""
    import tomllib

    from harness.planning.draws import config_id

    def value(item: Any) -> str:
        if isinstance(item, dict):
            return "{ " + ", ".join(f"{value(str(k))} = {value(v)}" for k, v in item.items()) + " }"
        if isinstance(item, list):
            return "[" + ", ".join(value(v) for v in item) + "]"
        if isinstance(item, (bool, int, str)):
            return json.dumps(item, ensure_ascii=False)  # TOML's escapes are JSON's, less the surrogate pairs
        if isinstance(item, float) and item == item and abs(item) != float("inf"):
            return repr(item)
        raise ValueError(f"a profile config cannot hold {item!r} (TOML has no such value)")

    text = value(config)
    read = tomllib.loads(f"c = {text}")["c"]
    if config_id(read) != config_id(config):
        raise ValueError(f"config {config!r} does not read back from TOML as itself")
    return text
