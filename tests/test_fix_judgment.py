"""A fix, a CLEARED and the settings that clear a glance entry are claims, judged like failures (issue 73): at the
user's releases, setup and GPU count, each fix of a failure is `fixes` (exact or bracketed), `does-not-fix` (the
failure again), `brings` (another failure, named) or `unmeasured` (with where it was measured and the command that
measures it). Read off the committed records and the judge's committed tables."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from harness.knowledge.judge import Query, evaluate, fix_answers
from harness.publishing.advisories import read_tables
from harness.tools.answers import audit
from scenarios import applicability
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "results"
NODE_STACK = {"torch": "2.11.0", "transformers": "5.17.0", "peft": "0.21.0", "accelerate": "1.15.0"}
S1_TRAINER = {"engine": "fsdp1", "adapter": "dora", "loop": "trainer"}


@cache
def tables() -> dict[str, Any]:
    return read_tables(RESULTS / "advisories")


def failure_of(answer: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in tables()["failures"] if f["id"] == answer["id"])


def s1_trainer_fixes(gpus: int) -> dict[str, dict[str, Any]]:
    query = Query(dict(NODE_STACK), dict(S1_TRAINER), "cuda", gpus)
    applying = [a for a in evaluate(tables(), query) if a["scenario"].startswith("S1") and a["state"] == "applies"]
    assert len(applying) == 1 and applying[0]["sure"] == "exact", applying
    return {f["variant"]: f for f in fix_answers(tables(), failure_of(applying[0]), query)}


def test_each_fix_of_the_2_gpu_fsdp1_trainer_failure_is_judged_at_2_gpus() -> None:
    """The issue's stack: FSDP2 is measured fixing it at exactly these releases on 2 GPUs; one dtype gets past the
    checkpoint and fails at the optimizer there; use_orig_params passed only on 1 GPU with its setup measured (the
    2-GPU passes came from a run that never measured which FSDP wrapped the model): unmeasured at 2."""
    fixes = s1_trainer_fixes(2)
    assert fixes["fsdp2"]["state"] == "fixes" and fixes["fsdp2"]["sure"] == "exact"
    assert fixes["uniform_dtype"]["state"] == "brings"
    assert fixes["uniform_dtype"]["brings"] == ["optimizer-bf16-grad-on-fp32-param"]
    orig = fixes["flip_use_orig_params"]
    assert orig["state"] == "unmeasured" and orig["sure"] == "unmeasured"
    assert "fixes it on 1 GPU at torch 2.11.0, transformers 5.17.0" in orig["where"]
    assert fixes["use_reentrant+input_grads"]["state"] != "fixes"
    ordered = list(fixes.values())
    sure = [audit_sure(f) for f in ordered]
    assert sure == sorted(sure), "most sure first"


def audit_sure(fix: dict[str, Any]) -> int:
    return ("exact", "bracketed", "unmeasured").index(fix["sure"])


def test_on_1_gpu_the_same_fix_is_measured_fixing_it() -> None:
    assert s1_trainer_fixes(1)["flip_use_orig_params"]["state"] == "fixes"


def test_audit_shows_each_fix_with_its_own_judgment_in_text_and_json(tmp_path: Any) -> None:
    query = audit.query_of(tables(), dict(NODE_STACK), dict(S1_TRAINER), [], False, 2, None, [])
    report = audit.audit(tables(), query)
    text = "\n".join(audit.columns(report))
    assert "FSDP: FSDP2 instead of FSDP1: fixes it here (a record at these releases)" in text
    assert "FSDP: use_orig_params flipped: not measured here" in text
    assert "measure the fixes here: in that environment on 2 GPU(s): `compat-matrix check" in text
    entry = next(a for a in audit.as_json(report)["answers"] if a["scenario"].startswith("S1"))
    states = {f["variant"]: (f["state"], f["sure"]) for f in entry["fixes"]}
    assert states["fsdp2"] == ("fixes", "exact") and states["flip_use_orig_params"] == ("unmeasured", "unmeasured")
    unmeasured = next(f for f in entry["fixes"] if f["variant"] == "flip_use_orig_params")
    assert unmeasured["measure"][:3] == ["compat-matrix", "check", "--scenario"]
    assert unmeasured["measure_on"]["gpus"] == 2
    assert all("always" not in f for f in entry["fixes"])


def cleared_case() -> tuple[dict[str, Any], dict[str, Any], dict[str, str], int]:
    """A failure with a fix a user's setting can hold, and a stack where that fix passed exactly where the baseline
    showed it on GPUs: (failure, fix, stack, GPU count)."""
    for failure in tables()["failures"]:
        if failure["device"] != "cuda" or not failure["distributed"]:
            continue
        for fix in failure["fixes"]:
            if not fix.get("setup"):
                continue
            for stack, _, size, state, _, _ in fix["points"]:
                versions = dict(zip(failure["depends"], stack, strict=True))
                query = Query(versions, {}, "cuda", size)
                mine = next(a for a in evaluate(tables(), query) if a["id"] == failure["id"])
                if state == "passes" and mine["state"] == "applies" and mine["sure"] == "exact":
                    return failure, fix, versions, size
    raise AssertionError("no GPU failure with a setting measured fixing it")


def judged(failure: dict[str, Any], setup: dict[str, str], versions: dict[str, str], gpus: int) -> dict[str, Any]:
    keys = failure["setups"][0]["keys"]
    query = Query(versions, dict(keys) | setup, "cuda", gpus)
    return next(a for a in evaluate(tables(), query) if a["id"] == failure["id"])


def test_cleared_only_where_the_fix_was_measured_fixing_it() -> None:
    """A setting measured fixing a failure on N GPUs at some releases clears it there (exact), never at 8 GPUs, nor at
    releases far from where it was measured: UNDECIDED with why."""
    failure, fix, versions, gpus = cleared_case()
    here = judged(failure, fix["setup"], versions, gpus)
    assert here["state"] == "cleared" and here["sure"] == "exact", here
    elsewhere = judged(failure, fix["setup"], versions, 8)
    assert elsewhere["state"] == "undecided" and elsewhere["sure"] == "unmeasured", elsewhere
    older = dict(versions, torch="2.4.1")
    assert judged(failure, fix["setup"], older, gpus)["state"] != "cleared"


def test_an_accelerate_fsdp2_sharded_config_at_8_processes_is_not_cleared(tmp_path: Any) -> None:
    config = tmp_path / "accelerate.yaml"
    config.write_text(
        "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n"
        "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
    )
    setup = audit.read_setup(config, None, ["trainer", "lora"], None, dict(NODE_STACK))
    query = audit.query_of(tables(), dict(NODE_STACK), setup.setup, [], False, setup.gpus, None, [])
    found = audit.audit(tables(), query).answers
    assert setup.gpus == 8
    assert not [a for a in found if a["state"] == "cleared"], [a["id"] for a in found if a["state"] == "cleared"]


@pytest.mark.parametrize("transformers", ["5.17.0", "4.41.2"])
def test_a_trainer_record_that_never_measured_its_fsdp_is_no_evidence_on_transformers_5(transformers: str) -> None:
    """S1's first GPU run (gpu-20261122T000257Z) labelled its Trainer path with the FSDP it asked for, and transformers
    5 runs FSDP2 unless told version 1: those records are not applicable there; on transformers 4 (FSDP1 only) they
    stand."""
    from harness.recording.records import read_records

    run = RESULTS / "runs" / "gpu-20261122T000257Z" / "records.jsonl"
    trainer = [
        r for r in read_records(run)
        if (r.get("config") or {}).get("path") == "trainer" and (r.get("config") or {}).get("fsdp") == "fsdp1"
        and r["versions"].get("transformers") == transformers and r["outcome"] in ("pass", "fail")
        and "fsdp2" not in r["variant"].split("+")
    ]  # fmt: skip
    assert trainer
    reasons = {applicability.reason(r) for r in trainer}
    if transformers.startswith("5."):
        assert all(r and "did not measure which FSDP wrapped the model" in r for r in reasons), reasons
    else:
        assert reasons == {None}


def test_the_vectors_reach_every_fix_state() -> None:
    """Over every failure's fix points: each state the fold gives is reached by some measured stack."""
    seen = set()
    for failure in tables()["failures"]:
        for fix in failure["fixes"]:
            for stack, _, size, *_ in fix["points"][:4]:
                query = Query(dict(zip(failure["depends"], stack, strict=True)), {}, failure["device"], size)
                seen |= {f["state"] for f in fix_answers(tables(), failure, query)}
    assert {"fixes", "brings", "unmeasured"} <= seen, seen
