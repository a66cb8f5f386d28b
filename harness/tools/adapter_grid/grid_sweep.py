"""`adapters-grid --sweep RUN`: the grid's flips at release resolution, by the evidence rule (issue 60).

A grid flip lies between two atlas days, which differ by several releases of several packages. The sweep names the
one that changed the outcome, as the atlas's flips do (`release_search/flip_naming.py`), with the grid's own probe:

1. **Moves.** Each axis package that differs between the two days is moved alone, to the newer day's release, over
   the older day's stack (its other dependencies as of the older day; as of the newer one where it cannot install
   so). A load-side flip loads the same saved adapters in that environment; a save-side flip saves there and loads
   the saved adapters on the newest load day of the flip (its own environment). The package whose move alone gives
   the newer day's outcome reproduces the flip; where none or several do, the flip is not named.
2. **The sweep.** That package's releases between the two days are measured (`flip_search.next_sweep`: all of them
   where few, else both ends and the first and last patch of every minor, then a search of each gap whose ends
   differ), so every change inside the interval is named, each with the probes behind both of its releases.

Only two outcomes are evidence: the older day's and the newer day's. An error, another leg failing, or adapters of
one flip disagreeing among themselves says nothing, and is stepped over. Every probe is written down as it is known
(`results/adapter-grid/<run>/sweep.json`), and a rerun reuses the probes it holds.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.knowledge.store import read_adapter_grid
from harness.paths import ADAPTER_GRID_FOLDER, meta_file
from harness.publishing import adapter_grid as grid
from harness.publishing.adapter_grid import grid_fields, grouped
from harness.recording.flip import Flip
from harness.tools.adapter_grid.grid_run import GridEnvironment, _lines, _phase, load_phase, loaded
from harness.tools.adapter_grid.grid_run import _day as _date
from harness.tools.release_search import flip_search

SWEEP_FILE = "sweep.json"


def evidence(raw: str | None, flip: Flip) -> str:
    """A probe's outcome for a flip in the one rule's words: the older day's outcome shows the flip's 'before', the
    newer day's its 'after'; anything else is no evidence."""
    if raw == flip.older_state:
        return flip_search.SHOWS
    if raw == flip.newer_state:
        return flip_search.ABSENT
    return flip_search.NO_EVIDENCE


def changed_packages(before: dict[str, str], after: dict[str, str]) -> list[tuple[str, str, str]]:
    """(package, older release, newer release) of every axis package the two days differ in: what a move can move
    (other packages follow the day their dependencies resolve as of)."""
    from harness.define.packages import AXIS_PACKAGES

    return [(p, before[p], after[p]) for p in AXIS_PACKAGES if before.get(p) and after.get(p) and before[p] != after[p]]


class Sweeper:
    """The probes of one run's sweep: environments built like the atlas flips' (so they are shared), each probe
    run once and kept in sweep.json the moment it is known."""

    def __init__(self, run: Path, store: Path, stream: Any = sys.stdout) -> None:
        from harness.define.profile import load_profile
        from harness.paths import MATRIX_DIR

        self.run, self.store, self.stream = run, store, stream
        found = read_adapter_grid(run)
        self.meta, self.pairs = found.meta, found.pairs
        self.history = load_profile(self.meta.get("profile") or "history", MATRIX_DIR)
        self.path = run / SWEEP_FILE
        self.doc: dict[str, Any] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.doc.setdefault("probes", [])
        self.doc["run"] = run.name
        self.days: dict[str, GridEnvironment] = {}
        self.releases = candidates  # the index's releases of a package between two (a test gives its own)

    # --- environments ---------------------------------------------------------------------------------------------

    def _env(
        self, before_day: str, after_day: str, package: str, version: str
    ) -> tuple[GridEnvironment | None, str, str]:
        """The older day's stack with `package` at `version` (dependencies as of the older day, else the newer)."""
        from harness.define.cells import expand
        from harness.environments.envs import InstallOptions, default_envs_dir, ensure_env
        from harness.tools.release_search.flip_naming import held_stack, moving

        versions = self.meta["days"][before_day]
        failure = ""
        for mode, day in (("older-dependencies", before_day), ("newer-dependencies", after_day)):
            held = moving(held_stack(self.history, versions, _date(day), "flip-S10"), package, _date(after_day))
            pins = {k: v[0] for k, v in held.axes.items()} | {package: version}
            single = replace(held, name=f"bisect-{package}-{version}", axes={p: (v,) for p, v in pins.items()},
                             stacks={}, exclusions=())  # fmt: skip
            (cell,) = [c for c in expand(single) if c.excluded_reason is None]
            env = ensure_env(cell, single, InstallOptions(envs_dir=default_envs_dir()))
            if env.python is not None:
                label = f"sweep-{package}-{version}-on-{_date(before_day)}-{mode.split('-')[0]}"
                return GridEnvironment(label, env.python, dict(env.versions)), mode, ""
            failure = str(env.failure)[:300]
        return None, "", failure

    def _day_env(self, day: str) -> GridEnvironment:
        """A grid day's own environment (the grid built it; rebuilt where it is gone)."""
        from harness.tools.adapter_grid.grid_run import day_environment

        if day not in self.days:
            self.days[day] = day_environment(self.meta, day)
        return self.days[day]

    # --- one probe ------------------------------------------------------------------------------------------------

    def probe(self, flips: list[Flip], package: str, version: str) -> dict[str, Any]:
        """Every flip of one interval and direction, at one release of `package` (reused where sweep.json holds it)."""
        first = flips[0]
        wanted = sorted(f.grid_key for f in flips)
        for earlier in self.doc["probes"]:
            if (earlier["direction"], earlier["before_day"], earlier["after_day"], earlier["package"],
                    earlier["version"]) == (first.side, first.older, first.newer, package, version) \
                    and set(wanted) <= set(earlier["states"]):  # fmt: skip
                return earlier
        began = time.monotonic()
        env, mode, failure = self._env(first.older, first.newer, package, version)
        entry: dict[str, Any] = {"direction": first.side, "before_day": first.older,
                                 "after_day": first.newer, "package": package, "version": version,
                                 "dependencies": mode}  # fmt: skip
        if env is None:
            entry |= {"states": dict.fromkeys(wanted, "install-failed"), "failure": failure}
        else:
            entry["versions"] = env.versions
            entry |= self._measure(flips, env)
        entry["seconds"] = round(time.monotonic() - began, 1)
        self.doc["probes"].append(entry)
        self._write()
        said = ", ".join(f"{k.split('|')[0]} {v}" for k, v in sorted(entry["states"].items()))
        print(f"  {package}=={version} ({mode or 'not installable'}): {said} ({entry['seconds']:.0f} s)",
              file=self.stream, flush=True)  # fmt: skip
        return entry

    def _measure(self, flips: list[Flip], env: GridEnvironment) -> dict[str, Any]:
        configs = {f.feature: self.meta["configs"][f.feature] for f in flips}
        sweep_store = self.store / "sweep"
        (sweep_store / "saved").mkdir(parents=True, exist_ok=True)
        if flips[0].side == "load":
            for flip in flips:  # the adapters the flip's row holds, saved on their own day by the grid run
                for saved_on in flip.fixed_days:
                    link = sweep_store / "saved" / saved_on
                    if not link.exists():
                        link.symlink_to(self.store / "saved" / saved_on, target_is_directory=True)
            wanted = sorted({(s, f.feature) for f in flips for s in f.fixed_days})
            lines = self._load(env, env.cell_id, wanted, configs, sweep_store)
            by_pair = {(e["saved_on"], e["config_id"]): e for e in lines}
            states = {f.grid_key: _common([by_pair.get((s, f.feature)) for s in f.fixed_days]) for f in flips}
            return {"states": states, "loads": [_short(e) for e in lines if (e["saved_on"], e["config_id"]) in wanted]}
        job = {"day": env.cell_id, "store": str(sweep_store), "configs": configs}
        _phase(env, "save", job, sweep_store)
        saved = {e["config_id"]: e for e in _lines(sweep_store / "saved" / env.cell_id / "saves.jsonl")}
        states, loads = {}, []
        for flip in flips:  # loaded on the newest day the flip holds for, in that day's own environment
            loaded_on = flip.fixed_days[-1]
            if saved.get(flip.feature, {}).get("outcome") != "saved":
                states[flip.grid_key] = f"save-{saved.get(flip.feature, {}).get('outcome', 'missing')}"
                continue
            day = self._day_env(loaded_on)
            label = GridEnvironment(f"{env.cell_id}-loaded-on-{_date(loaded_on)}", day.python, day.versions)
            lines = self._load(label, label.cell_id, [(env.cell_id, flip.feature)], configs, sweep_store)
            # the load day's file holds every feature this probe loaded there: this flip's line only
            mine = [e for e in lines if (e["saved_on"], e["config_id"]) == (env.cell_id, flip.feature)]
            states[flip.grid_key] = _common(mine)
            loads += [_short(e) | {"loaded_on": loaded_on} for e in mine]
        return {"states": states, "loads": loads}

    def _load(self, env: GridEnvironment, label: str, wanted: list[tuple[str, str]], configs: dict[str, Any],
              sweep_store: Path) -> list[dict[str, Any]]:  # fmt: skip
        load_phase(env, label, wanted, configs, sweep_store)
        from harness.recording.signatures import classify
        from harness.tools.adapter_grid.grid_run import _signature

        lines = loaded(sweep_store, label)
        for entry in lines:
            entry["signature"] = _signature(entry, classify)
        return lines

    def _write(self) -> None:
        self.path.write_text(json.dumps(self.doc, indent=1, sort_keys=True, default=str) + "\n")

    # --- one flip interval ----------------------------------------------------------------------------------------

    def name(self, flips: list[Flip]) -> None:
        """Moves, then the sweep of the package whose move alone reproduces each flip."""
        first = flips[0]
        before, after = self.meta["days"][first.older], self.meta["days"][first.newer]
        moves: dict[str, dict[str, str]] = {f.grid_key: {} for f in flips}
        print(f"{first.side} side, {_date(first.older)} -> {_date(first.newer)}: "
              f"{len(flips)} flip(s); moving each package alone", file=self.stream, flush=True)  # fmt: skip
        for package, _, new in changed_packages(before, after):
            entry = self.probe(flips, package, new)
            for flip in flips:
                moves[flip.grid_key][package] = entry["states"].get(flip.grid_key, "missing")
        named: dict[str, dict[str, Any]] = {}
        for flip in flips:
            reproducing = [p for p, raw in moves[flip.grid_key].items() if evidence(raw, flip) == flip_search.ABSENT]
            named[flip.grid_key] = {"moves": moves[flip.grid_key], "reproducing": reproducing}
        for package, old, new in changed_packages(before, after):
            mine = [f for f in flips if named[f.grid_key]["reproducing"] == [package]]
            if mine:
                self._sweep(mine, package, old, new, named)
        results = {entry["key"]: entry for entry in self.doc.get("flips", [])}
        for flip in flips:
            results[flip.grid_key] = {"key": flip.grid_key, **grid_fields(flip), **named[flip.grid_key]}
        self.doc["flips"] = sorted(results.values(), key=lambda e: e["key"])
        self._write()

    def _sweep(self, flips: list[Flip], package: str, old: str, new: str, named: dict[str, Any]) -> None:
        from harness.tools.release_search.release_sweep import cost_words

        candidates = self.releases(package, old, new, self.history.python)
        if not candidates or candidates[0] != old or candidates[-1] != new:
            for flip in flips:
                named[flip.grid_key]["note"] = f"no sweep: the index's releases of {package} from {old} to {new} are " \
                    f"{', '.join(candidates) or 'none'}"  # fmt: skip
            return
        print(f"  sweep {package} {old} .. {new}: {cost_words(candidates)}", file=self.stream, flush=True)
        raw: dict[str, dict[str, str]] = {f.grid_key: {} for f in flips}
        runs: dict[str, dict[str, Any]] = {}
        while True:
            steps = {
                f.grid_key: flip_search.next_sweep(candidates, {v: evidence(s, f) for v, s in raw[f.grid_key].items()})
                for f in flips
            }
            wanted = sorted({v for s in steps.values() for v in s.probes}, key=candidates.index)
            if not wanted:
                break
            for version in wanted:
                entry = self.probe(flips, package, version)
                runs[version] = entry
                for flip in flips:
                    raw[flip.grid_key][version] = entry["states"].get(flip.grid_key, "missing")
        for flip in flips:
            step = steps[flip.grid_key]
            changes = [_change(package, c, raw[flip.grid_key]) for c in step.changes]
            mine = named[flip.grid_key]
            mine |= {"package": package, "changes": changes, "candidates": candidates,
                     "measured": {v: raw[flip.grid_key][v] for v in candidates if v in raw[flip.grid_key]},
                     "unmeasured": step.unmeasured, "stepped_over": step.stepped_over}  # fmt: skip
            last = changes[-1] if changes else None
            before = evidence(raw[flip.grid_key].get(old), flip)
            if last and evidence(last["after"], flip) == flip_search.ABSENT and before == flip_search.SHOWS:
                mine |= {"release": last["release"], "last_release_before": last["last_before"]}
            elif evidence(raw[flip.grid_key].get(old), flip) != flip_search.SHOWS:
                mine["note"] = f"{package} {old} did not give the older day's outcome in the sweep " \
                    f"({raw[flip.grid_key].get(old)})"  # fmt: skip


def sweep_grid(run_id: str, results_dir: Path, stream: Any = sys.stdout) -> Path:
    """Name every flip of a grid run at release resolution; returns sweep.json's path."""
    from harness.environments.envs import default_envs_dir

    run = results_dir / ADAPTER_GRID_FOLDER / run_id
    if not meta_file(run).is_file():
        raise UsageError(f"--sweep {run_id}: no {run / 'meta.json'}")
    store = default_envs_dir().parent / ADAPTER_GRID_FOLDER / run_id
    if not (store / "saved").is_dir():
        raise UsageError(f"--sweep {run_id}: its saved adapters are not in {store} (a grid run on this machine "
                         "keeps them there): run `adapters-grid --resume` for it first")  # fmt: skip
    sweeper = Sweeper(run, store, stream)
    flips = grouped(grid.flips(sweeper.meta, sweeper.pairs))
    intervals: dict[tuple[str, str, str], list[Flip]] = {}
    for flip in flips:
        intervals.setdefault((flip.side or "", flip.older, flip.newer), []).append(flip)
    print(f"{len(flips)} flip(s) in {len(intervals)} interval(s) of {run_id}", file=stream, flush=True)
    began = time.monotonic()
    for key in sorted(intervals, key=lambda k: (k[1], k[0])):
        sweeper.name(intervals[key])
    sweeper.doc["last_invocation_minutes"] = round((time.monotonic() - began) / 60, 1)
    sweeper._write()
    return sweeper.path


def candidates(package: str, old: str, new: str, python: str | None) -> list[str]:
    """The installable releases from `old` to `new` (the index's), as the atlas flips' sweep takes them."""
    from harness.tools.release_search.release_sweep import candidates_between

    return candidates_between(package, old, new, python)


def _change(package: str, change: flip_search.SweptChange, raw: dict[str, str]) -> dict[str, Any]:
    before, after = raw[change.last_before], raw[change.release]
    direction = "ended" if after == "pass" else "started" if before == "pass" else "changed"
    return {"package": package, "release": change.release, "last_before": change.last_before, "before": before,
            "after": after, "stepped_over": change.stepped_over, "direction": direction}  # fmt: skip


def _common(lines: list[dict[str, Any] | None]) -> str:
    """The outcome every adapter of a flip gave at one probe, or 'mixed' / 'missing' (no evidence)."""
    if not lines or any(e is None for e in lines):
        return "missing"
    states = {grid.state(e) for e in lines if e is not None}
    return states.pop() if len(states) == 1 else "mixed"


def _short(entry: dict[str, Any]) -> dict[str, Any]:
    metrics = entry.get("metrics") or {}
    return {"pair": entry["pair"], "outcome": entry["outcome"], "signature": entry.get("signature"),
            "check": entry.get("check"), "off_by": metrics.get("off_by"),
            "message": str(entry.get("message", ""))[:300]}  # fmt: skip
