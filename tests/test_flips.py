"""Naming a flip of a dated run: which package (moved alone) and which release (bisected) changed a target.

Probes and the bisect are stand-ins here (a table of outcomes); the real ones are one-cell matrix runs."""

from __future__ import annotations

import json
from pathlib import Path

from harness.define.profile import load_profile
from harness.environments.envs import InstallOptions
from harness.execution.options import MatrixOptions
from harness.recording.flip import Flip
from harness.tools.release_search import bisection
from harness.tools.release_search import flip_naming as flips
from tests.conftest import REPO_ROOT

S4 = "S4-zero3-lora-checkpoint"
VERSIONS = {
    "2026-04-15": {"torch": "2.11.0+cu128", "transformers": "5.1.0", "peft": "0.19.0", "deepspeed": "0.19.2"},
    "2026-07-29": {"torch": "2.12.0+cu128", "transformers": "5.1.0", "peft": "0.20.0", "deepspeed": "0.19.4"},
}


def record(date: str, outcome: str, signature: str | None) -> dict:
    return {
        "cell": f"era_date-{date}",
        "pins": {"date": date},
        "scenario": S4,
        "variant": "baseline",
        "config": {"seed": 0},
        "config_id": "c0",
        "outcome": outcome,
        "signature": signature,
        "versions": VERSIONS[date],
        "hardware": {"device": "cpu", "world_size": 2},
    }


def test_the_package_whose_move_alone_flips_it_is_named_and_bisected(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "history-x"
    run_dir.mkdir(parents=True)
    rows = [record("2026-04-15", "fail", "checkpoint-recompute-shape[0]"), record("2026-07-29", "pass", None)]
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    moved = []

    def probe(profile, base, package, version, scenario, variant, options, out_dir, signature, **_):
        moved.append((package, profile, dict(base.pins)))
        state = "pass" if package == "deepspeed" else "fail"
        return bisection.Probe(version, state, [], f"run-{package}", 1)

    def bisector(profile, package, scenario, variant, options, *, old, new, signature, out_root, older_state, **_):
        assert (package, old, new, older_state) == ("deepspeed", "0.19.2", "0.19.4", "fail")
        return Flip(old, new, "fail", "pass", {package: [old, new]}, package=package, release="0.19.3")

    profile = load_profile("history", REPO_ROOT / "matrix")
    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    states = flips.dated_states(rows, {S4: {"target": ["checkpoint-recompute-shape[0]"]}})
    [flip] = flips.flips_in(states)
    assert (flip.older, flip.newer, flip.older_state, flip.newer_state) == (
        "2026-04-15",
        "2026-07-29",
        "target",
        "not-reproduced",
    )
    assert set(flip.changed) == {"torch", "peft", "deepspeed"}  # the local label +cu128 is not a change
    older = {p: v.split("+")[0] for p, v in VERSIONS["2026-04-15"].items()}
    named = flips.name_flip(flip, profile, older, options, tmp_path / "flip", probe=probe, bisector=bisector)
    assert (named.package, named.release) == ("deepspeed", "0.19.3")
    # Each probe moves one package: the rest stay at the older date's releases, resolved as of the older date;
    # only the moved package may come from up to the newer date.
    for package, profile_seen, pins in moved:
        assert pins["date"] == "2026-04-15"
        assert all(pins[p] == older[p] for p in older)
        assert profile_seen.outside_era == (package,) and profile_seen.outside_era_day == "2026-07-29"
    assert "deepspeed 0.19.3" in flips.describe(named)


def test_no_flip_where_the_target_state_is_unknown() -> None:
    rows = [record("2026-04-15", "env-broken", "env-broken-ValueError"), record("2026-07-29", "pass", None)]
    states = flips.dated_states(rows, {S4: {"target": ["checkpoint-recompute-shape[0]"]}})
    assert flips.flips_in(states) == []


def test_no_flip_where_the_configs_that_fail_could_not_run_the_day_before() -> None:
    """The day before, the config that shows the target could not run (env-broken) while another config passed:
    the cell reads pass then target, but no config went from pass to target, so there is nothing to bisect."""
    target = {S4: {"target": ["checkpoint-recompute-shape[0]"]}}
    rows = [
        record("2026-04-15", "env-broken", "deepspeed-cpu-needs-ipex"),
        record("2026-04-15", "pass", None) | {"config_id": "c1", "config": {"seed": 1}},
        record("2026-07-29", "fail", "checkpoint-recompute-shape[0]"),
        record("2026-07-29", "pass", None) | {"config_id": "c1", "config": {"seed": 1}},
    ]
    states = flips.dated_states(rows, target)
    assert [r["state"] for r in states[S4]] == ["not-reproduced", "target"]
    assert flips.flips_in(states) == []
    # The same config passing the day before is a flip.
    rows[0] = record("2026-04-15", "pass", None)
    assert [(f.older, f.newer) for f in flips.flips_in(flips.dated_states(rows, target))] == [
        ("2026-04-15", "2026-07-29")
    ]


def test_a_package_that_needs_newer_dependencies_is_probed_with_them(tmp_path: Path) -> None:
    """torch cannot move alone as of the older date (its CUDA libraries are newer): the probe then holds the
    other axis packages and resolves dependencies as of the newer date, and says so."""
    rows = [record("2026-04-15", "fail", "checkpoint-recompute-shape[0]"), record("2026-07-29", "pass", None)]
    [flip] = flips.flips_in(flips.dated_states(rows, {S4: {"target": ["checkpoint-recompute-shape[0]"]}}))
    flip.changed = {"torch": ["2.11.0", "2.12.0"]}

    def probe(profile, base, package, version, scenario, variant, options, out_dir, signature, **_):
        state = "unusable" if base.pins["date"] == "2026-04-15" else "fail"
        return bisection.Probe(version, state, [], "run", 1)

    profile = load_profile("history", REPO_ROOT / "matrix")
    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    named = flips.name_flip(flip, profile, {"torch": "2.11.0"}, options, tmp_path / "f", probe=probe)
    assert [(p["package"], p["dependencies"], p["state"]) for p in named.moves] == [
        ("torch", "older-dependencies", "unusable"),
        ("torch", "newer-dependencies", "fail"),
    ]
    assert named.reproducing == [] and named.package is None  # torch alone keeps the failure: not the cause


def test_a_flip_is_compared_with_the_upstream_record_of_its_own_direction() -> None:
    """DeepSpeed 0.19.3 is where S4's failure ends upstream: it says nothing about the torch release that
    brought it, and a measured end at 0.19.3 agrees with it."""
    from harness.publishing.atlas import upstream_verdict

    onset = {
        "signature": "checkpoint-recompute-shape[0]",
        "newer_state": "target",
        "package": "torch",
        "release": "2.5.0",
    }

    def flip(**fields: str) -> Flip:
        return Flip.from_json({"older": "a", "newer": "b", "older_state": "x", "changed": {}, **fields})

    assert upstream_verdict(flip(**onset)) is None
    end = onset | {"newer_state": "not-reproduced", "package": "deepspeed", "release": "0.19.3"}
    assert upstream_verdict(flip(**end))["agrees"] is True
    assert upstream_verdict(flip(**end | {"release": "0.19.2"}))["agrees"] is False
    # A flip whose probes did not run names no release: it neither agrees nor differs, and the table says so.
    unnamed = flip(**{k: v for k, v in end.items() if k not in ("package", "release")})
    assert upstream_verdict(unnamed)["agrees"] is None
    from harness.publishing.atlas import flips_markdown

    [row] = [line for line in flips_markdown([unnamed]).splitlines() if line.startswith("| ") and "0.19.3" in line]
    assert row.endswith("| deepspeed 0.19.3: not compared: none named here |"), row


def test_a_target_hidden_by_another_failure_is_shown_as_masked() -> None:
    """From the committed history run, judged with today's rules: on CPU the S2 4-bit configs could not run as
    QLoRA before bitsandbytes 0.48 (transformers 4.4x loaded them unquantized, bitsandbytes before 0.46 has no CPU
    4-bit, 0.46 dequantizes only uint8 storage). So the stored flip at bitsandbytes 0.46.0 (2025-03-20 ..
    2025-07-04) is no flip today and is set aside, and the one at 0.47.0 (2025-08-02 .. 2025-11-14) is a masking:
    no package is named as its cause and it is not judged against transformers 5.0.0."""
    from harness.define.registry import discover
    from harness.knowledge.flips import dated_verdicts, masking, with_masking
    from harness.knowledge.selection import latest_by_key
    from harness.publishing.atlas import flips_markdown
    from harness.recording.records import read_records
    from harness.recording.signatures import rename_all
    from tests.conftest import REPO_ROOT

    run = REPO_ROOT / "results" / "runs" / "history-20261124T071955Z-4cf0" / "records.jsonl"
    records, _ = latest_by_key(rename_all(read_records(run)))
    specs = {s.id: s.spec for s in discover()}
    common = {"scenario": "S2-qlora-grad-flags", "signature": "no-grad-element-0", "package": "bitsandbytes"}
    gone = common | {"older": "2025-03-20", "newer": "2025-07-04", "older_state": "target"}
    gone |= {"newer_state": "not-reproduced", "release": "0.46.0"}
    masked = common | {"older": "2025-08-02", "newer": "2025-11-14", "older_state": "not-reproduced"}
    masked |= {"newer_state": "target", "release": "0.47.0"}
    gone, masked = Flip.from_json(gone | {"changed": {}}), Flip.from_json(masked | {"changed": {}})
    text = flips_markdown(with_masking([gone, masked], records, specs), records, specs)
    assert "- S2-qlora-grad-flags 2025-03-20 .. 2025-07-04: was target -> not-reproduced (bitsandbytes 0.46.0)" in text
    masks = masking(masked, dated_verdicts(records, specs)[2])
    assert any(m.startswith("not applicable: bitsandbytes 0.46.1 on CPU dequantizes only uint8") for m in masks)
    [line] = [row for row in text.splitlines() if "2025-08-02 .. 2025-11-14" in row]
    cells = [c.strip() for c in line.split(" | ")]
    assert "masked by `not applicable: bitsandbytes 0.46.1" in line, line
    assert cells[4:6] == ["- (masking, not a cause)", "-"], "a masking names no package or release as the cause"


def test_a_flip_named_before_is_kept_and_one_that_is_gone_is_dropped(tmp_path: Path, monkeypatch) -> None:
    """A second `flips` over the same run does not probe again what the first named (--again does), and a flip
    the run's records no longer show leaves flips.json (the table must not list a flip its own rows deny)."""
    run_dir = tmp_path / "runs" / "history-x"
    run_dir.mkdir(parents=True)
    rows = [record("2026-04-15", "fail", "checkpoint-recompute-shape[0]"), record("2026-07-29", "pass", None)]
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    probed: list[str] = []

    def named_by_stand_in(flip, history, older, options, where, **_):
        probed.append(flip.older)
        flip.package, flip.release = "deepspeed", "0.19.3"
        return flip

    monkeypatch.setattr(flips, "name_flip", named_by_stand_in)
    profile = load_profile("history", REPO_ROOT / "matrix")
    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    saved = tmp_path / "flips" / "history-x" / "flips.json"
    assert len(flips.find_flips([run_dir], profile, options, tmp_path / "flips")) == 1 and probed == ["2026-04-15"]
    assert flips.find_flips([run_dir], profile, options, tmp_path / "flips") == [] and len(probed) == 1
    assert [(e["package"], e["release"]) for e in json.loads(saved.read_text())] == [("deepspeed", "0.19.3")]
    assert len(flips.find_flips([run_dir], profile, options, tmp_path / "flips", again=True)) == 1 and len(probed) == 2
    rows[0] = record("2026-04-15", "pass", None)
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (
        flips.find_flips([run_dir], profile, options, tmp_path / "flips") == [] and json.loads(saved.read_text()) == []
    )


def family_row(date: str, config: str, outcome: str, signature: str | None) -> dict:
    """One config's baseline on one day (S7-like: configs named by their saving path)."""
    return record(date, outcome, signature) | {"config_id": config, "config": {"c": config}, "versions": VERSIONS[date]}


def loop_heals_trainer_still_fails() -> list[dict]:
    """The loop's zero-size save heals on the second day while the Trainer's empty save still fails."""
    return [
        family_row("2026-04-15", "loop", "fail", "check-zero_size"),
        family_row("2026-04-15", "trainer", "fail", "check-empty"),
        family_row("2026-07-29", "loop", "pass", None),
        family_row("2026-07-29", "trainer", "fail", "check-empty"),
    ]


def test_each_failure_family_flips_on_its_own_and_probes_run_its_configs() -> None:
    """S7: the hand loop's ZeRO-3 save heals (zero-size tensors end) while the Trainer's still writes an empty
    file: the cell stays 'target', but the zero-size family flips, and its probes run only the config that showed
    it. A flaky record defines no state; a day where the family's config failed with another family is masked."""
    spec = {S4: {"target": ["check-*"]}}
    rows = loop_heals_trainer_still_fails()
    [flip] = flips.flips_in(flips.dated_states(rows, spec))
    assert (flip.signature, flip.older_state, flip.newer_state, flip.config_ids) == (
        "check-zero_size", "target", "not-reproduced", ["loop"]
    )  # fmt: skip
    rows[0] = family_row("2026-04-15", "loop", "flaky", "check-zero_size")  # showed once, not again: no state from it
    assert flips.flips_in(flips.dated_states(rows, spec)) == []
    rows[0] = family_row("2026-04-15", "loop", "fail", "check-zero_size")
    rows[3] = family_row(
        "2026-07-29", "trainer", "fail", "check-zero_size"
    )  # the empty family's config, another family
    assert [(f.signature, f.older_state) for f in flips.flips_in(flips.dated_states(rows, spec))] == []


def test_the_table_lists_a_family_flip_and_names_several_packages() -> None:
    """The table judges a family's flip by that family (the cell stays 'target': it must not set it aside as a
    flip today's rules no longer see), and a flip that several packages reproduce alone says which."""
    from harness.publishing.atlas import flips_markdown

    spec = {S4: {"target": ["check-*"]}}
    rows = loop_heals_trainer_still_fails()
    [flip] = flips.flips_in(flips.dated_states(rows, spec))
    flip.reproducing = ["torch", "deepspeed"]
    text = flips_markdown([flip], rows, spec)
    assert (
        "| `check-zero_size` | target -> not-reproduced | 2026-04-15 .. 2026-07-29 | "
        "not named: each of torch, deepspeed alone reproduces it | - |" in text
    )
    assert "no longer see" not in text


def test_a_config_that_heals_beside_one_that_never_does_is_a_flip_of_its_own() -> None:
    """A scenario whose configs are code paths of their own (SPEC flips_per_config, S9): the Trainer's config heals
    on the newer day while a loop by hand fails on both, so the cell shows the target on both days and a cell-level
    series sees no flip; the config's own series does, and its probes run only that config. A config that fails
    another way on a day (masked) makes no flip across that day."""
    from harness.tools.release_search.flip_naming import dated_states, flips_in

    def rec(day: str, config: str, outcome: str, sig: str | None = None) -> dict:
        return {
            "run_id": "r", "cell": f"era_date-{day}", "scenario": "S9-x", "variant": "baseline", "config_id": config,
            "config": {}, "outcome": outcome, "signature": sig, "pins": {"date": day},
            "versions": {"transformers": "4.45.0" if day == "2024-09-26" else "4.49.0"},
            "hardware": {"device": "cpu", "world_size": 1},
        }  # fmt: skip

    spec = {"target": ["t"], "variants": {"baseline": ("baseline", "b")}}
    records = [
        rec("2024-09-26", "trainer", "fail", "t"),
        rec("2025-03-20", "trainer", "pass"),
        rec("2024-09-26", "by-hand", "fail", "t"),
        rec("2025-03-20", "by-hand", "fail", "t"),
        rec("2024-09-26", "masked", "fail", "t"),
        rec("2025-03-20", "masked", "fail", "other"),
    ]
    assert flips_in(dated_states(records, {"S9-x": spec})) == []  # the cell shows the target on both days
    found = flips_in(dated_states(records, {"S9-x": spec | {"flips_per_config": True}}))
    assert [(f.family, f.older, f.newer, f.newer_state, f.config_ids) for f in found] == [
        ("config-trainer", "2024-09-26", "2025-03-20", "not-reproduced", ["trainer"])
    ]


S9A = "S9-identity-grad-accumulation"


def _day(date: str, transformers: str, outcome: str) -> dict:
    return {
        "cell": f"era_date-{date}", "pins": {"date": date}, "scenario": S9A, "variant": "baseline",
        "config": {"path": "trainer"}, "config_id": "c0", "outcome": outcome,
        "signature": "check-identity-accumulation" if outcome == "fail" else None,
        "versions": {"torch": "2.4.1", "transformers": transformers, "peft": "0.13.0"},
        "hardware": {"device": "cpu", "world_size": 1},
    }  # fmt: skip


def test_a_fix_and_the_break_after_it_inside_one_interval_are_both_named(tmp_path: Path, monkeypatch) -> None:
    """Two install days that both fail (a binary search sees nothing to name): the upstream record names
    transformers for this failure, so its releases between the days are swept, and the pass window inside is named
    at both ends, each backed by the runs at both releases."""
    from harness.tools.release_search import release_sweep

    releases = ["4.45.0", "4.45.1", "4.45.2", "4.46.1", "4.46.2", "4.46.3", "4.47.0"]
    monkeypatch.setattr(release_sweep, "candidates_between", lambda *_: releases)
    monkeypatch.setattr(release_sweep, "yanked_between", lambda *_: ["4.46.0"])
    rows = [_day("2024-09-26", "4.45.0", "fail"), _day("2024-12-07", "4.47.0", "fail")]
    spec = {S9A: {"target": ["check-identity-accumulation"], "flips_per_config": True}}
    states = flips.dated_states(rows, spec)
    assert flips.flips_in(states) == []  # the days agree: no flip
    [window] = flips.windows_in(states, spec, earlier=[])
    assert (window.older, window.newer, window.changed) == (
        "2024-09-26",
        "2024-12-07",
        {"transformers": ["4.45.0", "4.47.0"]},
    )
    ran = []

    def probe(profile, base, package, version, scenario, variant, options, out_dir, signature, **_):
        ran.append((package, version, dict(base.pins)["date"], options.config_ids))
        state = "pass" if version.startswith("4.46.") else "fail"
        return bisection.Probe(version, state, [signature] if state == "fail" else [], f"run-{version}", 1)

    profile = load_profile("history", REPO_ROOT / "matrix")
    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    older = {"torch": "2.4.1", "transformers": "4.45.0", "peft": "0.13.0"}
    named = flips.sweep_window(window, profile, older, options, tmp_path / "w", probe=probe)
    assert named.is_window
    assert named.changes_words() == "ended with transformers 4.46.1 · started with transformers 4.47.0"
    assert [(c["release"], c["last_before"], c["runs"]) for c in named.changes] == [
        ("4.46.1", "4.45.2", ["run-4.45.2", "run-4.46.1"]),
        ("4.47.0", "4.46.3", ["run-4.46.3", "run-4.47.0"]),
    ]
    assert sorted(v for _, v, _, _ in ran) == releases  # seven releases: every one measured, on the older day's stack
    assert {d for _, _, d, _ in ran} == {"2024-09-26"} and named.sweep["yanked"] == ["4.46.0"]
    # Written and read back as flips.json keeps it.
    again = Flip.from_json(json.loads(json.dumps(named.as_atlas_json())))
    assert again.changes == named.changes and again.sweep == named.sweep


def test_a_later_run_of_some_configs_is_read_as_the_table_reads_it(tmp_path: Path, monkeypatch) -> None:
    """A CPU run whose configs a later run measured again (`matrix --config`, e.g. under fixed hash seeds) is read
    with that run: the later run's records of those configs replace the first's, so a flip of the first run's
    records that the later run does not show is not probed, and a flip it does show is filed under the first run."""
    first, later = (
        tmp_path / "runs" / "history-20261129T010000Z-aaaa",
        tmp_path / "runs" / "history-20261129T020000Z-bbbb",
    )
    for run_dir, started, configs in ((first, "2026-11-29T01:00:00", None), (later, "2026-11-29T02:00:00", ["c0"])):
        run_dir.mkdir(parents=True)
        attempt = {"slice": {"config_ids": configs}} if configs else {}
        meta = {"profile": "history", "started_at": started, "attempts": [attempt]}
        (run_dir / "meta.json").write_text(json.dumps(meta))
    noisy = [record("2026-04-15", "fail", "checkpoint-recompute-shape[0]"), record("2026-07-29", "pass", None)]
    (first / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in noisy))
    steady = [record("2026-04-15", "pass", None), record("2026-07-29", "pass", None)]
    (later / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steady))
    probed: list[str] = []

    def named_by_stand_in(flip, history, older, options, where, **_):
        probed.append(flip.older)
        return flip

    monkeypatch.setattr(flips, "name_flip", named_by_stand_in)
    profile = load_profile("history", REPO_ROOT / "matrix")
    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    assert len(flips.find_flips([first], profile, options, tmp_path / "flips")) == 1, "the first run alone flips"
    assert flips.find_flips([first, later], profile, options, tmp_path / "flips", again=True) == []
    assert probed == ["2026-04-15"] and json.loads((tmp_path / "flips" / first.name / "flips.json").read_text()) == []


def test_a_drawn_config_is_carried_by_its_probes(tmp_path: Path, monkeypatch) -> None:
    """A probe runs explicit configs only: a Hypothesis draw that flipped would not run there at all ('did not run'),
    so the probe's profile carries the drawn config, and only for its scenario."""
    from harness.planning.draws import config_id

    drawn = {"seed": 7, "drawn_by": "hypothesis"}
    run_dir = tmp_path / "runs" / "history-x"
    run_dir.mkdir(parents=True)
    rows = [record("2026-04-15", "fail", "checkpoint-recompute-shape[0]"), record("2026-07-29", "pass", None)]
    for row in rows:
        row |= {"config": drawn, "config_id": config_id(drawn), "config_source": "hypothesis"}
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    carried: list[tuple] = []

    def named_by_stand_in(flip, history, older, options, where, **_):
        carried.append(history.settings_for(S4).configs)
        return flip

    monkeypatch.setattr(flips, "name_flip", named_by_stand_in)
    profile = load_profile("history", REPO_ROOT / "matrix")
    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    flips.find_flips([run_dir], profile, options, tmp_path / "flips")
    assert carried == [(drawn,)], carried
    assert profile.settings_for(S4).configs == (), "the profile itself is left as it was"
