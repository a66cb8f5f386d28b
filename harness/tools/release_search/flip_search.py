"""The one search for where an outcome flips between releases: pure, over the states known so far.

Every bisector in the house asks the same question -- which release of a package first shows the newer state --
and runs its probes its own way: the packaging bisect runs one-cell matrices, the atlas flips run them per
changed package, the GPU node runs planned rounds of them, `bisect-script` runs a user's script. They share this
search: given the releases in order and the states measured so far, it returns the next releases to probe, or
the answer. A probe whose state is neither of the two ends' (it could not install or run, or it failed another
way) is stepped over: it cannot be the answer, and it stays listed, since the change may hide in it.

Binary search with one probe per round (`per_round=1`: n releases take at most ceil(log2 n) + 1 runs, the
midpoint each time); a round of k probes spreads them evenly over the releases still open (a k-ary search, for
a GPU node where each round is a device call).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    """Where the search stands: the releases to probe next, or (none left) the answer."""

    probes: list[str]
    #: The first release with the newer state; None when no candidate has it (no flip in the range).
    first: str | None = None
    #: The last release with the older state before `first`.
    last_before: str | None = None
    #: Releases probed whose state was neither end's, in the order they were probed.
    stepped_over: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.probes


def next_step(candidates: list[str], known: dict[str, str], before: str, after: str, per_round: int = 1) -> Step:
    """The next probes over `candidates` (oldest first; the first one's state is known and is `before`), from
    `known` (release -> state, in the order probed). The newest candidate may be unknown: the search then treats
    "beyond the newest" as the flip's place until a probe says otherwise."""
    stepped = [v for v, state in known.items() if v in candidates and state not in (before, after)]
    usable = [v for v in candidates if v not in stepped]
    low = max(i for i, v in enumerate(usable) if known.get(v) == before)
    high = min((i for i, v in enumerate(usable) if i > low and known.get(v) == after), default=len(usable))
    if high - low <= 1:
        first = usable[high] if high < len(usable) else None
        return Step([], first, usable[low], stepped)
    return Step(spread(usable[low + 1 : high], per_round), stepped_over=stepped)


def spread(items: list[str], count: int) -> list[str]:
    """Up to `count` of `items` evenly spaced: the midpoint for one (binary search), a k-ary step for more."""
    if count == 1:
        return [items[(len(items) - 1) // 2]]
    if len(items) <= count:
        return items
    return [items[round((i + 1) * len(items) / (count + 1)) - 1] for i in range(count)]


#: A probe's state that means "the failure shows" / "it does not", in the words each bisector's probes use.
_SHOWS, _ABSENT = {"fail", "target"}, {"pass", "not-reproduced"}

#: What one run says about the target failure. Only two answers are evidence: the target showed, or the run
#: passed. A timeout, a crash, another failure, a skip or a stack that could not install or import says nothing
#: about the target (it may be there, hidden behind what came first): the search steps over it, never names a
#: flip from it. `UNUSABLE` is kept apart because a probe of a stack that cannot install may be tried another way.
SHOWS, ABSENT, UNUSABLE, NO_EVIDENCE = "shows", "absent", "unusable", "no-evidence"
_CANNOT_RUN = frozenset({"install-failed", "env-broken"})


def run_evidence(outcome: str, is_target: bool) -> str:
    """One run's evidence about the target, from its outcome and whether its failure is the target's (a hang
    that is itself the target counts as showing it): the one rule every bisector judges its runs by."""
    if is_target and outcome not in ("pass", "skip", *_CANNOT_RUN):
        return SHOWS
    if outcome == "pass":
        return ABSENT
    return UNUSABLE if outcome in _CANNOT_RUN else NO_EVIDENCE


def reproduces(state: str, newer_state: str) -> bool:
    """Whether a move's state is the newer side's: the failure shows where the newer side shows it, or passes where
    the newer side passes. A move that could not run or failed another way reproduces nothing. (The atlas's probes
    say fail/pass of sides that are target/not-reproduced; a script's say target/pass/other of sides alike.)"""
    if newer_state in _SHOWS:
        return state in _SHOWS
    return newer_state in _ABSENT and state in _ABSENT


# --- The sweep: every change between two measured points, not only one -------------------------------------------
#
# A binary search assumes one change between its ends. Between two install days a release can fix a failure and a
# later one break it again (transformers' gradient accumulation: fixed in 4.46.0, broken in 4.47.0, fixed in
# 4.47.1, broken in 4.48.0, fixed in 4.48.1); ends that agree then hide two changes, ends that differ hide three.
# The sweep measures every release where there are few, else the first and the last patch of every minor in
# between, then searches each gap between two neighbouring measured releases whose states differ. It finds every
# change the sweep points can see; a change and its undoing inside one minor's patches, with neither end showing
# it, stays unseen, and the sweep says which releases it did not measure.

#: Where a range has this many releases or fewer, the sweep measures every one.
FEW_RELEASES = 8


@dataclass(frozen=True)
class SweptChange:
    """One change the sweep found: the first release with the new state, the last one with the old state before it,
    and releases between them that were no evidence (stepped over: the change may hide in them)."""

    release: str
    last_before: str
    before: str
    after: str
    stepped_over: list[str] = field(default_factory=list)

    @property
    def direction(self) -> str:
        """'ended' where the failure stops showing, 'started' where it starts."""
        return "started" if evidence_state(self.after) == SHOWS else "ended"


@dataclass(frozen=True)
class Sweep:
    """Where a sweep stands: the releases to measure next, or (none left) every change found, in order."""

    probes: list[str]
    changes: list[SweptChange] = field(default_factory=list)
    stepped_over: list[str] = field(default_factory=list)
    #: Releases of the range the sweep never measured (no change can be named inside them from the records).
    unmeasured: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.probes


def evidence_state(state: str) -> str:
    """A probe's state in the one rule's words: SHOWS, ABSENT, or NO_EVIDENCE (anything else)."""
    if state in _SHOWS or state == SHOWS:
        return SHOWS
    if state in _ABSENT or state == ABSENT:
        return ABSENT
    return NO_EVIDENCE


def sweep_points(candidates: list[str], few: int = FEW_RELEASES) -> list[str]:
    """The releases a sweep measures first: all of them where there are `few` or fewer, else both ends and the first
    and the last release of every minor in between (oldest first)."""
    if len(candidates) <= few:
        return list(candidates)
    from packaging.version import Version

    chosen = {candidates[0], candidates[-1]}
    by_minor: dict[tuple[int, ...], list[str]] = {}
    for version in candidates:
        by_minor.setdefault(Version(version).release[:2], []).append(version)
    for releases in by_minor.values():
        chosen |= {releases[0], releases[-1]}
    return [v for v in candidates if v in chosen]


def sweep_bound(candidates: list[str], few: int = FEW_RELEASES) -> int:
    """The most runs a sweep of `candidates` can take if every gap between two sweep points held a change: its
    points, plus a binary search of each gap (ceil(log2(gap + 1)) runs)."""
    points = sweep_points(candidates, few)
    index = [candidates.index(p) for p in points]
    gaps = [b - a - 1 for a, b in itertools.pairwise(index) if b - a > 1]
    return len(points) + sum(math.ceil(math.log2(g + 1)) for g in gaps)


def next_sweep(candidates: list[str], known: dict[str, str], few: int = FEW_RELEASES) -> Sweep:
    """The next releases to measure over `candidates` (oldest first) from `known` (release -> state), or every change.

    First the sweep points (all at once: their order does not matter); then, for each pair of neighbouring releases
    that are evidence and whose states differ with unmeasured releases between them, the midpoint of those (a
    binary search per gap, all gaps at once). A release that was no evidence is stepped over: listed, never the
    answer. Done when every differing pair of neighbours is adjacent among the releases not stepped over."""
    missing = [v for v in sweep_points(candidates, few) if v not in known]
    if missing:
        return Sweep(missing)
    usable = [(i, v) for i, v in enumerate(candidates) if v in known and evidence_state(known[v]) != NO_EVIDENCE]
    stepped = [v for v in candidates if v in known and evidence_state(known[v]) == NO_EVIDENCE]
    probes: list[str] = []
    changes: list[SweptChange] = []
    for (i, older), (j, newer) in itertools.pairwise(usable):
        if evidence_state(known[older]) == evidence_state(known[newer]):
            continue
        gap = [v for v in candidates[i + 1 : j] if v not in known]
        if gap:
            probes += spread(gap, 1)
        else:
            between = [v for v in candidates[i + 1 : j] if v in stepped]
            changes.append(SweptChange(newer, older, known[older], known[newer], between))
    if probes:
        return Sweep(probes)
    unmeasured = [v for v in candidates if v not in known]
    return Sweep([], changes, stepped, unmeasured)
