"""One judge, two runtimes: the tables Python compiled (results/advisories/judge.json) are judged by Python
(`knowledge/judge.py`, `knowledge/ways_out.py`) and by the page's `judge.js` (under node here, in Chromium in
test_site_answer.py) on one table of test vectors, and the two give the same answers and the same ways out. The
vectors are every measured stack a failure holds, its neighbours no record holds, prefixes, partial inputs, loose
ranges, every setup the vocabulary can say and every device and GPU count."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from harness.knowledge.judge import Query, evaluate, fix_answers
from harness.knowledge.ways_out import way_out
from harness.publishing.advisories import read_tables
from tests.conftest import REPO_ROOT, run_node

TABLES = REPO_ROOT / "results" / "advisories"
JUDGE_JS = REPO_ROOT / "harness" / "publishing" / "site_judge.js"
SETUPS = [
    {}, {"engine": "fsdp2", "adapter": "lora"}, {"engine": "fsdp1", "adapter": "dora", "loop": "hand"},
    {"engine": "zero3"}, {"adapter": "qlora"}, {"engine": "fsdp2", "state_dict": "sharded_state_dict"},
    {"loop": "trainer", "engine": "ddp", "adapter": "lora"}, {"adapter": "lora", "loop": "accelerate"},
    {"loop": "trainer", "engine": "zero3", "use_reentrant": "true"}, {"adapter": "qlora", "use_reentrant": "false"},
    {"loop": "trainer", "engine": "fsdp2", "state_dict": "sharded_state_dict"}, {"zero3_gather_16bit": "true"},
]  # fmt: skip
#: The answers whose fixes are judged too (each fix at the query, as the page and `audit` show them).
WITH_FIXES = ("applies", "applies-if", "range", "undecided", "cleared")
WHERE = [(None, None), ("cpu", 0), ("cuda", 1), ("cuda", 2), ("cuda", 4)]


def vectors(tables: dict[str, Any], count: int = 160, seed: int = 20261128) -> list[dict[str, Any]]:
    """Queries: measured stacks (a failure's points), the same with one package moved to a release no record holds,
    cut to a prefix or left out, with loose ranges, each under a setup and a place from the lists above."""
    rng = random.Random(seed)
    stacks = []
    for failure in tables["failures"]:
        for stack, *_ in failure["points"][:: max(1, len(failure["points"]) // 3)]:
            stacks.append(dict(zip(failure["depends"], stack, strict=True)))
    made = []
    for n in range(count):
        versions = dict(rng.choice(stacks))
        kind = n % 6
        package = rng.choice(sorted(versions))
        if kind == 1:  # a release no record holds (a patch above, or far above)
            parts = versions[package].split(".")
            versions[package] = ".".join([*parts[:-1], str(int(parts[-1]) + 7)]) if rng.random() < 0.5 else "99.0"
        query = Query(versions, dict(rng.choice(SETUPS)), *rng.choice(WHERE))
        if kind == 2:
            query.prefix = [package]
            query.versions[package] = ".".join(versions[package].split(".")[:2])
        elif kind == 3:
            query.partial = True
            del query.versions[package]
        elif kind == 4:
            del query.versions[package]
            query.ranges = {package: rng.sample(tables["releases"].get(package, []), 2)}
        elif kind == 5:
            query.ignore = [rng.choice(tables["failures"])["id"]]
        made.append(query.as_json())
    return made


def python_answers(tables: dict[str, Any], queries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for given in queries:
        query = Query(**given)
        answers = evaluate(tables, query)
        failures = {f["id"]: f for f in tables["failures"]}
        fixes = {a["id"]: fix_answers(tables, failures[a["id"]], query) for a in answers if a["state"] in WITH_FIXES}
        found.append({"answers": answers, "way_out": way_out(tables, query, answers), "fixes": fixes})
    return json.loads(json.dumps(found))


def node_answers(tmp_path: Path, tables_file: Path, queries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (tmp_path / "queries.json").write_text(json.dumps(queries))
    script = (
        "const fs = require('fs'); const judge = require(process.argv[1]);"
        "const tables = JSON.parse(fs.readFileSync(process.argv[2]));"
        "const queries = JSON.parse(fs.readFileSync(process.argv[3]));"
        "const out = queries.map((q) => { const a = judge.evaluate(tables, q);"
        " const fixes = {}; for (const x of a) { if (" + json.dumps(list(WITH_FIXES)) + ".includes(x.state))"
        " fixes[x.id] = judge.fixAnswers(tables, tables.failures.find((f) => f.id === x.id), q); }"
        " return { answers: a, way_out: judge.wayOut(tables, q, a), fixes }; });"
        "process.stdout.write(JSON.stringify(out));"
    )
    return run_node(script, str(JUDGE_JS), str(tables_file), str(tmp_path / "queries.json"))


def test_python_and_the_page_judge_every_vector_alike(tmp_path: Path) -> None:
    tables = read_tables(TABLES)
    queries = vectors(tables)
    expected = python_answers(tables, queries)
    found = node_answers(tmp_path, TABLES / "judge.json", queries)
    states = {a["state"] for e in expected for a in e["answers"]}
    assert {"applies", "undecided", "clean", "not-applicable"} <= states, states  # the vectors reach every fold
    assert any(e["way_out"]["pins"] for e in expected)
    judged = {(f["state"], f["sure"]) for e in expected for fixes in e["fixes"].values() for f in fixes}
    assert {("fixes", "exact"), ("unmeasured", "unmeasured")} <= judged, judged  # the fixes' fold is reached too
    for query, mine, theirs in zip(queries, expected, found, strict=True):
        assert theirs == mine, json.dumps(query)


@pytest.mark.parametrize("broken", ["segments", "points"])
def test_the_agreement_test_can_fail(tmp_path: Path, broken: str) -> None:
    """A judge.js that read one decision otherwise would be caught: the same comparison over a table whose copy for
    node has one failure's segments or points changed."""
    tables = read_tables(TABLES)
    failure = next(f for f in tables["failures"] if f["conditions"] and f["points"])
    changed = json.loads(json.dumps(tables))
    target = next(f for f in changed["failures"] if f["id"] == failure["id"])
    if broken == "segments":
        for segments in target["segments"].values():
            for segment in segments:
                segment[4] = {"affected": "clear", "clear": "affected"}.get(segment[4], segment[4])
    else:
        for point in target["points"]:
            point[3] = {"shows": "passes", "passes": "shows"}.get(point[3], point[3])
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    point = next(p for p in failure["points"] if p[3] in ("shows", "passes"))
    stack = dict(zip(failure["depends"], point[0], strict=True))
    package = failure["conditions"][0]
    decided = next(s for s in failure["segments"][package] if s[4] in ("affected", "clear"))
    queries = [Query(stack).as_json(), Query({package: decided[0]}, partial=True).as_json()]  # a point; a segment
    assert node_answers(tmp_path, tmp_path / "changed.json", queries) != python_answers(tables, queries)
