"""Applicability: a record that is no evidence about the stack is never a pass or a fail.

The rules (`scenarios/applicability.py`) are tested on records real stacks produced: the committed history run
(torch 2.2 .. 2.15 on CPU), judged again with today's rules. The run-time half (a scenario measuring what ran and
refusing a config that silently degrades) is tested on real runs in `tests/test_matrix_cpu.py`.
"""

from __future__ import annotations

from collections import Counter

import pytest

from harness.recording.packing import records_exist
from harness.recording.records import read_records
from harness.recording.signatures import rename
from scenarios import applicability
from tests.conftest import REPO_ROOT

HISTORY = REPO_ROOT / "results" / "runs" / "history-20261124T071955Z-4cf0" / "records.jsonl"


@pytest.fixture(scope="module")
def history() -> list[dict]:
    return read_records(HISTORY)


def first(records: list[dict], text: str) -> dict:
    return next(r for r in records if text in (r.get("message") or ""))


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("CUDA driver version is insufficient", "FSDP2 in torch 2.4.0 needs CUDA"),
        ("FSDP requires CUDA for streams", "FSDP2 in torch 2.5.1 needs CUDA"),
        ("'Stream' object has no attribute 'record_event'", "FSDP2 in torch 2.6.0 needs CUDA"),
        ("Your setup doesn't support bf16/gpu", "refuses bf16 without a GPU"),
    ],
)
def test_a_machine_limit_on_cpu_is_not_applicable(history: list[dict], message: str, reason: str) -> None:
    record = first(history, message)
    assert record["outcome"] == "fail", "recorded as a failure of the stack at run time"
    judged = rename(record)
    assert (judged["outcome"], judged["signature"]) == ("skip", "not-applicable")
    assert reason in judged["not_applicable"], judged["not_applicable"]
    assert judged["outcome_at_run"] == "fail" and judged["signature_at_run"] == record["signature"]


def test_the_same_failure_on_a_gpu_stays_a_failure(history: list[dict]) -> None:
    """A CUDA error on a GPU machine is the stack's (or the node's) failure: no CPU rule applies there."""
    record = first(history, "FSDP requires CUDA for streams")
    on_gpu = record | {"hardware": {**record["hardware"], "device": "cuda"}}
    assert rename(on_gpu)["outcome"] == "fail"


def test_bitsandbytes_before_cpu_4bit_is_not_applicable_and_after_it_is_not_excused(history: list[dict]) -> None:
    empty = next(
        r
        for r in history
        if r["outcome"] == "fail"
        and r.get("exc_type", "").endswith("AssertionError")
        and not r["message"]
        and "/bitsandbytes/" in r.get("traceback", "")
    )
    judged = rename(empty)
    assert judged["outcome"] == "skip" and "has no 4-bit on CPU (it came with 0.46.0)" in judged["not_applicable"]
    newer = empty | {"versions": {**empty["versions"], "bitsandbytes": "0.48.2"}}
    assert rename(newer)["outcome"] == "fail", "bitsandbytes with a CPU backend gets no excuse"
    assert rename(newer)["signature"] == "bnb-4bit-assert"


def test_a_qlora_pass_that_ran_unquantized_is_not_a_pass(history: list[dict]) -> None:
    """The audit's worst case: a "4bit" config that passed with the model loaded unquantized ("No GPU found")."""
    passes = [r for r in history if r["outcome"] == "pass" and (r.get("config") or {}).get("base") == "4bit"]
    degraded = [r for r in passes if r.get("path") == "frozen-base"]
    assert degraded, "the committed history run holds such passes"
    for record in degraded:
        judged = rename(record)
        assert judged["outcome"] == "skip" and judged["reported_outcome"] == "pass"
        assert judged["not_applicable"].startswith("declared a 4bit base, but a frozen-base base ran")
    really_4bit = [r for r in passes if r.get("path") == "4bit"]
    assert really_4bit and all(rename(r)["outcome"] == "pass" for r in really_4bit)


def test_measured_setup_that_differs_from_the_declared_one_is_not_applicable() -> None:
    base = {"outcome": "pass", "signature": None, "config": {"base": "manual-4bit"}, "hardware": {"device": "cpu"}}
    quantized = base | {"setup": {"linear4bit_modules": 4, "quantized_weights": 4}}
    assert applicability.reason(quantized) is None
    assert "no weight was quantized" in applicability.reason(base | {"setup": {"quantized_weights": 0}})
    fsdp = {"outcome": "fail", "signature": "x", "config": {}, "setup": {"fsdp_declared": "fsdp1", "fsdp": "fsdp2"}}
    assert applicability.reason(fsdp) == "declared fsdp1, but fsdp2 wrapped the model"


def test_no_failure_of_the_history_run_is_left_unnamed(history: list[dict]) -> None:
    """Every failure of the committed history run has a name with today's rules (none `unclassified-`)."""
    names = Counter(rename(r)["signature"] for r in history if rename(r)["outcome"] in ("fail", "flaky"))
    unnamed = {name: n for name, n in names.items() if name.startswith("unclassified-")}
    assert not unnamed, unnamed


def test_distinct_failures_get_distinct_names() -> None:
    """Quoted identifiers are part of a name, and set print order is not."""
    from harness.recording.signatures import exception_signature, normalise_message

    a = exception_signature("builtins.AttributeError", "'Stream' object has no attribute 'wait_event'")
    b = exception_signature("builtins.AttributeError", "'Tensor' object has no attribute 'grad_fn_x'")
    assert a != b
    assert normalise_message("dtype but got {torch.bfloat16, torch.float32}") == normalise_message(
        "dtype but got {torch.float32, torch.bfloat16}"
    )
    tb = 'File "/x/site-packages/bitsandbytes/functional.py", line 9, in quantize_4bit\n'
    other = 'File "/x/site-packages/torch/nn/functional.py", line 9, in linear\n'
    assert exception_signature("builtins.ValueError", "", tb) != exception_signature("builtins.ValueError", "", other)


def test_committed_history_run_exists() -> None:
    assert records_exist(HISTORY)  # committed runs are packed (records.jsonl.xz)


def test_a_trainer_pass_that_ran_another_fsdp_than_declared_is_not_applicable() -> None:
    """The node's Trainer S1 config declared FSDP1 and transformers 5 wrapped the model with FSDP2 (its default):
    the record said FSDP1. Judged today, those passes are not applicable, saying which FSDP ran."""
    run = REPO_ROOT / "results" / "runs" / "gpu-trainer-20261122T001134Z" / "records.jsonl"
    passes = [r for r in read_records(run) if r["outcome"] == "pass" and r.get("path") == "trainer-fsdp2"]
    declared_fsdp1 = [r for r in passes if "fsdp2" not in r["variant"].split("+")]
    assert declared_fsdp1
    assert all(rename(r)["not_applicable"] == "declared fsdp1, but fsdp2 wrapped the model" for r in declared_fsdp1)
    asked_fsdp2 = [r for r in passes if "fsdp2" in r["variant"].split("+")]
    assert asked_fsdp2 and all(rename(r)["outcome"] == "pass" for r in asked_fsdp2)


def test_a_fix_that_could_not_run_on_a_config_is_judged_only_where_it_ran() -> None:
    from harness.recording.verdicts import fix_verdicts

    def rec(variant: str, cid: str, outcome: str, sig: str | None = None) -> dict:
        return {"variant": variant, "config_id": cid, "outcome": outcome, "signature": sig}

    na = "not-applicable"
    records = [
        rec("baseline", "a", "fail", "t"),
        rec("baseline", "b", "fail", "t"),
        rec("x", "a", "fail", "other"),
        rec("x", "b", "skip", na),
        rec("y", "a", "skip", na),
        rec("y", "b", "skip", na),
        rec("z", "a", "pass"),
        rec("z", "b", "pass"),
    ]
    fixed, partly, not_fixed = fix_verdicts(records, {"a", "b"})
    assert fixed == ["z"] and partly == []
    assert ("x", ["other"]) in not_fixed, "a not-applicable record is not a way of not fixing"
    assert ("y", [na]) in not_fixed, "a variant that ran nowhere is shown as not applicable"


def test_a_failure_that_cannot_say_which_base_ran_is_judged_by_its_config_siblings(history: list[dict]) -> None:
    """On 2024-07-25 (transformers 4.43 on CPU) the seed's 4-bit config in Trainer order failed before it could
    return its path; its fix variants, same config and cell, show the base was loaded unquantized."""
    from harness.recording.signatures import rename_all

    judged = rename_all(history)
    [failed] = [
        r
        for r, raw in zip(judged, history, strict=True)
        if raw["cell"] == "era_date-2024-07-25"
        and raw["scenario"] == "S2-qlora-grad-flags"
        and raw["variant"] == "baseline"
        and raw["outcome"] == "fail"
        and raw["config"]["base"] == "4bit"
    ]
    assert failed["outcome"] == "skip" and failed["reported_signature"] == "no-grad-element-0"
    assert "this config's other jobs in the cell ran a frozen-base base" in failed["not_applicable"]


def test_a_retired_check_is_no_evidence_either_way() -> None:
    """S5's retired check (DoRA's inner fp32 is by design): a record that failed it stopped before today's check ran,
    so it is set aside with the reason, never a failure the table counts."""
    from scenarios import applicability

    record = {"outcome": "fail", "signature": "check-dora_output_dtype", "hardware": {"device": "cuda"}}
    assert "retired" in (applicability.reason(record) or "")
    assert applicability.reason(record | {"outcome": "pass"}) is None
    assert applicability.reason(record | {"signature": "check-dora_layer_output_dtype"}) is None
