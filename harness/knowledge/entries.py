"""The one fold of "what the records show" at a stack that ran: an entry is a row (`Row`: a stack that ran) and a
scenario, with the records at exactly the row's releases of every package the scenario depends on (the row's own and
any run's at those releases: the judge's points), pitfall configs left out by the one pitfall rule, counted over the
setups the judge's failure applies to there, and the verdict of those records.

The glance, `matrix.json`'s entries, the summary, `check`'s exit code and the findings' fixes all read entries (or
`Atlas.verdict_of` for records of their own): none of them folds the records again, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.define.profile import DATE_AXIS
from harness.knowledge.judge import Query
from harness.recording.verdicts import Verdict, verdict

#: The judge's states that mark an entry failing (measured at exactly the row's releases).
FAILING = ("applies", "applies-if")


@dataclass
class Row:
    """A stack that ran: its cell, the versions its records ran, where, and the records."""

    cell: str
    versions: dict[str, str]
    device: str
    ranks: int
    day: str | None
    records: list[dict[str, Any]]

    @classmethod
    def of(cls, cell: str, versions: dict[str, str], records: list[dict[str, Any]]) -> Row:
        hardware = [r.get("hardware") or {} for r in records]
        device = "cuda" if any(h.get("device") == "cuda" for h in hardware) else "cpu"
        gpus = max((int(h.get("gpu_count") or 0) for h in hardware), default=0)
        ranks = gpus if device == "cuda" and gpus else max((int(h.get("world_size") or 1) for h in hardware), default=1)
        day = next((str(r["pins"][DATE_AXIS]) for r in records if (r.get("pins") or {}).get(DATE_AXIS)), None)
        return cls(cell, versions, device, ranks, day, records)

    def query(self) -> Query:
        """The judge's question at this row: exactly its releases, on its device (a GPU row at its GPU count)."""
        return Query(dict(self.versions), {}, self.device, self.ranks if self.device == "cuda" else None)


class RecordsAtStacks(Protocol):
    """What an entry is folded from (the `Atlas`): the records at exact releases, the pitfall rule, setups."""

    specs: dict[str, dict[str, Any]]

    def records_at(
        self, scenario: str, versions: dict[str, str], device: str | None, ranks: int | None = None,
        keep_pitfalls: bool = False,
    ) -> list[dict[str, Any]]: ...  # fmt: skip

    def counted(self, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], set[str]]: ...

    def setup_of(self, record: dict[str, Any]) -> dict[str, str]: ...


@dataclass
class Entry:
    """A scenario at one row: what every view of that row and scenario shows."""

    row: Row
    scenario: str
    #: The records counted (pitfall configs left out; narrowed to the failing setups where the judge says it fails).
    records: list[dict[str, Any]]
    #: The pitfall configs left out of the count.
    pitfalls: list[str]
    #: The judge's answers that say the scenario's failure applies at exactly these releases.
    failing: list[dict[str, Any]] = field(default_factory=list)
    verdict: Verdict | None = None

    @property
    def state(self) -> str:
        """The verdict's state ("target", "not-reproduced", "skip" ...), "empty" where nothing counted."""
        return self.verdict.state if self.verdict else "empty"

    @property
    def judged(self) -> str:
        """ "fails" where the judge's failure applies here, "holds" where the records show it does not, else "none"."""
        if self.failing:
            return "fails"
        return "holds" if self.state in ("not-reproduced", "passes") else "none"

    @property
    def ran(self) -> bool:
        """Whether any record (a pitfall's included) speaks at this row: an entry a view shows."""
        return bool(self.records or self.pitfalls)


def entry_of(atlas: RecordsAtStacks, row: Row, scenario: str, answers: list[dict[str, Any]]) -> Entry:
    """The entry of a row's scenario, from the judge's `answers` at the row (those of this scenario)."""
    spec = atlas.specs.get(scenario)
    counted, left_out = atlas.counted(atlas.records_at(scenario, row.versions, row.device, row.ranks, True))
    failing = [a for a in answers if a["state"] in FAILING and a["sure"] == "exact"]
    if failing:  # counted over the setups the failure applies to there: another setup's configs are not its n
        setups = [s for a in failing for s in a.get("setups", [])]
        counted = [r for r in counted if atlas.setup_of(r) in setups] or counted
    return Entry(row, scenario, counted, sorted(left_out), failing, verdict(counted, spec) if counted else None)
