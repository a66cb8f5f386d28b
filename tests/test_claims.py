"""Prose traces to records: every run that the README, the docs or a NOTES file names exists in the checkout, and
holds records of each scenario named beside it.

These tests exist because prose ran ahead of records once: the README said S8 found a hang "until the job's limit"
on 2025-11-14, while every S8 record of that day was a failure after about five seconds. A sentence that names a
run can now be followed to it; a sentence that names a run nobody committed, or a scenario that run never ran,
fails here.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from harness.recording.records import read_records
from tests.conftest import REPO_ROOT

#: A run id as the harness makes them: profile, a UTC timestamp, and (since 2026-11-24) four hex digits.
RUN_ID = re.compile(r"\b[a-z][a-z0-9-]*?-20\d{6}T\d{6}Z(?:-[0-9a-f]{4})?\b")
#: A scenario named in prose: 'S8', 'S2-FSDP' or a full id; 'S1/S4' names two.
SCENARIO = re.compile(r"(?<![\w/.-])S([1-8])(?![\d\w])")


def prose_files() -> list[Path]:
    found = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("**/*.md"))]
    return found + sorted((REPO_ROOT / "results").glob("**/NOTES.md"))


@cache
def committed_runs() -> dict[str, Path]:
    """run id -> where its records are: every run directory under results/, and the one-file runs kept beside
    a NOTES.md (results/world-size/<id>.records.jsonl)."""
    runs = {
        meta.parent.name: meta.parent / "records.jsonl" for meta in (REPO_ROOT / "results").glob("**/runs/*/meta.json")
    }
    for path in (REPO_ROOT / "results").glob("**/*.records.jsonl"):
        runs[path.name.removesuffix(".records.jsonl")] = path
    for meta in (REPO_ROOT / "results" / "adapter-grid").glob("*/meta.json"):  # S10's grid runs: pairs, not records
        runs[meta.parent.name] = meta
    return runs


@cache
def scenarios_of(run_id: str) -> frozenset[str]:
    """The scenario modes ('S8') the run's records hold."""
    path = committed_runs()[run_id]
    if path.name == "meta.json":
        return frozenset({json.loads(path.read_text())["scenario"].split("-")[0]})
    return frozenset(r["scenario"].split("-")[0] for r in read_records(path, warn=False))


def blocks(text: str) -> list[str]:
    """The units a claim lives in: paragraphs, list items and table rows (a sentence wrapped over lines stays whole)."""
    found: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        starts_item = re.match(r"^\s*(?:[-*] |\d+\. |\|)", line) is not None
        if not line.strip() or starts_item or line.startswith("#"):
            if current:
                found.append(" ".join(current))
            current = [] if not line.strip() or line.startswith("#") else [line]
            if line.startswith("|") and current:
                found.append(line)
                current = []
            continue
        current.append(line)
    if current:
        found.append(" ".join(current))
    return found


def test_every_named_run_exists() -> None:
    missing = []
    for path in prose_files():
        for run_id in sorted(set(RUN_ID.findall(path.read_text()))):
            if run_id not in committed_runs():
                missing.append(f"{path.relative_to(REPO_ROOT)}: {run_id}")
    assert not missing, "runs named in prose that the checkout does not hold:\n" + "\n".join(missing)


def sentences(block: str) -> list[str]:
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", block)


def own_run(path: Path) -> str | None:
    """The run a NOTES.md under results/runs/<id>/ is about (its sentences speak of it without naming it)."""
    return path.parent.name if path.parent.parent.name == "runs" and path.parent.name in committed_runs() else None


def test_a_scenario_named_beside_a_run_is_one_that_run_holds() -> None:
    """In each sentence that names runs, every scenario it names is held by one of them (or, in a run's own
    NOTES.md, by that run)."""
    wrong = []
    for path in prose_files():
        for block in blocks(path.read_text()):
            for sentence in sentences(block):
                named_runs = [r for r in set(RUN_ID.findall(sentence)) if r in committed_runs()]
                if not named_runs:
                    continue
                held = set().union(*(scenarios_of(r) for r in [*named_runs, *filter(None, [own_run(path)])]))
                for mode in sorted({f"S{m}" for m in SCENARIO.findall(sentence)} - held):
                    wrong.append(f"{path.relative_to(REPO_ROOT)}: {mode} beside {', '.join(sorted(named_runs))}")
    assert not wrong, "a scenario named beside runs that hold none of its records:\n" + "\n".join(wrong)


def test_the_claims_check_fails_on_a_run_that_does_not_exist(tmp_path: Path) -> None:
    text = "S8 meets the hang on today's stack (run `gpu-history-ws2-20991231T000000Z-dead`)."
    assert RUN_ID.findall(text) == ["gpu-history-ws2-20991231T000000Z-dead"]
    assert "gpu-history-ws2-20991231T000000Z-dead" not in committed_runs()
    [block] = blocks(text)
    assert SCENARIO.findall(block) == ["8"] and sentences(block) == [text]
    # A real run beside a scenario it never ran: S8 has no record in the CPU S7 history run.
    assert "S8" not in scenarios_of("history-20261126T013700Z-b500")


def test_the_readme_is_a_front_door() -> None:
    """At most 200 lines, the two commands as CI runs them, and every docs page it links to exists."""
    text = (REPO_ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert 'python3 -m pip install "nox[uv]>=2025.2.9" && python3 -m nox -s lint tests' in text
    assert 'python3 -m pip install "nox[uv]>=2025.2.9" && python3 -m nox -s matrix' in text
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert 'python3 -m pip install -q "nox[uv]>=2025.2.9" && python3 -m nox -s lint tests' in ci
    links = re.findall(r"\]\((docs/[\w.-]+\.md)\)", text)
    assert len(set(links)) >= 9 and all((REPO_ROOT / link).is_file() for link in links)
    for page in (REPO_ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\((?!https?:|#)([^)#]+)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"
