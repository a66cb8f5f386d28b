"""One run of a user's script in one stack of `bisect-script`'s search, and the file the runs are kept in.

What the run showed is `execution/script_launch.ScriptRun`, declared once beside the launcher that makes it; a
`StackRun` only adds where the search placed it (phase, stack, key) and what it says about the failure asked about
(its state). `runs.jsonl` keeps each as one flat line, the run's fields beside the search's, the layout every
committed verdict's runs have, so an interrupted search resumes from them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from harness.execution.script_launch import ScriptRun

#: The fields of a run, as a line of runs.jsonl spells them beside the search's own.
RUN_FIELDS = frozenset(f.name for f in fields(ScriptRun))
#: What a line of runs.jsonl says of the invocation rather than of the run (a reused run is matched by its key).
INVOCATION_FIELDS = ("script_sha256", "nproc")


@dataclass
class StackRun:
    """The script's run in one stack: the run, where the search placed it, and its state by the one rule."""

    phase: str  # scan | move | bisect | blame
    label: str
    run: ScriptRun
    #: What the stack was: its kind, mode, versions, what was overlaid or left out, the device it ran on.
    stack: dict[str, Any]
    key: str
    reused: bool = False
    #: target | pass | other | unusable, or "" before a target is chosen (`ScriptBisect.state_of`).
    state: str = ""
    #: Set by the search: this run failed another way at a later point of the script than the failure asked about
    #: (so that failure is gone on its stack: evidence, `ScriptBisect.state_of`).
    later: bool = False

    @classmethod
    def of(cls, phase: str, label: str, run: ScriptRun, stack: dict[str, Any], key: str) -> StackRun:
        """A fresh run placed in the search (its seconds to the hundredth, as runs.jsonl keeps them)."""
        return cls(phase, label, replace(run, seconds=round(run.seconds, 2)), stack, key)

    def as_json(self) -> dict[str, Any]:
        """One line of runs.jsonl: the run's fields flat beside the search's."""
        return {
            "phase": self.phase, "label": self.label, **asdict(self.run), "stack": self.stack, "key": self.key,
            "reused": self.reused, "state": self.state, "later": self.later,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackRun:
        """A line of runs.jsonl read back (a line from before a field existed takes its default)."""
        run = ScriptRun(**({"exit_code": None} | {k: v for k, v in data.items() if k in RUN_FIELDS}))
        return cls(
            data["phase"], data["label"], run, data["stack"], data["key"],
            bool(data.get("reused", False)), str(data.get("state", "")), bool(data.get("later", False)),
        )  # fmt: skip


def earlier_runs(path: Path) -> dict[str, dict[str, Any]]:
    """Runs an earlier invocation made, by key (a torn last line from a kill is skipped)."""
    found: dict[str, dict[str, Any]] = {}
    for data in read_json_lines(path):
        for name in INVOCATION_FIELDS:
            data.pop(name, None)
        found[data["key"]] = data
    return found


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `path` (none if absent), a torn line of a killed writer skipped."""
    found = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found
