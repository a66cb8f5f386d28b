"""A flip: where an outcome changed between two stacks, and what names the change. One type for all of them.

The atlas's flips (between two install days of a dated run), the GPU node's (the same, planned in rounds), a user
script's (`bisect-script`, between two of its stacks) and the packaging bisect's (one package's releases over a
base cell) all find the same thing: the older and the newer side and their states, the packages that changed,
the moves of each changed package alone, which of them reproduce, and the first release of the one that does.
The commands that find them write them; the table, the issue bodies and the verdict summaries read them back as
this type.

Each file keeps its own layout (flips.json, a script verdict, a bisect verdict): `as_atlas_json`,
`as_script_json`, `as_bisect_json` write it key for key as before, and `from_json` reads any of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Flip:
    older: str
    newer: str
    older_state: str
    newer_state: str
    #: package -> [older release, newer release] (None where a side lacks it)
    changed: dict[str, list[Any]] = field(default_factory=dict)
    #: The scenario and its failure (atlas and packaging flips; a script's failure is its verdict's target).
    scenario: str | None = None
    signature: str | None = None
    #: Each changed package moved alone onto the older side (the atlas files call them "probes").
    moves: list[dict[str, Any]] = field(default_factory=list)
    #: The packages whose move alone reproduces the newer outcome.
    reproducing: list[str] = field(default_factory=list)
    package: str | None = None
    #: The first release of `package` with the newer state (a script verdict calls it "first_release").
    release: str | None = None
    last_release_before: str | None = None
    #: The releases searched, and the runs of the search over them (the packaging bisect's "probes").
    candidates: list[str] = field(default_factory=list)
    bisect_runs: list[dict[str, Any]] = field(default_factory=list)
    stepped_over: list[Any] = field(default_factory=list)
    #: The packages the named release's runs held at the older side's versions.
    held: dict[str, str] = field(default_factory=dict)
    note: str = ""
    #: Changed packages not moved because the moves' bound was reached.
    untried: list[str] = field(default_factory=list)
    #: Where the atlas flip's bisect wrote its probes.
    bisect: str | None = None
    #: The release the upstream record names for this change, and whether we agree.
    upstream: dict[str, Any] | None = None
    #: The configs that show the target on the target side: the probes run only these.
    config_ids: list[str] = field(default_factory=list)
    #: The failure family this flip is of, where the scenario's target shows as several.
    family: str | None = None
    #: The packaging bisect's variant and the cell its probes vary.
    variant: str | None = None
    base_cell: str | None = None
    #: Every change a sweep of the package's releases found between the two sides, in order (`release_sweep`):
    #: {package, release, last_before, before, after, direction, stepped_over, runs}. A flip whose sides agree and
    #: whose sweep found changes inside is a window (a fix and the break after it, or the other way round).
    changes: list[dict[str, Any]] = field(default_factory=list)
    #: The sweep behind `changes`: candidates, points, runs (each with its seconds), releases never measured.
    sweep: dict[str, Any] | None = None
    #: What naming it cost on a GPU node (`node_flips.node_cost`): probe days read, their records, seconds of jobs.
    node_cost: dict[str, Any] | None = None
    #: The dated run the flip was found in (set when the table reads flips.json; never written).
    run_id: str | None = None
    #: A flip of the adapters grid (`publishing/adapter_grid.py`): which side of the round trip changed ("load": one
    #: saved adapter loaded on two days; "save": adapters of two days loaded on one), and the days it holds for (the
    #: rows' saved-on days, or the columns' loaded-on days).
    side: str | None = None
    fixed_days: list[str] = field(default_factory=list)
    #: Why the flip is no evidence of a change (another failure hides the target on one side, its configs could not
    #: run there): decided once when the knowledge model reads it (`knowledge.flips.with_masking`); never written.
    masked_by: list[str] = field(default_factory=list)

    @property
    def direction(self) -> str:
        return "started" if self.newer_state == "target" else "ended"

    @property
    def feature(self) -> str:
        """The one config a per-config flip is of (an adapters-grid flip's feature)."""
        return self.config_ids[0] if self.config_ids else ""

    @property
    def grid_key(self) -> str:
        """An adapters-grid flip's key, as sweep.json keeps it: feature, side, the two days, the two outcomes."""
        fields = (self.feature, self.side or "", self.older, self.newer, self.older_state, self.newer_state)
        return "|".join(fields)

    def changed_words(self) -> list[str]:
        """'peft 0.13.0 -> 0.14.0' for each package that differs between the two sides."""
        return [f"{p} {a or '-'} -> {b or '-'}" for p, (a, b) in self.changed.items()]

    @property
    def is_window(self) -> bool:
        """Both sides agree, and a sweep found changes between them: what a binary search cannot see."""
        return self.older_state == self.newer_state and bool(self.changes)

    def changes_words(self) -> str:
        """'ended with transformers 4.46.0 · started again with transformers 4.47.0', from the sweep; '' without."""
        return changes_words(self.changes)

    @property
    def search_bound(self) -> int:
        """The most runs a binary search over the candidates takes, the older end's included: ceil(log2 n) + 1."""
        return math.ceil(math.log2(max(len(self.candidates), 1))) + 1

    def why_not_named(self) -> str:
        """Why no package is named, from the moves as they were judged: several reproduce alone, or none does
        (each move's state, the reasons where it is no evidence); '' where a package is named."""
        if self.package:
            return ""
        if len(self.reproducing) > 1:
            return f"each of {', '.join(self.reproducing)} alone reproduces it"
        last = {m["package"]: m for m in self.moves if "package" in m}  # a move tried twice counts as its last
        if not last:
            return "no probe ran"
        moves = "; ".join(f"{p} {m.get('version')}: {move_words(m)}" for p, m in last.items())
        return f"no single package ({moves})"

    def release_words(self) -> str:
        """The named release as the records show it: '0.12.0', or '0.12.0 (before it: another failure ...)' where
        the release before it was no evidence (the failure first shows there; whether it was absent before is not
        known), or '-' with the reason where the release is not named."""
        if not self.release:
            return "-" + (f" ({self.note})" if self.package and self.note else "")
        return self.release + (f" ({self.note})" if self.note else "")

    def as_atlas_json(self) -> dict[str, Any]:
        """flips.json's layout."""
        return {
            "scenario": self.scenario, "older": self.older, "newer": self.newer, "older_state": self.older_state,
            "newer_state": self.newer_state, "signature": self.signature, "changed": self.changed,
            "probes": self.moves, "reproducing": self.reproducing, "package": self.package, "release": self.release,
            "bisect": self.bisect, "upstream": self.upstream, "config_ids": self.config_ids, "family": self.family,
            "last_release_before": self.last_release_before, "note": self.note,
        } | ({"changes": self.changes, "sweep": self.sweep} if self.sweep else {}) | (
            {"node_cost": self.node_cost} if self.node_cost else {}
        )  # fmt: skip

    def as_script_json(self) -> dict[str, Any]:
        """A `bisect-script` verdict's layout of one flip."""
        return {
            "older": self.older, "newer": self.newer, "older_state": self.older_state,
            "newer_state": self.newer_state, "changed": self.changed, "moves": self.moves, "package": self.package,
            "first_release": self.release, "last_release_before": self.last_release_before,
            "candidates": self.candidates, "bisect_runs": self.bisect_runs, "stepped_over": self.stepped_over,
            "held": self.held, "note": self.note, "untried": self.untried, "direction": self.direction,
        } | ({"changes": self.changes, "sweep": self.sweep} if self.sweep else {})  # fmt: skip

    def as_bisect_json(self) -> dict[str, Any]:
        """A packaging bisect's verdict.json layout (its probes are the search's runs, the older end first)."""
        return {
            "package": self.package, "scenario": self.scenario, "variant": self.variant,
            "base_cell": self.base_cell, "candidates": self.candidates, "old_state": self.older_state,
            "first_flip": self.release, "stepped_over": self.stepped_over, "probes": self.bisect_runs,
            "cell_runs": len(self.bisect_runs),
            "bound_ceil_log2_n_plus_1": self.search_bound, "last_release_before": self.last_release_before,
            "note": self.note,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Flip:
        """A flip read back from any of the three layouts."""
        if "first_flip" in data:  # a packaging bisect's verdict
            candidates = data.get("candidates") or []
            older_state = data.get("old_state", "")
            return cls(
                older=candidates[0] if candidates else "", newer=candidates[-1] if candidates else "",
                older_state=older_state, newer_state="pass" if older_state == "fail" else "fail",
                scenario=data.get("scenario"), package=data.get("package"), release=data.get("first_flip"),
                candidates=candidates, bisect_runs=data.get("probes") or [],
                stepped_over=data.get("stepped_over") or [], variant=data.get("variant"),
                base_cell=data.get("base_cell"), last_release_before=data.get("last_release_before"),
                note=data.get("note") or "",
            )  # fmt: skip
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "probes" in data:
            values["moves"] = data["probes"]
        if "first_release" in data:
            values["release"] = data["first_release"]
        return cls(**values)


def changes_words(changes: list[dict[str, Any]]) -> str:
    """A sweep's changes in order: 'ended with transformers 4.46.0 · started again with transformers 4.47.0' (the
    first of each direction without 'again'); '' where there is none."""
    seen: set[str] = set()
    words = []
    for change in changes:
        again = " again" if change["direction"] in seen else ""
        seen.add(change["direction"])
        package = f"{change['package']} " if change.get("package") else ""
        words.append(f"{change['direction']}{again} with {package}{change['release']}")
    return " · ".join(words)


def move_words(move: dict[str, Any]) -> str:
    """One move's state in words: 'the failure shows', 'passes', 'could not install or import', or 'no evidence
    (timeout)' with the reasons its probe recorded."""
    state = move.get("state")
    if state in ("fail", "target"):
        return "the failure shows"
    if state in ("pass", "not-reproduced"):
        return "passes"
    if state == "unusable":
        return "could not install or import"
    reasons = move.get("signatures") or ([move["error"]] if move.get("error") else [])
    return "no evidence" + (f" ({', '.join(str(r) for r in reasons)})" if reasons else "")
