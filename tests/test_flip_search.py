"""The one flip search: it finds the first release with the newer state, steps over releases that could not
run, and replays every committed bisect exactly (the same probes in the same order, the same answer)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from harness.tools.flip_search import next_step

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
    from harness.tools.flip_search import reproduces

    # The atlas: probes say fail/pass, the sides are target/not-reproduced.
    assert reproduces("fail", "target") and reproduces("pass", "not-reproduced")
    assert not reproduces("pass", "target") and not reproduces("fail", "not-reproduced")
    # A script: probes and sides say target/pass; a run that failed another way or could not run says nothing.
    assert reproduces("target", "target") and reproduces("pass", "pass")
    assert not any(reproduces(s, side) for s in ("other", "unusable") for side in ("target", "pass"))
