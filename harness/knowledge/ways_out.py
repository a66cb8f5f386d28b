"""Ways out, judged over the whole model: the smallest set of release moves after which no known failure applies and
none is brought, each move judged again by the one judge (`judge.evaluate`), never advice from one failure alone.

The candidates are the releases where the records decide a failure of the query clear (a fix's release and the ones
after it that were measured, or the last release measured good before an onset), for the packages those failures'
conditions name, then the packages of what a move would bring. Sets grow one package at a time (at most `MOST_MOVES`)
and the first size that leaves nothing applying wins; among those, the one that leaves the fewest failures
undecided, moves down the fewest packages and moves the least. Every release it names was measured (it comes from the
records), and the answer says which failures it leaves undecided.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from itertools import combinations, product
from typing import Any

from harness.knowledge.broken import measured_broken
from harness.knowledge.installable import complete, distance
from harness.knowledge.judge import AFFECTED, CLEAR, Query, evaluate, key

#: How many packages one way out may move.
MOST_MOVES = 3
#: How many candidate stacks one search may judge (a bound on its time; the answer says when it was reached).
MOST_TRIES = 4000
#: The states a way out must leave none of.
BLOCKING = ("applies", "applies-if")
#: What a failure that applied must be after a move to count as ended: measured clean, or not the user's any more (a
#: move into releases no record holds leaves it undecided: not ended).
ENDED = ("clean", "not-applicable", "cleared")


#: How many times the search widens its candidates with the releases that end what its moves bring.
MOST_ROUNDS = 3


def way_out(tables: Mapping[str, Any], query: Query, answers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """{'pins': {package: release} (the one recommended set; {} where nothing applies), 'from': the releases they
    replace, 'leaves': ids left undecided, 'ends': ids it ends, 'stays': ids no measured release ends (their way out
    is a fix of the setup), 'still': ids that applied and still apply (or are not measured ended) at the pins,
    'brings': ids that apply at the pins and did not at the user's releases, 'notes': per applying failure what a
    single move of each of its packages does, 'searched': what the search covered, 'none': why no set leaves nothing
    applying (or '')}."""
    answers = evaluate(tables, query) if answers is None else answers
    blocking = [a for a in answers if a["state"] in BLOCKING]
    if not blocking:
        return {"pins": {}, "from": {}, "leaves": [], "ends": [], "stays": [], "notes": {}, "none": ""}
    before = {a["id"] for a in blocking}
    by_id = {f["id"]: f for f in tables["failures"] if f["id"] in before}
    # A failure no measured release decides clear (on every stack, or with no release named) stays whatever moves:
    # its way out is a change of the setup (its fixes), and the search leaves it aside.
    movable = [f for f in by_id.values() if _candidates([f], query)]
    stays = sorted(set(by_id) - {f["id"] for f in movable})
    candidates = _candidates(movable, query)
    candidates |= _unblocking(tables, query, candidates)
    notes = {i: _single_moves(tables, query, f, answers) for i, f in by_id.items()}
    ending = {f["id"] for f in movable}
    found, tried = None, 0
    for _ in range(MOST_ROUNDS if movable else 0):
        found, tried, brought = _search(tables, query, candidates, set(stays), ending, before, tried)
        if found is None or found[2] or tried >= MOST_TRIES:
            break
        # What the closest sets bring is ended by releases of its own packages: the search widens to them.
        wider = _widened(candidates, _candidates([f for f in tables["failures"] if f["id"] in brought], query), query)
        if wider == candidates:
            break
        candidates = wider
    searched = _searched_words(candidates, tried)
    if found is None:
        return {"pins": {}, "from": {}, "leaves": [], "ends": [], "stays": stays, "notes": notes,
                "searched": searched, "none": _none_words(candidates, tried)}  # fmt: skip
    moved, after, whole = found
    states = {a["id"]: a["state"] for a in after}
    blocking_after = {i for i, s in states.items() if s in BLOCKING and i not in stays}
    return {
        "pins": moved,
        "from": {p: query.versions.get(p) for p in moved},
        "leaves": sorted(i for i, s in states.items() if s == "undecided"),
        "ends": sorted(i for i in ending if states.get(i) in ENDED),
        "stays": stays,
        "still": sorted((blocking_after & before) | {i for i in ending if states.get(i) not in ENDED}),
        "brings": sorted(blocking_after - before),
        "notes": notes,
        "searched": searched,
        "none": "" if whole else _none_words(candidates, tried) + "; the closest set is given, and what it leaves",
    }


def _widened(candidates: dict[str, list[str]], more: dict[str, list[str]], query: Query) -> dict[str, list[str]]:
    """The candidates with `more` added, each package's releases nearest first."""
    merged = {p: set(v) for p, v in candidates.items()}
    for package, releases in more.items():
        merged.setdefault(package, set()).update(releases)
    return {p: _nearest_first(p, merged[p], query) for p in sorted(merged)}


def _nearest_first(package: str, releases: set[str], query: Query) -> list[str]:
    have = key(query.versions[package]) if package in query.versions else None
    return sorted((v for v in sorted(releases) if key(v) != have), key=lambda v: distance(v, have))


def _candidates(failures: list[Mapping[str, Any]], query: Query) -> dict[str, list[str]]:
    """package -> the releases where one of these failures' segments is decided clear (nearest first)."""
    found: dict[str, set[str]] = {}
    for failure in failures:
        for package in failure["conditions"]:
            for segment in failure["segments"][package]:
                if segment[4] == CLEAR:
                    found.setdefault(package, set()).update(v for v in (segment[0], segment[2]) if v)
    return {p: _nearest_first(p, releases, query) for p, releases in sorted(found.items())}


#: How many releases of a package a broken stack lets a way out move (the nearest ones).
MOST_UNBLOCKING = 6


def _unblocking(tables: Mapping[str, Any], query: Query, candidates: dict[str, list[str]]) -> dict[str, list[str]]:
    """Packages a way out may move besides the failures' own: the user's release of a package that a stack measured
    not to run failed through (transformers 5.10.1 imports torch.float8_e8m0fnu, which torch 2.4.1 lacks), each with
    its nearest measured releases."""
    found: dict[str, list[str]] = {}
    for broken in tables.get("broken", []):
        for package in broken.get("packages", []):
            have = query.versions.get(package)
            if package in candidates or package in found or have is None or broken["versions"].get(package) != have:
                continue
            releases = [v for v in tables["releases"].get(package, []) if key(v) != key(have)]
            found[package] = sorted(releases, key=lambda v: distance(v, key(have)))[:MOST_UNBLOCKING]
    return found


def unsettled(after: list[dict[str, Any]], ending: set[str], stays: set[str]) -> list[str]:
    """The states after a move that keep it from being a way out: a failure that applies (one no release ends aside),
    and one it had to end that is not measured ended (undecided: moved into releases no record holds)."""
    return [
        a["state"]
        for a in after
        if (a["state"] in BLOCKING and a["id"] not in stays) or (a["id"] in ending and a["state"] not in ENDED)
    ]


def _search(
    tables: Mapping[str, Any],
    query: Query,
    candidates: dict[str, list[str]],
    stays: set[str],
    ending: set[str],
    before: set[str],
    tried: int = 0,
) -> tuple[tuple[dict[str, str], list[dict[str, Any]], bool] | None, int, set[str]]:
    """(moves, the answers after them, whether they leave nothing blocking but what `stays`) of the best set, how
    many stacks were judged so far (`tried` carried over from an earlier round), and the failures the sets judged
    bring (blocking after, not in `before`). The smallest size that leaves nothing blocking wins; where no size does,
    the set that leaves the fewest failures applying (then applying if, then undecided) is the closest."""
    packages = sorted(candidates)
    closest: tuple[tuple[Any, ...], dict[str, str], list[dict[str, Any]]] | None = None
    brought: set[str] = set()
    for size in range(1, min(MOST_MOVES, len(packages)) + 1):
        best: tuple[tuple[Any, ...], dict[str, str], list[dict[str, Any]]] | None = None
        for chosen in combinations(packages, size):
            for releases in product(*(candidates[p] for p in chosen)):
                if tried >= MOST_TRIES:
                    break
                tried += 1
                moved = complete(tables, query.versions, dict(zip(chosen, releases, strict=True)))
                if moved is None or measured_broken(tables, query.versions, moved):
                    continue
                after = evaluate(tables, replace(query, versions=query.versions | moved))
                brought |= {a["id"] for a in after if a["state"] in BLOCKING and a["id"] not in before | stays}
                left = unsettled(after, ending, stays)
                score = (left.count("applies"), left.count("applies-if"), len(left), *_score(moved, query, after))
                if not left and (best is None or score < best[0]):
                    best = (score, moved, after)
                if closest is None or score < closest[0]:
                    closest = (score, moved, after)
        if best is not None:
            return (best[1], best[2], True), tried, brought
    return ((closest[1], closest[2], False) if closest else None), tried, brought


def _score(moved: dict[str, str], query: Query, after: list[dict[str, Any]]) -> tuple[Any, ...]:
    undecided = sum(1 for a in after if a["state"] == "undecided")
    far = [distance(v, key(query.versions[p]) if p in query.versions else None) for p, v in moved.items()]
    return (undecided, len(moved), sum(d[0] for d in far), sorted(d[1] for d in far), sorted(moved.items()))


def _single_moves(
    tables: Mapping[str, Any], query: Query, failure: Mapping[str, Any], before: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """For each package of the failure: the nearest release that ends it (an upgrade, else the last good one to pin),
    and what that one move ends and brings, judged again."""
    blocking = {a["id"] for a in before if a["state"] in BLOCKING}
    notes = []
    for package in failure["conditions"]:
        have = query.versions.get(package)
        releases = _candidates([failure], query).get(package, [])
        for release in releases:
            moved = complete(tables, query.versions, {package: release})
            if moved is None or measured_broken(tables, query.versions, moved):
                continue
            after = evaluate(tables, replace(query, versions=query.versions | moved))
            states = {a["id"]: a["state"] for a in after}
            if states.get(failure["id"]) not in ENDED:
                continue  # still there, or not measured there: not ended
            now = {i for i, s in states.items() if s in BLOCKING}
            notes.append({
                "package": package, "release": release, "from": have,
                "direction": "upgrade" if have is None or key(release) > key(have) else "downgrade",
                "ends": sorted(blocking - now), "brings": sorted(now - blocking),
                "along": {p: v for p, v in sorted(moved.items()) if p != package},
            })  # fmt: skip
            break
        else:
            decided = [s for s in failure["segments"][package] if s[4] in (AFFECTED, CLEAR)]
            notes.append({"package": package, "release": None, "from": have, "direction": None, "ends": [],
                          "brings": [], "why": _no_release_words(package, decided)})  # fmt: skip
    return notes


def _no_release_words(package: str, decided: list[list[Any]]) -> str:
    if any(s[4] == CLEAR for s in decided):
        return f"no measured release of {package} ends it without another failure"
    return f"no measured release of {package} ends it"


def _searched_words(candidates: dict[str, list[str]], tried: int) -> str:
    """What the search covered: every set of up to MOST_MOVES packages over these releases, or where it stopped."""
    releases = sum(len(v) for v in candidates.values())
    over = (f"{releases} measured release(s) of {', '.join(candidates)} (each ends a failure of yours or one a move "
            "brings, or unblocks a stack measured not to run)")  # fmt: skip
    if tried >= MOST_TRIES:
        return f"stopped after {MOST_TRIES} stacks judged, before every set of up to {MOST_MOVES} moves over {over}"
    return f"every set of up to {MOST_MOVES} moves over {over}: {tried} stacks judged"


def _none_words(candidates: dict[str, list[str]], tried: int) -> str:
    if not candidates:
        return "no measured release ends them: the way out is a change of the setup (their fixes)"
    if tried >= MOST_TRIES:
        return f"no set of moves found before the search stopped ({MOST_TRIES} stacks judged)"
    searched = _searched_words(candidates, tried)
    return f"no set of up to {MOST_MOVES} release moves leaves every known failure behind (searched {searched})"
