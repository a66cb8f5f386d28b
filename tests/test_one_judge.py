"""Every answer is a view of one judge: over every stack the committed atlas measured and every setup its records
ran, the glance cell, `lookup`, `check` and `audit` agree on the same failures and states; no answer depends on hash
order; every way out, judged again, leaves nothing applying that a release can end; and the cases the one-judge issue
names answer as the records show (issue 66)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from harness.define import setup as vocabulary
from harness.knowledge.atlas import Atlas
from harness.knowledge.judge import Query
from harness.knowledge.ways_out import way_out
from harness.publishing.glance import glance_tables
from harness.tools.answers import audit, check, lookup
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "results"
FAILING = ("applies", "applies-if")


@cache
def atlas() -> Atlas:
    return Atlas(RESULTS)


def questions() -> list[tuple[Any, dict[str, str]]]:
    """(row, setup) for every measured stack and every setup its scenarios' records ran there, and no setup."""
    found = []
    for row in atlas().rows:
        setups = {json.dumps(atlas().setup_of(r), sort_keys=True) for r in row.records}
        found += [(row, {}), *((row, json.loads(s)) for s in sorted(setups) if s != "{}")]
    return found


def failing(answers: list[dict[str, Any]], scenario: str, exact_only: bool = True) -> set[str]:
    return {a["id"] for a in answers if a["scenario"] == scenario and a["state"] in FAILING
            and (a["sure"] == "exact" or not exact_only)}  # fmt: skip


def test_the_glance_lookup_check_and_audit_agree_on_every_measured_stack_and_setup() -> None:
    found = atlas()
    cells = {
        ("cuda" if t["device"] == "GPU" else "cpu", t["ranks"], r["cell"], json.dumps(r["versions"], sort_keys=True),
         e["scenario"]): e
        for t in glance_tables(found) for r in t["rows"] for e in r["entries"]
    }  # fmt: skip
    tables = found.tables
    asked = 0
    for row, setup in questions():
        gpus = row.ranks if row.device == "cuda" else 0
        by_audit = audit.audit(tables, audit.query_of(tables, row.versions, setup, [], False, gpus, None, [])).answers
        by_lookup = found.judge(lookup.query_of(row.versions, setup, row.device, gpus))
        for scenario in sorted({r["scenario"] for r in row.records}):
            asked += 1
            mine = failing(by_audit, scenario)
            assert mine == failing(by_lookup, scenario), (row.cell, setup, scenario)
            entry = cells[(row.device, row.ranks, row.cell, json.dumps(row.versions, sort_keys=True), scenario)]
            glance_says = any(
                vocabulary.agrees(f["setup"], setup) and not any(_holds(setup, c) for c in f["unless"])
                for f in map(json.loads, entry["failing"])
            )
            assert glance_says == bool(mine), (row.cell, setup, scenario, entry["failing"], by_audit)
            if not setup and entry["text"] != "-":
                assert (entry["state"] in ("target", "failures")) == bool(mine), (row.cell, scenario, entry, mine)
                live = {scenario: [r for r in row.records if r["scenario"] == scenario]}
                # check's exit code is its own runs': where the row's own records show the target, the judge does
                assert not check.reproduced_here(live, found, found.specs) or mine, (row.cell, scenario)
    assert asked >= 378


def test_every_glance_symbol_is_the_judges() -> None:
    """Every entry of every glance row, not only the rows' own scenarios: ✗ exactly where the judge says a failure of
    the scenario applies, measured at exactly the row's releases (issue 73: 43 entries showed '-' there)."""
    found = atlas()
    rows = {(r.cell, json.dumps(r.versions, sort_keys=True)): r for r in found.rows}
    checked = 0
    for table in glance_tables(found):
        for row in table["rows"]:
            answers = found.judge(rows[(row["cell"], json.dumps(row["versions"], sort_keys=True))].query())
            for entry in row["entries"]:
                assert entry["text"].startswith("✗") == bool(failing(answers, entry["scenario"])), (row["label"], entry)
                checked += 1
    assert checked > 1000


def _holds(setup: dict[str, str], setting: dict[str, str]) -> bool:
    return all(setup.get(k) == v for k, v in setting.items())


def test_no_answer_depends_on_hash_order(tmp_path: Path) -> None:
    """The judge's tables and a way out, made in two processes with other string hashes, are byte for byte one."""
    script = (
        "import json, sys; from pathlib import Path; from harness.knowledge.atlas import Atlas;"
        "from harness.knowledge.judge import Query; from harness.knowledge.ways_out import way_out;"
        "a = Atlas(Path(sys.argv[1])); q = Query({'torch': '2.9.1', 'transformers': '4.57.1', 'peft': '0.18.0',"
        " 'accelerate': '1.11.0', 'deepspeed': '0.18.2', 'bitsandbytes': '0.48.2'}, {}, 'cpu', 0);"
        "print(json.dumps([a.tables, way_out(a.tables, q)], sort_keys=True))"
    )
    outputs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, "-c", script, str(RESULTS)], capture_output=True, text=True,
                              cwd=REPO_ROOT, env=env, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert (
        json.loads(outputs[0])[0]["failures"]
        == json.loads((RESULTS / "advisories" / "judge.json").read_text())["failures"]
    ), "the committed tables are what the records give today"


def test_every_way_out_judged_again_leaves_nothing_a_release_can_end() -> None:
    found = atlas()
    tables = found.tables
    checked = 0
    for row, setup in questions()[::7]:
        query = Query(dict(row.versions), setup, row.device, row.ranks if row.device == "cuda" else 0)
        answers = found.judge(query)
        result = way_out(tables, query, answers)
        if not result["pins"]:
            continue
        after = found.judge(Query(query.versions | result["pins"], setup, query.device, query.gpus))
        left = {a["id"] for a in after if a["state"] in FAILING}
        declared = set(result["stays"]) | set(result.get("still", [])) | set(result.get("brings", []))
        assert left <= declared, (row.cell, setup, result)  # nothing applies that the answer did not declare
        before = {a["id"] for a in answers if a["state"] in FAILING}
        assert set(result.get("brings", [])).isdisjoint(before) and set(result.get("still", [])) <= before
        if not result["none"]:
            assert left <= before, (row.cell, setup, "a way out brings a failure", left - before)
        for package, release in result["pins"].items():
            assert release in tables["releases"][package], (package, release)  # each release it names was measured
        checked += 1
    assert checked >= 5


def test_the_cases_the_issue_names() -> None:
    found = atlas()
    tables = found.tables

    def answers(versions: dict[str, str], words: str, gpus: int | None, partial: bool = True) -> list[dict]:
        setup = vocabulary.parse_words([words])
        return audit.audit(tables, audit.query_of(tables, versions, setup, [], partial, gpus, None, [])).answers

    # The 2026-04-15 GPU stack, FSDP2 + LoRA on 2 GPUs: the resume failure is not claimed there (another failure).
    april = {"torch": "2.11.0", "transformers": "5.5.4", "peft": "0.19.0", "accelerate": "1.13.0"}
    resume = [a for a in answers(april, "fsdp2,lora", 2) if a["scenario"] == "S9-identity-resume"]
    assert resume and all(a["state"] not in FAILING for a in resume), resume
    # FSDP1 + DoRA + the Trainer on 2 GPUs at a stack whose records show S1 failing for that setup: reported.
    november = {"torch": "2.11.0", "transformers": "5.17.0", "peft": "0.21.0", "accelerate": "1.15.0"}
    s1 = [a for a in answers(november, "fsdp1,dora,trainer", 2) if a["scenario"] == "S1-dora-fsdp-checkpoint"]
    assert any(a["state"] == "applies" and a["sure"] == "exact" for a in s1), s1
    # FSDP2 + QLoRA: the S2 FSDP failure of the configs that ran FSDP2.
    qlora = {"torch": "2.11.0", "transformers": "4.57.1", "peft": "0.18.0", "accelerate": "1.11.0",
             "bitsandbytes": "0.48.2"}  # fmt: skip
    s2 = [a for a in answers(qlora, "fsdp2,qlora", 2) if a["scenario"] == "S2-qlora-fsdp-grad-flags"]
    assert any(a["state"] == "applies" and "FSDP2" in a["when"] for a in s2), s2
    # lookup and audit agree on the bitsandbytes 0.48.2 CPU stack.
    cpu = {"torch": "2.9.1", "transformers": "4.57.1", "bitsandbytes": "0.48.2"}
    by_lookup = found.judge(lookup.query_of(cpu, {}, "cpu", 0))
    by_audit = answers(cpu, "", 0)
    assert {(a["id"], a["state"]) for a in by_audit} == {
        (a["id"], a["state"]) for a in by_lookup if a["state"] in audit.SHOWN
    }


def test_label_smoothing_ends_with_its_own_release_and_rows_say_what_ran() -> None:
    """At transformers 4.47.0 the label-smoothing config's failure is its own (ended by 5.15.0), never folded into the
    other LoRA configs' (ended by 4.47.1); the 2026-11-24 rows name the transformers each half of its records ran."""
    found = atlas()
    answers = found.judge(lookup.query_of({"transformers": "4.47.0"}, {}, "cpu", 0))
    smoothing = [a for a in answers if a["state"] == "applies-if" and "label_smoothing" in a.get("condition", "")]
    assert smoothing
    result = way_out(found.tables, lookup.query_of({"transformers": "4.47.0"}, {}, "cpu", 0), answers)
    notes = result["notes"][smoothing[0]["id"]]
    assert [(n["package"], n["release"]) for n in notes] == [("transformers", "5.15.0")]
    labels = {r.versions["transformers"] for r in found.rows if r.day == "2026-11-24" and r.device == "cpu"}
    assert labels == {"5.23.0", "5.24.0"}


def test_no_record_of_a_failure_contradicts_its_conditions() -> None:
    """The releases a failure's conditions decide (affected, clear) agree with every record of its configs: none of them
    showed it where the segments say clear, or passed where every condition says affected (such a config has another
    history and is a failure of its own)."""
    from harness.knowledge.judge import _decide

    checked = 0
    for failure in atlas().tables["failures"]:
        for stack, _setup, _size, state, ref in failure["points"]:
            at = dict(zip(failure["depends"], stack, strict=True))
            decided = [_decide(failure["segments"][p], at[p], False)[0] for p in failure["conditions"]]
            if not decided or state not in ("shows", "passes"):
                continue
            checked += 1
            if state == "shows":
                assert "clear" not in decided, (failure["id"], at, failure["refs"][ref])
            else:
                assert not all(d == "affected" for d in decided), (failure["id"], at, failure["refs"][ref])
    assert checked >= 300


def test_conditions_are_words_a_user_can_check_never_a_repr() -> None:
    """What an advisory says of its setups and its condition on the user's model reads as words: no Python dict or
    list printed, no summary cut mid-word."""
    for path in sorted((RESULTS / "advisories").glob("x_*.json")):
        advisory = json.loads(path.read_text())
        facts = advisory["database_specific"]
        said = [*facts["setups"], facts.get("applies_if") or "", facts.get("measured_with") or "", advisory["summary"]]
        for text in said:
            assert "{" not in text and "[" not in text.replace("[0]", ""), (advisory["id"], text)
        summary = advisory["summary"]
        assert len(summary) <= 200 and (not summary.endswith("…") or summary[-2] != " "), summary


def test_lookup_and_audit_agree_on_stacks_no_record_holds() -> None:
    """The judge vectors (measured stacks, their neighbours no record holds, packages left out) asked as `lookup` and
    as `audit` of a requirements file ask them: the same failures in the same states."""
    from tests.test_judge_vectors import vectors

    found = atlas()
    tables = found.tables
    compared = 0
    for given in vectors(tables):
        if given["prefix"] or given["ranges"] or given["ignore"]:
            continue
        versions = {p: v for p, v in given["versions"].items() if len(v.split(".")) >= 3}
        setup, gpus = given["setup"], given["gpus"]
        by_audit = audit.audit(tables, audit.query_of(tables, versions, setup, [], True, gpus, given["device"], []))
        by_lookup = found.judge(lookup.query_of(versions, setup, given["device"], gpus))
        shown = {(a["id"], a["state"], a["sure"]) for a in by_lookup if a["state"] in audit.SHOWN}
        assert {(a["id"], a["state"], a["sure"]) for a in by_audit.answers} == shown, given
        compared += 1
    assert compared >= 50


def test_an_exact_answer_rests_on_a_record_at_exactly_those_releases() -> None:
    """Every `exact` answer of the property questions is backed by an observation of that failure's configs at exactly
    the asked releases of every package it depends on, of an agreeing setup, on the asked device."""
    found = atlas()
    failures = {f.id: f for f in found.failures}
    checked = 0
    for row, setup in questions()[::3]:
        gpus = row.ranks if row.device == "cuda" else 0
        for answer in found.judge(lookup.query_of(row.versions, setup, row.device, gpus)):
            if answer["sure"] != "exact" or answer["id"] not in failures:
                continue
            failure = failures[answer["id"]]
            backing = [
                o for o in failure.observed
                if all(o.release(p) == row.versions.get(p) for p in failure.depends)
                and vocabulary.agrees(dict(o.setup), setup) and o.device == row.device
            ]  # fmt: skip
            assert backing, (answer["id"], row.cell, setup)
            checked += 1
    assert checked >= 100


def test_a_failure_of_several_configs_applies_only_if_the_model_holds_one_of_their_conditions() -> None:
    """Configs whose flips name the same releases are one failure. Where each holds a condition of its own that they
    do not all share (S10: two heads and three heads; a `lora_q` target and two drawn configs), the failure applies
    if the model holds one of them: never unconditionally, and never on the weaker part they share."""
    found = atlas()
    by_configs = {tuple(sorted(f.config_ids)): f for f in found.failures if f.scenario == "S10-adapter-roundtrip"}
    heads = by_configs[("3758217f60", "f48fc80d47")]
    condition = found.details[heads.id][0]
    assert condition.startswith("one of 2 models: ") and "'score_10'" in condition and " — or — " in condition
    lora_q = next(f for k, f in by_configs.items() if "92575b1e5f" in k and len(k) > 1)
    assert "a LoRA target is named 'lora_q'" in found.details[lora_q.id][0]
    table = next(t for t in found.tables["failures"] if t["id"] == lora_q.id)
    assert table["detail"] == found.details[lora_q.id][0], "the judge's tables hold the same condition"


def test_the_glance_matrix_json_and_the_summary_agree_on_every_entry() -> None:
    """One fold (issue 76): the glance, matrix.json's entries and the summary read the same entry per stack and
    scenario; none of them folds the records again with a pitfall rule of its own."""
    from harness.publishing.publish import matrix_entries
    from harness.publishing.report import _summary

    found = atlas()
    glance = {
        (r["cell"], r["label"], e["scenario"]): e
        for t in glance_tables(found) for r in t["rows"] for e in r["entries"] if e["text"] != "-"
    }  # fmt: skip
    entries = {(e["cell"], e["row"], e["scenario"]): e for e in matrix_entries(found)}
    assert set(glance) == set(entries), "an entry the glance shows and matrix.json does not, or the other way"
    wrong = [
        key
        for key, shown in glance.items()
        if (shown["text"], shown["state"], shown["pitfalls"], shown["judged"])
        != (entries[key]["glance"], entries[key]["target"]["state"], entries[key]["pitfalls"], entries[key]["judged"])
    ]
    assert wrong == [], wrong[:5]
    # The summary's lines are the same entries' verdicts, one row per stack that ran.
    summary = "\n".join(_summary(found))
    for key, entry in entries.items():
        first = entry["headline"][0].replace("<", "&lt;").replace(">", "&gt;")
        assert first.split(" ")[0] in summary, key
    # and a pitfall config is never counted: the node's S1 entry counts no record of a pitfall config
    pitfall_ids = {p.config_id for p in found.pitfalls.values()}
    assert all(not (set(e["pitfalls"]) & {k.rsplit("|", 1)[1] for k in e["keys"]}) for e in entries.values())
    assert pitfall_ids, "the committed atlas has pitfalls: the rule above is exercised"
