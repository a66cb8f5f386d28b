"""Stable publication (issue 77): a report from the same records rewrites no file, and each advisory's OSV times mean
what OSV says: `published` the first publication, set once; `modified` the last change of its content. These tests
exist because every regeneration once rewrote each advisory's `published` to its newest record's time, so an
advisory said it was first published after the commit that first added it."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.publishing import advisories

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"


def _files(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path -> sha256 of its bytes)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_second_report_from_the_same_records_changes_no_file(tmp_path: Path) -> None:
    """`report` twice into a copy of the committed results: the second writes every file byte for byte as the
    first did (the table, the advisories and the judge's tables, matrix.json, the site, the pictures, the
    reproducers, JUnit)."""
    copy = tmp_path / "results"
    shutil.copytree(RESULTS, copy, ignore=shutil.ignore_patterns("site", "repros", "junit", "matrix.json"))
    report = [sys.executable, "-m", "harness", "report", "--results-dir", str(copy)]
    first = subprocess.run(report, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    after_first = _files(copy)
    assert "advisories/index.json" in after_first and "matrix.json" in after_first
    second = subprocess.run(report, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    after_second = _files(copy)
    changed = sorted(p for p in after_first.keys() | after_second.keys() if after_first.get(p) != after_second.get(p))
    assert changed == [], f"a report from the same records rewrote {changed[:10]}"


def _advisory(published: str, summary: str = "S1: a failure") -> dict:
    return {"id": "x_COMPAT-MATRIX-S1-cpu-0", "modified": published, "published": published, "summary": summary}


def test_published_is_set_once_and_modified_moves_only_with_the_content() -> None:
    committed = _advisory("2026-11-24T07:30:00Z") | {"modified": "2026-11-28T10:00:00Z"}
    # The same content made again from records that now reach further (a growth): nothing moves.
    again = advisories.settle(_advisory("2026-11-24T07:30:00Z"), committed, now="2026-12-05T12:00:00Z")
    assert (again["published"], again["modified"]) == ("2026-11-24T07:30:00Z", "2026-11-28T10:00:00Z")
    # Its first record retired (the earliest record showing it is now a later one): published stays.
    later = advisories.settle(_advisory("2026-11-27T09:00:00Z"), committed, now="2026-12-05T12:00:00Z")
    assert later["published"] == "2026-11-24T07:30:00Z" and later["modified"] == "2026-11-28T10:00:00Z"
    # The content changed: modified is the report's time, published stays.
    changed = advisories.settle(
        _advisory("2026-11-24T07:30:00Z", "S1: now fixed"), committed, now="2026-12-05T12:00:00Z"
    )
    assert (changed["published"], changed["modified"]) == ("2026-11-24T07:30:00Z", "2026-12-05T12:00:00Z")
    # A published time later than the first record showing the failure (what every regeneration once wrote) is
    # the first record's: an advisory never says it was published after its evidence.
    wrong = committed | {"published": "2026-12-05T10:56:09Z", "modified": "2026-12-05T10:56:09Z"}
    fixed = advisories.settle(_advisory("2026-11-24T07:30:00Z"), wrong, now="2026-12-05T12:00:00Z")
    assert (fixed["published"], fixed["modified"]) == ("2026-11-24T07:30:00Z", "2026-12-05T10:56:09Z")
    # Its records were re-measured since the commit that first added its file (the earliest record showing it is now
    # later than that commit): the commit is its first publication.
    readded = advisories.settle(
        _advisory("2026-11-29T01:44:49Z"), wrong, "2026-12-05T12:00:00Z", "2026-11-28T13:00:25+00:00"
    )
    assert readded["published"] == "2026-11-28T13:00:25Z" and readded["modified"] == "2026-12-05T10:56:09Z"
    # A new advisory: published when its failure was first shown, modified now.
    new = advisories.settle(
        _advisory("2026-11-24T07:30:00+00:00".replace("+00:00", "Z")), None, now="2026-12-05T12:00:00+00:00"
    )
    assert (new["published"], new["modified"]) == ("2026-11-24T07:30:00Z", "2026-12-05T12:00:00Z")
    # One that does not read as times is published anew, never a traceback.
    odd = advisories.settle(
        _advisory("2026-11-24T07:30:00Z"), committed | {"published": "soon"}, now="2026-12-05T12:00:00Z"
    )
    assert odd["published"] == "2026-11-24T07:30:00Z"


def _first_added(path: Path) -> str | None:
    """When git first added the file (its committer time, UTC), or None outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "log", "--diff-filter=A", "--format=%cI", "--", str(path.relative_to(REPO))],
            capture_output=True, text=True, cwd=REPO, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    lines = done.stdout.split()
    return advisories._osv_time(lines[-1]) if lines else None


def test_no_committed_advisory_says_it_was_published_after_the_commit_that_added_it() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no commit to compare with")
    index = json.loads((RESULTS / "advisories" / "index.json").read_text())
    late = []
    for entry in index:
        path = RESULTS / "advisories" / entry["file"]
        advisory = json.loads(path.read_text())
        added = _first_added(path)
        assert advisory["published"] <= advisory["modified"], entry["id"]
        if added is not None and advisory["published"] > added:
            late.append((entry["id"], advisory["published"], added))
    assert late == []
