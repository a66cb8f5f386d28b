"""A finding as the records hold it: `results/findings/<id>/` with its `finding.toml` (where it came from, the
package and the two releases), the newest verification run of each side (`runs.jsonl`) and the traced comparison
(`changed.json`). The knowledge model reads a verified finding as a change of its scenario's configs (its reproducer
flipped at both releases with every other pin held); `publishing/findings.py` writes FINDINGS.md and the issue
bodies from the same objects."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError

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

    @property
    def verified(self) -> bool:
        """The reproducer flips as the atlas did: it fails at `bad` and passes at `good`, every other pin held."""
        bad, good = self.runs.get("bad"), self.runs.get("good")
        if not bad or not good or bad.get("exit_code") != 1 or good.get("exit_code") != 0:
            return False
        moved = [p for p in bad["pins"] if p not in good["pins"]]
        measured = (bad.get("versions", {}).get(self.package), good.get("versions", {}).get(self.package))
        return moved == [f"{self.package}=={self.bad}"] and measured in ((self.bad, self.good), (None, None))

    def release_words(self) -> str:
        if self.direction == "starts":
            return f"since {self.package} {self.bad} (last good: {self.good})"
        return f"until {self.package} {self.good} fixed it (last bad: {self.bad})"


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
    for line in (folder / "runs.jsonl").read_text().splitlines() if (folder / "runs.jsonl").is_file() else []:
        if line.strip():
            run = json.loads(line)
            runs[run["side"]] = run  # the newest of each side
    changed = json.loads((folder / "changed.json").read_text()) if (folder / "changed.json").is_file() else None
    blame = json.loads((folder / "blame.json").read_text()) if (folder / "blame.json").is_file() else None
    upstream = data.get("upstream") or {}
    return Finding(
        id=folder.name, folder=folder, **{k: str(data[k]) for k in _REQUIRED}, flip=data.get("flip") or {},
        searched=list(upstream.get("searched") or []), status=str(upstream.get("status") or "new"),
        link=str(upstream.get("link") or ""), runs=runs, changed=changed, blame=blame, gpus=int(data.get("gpus") or 0),
        probe=dict(data.get("probe") or {}),
    )  # fmt: skip


def load_all(root: Path) -> list[Finding]:
    return [load_finding(path.parent) for path in sorted(root.glob("*/finding.toml"))]
