"""The one judge: given the releases a user runs and how they train, what each known failure is for them.

It works in two steps, so that the page can answer without judging again:
- `compile_tables` (once, from the model): per failure, its setups, the packages it depends on, every stack its
  configs were measured at (the points, with what they showed), and per package the decision segments (a release
  range and what the records decide there: affected, clear, unmeasured, or only measured), each with its words.
- `evaluate` (per question): a lookup of the user's releases in those tables and one fixed fold. The browser runs
  the same fold over the same tables (`judge.js`); a table of test vectors holds the two to the same answers.

Per failure the answer is one state and how sure it is:
- state: `applies`, `cleared` (a setting the user already has is its measured fix), `undecided` (and why),
  `range` (a range the user allows admits a release measured failing), `pitfall` (of the setup, whatever the
  release), `clean` (measured not to show) or `not-applicable` (another setup, another device, a package not there);
- sure: `exact` (a record at exactly these releases of every package the failure depends on, same setup),
  `bracketed` (the releases around them were measured: the segments name them) or `unmeasured` (and the command
  that measures them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from harness.knowledge.evidence import OTHER, PASSES, SHOWS

SCHEMA = "compat-matrix/judge/v1"
#: Segment states: what the records decide for a release range of one package.
AFFECTED, CLEAR, UNMEASURED, MEASURED = "affected", "clear", "unmeasured", "measured"
#: Answer states, in the order an answer lists them.
STATES = ("applies", "applies-if", "range", "undecided", "pitfall", "cleared", "clean", "not-applicable")


_RELEASE = re.compile(r"^\s*v?(?:\d+!)?(\d+(?:\.\d+)*)")


@cache
def key(version: str) -> tuple[int, ...]:
    """The release numbers of a version, padded so that 2.4 and 2.4.0 compare equal (a local label, a pre- or
    post-release part left out: the atlas measures final releases). Cached: a way-out search compares the same few
    hundred releases millions of times."""
    found = _RELEASE.match(str(version).split("+", 1)[0])
    parts = [int(x) for x in found.group(1).split(".")] if found else []
    return tuple((parts + [0] * 6)[:6])


def prefix_bounds(version: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """[low, high) of the releases a prefix names: '2.4' -> 2.4.0 up to (not including) 2.5.0."""
    parts = list(key(version))
    found = _RELEASE.match(str(version).split("+", 1)[0])
    given = min(6, len(found.group(1).split("."))) if found else 1
    high = parts[:given]
    high[-1] += 1
    return tuple(parts), tuple(high + [0] * (6 - len(high)))


@dataclass
class Query:
    """What the user runs. `versions`: package -> release (or a prefix, where the package is in `prefix`); `setup`:
    the vocabulary's keys; `device`: 'cpu', 'cuda' or None (not said); `gpus`: how many (None: not said); `partial`:
    the input need not name every package installed (a requirements file); `ranges`: package -> the releases the
    atlas measured that a loose requirement admits."""

    versions: dict[str, str] = field(default_factory=dict)
    setup: dict[str, str] = field(default_factory=dict)
    device: str | None = None
    gpus: int | None = None
    partial: bool = False
    prefix: list[str] = field(default_factory=list)
    ranges: dict[str, list[str]] = field(default_factory=dict)
    ignore: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "versions": dict(self.versions), "setup": dict(self.setup), "device": self.device, "gpus": self.gpus,
            "partial": self.partial, "prefix": list(self.prefix), "ranges": dict(self.ranges),
            "ignore": list(self.ignore),
        }  # fmt: skip


def _matches(have: str | None, want: str, prefix: bool) -> bool:
    if have is None:
        return False
    if not prefix:
        return key(have) == key(want)
    low, high = prefix_bounds(want)
    return low <= key(have) < high


def _agrees(have: Mapping[str, str], want: Mapping[str, str], narrowing: list[str]) -> bool:
    return all(have[k] == v for k, v in want.items() if k in have and k in narrowing)


def _segment_of(segments: list[list[Any]], version: str) -> list[Any]:
    """The segment [low, low_in, high, high_in, state, why] that holds an exact release."""
    at = key(version)
    for segment in segments:
        low, low_in, high, high_in = segment[:4]
        above = low is None or (key(low) < at or (low_in and key(low) == at))
        below = high is None or (at < key(high) or (high_in and key(high) == at))
        if above and below:
            return segment
    return [None, False, None, False, UNMEASURED, f"{version}: no release measured near it"]


def _segments_over(segments: list[list[Any]], version: str) -> list[list[Any]]:
    """The segments a prefix's releases fall in ('4.47' spans 4.47.0 and 4.47.1: maybe two of them)."""
    low, high = prefix_bounds(version)
    found = []
    for segment in segments:
        s_low = None if segment[0] is None else key(segment[0])
        s_high = None if segment[2] is None else key(segment[2])
        starts_below = s_high is None or low < s_high or (segment[3] and low == s_high)
        ends_above = s_low is None or s_low < high
        if starts_below and ends_above:
            found.append(segment)
    return found


def _decide(segments: list[list[Any]], version: str, prefix: bool) -> tuple[str, str]:
    """(state, why) of one package's release in a failure's segments."""
    if not prefix:
        segment = _segment_of(segments, version)
        return segment[4], segment[5]
    over = _segments_over(segments, version)
    states = {s[4] for s in over}
    if len(states) == 1:
        return over[0][4], over[0][5]
    if states <= {AFFECTED, MEASURED}:
        return AFFECTED, "; ".join(s[5] for s in over)
    return UNMEASURED, f"{version} names releases that differ: " + "; ".join(s[5] for s in over)


def evaluate(tables: Mapping[str, Any], query: Query) -> list[dict[str, Any]]:
    """Every known failure and pitfall, judged for the query: one answer each (see the module's words), in the order
    of `STATES`, then by id."""
    narrowing = list(tables["narrowing"])
    answers = [
        _judge(failure, query, narrowing, tables) for failure in tables["failures"] if failure["id"] not in query.ignore
    ]
    answers += [_pitfall(pitfall, query, narrowing) for pitfall in tables["pitfalls"]]
    return sorted(answers, key=lambda a: (STATES.index(a["state"]), a["id"]))


def _answer(failure: Mapping[str, Any], state: str, why: str, sure: str = "", **more: Any) -> dict[str, Any]:
    return {"id": failure["id"], "scenario": failure["scenario"], "device": failure["device"], "state": state,
            "why": why, "sure": sure} | more  # fmt: skip


def _judge(failure: Mapping[str, Any], query: Query, narrowing: list[str], tables: Mapping[str, Any]) -> dict[str, Any]:
    device = _device_answer(failure, query, narrowing, tables)
    if device is not None:
        return device
    setups = [i for i, s in enumerate(failure["setups"]) if _agrees(s["keys"], query.setup, narrowing)]
    if not setups:
        return _answer(failure, "not-applicable", "another setup")
    answer = _by_points(failure, query, setups) or _by_segments(failure, query)
    answer.setdefault("setups", [failure["setups"][i]["keys"] for i in setups])
    answer.setdefault("when", "; ".join(failure["setups"][i]["words"] for i in setups))
    when = answer["when"]
    if answer["state"] in ("applies", "undecided", "range"):
        held = next((f for f in failure["fixes"] if _has_setting(query.setup, f)), None)
        if held is not None:
            return _with_setting(failure, answer, fix_answer(failure, held, query, setups), when)
    if answer["state"] in ("applies", "clean") and failure["distributed"] and failure["device"] == "cuda":
        sizes = failure["world_sizes"]
        if query.gpus and sizes and query.gpus not in sizes:
            answer = _answer(failure, "undecided", f"measured on {' and '.join(map(str, sizes))} GPUs, not on "
                             f"{query.gpus}", "unmeasured", when=when)  # fmt: skip
    if answer["state"] == "applies" and failure["detail"]:
        # A condition on the user's model that no lockfile shows: it applies if their model has it.
        answer = answer | {"state": "applies-if", "condition": failure["detail"]}
    return answer


def _has_setting(setup: Mapping[str, str], fix: Mapping[str, Any]) -> bool:
    """Whether the user's setup already holds a fix's setting (SPEC `variant_setup`: a state-dict type,
    use_reentrant, ...): then the fix's records, not the baseline's, are the evidence about them."""
    setting = fix.get("setup") or {}
    return bool(setting) and all(setup.get(k) == v for k, v in setting.items())


def _with_setting(
    failure: Mapping[str, Any], answer: dict[str, Any], fixed: dict[str, Any], when: str
) -> dict[str, Any]:
    """The answer for a user whose setup holds a fix's setting, judged on the fix's own records at their releases,
    setup and world size: CLEARED only where it fixes it there (exact or bracketed); the failure again applies; another
    failure, or nothing measured there, leaves it undecided."""
    said = f"your setup has {fixed['words']}"
    if fixed["state"] == FIXES:
        return _answer(failure, "cleared", f"{said}, which fixes it here: {fixed['why']}", fixed["sure"], when=when)
    if fixed["state"] == NOT_FIXED:
        return _answer(failure, "applies", f"{said}, which does not fix it here: {fixed['why']}", fixed["sure"],
                       when=when)  # fmt: skip
    if fixed["state"] == BRINGS:
        brought = ", ".join(fixed["brings"])
        return _answer(failure, "undecided", f"{said}; with it the runs here fail another way ({brought}): no "
                       "evidence either way", fixed["sure"], when=when)  # fmt: skip
    return _answer(failure, "undecided", f"{said}, not measured at your releases, setup and GPU count ("
                   f"{fixed['where'] or 'nowhere else either'}); without it: {answer['why']}", "unmeasured",
                   when=when)  # fmt: skip


# --- fixes, judged like failures ------------------------------------------------------------------------------------

#: What a fix is at the user's releases, setup and world size (in the order an answer lists them within how sure).
FIXES, BRINGS, NOT_FIXED, FIX_UNMEASURED = "fixes", "brings", "does-not-fix", "unmeasured"
FIX_STATES = (FIXES, BRINGS, NOT_FIXED, FIX_UNMEASURED)
SURES = ("exact", "bracketed", "unmeasured")
_FIX_WORDS = {FIXES: "fixes it", NOT_FIXED: "fails the same way", BRINGS: "fails another way"}


def fix_answers(tables: Mapping[str, Any], failure: Mapping[str, Any], query: Query) -> list[dict[str, Any]]:
    """Every measured fix of a failure judged at the query, most sure first (exact, bracketed, unmeasured), then
    fixes before those that bring another failure or do not fix it, real fixes before workarounds."""
    narrowing = list(tables["narrowing"])
    setups = [i for i, s in enumerate(failure["setups"]) if _agrees(s["keys"], query.setup, narrowing)]
    found = [fix_answer(failure, fix, query, setups or list(range(len(failure["setups"])))) for fix in failure["fixes"]]
    return sorted(found, key=lambda f: (SURES.index(f["sure"]), FIX_STATES.index(f["state"]), f["kind"] != "fix"))


def fix_answer(failure: Mapping[str, Any], fix: Mapping[str, Any], query: Query, setups: list[int]) -> dict[str, Any]:
    """One fix at the user's releases, setup and world size: `fixes` it, `does-not-fix` (the failure again),
    `brings` (another failure: named) or `unmeasured` (with where it was measured), and how sure: exact (a record at
    exactly these releases of every package the failure depends on, this setup and GPU count), bracketed (measured
    on both sides with the same outcome and nothing else between) or unmeasured."""
    sized = failure["distributed"] and failure["device"] == "cuda" and bool(query.gpus)
    mine = [p for p in fix["points"] if p[1] in setups]
    points = [p for p in mine if not sized or p[2] == query.gpus]
    depends = failure["depends"]
    base = {"variant": fix["variant"], "kind": fix["kind"], "words": fix["words"], "brings": [], "evidence": []}
    base |= {"setup": fix["setup"]} if fix.get("setup") else {}
    where = _fix_where(failure, mine)
    missing = [p for p in depends if p not in query.versions]
    if missing and (not query.partial or set(missing) & set(failure["conditions"])):
        why = f"{', '.join(missing)} not given: a fix is judged only where every release it depends on is known"
        return base | {"state": FIX_UNMEASURED, "sure": "unmeasured", "why": why, "where": where}
    # A package a requirements file leaves out, on which no release of the failure turns: judged over the others, as
    # the failure is (never exact: not every release it depends on is known).
    given = [i for i, p in enumerate(depends) if p in query.versions]
    view = dict(failure) | {"depends": [depends[i] for i in given]}
    projected = [[[p[0][i] for i in given], *p[1:]] for p in points]
    note = f" ({', '.join(missing)} not given)" if missing else ""
    at_query = [(d, query.versions[d], d in query.prefix) for d in view["depends"]]
    exact = [p for p in projected if all(_matches(v, *asked[1:]) for asked, v in zip(at_query, p[0], strict=True))]
    found = _fix_exact(view, exact) if exact else _fix_bracket(view, projected, query)
    if found is not None:
        if note and found["sure"] == "exact":
            found = found | {"sure": "bracketed"}
        return base | found | {"why": found["why"] + note, "where": where}
    why = "not measured at these releases" + (f" on {query.gpus} GPUs" if sized else "") + note
    return base | {"state": FIX_UNMEASURED, "sure": "unmeasured", "why": why, "where": where}


def _fix_state(states: set[str]) -> str:
    found = _stack_state(states)
    return {SHOWS: NOT_FIXED, PASSES: FIXES}.get(found, BRINGS)


def _fix_exact(failure: Mapping[str, Any], exact: list[list[Any]]) -> dict[str, Any]:
    verdicts = {tuple(p[0]): _fix_state({q[3] for q in exact if q[0] == p[0]}) for p in exact}
    others = sorted({sig for p in exact for sig in p[4]})
    at = _stack_words(failure["depends"], min(verdicts, key=lambda s: [key(v) for v in s]))
    evidence = [failure["refs"][p[5]] for p in exact[:3]]
    if len(set(verdicts.values())) > 1:
        words = "; ".join(
            f"{_stack_words(failure['depends'], s)}: {_FIX_WORDS[v]}" for s, v in sorted(verdicts.items())
        )
        return {"state": FIX_UNMEASURED, "sure": "unmeasured", "evidence": evidence,
                "why": f"the releases asked name stacks where it differs: {words}"}  # fmt: skip
    state = next(iter(verdicts.values()))
    why = f"measured: {_FIX_WORDS[state]} at {at}" + (f" ({', '.join(others)})" if state == BRINGS else "")
    return {"state": state, "sure": "exact", "why": why, "brings": others if state == BRINGS else [],
            "evidence": evidence}  # fmt: skip


def _fix_bracket(failure: Mapping[str, Any], points: list[list[Any]], query: Query) -> dict[str, Any] | None:
    """Two measured stacks around the user's (each package at or below theirs, at or above theirs) with the same
    outcome, and no measured stack between them with another: the closest such pair."""
    depends = failure["depends"]
    state_at: dict[tuple[str, ...], set[str]] = {}
    for p in points:
        state_at.setdefault(tuple(p[0]), set()).add(p[3])
    verdicts = {s: _fix_state(found) for s, found in state_at.items()}

    def side(stack: tuple[str, ...], below: bool) -> bool:
        for package, version in zip(depends, stack, strict=True):
            low, high = prefix_bounds(query.versions[package]) if package in query.prefix else (None, None)
            at = key(version)
            if low is None:
                low = high = key(query.versions[package])
            if below and not at <= low:
                return False
            if not below and not (at >= high if package in query.prefix else at >= low):
                return False
        return True

    best = None
    for lo in (s for s in verdicts if side(s, True)):
        for hi in (s for s in verdicts if side(s, False) and verdicts[s] == verdicts[lo]):
            inside = [s for s in verdicts if all(key(a) <= key(b) <= key(c) for a, b, c in zip(lo, s, hi, strict=True))]
            if any(verdicts[s] != verdicts[lo] for s in inside):
                continue
            span = sum(key(c)[0] * 1000 + key(c)[1] - key(a)[0] * 1000 - key(a)[1] for a, c in zip(lo, hi, strict=True))
            if best is None or span < best[0]:
                best = (span, lo, hi)
    if best is None:
        return None
    _, lo, hi = best
    state = verdicts[lo]
    others = sorted({sig for p in points if tuple(p[0]) in (lo, hi) for sig in p[4]})
    why = (f"measured: {_FIX_WORDS[state]} at {_stack_words(depends, lo)} and at {_stack_words(depends, hi)}, the "
           "releases around yours" + (f" ({', '.join(others)})" if state == BRINGS else ""))  # fmt: skip
    return {"state": state, "sure": "bracketed", "why": why, "brings": others if state == BRINGS else []}


def fix_where(failure: Mapping[str, Any], fix: Mapping[str, Any]) -> str:
    """Where a fix of the failure was measured and what it did there, over every setup and world size (an advisory's
    words: it is no answer at a user's releases)."""
    return _fix_where(failure, fix["points"])


def _fix_where(failure: Mapping[str, Any], points: list[list[Any]]) -> str:
    """Where a fix was measured for these setups, in words: its outcome per world size (on GPUs) and stacks."""
    depends = failure["depends"]
    gpus = failure["device"] == "cuda"
    grouped: dict[tuple[int, str], set[tuple[str, ...]]] = {}
    for p in points:
        state = _fix_state({p[3]})
        grouped.setdefault((p[2] if gpus else 0, state), set()).add(tuple(p[0]))
    said = []
    for (size, state), stacks in sorted(grouped.items(), key=lambda kv: (kv[0][0], FIX_STATES.index(kv[0][1]))):
        on = f" on {size} GPU{'s' if size > 1 else ''}" if size else ""
        ordered = sorted(stacks, key=lambda s: [key(v) for v in s])
        if len(ordered) == 1:
            at = _stack_words(depends, ordered[0])
        else:
            spans = [sorted({s[i] for s in ordered}, key=key) for i in range(len(depends))]
            moving = [f"{p} {spans[i][0]} to {spans[i][-1]}" for i, p in enumerate(depends) if len(spans[i]) > 1]
            at = f"{len(ordered)} stacks ({', '.join(moving)})"
        said.append(f"{_FIX_WORDS[state]}{on} at {at}")
    return "; ".join(said)


def _stack_words(depends: list[str], stack: Any) -> str:
    return ", ".join(f"{p} {v}" for p, v in zip(depends, stack, strict=True))


def _device_answer(
    failure: Mapping[str, Any], query: Query, narrowing: list[str], tables: Mapping[str, Any]
) -> dict[str, Any] | None:
    """None where the failure's device is the user's (or the user did not say); else why it does not decide."""
    if query.device is None or query.device == failure["device"]:
        return None
    if failure["device"] == "cuda":
        return _answer(failure, "not-applicable", "measured on GPUs; you train on CPU")
    covered = tables["coverage"].get(f"{failure['scenario']}@{query.device}", [])
    if any(_agrees(setup, query.setup, narrowing) for setup in covered):
        return _answer(failure, "not-applicable", "measured on CPU; the GPU records of this setup decide")
    if not any(_agrees(s["keys"], query.setup, narrowing) for s in failure["setups"]):
        return _answer(failure, "not-applicable", "another setup")
    return _answer(failure, "undecided", "measured on CPU only: no GPU record of this setup", "unmeasured",
                   when="; ".join(s["words"] for s in failure["setups"]))  # fmt: skip


def _by_points(failure: Mapping[str, Any], query: Query, setups: list[int]) -> dict[str, Any] | None:
    """The answer from records at exactly the user's releases of every package the failure depends on (None where
    there are none): it shows there, it passed there, or it failed another way there (no evidence either way)."""
    depends = failure["depends"]
    if any(p not in query.versions for p in depends):
        return None
    by_stack: dict[tuple[str, ...], dict[int, set[str]]] = {}
    refs: list[Any] = []
    for stack, setup, size, state, ref in failure["points"]:
        if setup not in setups or (
            failure["distributed"] and failure["device"] == "cuda" and query.gpus and size != query.gpus
        ):
            continue
        if all(_matches(v, query.versions[p], p in query.prefix) for p, v in zip(depends, stack, strict=True)):
            by_stack.setdefault(tuple(stack), {}).setdefault(setup, set()).add(state)
            refs.append(failure["refs"][ref])
    if not by_stack:
        return None
    verdicts = {stack: _stack_state(set().union(*found.values())) for stack, found in by_stack.items()}
    states = set(verdicts.values())
    ordered = sorted(by_stack, key=lambda stack: [key(v) for v in stack])
    at = ", ".join(f"{p} {v}" for p, v in zip(depends, ordered[0], strict=True))
    showing = sorted({i for found in by_stack.values() for i, s in found.items() if _stack_state(s) == SHOWS})
    if states == {SHOWS}:
        return _answer(failure, "applies", f"measured failing at {at}", "exact", evidence=refs[:3],
                       setups=[failure["setups"][i]["keys"] for i in showing],
                       when="; ".join(failure["setups"][i]["words"] for i in showing))  # fmt: skip
    if states == {PASSES}:
        return _answer(failure, "clean", f"measured passing at {at}", "exact", evidence=refs[:3])
    if len(verdicts) > 1:
        words = "; ".join(
            f"{', '.join(f'{p} {v}' for p, v in zip(depends, stack, strict=True))}: {_STATE_WORDS[s]}"
            for stack, s in ((stack, verdicts[stack]) for stack in ordered)
        )
        return _answer(failure, "undecided", f"the releases asked name stacks that differ: {words}", "exact",
                       evidence=refs[:3])  # fmt: skip
    return _answer(failure, "undecided", f"at {at} its configs failed another way or differ: no evidence either way",
                   "exact", evidence=refs[:3])  # fmt: skip


_STATE_WORDS = {SHOWS: "fails", PASSES: "passes", OTHER: "fails another way", "mixed": "passes on some configs"}


def _stack_state(states: set[str]) -> str:
    if "mixed" in states:
        states = (states - {"mixed"}) | {PASSES, OTHER}
    if SHOWS in states:
        return SHOWS
    if states == {PASSES}:
        return PASSES
    return OTHER if PASSES not in states else "mixed"


def _by_segments(failure: Mapping[str, Any], query: Query) -> dict[str, Any]:
    """The answer between measured releases: each package's release looked up in the failure's segments, then one
    fold: an unmeasured release leaves it undecided; a release measured clear clears it; else it applies, bracketed."""
    unmeasured, clear, affected, admitted, missing = [], [], [], [], []
    for package in failure["depends"]:
        segments = failure["segments"][package]
        conditioned = package in failure["conditions"]
        if package not in query.versions:
            if conditioned and package in query.ranges:
                releases = query.ranges[package]
                decided = [(v, _decide(segments, v, False)) for v in releases]
                bad = [v for v, (s, _) in decided if s == AFFECTED]
                if bad:
                    admitted.append(f"{package}: a range you allow admits {', '.join(bad)}, measured failing")
                elif any(s == CLEAR for _, (s, _) in decided):
                    clear.append(f"{package}: the releases your range allows were measured clear")
                else:
                    unmeasured.append(f"{package}: your range holds no release measured for it")
            elif conditioned and query.partial:
                unmeasured.append(f"{package} is not in your files (installed apart? give its release: a lock, --env)")
            elif conditioned or not query.partial:  # a lock or an environment without it: it is not installed
                return _answer(failure, "not-applicable", f"{package} is not installed")
            else:
                missing.append(package)
            continue
        state, why = _decide(segments, query.versions[package], package in query.prefix)
        {UNMEASURED: unmeasured, CLEAR: clear, AFFECTED: affected}.get(state, []).append(why)
    note = f" ({', '.join(missing)} not given)" if missing else ""
    if unmeasured:
        return _answer(failure, "undecided", "; ".join(unmeasured), "unmeasured")
    if clear:
        return _answer(failure, "clean", "; ".join(clear) + note, "bracketed")
    if admitted:
        return _answer(failure, "range", "; ".join(admitted), "bracketed")
    if failure["shape"] == "mixed":
        return _answer(failure, "undecided", "its configs show it on some stacks and pass on others, and no release "
                       "is named between: only a record at your releases decides", "unmeasured")  # fmt: skip
    if failure["shape"] == "everywhere":
        if missing:  # no release bounds it: only the releases it was measured with decide, and these are not known
            return _answer(failure, "undecided", f"{', '.join(missing)} not given: a failure no release bounds is "
                           "decided only where every release it depends on is known", "unmeasured")  # fmt: skip
        affected.append(failure["everywhere"])
    return _answer(failure, "applies", "; ".join(affected) + note, "bracketed")


def _pitfall(pitfall: Mapping[str, Any], query: Query, narrowing: list[str]) -> dict[str, Any]:
    """A pitfall is the user's where they named their setup and it agrees (its releases do not matter), on its
    device (or where the user did not say)."""
    named = [k for k in query.setup if k in narrowing and k in pitfall["setup"]]
    same_device = query.device is None or query.device == pitfall["device"]
    if named and same_device and _agrees(pitfall["setup"], query.setup, narrowing):
        return _answer(pitfall, "pitfall", pitfall["why"], "", when=pitfall["words"], way_out=pitfall["way_out"])
    return _answer(pitfall, "not-applicable", "another setup or device")
