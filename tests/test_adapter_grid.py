"""Adapters carried across releases (issue 60): which pairs a day loads, how the grid reads (a cell no record holds is
blank, never inferred; a feature a day's peft lacks is n/a), flips only between measured neighbours, per direction,
and a real two-stack grid in the CI profile's environments, resumed without measuring anything twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.knowledge.store import Store, read_adapter_grid
from harness.publishing import adapter_grid
from harness.tools.adapter_grid.grid_run import pairs_for

REPO = Path(__file__).resolve().parents[1]
DAYS = ["era_date-2024-01-01", "era_date-2024-06-01", "era_date-2025-01-01"]
SEED = {"model": "named", "adapters": ["default"], "targets": "list"}
HEAD = {**SEED, "modules_to_save": True}


def test_a_day_loads_everything_saved_before_it_and_the_day_after() -> None:
    plan = pairs_for(DAYS, {d: {"f"} for d in DAYS})
    assert plan[DAYS[0]] == [(DAYS[0], "f"), (DAYS[1], "f")]
    assert plan[DAYS[1]] == [(d, "f") for d in DAYS]
    assert plan[DAYS[2]] == [(d, "f") for d in DAYS]
    assert pairs_for(DAYS, {DAYS[1]: {"f"}})[DAYS[0]] == [(DAYS[1], "f")]  # nothing saved on the first day


def _run(tmp_path: Path, pairs: list[tuple[str, str, str, str]], saves: list[tuple[str, str, str]]) -> Path:
    run = tmp_path / "adapter-grid" / "adapter-grid-history-1"
    run.mkdir(parents=True)
    versions = {d: {"peft": f"0.{10 + i}.0", "torch": "2.4.1"} for i, d in enumerate(DAYS)}
    (run / "meta.json").write_text(json.dumps({"status": "done", "days": versions, "order": DAYS,
                                               "configs": {"seed": SEED, "head": HEAD}}))  # fmt: skip
    lines = []
    for feature, saved_on, loaded_on, outcome in pairs:
        entry = {"config_id": feature, "saved_on": saved_on, "loaded_on": loaded_on, "outcome": outcome}
        if outcome == "fail":
            entry |= {"check": "roundtrip-load", "signature": "check-roundtrip-load", "metrics": {"off_by": 0.91}}
        lines.append(json.dumps(entry))
    (run / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    (run / "saves.jsonl").write_text("\n".join(json.dumps({"config_id": f, "day": d, "outcome": o})
                                               for f, d, o in saves) + "\n")  # fmt: skip
    return run


def test_the_grid_says_not_measured_and_n_a_and_names_flips_between_measured_neighbours(tmp_path: Path) -> None:
    a, b, c = DAYS
    _run(tmp_path, [
        ("head", a, a, "fail"), ("head", a, b, "fail"), ("head", a, c, "pass"),  # loading on c heals a's adapter
        ("head", b, b, "fail"), ("head", c, c, "pass"), ("head", c, b, "fail"),  # (b, c) not measured
        ("seed", a, a, "pass"), ("seed", a, c, "pass"),
    ], [("head", a, "saved"), ("head", b, "saved"), ("head", c, "saved"), ("seed", a, "saved"),
        ("seed", b, "not-applicable"), ("seed", c, "saved")])  # fmt: skip
    found = adapter_grid.document(Store(tmp_path))
    head = next(f for f in found["features"] if f["id"] == "head")
    assert head["words"] == "a modules_to_save head"
    assert head["rows"][0]["cells"] == ["✗ load 0.91x", "✗ load 0.91x", "✓"]
    assert head["rows"][1]["cells"] == ["", "✗ load 0.91x", ""]  # b's adapter on a and on c: never measured
    seed = next(f for f in found["features"] if f["id"] == "seed")
    assert seed["rows"][1]["cells"] == ["n/a", "n/a", "n/a"]
    assert seed["flips"] == ["No flip: every row and every column measured holds one outcome."]
    grid = read_adapter_grid(tmp_path / "adapter-grid" / "adapter-grid-history-1")
    meta, pairs = grid.meta, grid.pairs
    flips = adapter_grid.flips(meta, pairs)
    load = [f for f in flips if f.side == "load"]
    # a's adapter and c's both load wrong on b and right on c
    assert [(f.fixed_days, f.older, f.newer, f.older_state, f.newer_state) for f in load] == [
        ([a], b, c, "check-roundtrip-load", "pass"), ([c], b, c, "check-roundtrip-load", "pass")]  # fmt: skip
    assert load[0].changed_words() == ["peft 0.11.0 -> 0.12.0"]
    save = [f for f in flips if f.side == "save"]
    # column c: a's adapter passes there, c's too, b's never measured there: no flip; column b: a fails, b fails,
    # c fails; column a: only a. No save-side flip at all.
    assert save == []
    text = adapter_grid.render(Store(tmp_path))
    assert "loaded on 2025-01-01 (peft 0.12.0) instead of 2024-06-01 (peft 0.11.0)" in text


def test_a_bad_feature_is_refused_with_the_ids(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "harness", "adapters-grid", "--feature", "nope", "--profile", "ci",
                           "--results-dir", str(tmp_path)], capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert done.returncode == 2 and "--feature nope" in done.stderr, done.stderr


@pytest.mark.matrix
def test_a_real_two_stack_grid_and_its_resume(tmp_path: Path) -> None:
    """The CI profile's two stacks (peft 0.12.0 and today's) as two days: the seed adapter holds everywhere it was
    measured; a resumed run measures nothing again and keeps every outcome."""
    command = [sys.executable, "-m", "harness", "adapters-grid", "--profile", "ci", "--feature", "8c68d061ac",
               "--feature", "aca27fb848", "--results-dir", str(tmp_path)]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert first.returncode == 0, first.stdout + first.stderr
    run = next((tmp_path / "adapter-grid").iterdir())
    grid = read_adapter_grid(run)
    meta, pairs, saves = grid.meta, grid.pairs, grid.saves
    assert len(meta["order"]) == 2 and len(saves) == 4
    assert len(pairs) == 2 * 4, pairs  # each day loads both days' adapters: 4 pairs per feature
    seed = [p for p in pairs if p["config_id"] == "8c68d061ac"]
    older = {p["saved_on"]: meta["order"].index(p["saved_on"]) for p in seed}
    forward = [p for p in seed if older[p["saved_on"]] <= meta["order"].index(p["loaded_on"])]
    assert len(forward) == 3 and all(p["outcome"] == "pass" for p in forward), forward
    (backward,) = [p for p in seed if p not in forward]  # today's adapter on peft 0.12.0: its config names new fields
    assert backward["outcome"] == "pass" or backward["signature"] == "adapter-config-from-newer-peft", backward
    for p in pairs:
        assert p["outcome"] in ("pass", "fail", "error") and (p["outcome"] == "pass") == (p["signature"] is None)
    again = subprocess.run([*command, "--resume", run.name], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = read_adapter_grid(run)
    pairs_again, saves_again = resumed.pairs, resumed.saves
    strip = lambda rows: sorted((r.get("pair") or r["config_id"], r["outcome"], r.get("signature")) for r in rows)  # noqa: E731
    assert strip(pairs_again) == strip(pairs) and strip(saves_again) == strip(saves)


def test_the_sweep_names_the_release_by_moving_each_package_alone_and_reuses_its_probes(tmp_path: Path) -> None:
    """A load-side flip between days that differ in peft and torch: torch moved alone keeps the failure, peft moved
    alone heals it, and the sweep of peft's releases names the first release that heals (0.11.2), with the probe
    behind both of its releases; a second pass measures nothing again."""
    from harness.tools.adapter_grid.grid_run import GridEnvironment as Day
    from harness.tools.adapter_grid.grid_sweep import Sweeper, grouped

    a, b, c = DAYS
    run = _run(tmp_path, [("head", a, b, "fail"), ("head", a, c, "pass"), ("head", b, b, "fail"),
                          ("head", b, c, "pass")], [])  # fmt: skip
    meta = json.loads((run / "meta.json").read_text())
    meta["days"][c]["torch"] = "2.5.0"
    (run / "meta.json").write_text(json.dumps(meta))
    measured: list[tuple[str, str]] = []

    class Fake(Sweeper):
        def _env(self, before_day: str, after_day: str, package: str, version: str) -> tuple[Day, str, str]:
            return Day(f"{package}-{version}", Path(sys.executable), {package: version}), "older-dependencies", ""

        def _measure(self, flips: list, env: Day) -> dict:
            package, version = env.cell_id.split("-")
            measured.append((package, version))
            heals = package == "peft" and version not in ("0.11.0", "0.11.1")
            return {"states": {f.grid_key: "pass" if heals else "check-roundtrip-load" for f in flips}, "loads": []}

    sweeper = Fake(run, tmp_path / "store", stream=open(tmp_path / "log", "w"))
    sweeper.releases = lambda package, old, new, python: ["0.11.0", "0.11.1", "0.11.2", "0.12.0"]
    (flip,) = grouped(adapter_grid.flips(sweeper.meta, sweeper.pairs))
    assert (flip.side, flip.fixed_days) == ("load", [a, b])
    assert (flip.older_state, flip.newer_state) == ("check-roundtrip-load", "pass")
    sweeper.name([flip])
    (named,) = json.loads((run / "sweep.json").read_text())["flips"]
    assert named["moves"] == {"torch": "check-roundtrip-load", "peft": "pass"}
    assert named["reproducing"] == ["peft"]
    assert (named["release"], named["last_release_before"]) == ("0.11.2", "0.11.1")
    assert [(c["direction"], c["release"]) for c in named["changes"]] == [("ended", "0.11.2")]
    assert sorted(measured) == [("peft", v) for v in ("0.11.0", "0.11.1", "0.11.2", "0.12.0")] + [("torch", "2.5.0")]
    again = Fake(run, tmp_path / "store", stream=open(tmp_path / "log", "w"))
    again.releases = sweeper.releases
    measured.clear()
    again.name([flip])
    assert measured == []  # every probe is read back from sweep.json
    text = adapter_grid.render(Store(tmp_path))
    assert "peft 0.11.2: ended with peft 0.11.2 (0.11.1 before it: check-roundtrip-load)" in text, text
    assert "moved alone: peft pass, torch check-roundtrip-load" in text


def test_a_flip_no_single_move_gives_is_not_named(tmp_path: Path) -> None:
    from harness.tools.adapter_grid.grid_run import GridEnvironment as Day
    from harness.tools.adapter_grid.grid_sweep import Sweeper, grouped

    a, b, c = DAYS
    run = _run(tmp_path, [("head", a, b, "fail"), ("head", a, c, "pass")], [])
    meta = json.loads((run / "meta.json").read_text())
    meta["days"][c]["torch"] = "2.5.0"
    (run / "meta.json").write_text(json.dumps(meta))

    class Fake(Sweeper):
        def _env(self, before_day: str, after_day: str, package: str, version: str) -> tuple[Day, str, str]:
            return Day(f"{package}-{version}", Path(sys.executable), {}), "older-dependencies", ""

        def _measure(self, flips: list, env: Day) -> dict:  # only both together heal: neither move alone does
            return {"states": {f.grid_key: "error" if env.cell_id.startswith("torch") else "check-roundtrip-load"
                               for f in flips}, "loads": []}  # fmt: skip

    sweeper = Fake(run, tmp_path / "store", stream=open(tmp_path / "log", "w"))
    sweeper.name(grouped(adapter_grid.flips(sweeper.meta, sweeper.pairs)))
    (named,) = json.loads((run / "sweep.json").read_text())["flips"]
    assert named["reproducing"] == [] and "release" not in named
    assert "not named: no package moved alone gives it" in adapter_grid.render(Store(tmp_path))


def test_a_save_side_probe_judges_each_flip_by_its_own_adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two save-side flips of one interval load their probe-saved adapters on the same day, into one file of lines:
    each flip is judged by its own adapter's line (the other's pass does not stand for its failure)."""
    from harness.recording.flip import Flip
    from harness.tools.adapter_grid import grid_sweep as adapter_grid_sweep
    from harness.tools.adapter_grid.grid_run import GridEnvironment as Day
    from harness.tools.adapter_grid.grid_sweep import Sweeper

    _, b, c = DAYS
    run = _run(tmp_path, [], [])
    env = Day("sweep-peft-0.12.0-on-2024-06-01-older", Path(sys.executable), {"peft": "0.12.0"})

    def saved(day: Day, phase: str, job: dict, store: Path) -> float:
        folder = store / "saved" / day.cell_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "saves.jsonl").write_text("".join(json.dumps({"config_id": f, "outcome": "saved"}) + "\n"
                                                    for f in job["configs"]))  # fmt: skip
        return 0.0

    outcomes = {"seed": "pass", "head": "fail"}

    class Fake(Sweeper):
        def _day_env(self, day: str) -> Day:
            return Day(day, Path(sys.executable), {})

        def _load(self, env: Day, label: str, wanted: list, configs: dict, store: Path) -> list[dict]:
            return [{"pair": f"{s}|{f}", "saved_on": s, "config_id": f, "outcome": outcomes[f],
                     **({"signature": "check-roundtrip-save"} if outcomes[f] == "fail" else {})}
                    for s, f in [(env.cell_id.split("-loaded-on-")[0], "seed"), (wanted[0][0], "head")]]  # fmt: skip

    monkeypatch.setattr(adapter_grid_sweep, "_phase", saved)
    sweeper = Fake(run, tmp_path / "store", stream=open(tmp_path / "log", "w"))
    flips = [Flip(b, c, "check-roundtrip-save", "pass", config_ids=[f], side="save", fixed_days=[c])
             for f in ("seed", "head")]  # fmt: skip
    found = sweeper._measure(flips, env)
    assert found["states"] == {flips[0].grid_key: "pass", flips[1].grid_key: "check-roundtrip-save"}
    assert [line["pair"] for line in found["loads"]] == [f"{env.cell_id}|seed", f"{env.cell_id}|head"]


def test_a_pair_loaded_under_several_hash_seeds_is_judged_by_its_first_failure() -> None:
    """A config with several modules_to_save heads is loaded under each of S10's fixed hash seeds (peft#2289): one
    entry per pair, the first failing seed's, and every seed's outcome kept; a pair loaded once stays as it was."""
    from harness.tools.adapter_grid.grid_run import combined_seeds, several_heads

    def load(pair: str, seed: str, outcome: str) -> dict:
        return {"pair": pair, "hash_seed": seed, "outcome": outcome} | ({"check": "load"} if outcome == "fail" else {})

    found = combined_seeds([load("a|x", "0", "pass"), load("a|x", "1", "fail"), load("a|x", "2", "pass"),
                            load("b|y", "0", "pass")])  # fmt: skip
    by_pair = {e["pair"]: e for e in found}
    assert by_pair["a|x"]["outcome"] == "fail" and by_pair["a|x"]["hash_seed"] == "1"
    assert by_pair["a|x"]["load_hash_seeds"] == {"0": "pass", "1": "load", "2": "pass"}
    assert by_pair["b|y"] == load("b|y", "0", "pass"), "one load: no seeds said"
    heads = {"modules_to_save": True, "heads": ["score", "score_1"]}
    assert several_heads({"two": heads, "one": heads | {"heads": ["score"]}, "none": {"heads": ["a", "b"]}}) == {"two"}
