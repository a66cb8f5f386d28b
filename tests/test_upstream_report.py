"""`upstream-report` answers for every reproducer the report lists (issue 76): the index names a shared cell
`<cell>@<profile>` as the table does, and the issue body is made from the table's record, citing only the flips of the
runs the table shows (never a superseded run's)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness.define.registry import discover
from harness.knowledge.atlas import Atlas
from harness.publishing.repro import sync_repros
from harness.publishing.upstream import report_body
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "results"


def test_every_reproducer_of_the_report_answers(tmp_path: Path) -> None:
    atlas = Atlas(RESULTS)
    out = tmp_path / "repros"
    sync_repros(atlas.selection.records, {s.id: s for s in discover()}, out)
    index = json.loads((out / "index.json").read_text())
    shared = [e for e in index if "@" in e["cell"]]
    assert len(index) > 500 and shared, (len(index), len(shared))  # the shared cells the old lookup refused
    sample = random.Random(20261205).sample(index, 150) + shared[:50]
    for entry in sample:
        body = report_body(atlas, entry, out)
        assert "### System Info" in body and entry["file"] in body


def test_an_issue_body_cites_only_the_flips_the_table_shows(tmp_path: Path) -> None:
    atlas = Atlas(RESULTS)
    shown = {(f.scenario, f.package, f.release, f.older, f.newer) for f in atlas.flips}
    from harness.publishing.upstream import _flips

    for scenario in {f.scenario for f in atlas.flips}:
        for line in _flips(atlas, scenario):
            if "history flip between" in line:
                assert any(f"{p} {r}:" in line and f"between {o} and {n}" in line for s, p, r, o, n in shown
                           if s == scenario), line  # fmt: skip
