"""A finding as the records hold it: `results/findings/<id>/` with its `finding.toml` (where it came from, the
package and the two releases), the newest verification run of each side (`runs.jsonl`) and the traced comparison
(`changed.json`). The knowledge model reads a verified finding as a change of its scenario's configs (its reproducer
flipped at both releases with every other pin held); `publishing/findings.py` writes FINDINGS.md and the issue
bodies from the same objects."""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.recording.machine import CPU_FLAGS, describe_machine

_REQUIRED = ("title", "scenario", "signature", "repository", "package", "direction", "bad", "good")


@dataclass
class Finding:
    id: str
    folder: Path
    title: str
    scenario: str
    signature: str
    repository: str
    package: str
    #: "starts" (the failure comes with `bad`, `good` the last release without it) or "ends" (`good` fixed it).
    direction: str
    bad: str
    good: str
    flip: dict[str, Any] = field(default_factory=dict)
    searched: list[str] = field(default_factory=list)
    status: str = "new"
    link: str = ""
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    changed: dict[str, Any] | None = None
    #: What putting the changed code back showed (`blame.json`, `findings ID --verify --blame`), where it ran.
    blame: dict[str, Any] | None = None
    #: GPUs the reproducer needs (0: it runs on CPU with `uv run`).
    gpus: int = 0
    #: Where no atlas flip names the release (its onset day is masked): the probe run that showed it, the day it moved
    #: the package onto and the config ({run, day, config, atlas_run, pass_run, pass_day}).
    probe: dict[str, Any] = field(default_factory=dict)

    #: Every verification as (bad run, good run), oldest first, of the reproducer as it now reads.
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """The reproducer flipped as the atlas did on some machine: it failed at `bad` and passed at `good`, every
        other pin held. Where it did not on another machine, `not_reproduced` says which (a library may take
        another path by the CPU)."""
        return bool(self.reproduced)

    @property
    def reproduced(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [pair for pair in self.pairs if pair_flips(self, *pair)]

    @property
    def not_reproduced(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [pair for pair in self.pairs if not pair_flips(self, *pair)]

    def machines_words(self) -> str:
        """Where it flipped and where it did not, by date and machine: '' where every verification flipped."""
        if not self.not_reproduced:
            return ""

        def where(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
            seen = dict.fromkeys(f"{bad['made_at'][:10]} ({describe_machine(bad.get('machine'))})" for bad, _ in pairs)
            return ", ".join(seen)

        flipped = f"flips on {where(self.reproduced)}; " if self.reproduced else ""
        return f"{flipped}does not flip on {where(self.not_reproduced)}"

    @property
    def cpu_condition(self) -> tuple[str, ...]:
        """The CPU flags on every machine where a verification flipped and on no machine where one did not (both
        recorded): where the library takes another path by the CPU, the failure's condition on the user's machine.
        Empty where every verification flipped, or where a side's machines were not recorded."""
        flipped = [
            set(b["machine"]["cpu_flags"]) for b, _ in self.reproduced if "cpu_flags" in (b.get("machine") or {})
        ]
        held = [
            set(b["machine"]["cpu_flags"]) for b, _ in self.not_reproduced if "cpu_flags" in (b.get("machine") or {})
        ]
        if not flipped or not held:
            return ()
        needed = set.intersection(*flipped) - set.union(*held)
        return tuple(f for f in CPU_FLAGS if f in needed)

    @property
    def script_text(self) -> str:
        """The reproducer as it now reads (repro.py beside finding.toml): what an issue body shows."""
        return (self.folder / "repro.py").read_text()

    def release_words(self) -> str:
        if self.direction == "starts":
            return f"since {self.package} {self.bad} (last good: {self.good})"
        return f"until {self.package} {self.good} fixed it (last bad: {self.bad})"


def pair_flips(finding: Finding, bad: dict[str, Any], good: dict[str, Any]) -> bool:
    """One verification flips as the atlas did: `bad` fails, `good` passes, only the finding's package moved."""
    if bad.get("exit_code") != 1 or good.get("exit_code") != 0:
        return False
    moved = [p for p in bad["pins"] if p not in good["pins"]]
    measured = (bad.get("versions", {}).get(finding.package), good.get("versions", {}).get(finding.package))
    return moved == [f"{finding.package}=={finding.bad}"] and measured in ((finding.bad, finding.good), (None, None))


def _pairs(runs: list[dict[str, Any]], sha: str | None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each bad run with the good run written after it (`verify` writes them in that order), where the bad run is
    of the reproducer as it now reads (`sha`: its sha256; None keeps them all)."""
    found = []
    for bad, good in itertools.pairwise(runs):
        if bad["side"] == "bad" and good["side"] == "good" and (sha is None or bad.get("script_sha256") == sha):
            found.append((bad, good))
    return found


def load_finding(folder: Path) -> Finding:
    """One finding: its toml, the newest verification run of each side, and the traced comparison."""
    try:
        data = tomllib.loads((folder / "finding.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{folder / 'finding.toml'}: {exc}") from None
    missing = [k for k in _REQUIRED if not data.get(k)]
    if missing or data.get("direction") not in ("starts", "ends"):
        raise UsageError(f"{folder / 'finding.toml'}: needs {', '.join(missing) or 'direction starts or ends'}")
    runs: dict[str, dict[str, Any]] = {}
    every = []
    for line in (folder / "runs.jsonl").read_text().splitlines() if (folder / "runs.jsonl").is_file() else []:
        if line.strip():
            run = json.loads(line)
            every.append(run)
            runs[run["side"]] = run  # the newest of each side
    script = folder / "repro.py"
    sha = hashlib.sha256(script.read_bytes()).hexdigest() if script.is_file() else None
    changed = json.loads((folder / "changed.json").read_text()) if (folder / "changed.json").is_file() else None
    blame = json.loads((folder / "blame.json").read_text()) if (folder / "blame.json").is_file() else None
    upstream = data.get("upstream") or {}
    found = Finding(
        id=folder.name, folder=folder, **{k: str(data[k]) for k in _REQUIRED}, flip=data.get("flip") or {},
        searched=list(upstream.get("searched") or []), status=str(upstream.get("status") or "new"),
        link=str(upstream.get("link") or ""), runs=runs, changed=changed, blame=blame, gpus=int(data.get("gpus") or 0),
        probe=dict(data.get("probe") or {}), pairs=_pairs(every, sha),
    )  # fmt: skip
    if found.reproduced:  # what the user sees is what the runs that flipped showed, on the machine they flipped on;
        # a pair made at the script's own pins (`uv run`) before one over a node's stack (an overlay on its packages)
        own = [pair for pair in found.reproduced if not (pair[0].get("machine") or {}).get("overlay")]
        bad, good = (own or found.reproduced)[-1]
        found.runs = {"bad": bad, "good": good}
    return found


def load_all(root: Path) -> list[Finding]:
    return [load_finding(path.parent) for path in sorted(root.glob("*/finding.toml"))]
