"""Pairs of releases measured not to work together are never proposed again (issue 73): the committed `--fix
--measure` of 2026-11-28 recorded transformers 5.15.0's Trainer calling `Accelerator.unwrap_model(keep_torch_compile=
...)`, which accelerate 1.2.0 refuses. What a run learned reaches the next answer: the judge's tables name the pair,
no way out pairs a newer transformers with that accelerate or an older one (unless a record shows them running), the
old stack's `--fix` pins audited again leave applying only what the answer declared, and `--fix --measure` names the
pair its runs failed through and the way round it measures next."""

from __future__ import annotations

from functools import cache
from typing import Any

from harness.knowledge.broken import measured_broken, mismatched_call
from harness.knowledge.judge import Query, evaluate
from harness.knowledge.ways_out import way_out
from harness.publishing.advisories import read_tables
from harness.recording.records import read_records
from harness.tools.answers import audit
from harness.tools.answers.audit_prove import prove, refused_pairs, way_round
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "results"
OLD = {"torch": "2.4.1", "transformers": "4.46.3", "peft": "0.13.2", "accelerate": "1.0.1", "deepspeed": "0.15.4"}
ZERO3 = {"engine": "zero3", "adapter": "lora"}


@cache
def tables() -> dict[str, Any]:
    return read_tables(RESULTS / "advisories")


def test_the_measured_refusal_names_its_caller_and_callee() -> None:
    found = []
    for path in (RESULTS / "measured").glob("*/runs/*/records.jsonl*"):
        found += [r for r in read_records(path.with_suffix("") if path.suffix == ".xz" else path)
                  if "keep_torch_compile" in str(r.get("message"))]  # fmt: skip
    calls = {mismatched_call(r) for r in found}
    assert ("transformers", "accelerate") in calls, calls
    pair = next(b for b in tables()["broken"] if b.get("caller") == "transformers" and b.get("callee") == "accelerate")
    assert pair["versions"] == {"transformers": "5.15.0", "accelerate": "1.2.0"} and "keep_torch_compile" in pair["why"]


def test_no_newer_caller_with_an_older_callee_unless_measured_together() -> None:
    base = {"torch": "2.6.0", "peft": "0.21.0"}
    assert measured_broken(tables(), base, {"transformers": "5.15.0", "accelerate": "1.2.0"})
    assert measured_broken(tables(), base, {"transformers": "5.24.0", "accelerate": "1.2.0"})
    assert measured_broken(tables(), base, {"transformers": "5.24.0", "accelerate": "1.0.1"})
    assert not measured_broken(tables(), base, {"transformers": "5.24.0", "accelerate": "1.5.2"})
    assert not measured_broken(tables(), base, {"transformers": "5.10.1", "accelerate": "1.2.0"})  # an older caller


def test_the_old_stacks_pins_audited_again_leave_only_what_was_declared() -> None:
    query = Query(dict(OLD), dict(ZERO3))
    before = evaluate(tables(), query)
    found = way_out(tables(), query, before)
    assert found["pins"], found
    stack = OLD | found["pins"]
    assert not (stack["transformers"].startswith("5.") and stack["accelerate"] in ("1.0.1", "1.1.0", "1.2.0")), stack
    after = evaluate(tables(), Query(stack, dict(ZERO3)))
    applying = {a["id"] for a in after if a["state"] in ("applies", "applies-if")}
    assert applying <= set(found["stays"]) | set(found.get("still", [])) | set(found.get("brings", [])), found
    applied = {a["id"] for a in before if a["state"] in ("applies", "applies-if")}
    assert not set(found.get("brings", [])) & applied  # a failure it brings is said as brought, never as left
    assert "searched" in found and "stacks judged" in found["searched"]


def test_the_way_round_a_refused_pair_moves_the_refusing_package() -> None:
    pins = {"torch": "2.5.1", "transformers": "5.15.0", "peft": "0.21.0", "accelerate": "1.2.0", "deepspeed": "0.19.3"}

    class Found:
        def __init__(self) -> None:
            self.tables = tables()

    refused = refused_pairs(Found(), pins, ["S4-zero3-lora-checkpoint"])
    assert [b["callee"] for b in refused] == ["accelerate"], refused
    around = way_round(tables(), pins, refused[0])
    assert around is not None and "accelerate" in around, around
    assert around["accelerate"] != "1.2.0" and not measured_broken(tables(), pins, around)


def test_a_condition_on_the_model_does_not_block_the_proof_unless_strict(tmp_path: Any) -> None:
    """Only APPLIES IF answers (S10's adapter names) at the 2025-11-14 stack with a loop by hand: nothing to build,
    exit 0; --strict would build the way out (not run here)."""
    stack = {"torch": "2.9.1", "transformers": "4.57.1", "peft": "0.18.0", "accelerate": "1.11.0"}
    query = audit.query_of(tables(), stack, {"adapter": "lora", "loop": "hand"}, [], False, 0, None, [])
    report = audit.audit(tables(), query)
    assert {a["state"] for a in report.answers} & {"applies-if"} and "applies" not in {a["state"] for a in
                                                                                       report.answers}  # fmt: skip
    lines, code = prove(report, tmp_path)
    assert code == 0 and "nothing to prove (--strict proves those too)" in lines[0], lines


def test_a_clone_s_file_times_never_send_the_judge_back_to_the_records(tmp_path: Any) -> None:
    """A fresh clone sets every file's time anew, in checkout order, so the measured runs' records can be newer than
    judge.json: the tables name the measured runs they were compiled with (run id -> records), so only a run measured
    since, or one holding more records now, makes `audit` compile the tables from the records again."""
    import os
    import shutil
    import time

    from harness.knowledge.store import Store

    results = tmp_path / "results"
    for folder in ("measured", "advisories"):
        shutil.copytree(RESULTS / folder, results / folder)
    compiled = read_tables(results / "advisories")
    assert compiled["measured_runs"] == Store(results).measured_runs != {}, "premise: the report's tables name them"
    later = time.time() + 3600
    for path in results.glob("measured/*/runs/*/*"):
        os.utime(path, (later, later))
    assert not audit.measured_since(results, compiled), "newer file times alone are no new measurement"
    run = next(results.glob("measured/*/runs/*"))
    shutil.copytree(run, run.parent / "measured-00000000-20261205T000000Z-0000")
    assert audit.measured_since(results, compiled), "a run measured since the tables is read from its records"
