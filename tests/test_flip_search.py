"""The one flip search: it finds the first release with the newer state, steps over releases that could not
run, and replays every committed bisect exactly (the same probes in the same order, the same answer)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from harness.recording.flip import changes_words
from harness.tools.release_search.flip_search import Sweep, next_step, next_sweep, sweep_bound

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _run(states: list[str], per_round: int) -> tuple[str | None, list[str], int]:
    """Search releases '0'..'n-1' whose true states are `states` (the first known); (answer, stepped, probes)."""
    candidates = [str(i) for i in range(len(states))]
    known = {"0": states[0]}
    rounds = 0
    while not (step := next_step(candidates, known, "pass", "fail", per_round)).done:
        rounds += 1
        for version in step.probes:
            known[version] = states[int(version)]
    return step.first, step.stepped_over, len(known) - 1


@st.composite
def monotone(draw: st.DrawFn) -> tuple[list[str], int]:
    n = draw(st.integers(2, 40))
    flip = draw(st.integers(1, n))  # n: no release fails
    states = ["pass" if i < flip else "fail" for i in range(n)]
    for i in draw(st.sets(st.integers(1, n - 1), max_size=n // 3)):
        states[i] = "unusable"
    return states, flip


@settings(max_examples=300, deadline=None)
@given(monotone(), st.sampled_from([1, 4]))
def test_the_first_usable_release_at_or_after_the_flip_is_named(case: tuple[list[str], int], per_round: int) -> None:
    states, flip = case
    first, stepped, probes = _run(states, per_round)
    expected = next((str(i) for i in range(flip, len(states)) if states[i] != "unusable"), None)
    assert first == expected
    assert all(states[int(v)] == "unusable" for v in stepped)
    if per_round == 1:
        usable_probes = probes - len(stepped)
        assert usable_probes <= math.ceil(math.log2(len(states))) + 1


def test_a_release_that_fails_another_way_is_stepped_over_not_the_answer() -> None:
    states = ["pass", "pass", "other", "fail", "fail"]
    candidates = [str(i) for i in range(len(states))]
    known = {"0": "pass", "4": "fail"}
    while not (step := next_step(candidates, known, "pass", "fail")).done:
        known[step.probes[0]] = states[int(step.probes[0])]
    assert (step.first, step.last_before) == ("3", "1") and step.stepped_over == ["2"]


def _packaging_verdicts() -> list[Path]:
    return sorted(RESULTS.glob("bisect/*/verdict.json")) + sorted(RESULTS.glob("flips/*/*/bisect/*/verdict.json"))


def test_every_committed_packaging_bisect_replays_exactly() -> None:
    verdicts = _packaging_verdicts()
    assert len(verdicts) >= 10
    for path in verdicts:
        verdict = json.loads(path.read_text())
        recorded = [(p["version"], p["state"]) for p in verdict["probes"]]
        candidates, before = verdict["candidates"], verdict["old_state"]
        after = "pass" if before == "fail" else "fail"
        known = dict(recorded[:1])
        replayed = [recorded[0]]
        while not (step := next_step(candidates, known, before, after)).done:
            version = step.probes[0]
            state = dict(recorded)[version]  # a probe the committed bisect never ran raises KeyError here
            known[version] = state
            replayed.append((version, state))
        assert replayed == recorded, path
        assert (step.first, step.stepped_over) == (verdict["first_flip"], verdict["stepped_over"]), path


def test_every_committed_script_bisect_replays_exactly() -> None:
    replayed_flips = 0
    for path in sorted(RESULTS.glob("script-bisect/*/verdict.json")):
        for flip in json.loads(path.read_text())["flips"]:
            package = flip.get("package")
            if not package or not flip.get("candidates") or flip["changed"][package][0] is None:
                continue
            if flip.get("sweep"):
                continue  # a sweep's verdict: replayed by test_every_committed_script_sweep_replays_exactly
            recorded = [(r["version"], r["state"]) for r in flip["bisect_runs"]]
            after = flip["candidates"]
            candidates = [str(Version(flip["changed"][package][0])), *after]
            before_state, after_state = flip["older_state"], flip["newer_state"]
            known = {candidates[0]: before_state, after[-1]: after_state}
            replayed = []
            while not (step := next_step(candidates, known, before_state, after_state)).done:
                version = step.probes[0]
                known[version] = dict(recorded)[version]
                replayed.append((version, known[version]))
            assert replayed == recorded, path
            assert (step.first, step.last_before) == (flip["first_release"], flip["last_release_before"]), path
            replayed_flips += 1
    assert replayed_flips >= 3


def test_every_committed_script_sweep_replays_exactly() -> None:
    """A bisect-script verdict made with the sweep: replaying the sweep over its own recorded states takes the same
    releases (in the order it measured them, sweep points first) and finds the same changes."""
    replayed_flips = 0
    for path in sorted(RESULTS.glob("script-bisect/*/verdict.json")):
        for flip in json.loads(path.read_text())["flips"]:
            if not flip.get("sweep"):
                continue
            package = flip["package"]
            candidates = flip["sweep"]["candidates"]
            recorded = {r["version"]: r["state"] for r in flip["bisect_runs"]}
            known = {candidates[0]: flip["older_state"], candidates[-1]: flip["newer_state"]}
            order = []
            while not (step := next_sweep(candidates, known)).done:
                for version in step.probes:
                    if version not in known:
                        known[version] = recorded[version]
                        order.append(version)
            assert order == [r["version"] for r in flip["bisect_runs"]], path
            found = [(c.direction, c.release, c.last_before) for c in step.changes]
            assert found == [(c["direction"], c["release"], c["last_before"]) for c in flip["changes"]], path
            assert all(c["package"] == package for c in flip["changes"])
            replayed_flips += 1
    assert replayed_flips >= 1, "a committed bisect-script verdict made with the sweep"


def _same_layout(written: dict, entry: dict, added_since: set[str]) -> bool:
    """`written` is `entry` key for key, in order, but for keys later versions added (absent from older files)."""
    kept = {k: v for k, v in written.items() if k in entry}
    return json.dumps(kept, indent=1) == json.dumps(entry, indent=1) and set(written) - set(entry) <= added_since


def test_every_committed_flip_file_reads_into_the_one_type_and_writes_back_the_same() -> None:
    """flips.json, packaging bisect verdicts and bisect-script verdicts are all `Flip`s: each committed entry read
    into it writes back key for key (older files lack the keys added since: `config_ids`, `family`,
    `last_release_before` and `note` of an atlas flip, the last two of a packaging bisect's, `untried` of a
    script's)."""
    from harness.recording.flip import Flip

    seen = 0
    for path in sorted(RESULTS.glob("flips/*/flips.json")):
        for entry in json.loads(path.read_text()):
            added = {"config_ids", "family", "last_release_before", "note"}
            assert _same_layout(Flip.from_json(entry).as_atlas_json(), entry, added), path
            seen += 1
    for path in _packaging_verdicts():
        entry = json.loads(path.read_text())
        assert _same_layout(Flip.from_json(entry).as_bisect_json(), entry, {"last_release_before", "note"}), path
        seen += 1
    for path in sorted(RESULTS.glob("script-bisect/*/verdict.json")):
        for entry in json.loads(path.read_text())["flips"]:
            assert _same_layout(Flip.from_json(entry).as_script_json(), entry, {"untried"}), path
            seen += 1
    assert seen >= 30


def test_a_move_reproduces_only_the_newer_sides_state_in_either_vocabulary() -> None:
    from harness.tools.release_search.flip_search import reproduces

    # The atlas: probes say fail/pass, the sides are target/not-reproduced.
    assert reproduces("fail", "target") and reproduces("pass", "not-reproduced")
    assert not reproduces("pass", "target") and not reproduces("fail", "not-reproduced")
    # A script: probes and sides say target/pass; a run that failed another way or could not run says nothing.
    assert reproduces("target", "target") and reproduces("pass", "pass")
    assert not any(reproduces(s, side) for s in ("other", "unusable") for side in ("target", "pass"))


# --- The sweep: every change between two measured points ----------------------------------------------------------


def _sweep(candidates: list[str], truth: dict[str, str]) -> tuple[Sweep, list[str]]:
    """Run the sweep to its end against `truth`; (the answer, the releases measured in order)."""
    known: dict[str, str] = {}
    measured: list[str] = []
    while not (step := next_sweep(candidates, known)).done:
        for version in step.probes:
            assert version not in known, "a release is never measured twice"
            known[version] = truth[version]
            measured.append(version)
    return step, measured


def _words(answer: Sweep, package: str = "") -> str:
    return changes_words([{**asdict(c), "direction": c.direction, "package": package} for c in answer.changes])


def test_a_fix_and_the_break_after_it_inside_one_interval_are_both_named() -> None:
    """Both ends fail (a binary search sees no flip at all): the sweep finds the pass window inside."""
    releases = ["4.45.0", "4.45.1", "4.45.2", "4.46.0", "4.46.1", "4.46.2", "4.46.3", "4.47.0"]
    truth = {v: "pass" if v.startswith("4.46.") else "fail" for v in releases}
    answer, measured = _sweep(releases, truth)
    assert [(c.direction, c.release, c.last_before) for c in answer.changes] == [
        ("ended", "4.46.0", "4.45.2"),
        ("started", "4.47.0", "4.46.3"),
    ]
    assert _words(answer, "transformers") == "ended with transformers 4.46.0 · started with transformers 4.47.0"
    assert measured == releases  # eight or fewer: every release


def test_three_changes_between_ends_that_differ_are_all_named_in_order() -> None:
    releases = ["4.47.0", "4.47.1", "4.48.0", "4.48.1", "4.48.2", "4.48.3", "4.49.0"]
    truth = dict(zip(releases, ["fail", "pass", "fail", "pass", "pass", "pass", "pass"], strict=True))
    answer, _ = _sweep(releases, truth)
    assert _words(answer) == "ended with 4.47.1 · started with 4.48.0 · ended again with 4.48.1"


def test_a_release_that_is_no_evidence_is_stepped_over_and_listed_with_the_change() -> None:
    releases = ["1.0", "1.1", "1.2", "1.3"]
    truth = {"1.0": "fail", "1.1": "no-evidence", "1.2": "pass", "1.3": "pass"}
    answer, _ = _sweep(releases, truth)
    [change] = answer.changes
    assert (change.release, change.last_before, change.stepped_over) == ("1.2", "1.0", ["1.1"])


@st.composite
def patch_histories(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    """Releases over several minors (many patches each), with at most one change inside each minor's patches and any
    state at each minor's first release: the histories a sweep must see whole."""
    candidates, truth = [], {}
    for minor in range(draw(st.integers(1, 6))):
        patches = draw(st.integers(1, 7))
        start = draw(st.sampled_from(["pass", "fail"]))
        change_at = draw(st.integers(0, patches))  # patches: no change inside this minor
        for patch in range(patches):
            version = f"1.{minor}.{patch}"
            candidates.append(version)
            flipped = patch >= change_at and change_at > 0
            truth[version] = ({"pass": "fail", "fail": "pass"}[start]) if flipped else start
    for version in draw(st.sets(st.sampled_from(candidates), max_size=len(candidates) // 4)):
        truth[version] = "no-evidence"
    return candidates, truth


@settings(max_examples=300, deadline=None)
@given(patch_histories())
def test_every_change_is_found_where_each_minor_changes_at_most_once(case: tuple[list[str], dict[str, str]]) -> None:
    candidates, truth = case
    answer, measured = _sweep(candidates, truth)
    evidence = [v for v in candidates if truth[v] != "no-evidence"]
    expected = [
        (newer, older) for older, newer in itertools.pairwise(evidence) if truth[older] != truth[newer]
    ]  # what a run of every release would show, stepping over the releases that are no evidence
    # A change hidden behind releases that were no evidence at a sweep point may be found at the next evidence.
    found = [(c.release, c.last_before) for c in answer.changes]
    if not any(truth[v] == "no-evidence" for v in candidates):
        assert found == expected
        assert len(measured) <= sweep_bound(candidates)
    assert all(truth[c.release] != "no-evidence" and truth[c.last_before] != "no-evidence" for c in answer.changes)
    assert set(answer.unmeasured) == set(candidates) - set(measured)
