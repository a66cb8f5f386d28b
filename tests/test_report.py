"""Which records the published table uses, and how an entry reads (records built here, no ML stack)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.knowledge.atlas import Atlas
from harness.knowledge.selection import select_runs
from harness.publishing.report import render_markdown


def write_run(root: Path, run_id: str, profile: str, started: str, records: list[dict], **meta: object) -> None:
    run = root / "runs" / run_id
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"run_id": run_id, "profile": profile, "started_at": started} | meta))
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def rec(run: str, cell: str, scenario: str, outcome: str, variant: str = "baseline", sig: str | None = None) -> dict:
    return {
        "run_id": run,
        "cell": cell,
        "scenario": scenario,
        "variant": variant,
        "config_id": "c1",
        "config": {},
        "outcome": outcome,
        "signature": sig,
        "message": "",
        "metrics": {},
        "started_at": run,
    }


def test_newer_run_updates_its_cells_without_hiding_the_rest(tmp_path: Path) -> None:
    older = [rec("gpu-1", "a", "S1-x", "fail", sig="s"), rec("gpu-1", "b", "S4-y", "pass")]
    write_run(tmp_path, "gpu-1", "gpu", "1", older)
    write_run(tmp_path, "gpu-2", "gpu", "2", [rec("gpu-2", "a", "S1-x", "pass")])
    write_run(tmp_path, "gpu-0", "gpu", "0", [rec("gpu-0", "b", "S4-y", "fail", sig="t")], superseded_by=["gpu-1"])
    selection = select_runs(tmp_path)
    assert selection.run_ids == ["gpu-1", "gpu-2"]
    by_pair = {(r["cell"], r["scenario"]): r["outcome"] for r in selection.records}
    assert by_pair == {("a", "S1-x"): "pass", ("b", "S4-y"): "pass"}


def test_a_withdrawn_run_is_no_evidence_even_where_nothing_replaced_it(tmp_path: Path) -> None:
    """S8's runs that ran several jobs in one pair of processes were withdrawn: their cells leave the table rather
    than show what a reused process met."""
    write_run(
        tmp_path, "gpu-1", "gpu", "1", [rec("gpu-1", "a", "S8-x", "fail", sig="s"), rec("gpu-1", "b", "S8-x", "fail")]
    )
    write_run(tmp_path, "gpu-2", "gpu", "2", [rec("gpu-2", "a", "S8-x", "pass")])
    assert {r["cell"] for r in select_runs(tmp_path).records} == {"a", "b"}
    meta = tmp_path / "runs" / "gpu-1" / "meta.json"
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"withdrawn": "several jobs in one process"}))
    selection = select_runs(tmp_path)
    assert selection.run_ids == ["gpu-2"]
    assert [(r["cell"], r["outcome"]) for r in selection.records] == [("a", "pass")]
    assert selection.conflicting == frozenset()


def test_flaky_baseline_is_shown_as_flaky_never_as_not_reproduced(tmp_path: Path) -> None:
    write_run(tmp_path, "cpu-1", "cpu", "1", [rec("cpu-1", "a", "S1-x", "flaky", sig="unclassified-RuntimeError-1")])
    text = render_markdown(select_runs(tmp_path))
    summary_row = next(line for line in text.split("## Summary")[1].splitlines() if line.startswith("| `a` |"))
    assert "FLAKY `unnamed RuntimeError 1`" in summary_row and "not reproduced" not in summary_row


def test_an_older_run_that_disagrees_is_shown_as_flaky_not_hidden(tmp_path: Path) -> None:
    write_run(tmp_path, "gpu-1", "gpu", "1", [rec("gpu-1", "a", "S1-x", "fail", sig="s")])
    write_run(tmp_path, "gpu-2", "gpu", "2", [rec("gpu-2", "a", "S1-x", "pass")])
    selection = select_runs(tmp_path)
    assert [r["outcome"] for r in selection.records] == ["pass"]  # the newest evidence is the entry
    assert selection.conflicting == {("a", "S1-x", "baseline", "c1")}
    section = render_markdown(selection).split("## S1-x", 1)[1]
    assert "**flaky**" in section


def test_a_disagreement_under_changed_scenario_code_is_not_called_flaky(tmp_path: Path) -> None:
    write_run(
        tmp_path, "gpu-1", "gpu", "1", [rec("gpu-1", "a", "S1-x", "fail", sig="s")], scenario_digests={"S1-x": "aaa"}
    )
    write_run(tmp_path, "gpu-2", "gpu", "2", [rec("gpu-2", "a", "S1-x", "pass")], scenario_digests={"S1-x": "bbb"})
    assert select_runs(tmp_path).conflicting == frozenset()


def test_changes_since_the_previous_run_of_a_profile(tmp_path: Path) -> None:
    from harness.publishing.publish import changes_markdown, changes_since_previous

    write_run(
        tmp_path, "cpu-1", "cpu", "1", [rec("cpu-1", "a", "S1-x", "pass"), rec("cpu-1", "b", "S1-x", "fail", sig="s")]
    )
    write_run(
        tmp_path, "cpu-2", "cpu", "2", [rec("cpu-2", "a", "S1-x", "fail", sig="s"), rec("cpu-2", "b", "S1-x", "pass")]
    )
    changes = changes_since_previous(Atlas(tmp_path, {}))
    assert [(c["cell"], c["before"], c["after"]) for c in changes["newly_failing"]] == [("a", "pass", "fail")]
    assert [(c["cell"], c["before"], c["after"]) for c in changes["newly_fixed"]] == [("b", "fail", "pass")]
    text = changes_markdown(changes)
    assert "**Newly failing:** 1" in text and "**Newly fixed:** 1" in text


def test_an_old_record_is_named_by_todays_rules(tmp_path: Path) -> None:
    """A failure recorded before its rule existed (here peft's DoRA reading a sharded LoRA weight, recorded as
    unclassified on 2026-11-22) shows under today's name; its record keeps the run-time name."""
    traceback = (
        '  File "/opt/torch/.venv/lib/python3.12/site-packages/peft/tuners/lora/dora.py", line 97, in '
        "get_lora_weight\n    x_eye = torch.eye(lora_A.weight.shape[1], device=lora_A.weight.device)\n"
        "IndexError: tuple index out of range\n"
    )
    old = rec("gpu-1", "a", "S1-x", "fail", sig="unclassified-IndexError-df54036f") | {
        "exc_type": "builtins.IndexError",
        "message": "tuple index out of range",
        "traceback": traceback,
    }
    write_run(tmp_path, "gpu-1", "gpu", "1", [old])
    stored = (tmp_path / "runs" / "gpu-1" / "records.jsonl").read_text()
    text = render_markdown(select_runs(tmp_path))
    summary_row = next(line for line in text.split("## Summary")[1].splitlines() if line.startswith("| `a` |"))
    assert "FAIL `dora-reads-sharded-lora-weight`" in summary_row and "unclassified" not in summary_row
    assert "| `unnamed IndexError df54036f` | `dora-reads-sharded-lora-weight` | 1 |" in text
    assert (tmp_path / "runs" / "gpu-1" / "records.jsonl").read_text() == stored


def test_headline_counts_the_target_apart_from_other_failures(tmp_path: Path) -> None:
    """The seed's failure on 2 of 3 candidate configs, an unrelated failure on the third, a LoRA control that
    passes: the target's count and its fixes cover exactly the 2 configs; the setup change is a workaround."""
    spec = {
        "target": ["checkpoint-recompute-dtype*"],
        "controls": [{"use_dora": False}],
        "variants": {"baseline": ("baseline", "b"), "use_reentrant": ("fix", "f"), "fsdp2": ("workaround", "w")},
    }
    hw = {"device": "cpu", "gpu_name": None, "gpu_count": 0, "world_size": 2}

    def r(config_id: str, variant: str, outcome: str, sig: str | None = None, dora: bool = True) -> dict:
        return rec("cpu-1", "a", "S1-x", outcome, variant, sig) | {
            "config_id": config_id,
            "config": {"use_dora": dora},
            "hardware": hw,
            "path": "fsdp1-manual/hf",
            "setup": {"fsdp": "fsdp1", "world_size": 2},
        }

    dtype = "checkpoint-recompute-dtype[float32->bfloat16]"
    records = [
        r("c1", "baseline", "fail", dtype),
        r("c2", "baseline", "fail", dtype),
        r("c3", "baseline", "fail", "optimizer-bf16-grad-on-fp32-param"),
        r("c4", "baseline", "pass", dora=False),
        r("c1", "use_reentrant", "pass"),
        r("c2", "use_reentrant", "fail", "no-grad-element-0"),
        r("c3", "use_reentrant", "fail", "optimizer-bf16-grad-on-fp32-param"),
        r("c1", "fsdp2", "pass"),
        r("c2", "fsdp2", "pass"),
        r("c3", "fsdp2", "fail", "optimizer-bf16-grad-on-fp32-param"),
    ]
    write_run(tmp_path, "cpu-1", "cpu", "1", records)
    text = render_markdown(select_runs(tmp_path), {"S1-x": spec})
    row = next(line for line in text.split("## Summary")[1].splitlines() if line.startswith("| `a` |"))
    lines = row.split("|")[2].strip().split(" <br>")
    assert lines[0] == "FAIL target `checkpoint-recompute-dtype[float32->bfloat16]` (2/3)"
    assert lines[1] == "fixed by: FSDP: FSDP2 instead of FSDP1 (workaround)"
    assert lines[2] == "partly: checkpointing: use_reentrant=True (1/2)"
    assert lines[3] == "other failures: `optimizer-bf16-grad-on-fp32-param` (1)"
    assert lines[4] == "controls: pass 1/1"
    assert lines[5] == "ran: cpu, world size 2, FSDP1"


def test_ran_says_only_what_was_measured(tmp_path: Path) -> None:
    """A record without measured setup is not labelled by its declared path (a Trainer config that asked for FSDP1
    and ran FSDP2 on transformers 5): the 'ran:' line says the setup was not measured."""
    hw = {"device": "cuda", "gpu_name": "H100", "gpu_count": 2, "world_size": 2}
    declared = rec("gpu-1", "a", "S1-x", "pass") | {
        "hardware": hw,
        "path": "trainer-fsdp1",
        "metrics": {"fsdp": "fsdp1"},
    }
    measured = rec("gpu-1", "a", "S1-x", "pass") | {"hardware": hw, "config_id": "c2", "setup": {"fsdp": "fsdp2"}}
    write_run(tmp_path, "gpu-1", "gpu", "1", [declared, measured])
    text = render_markdown(select_runs(tmp_path), {"S1-x": {"target": ["t"], "variants": {}}})
    summary = text.split("## Summary")[1]
    assert "ran: cuda H100, world size 2, FSDP2, setup not measured (1 config)" in summary
    assert "FSDP1" not in summary


def test_a_cell_shared_by_two_profiles_keeps_its_flaky_mark(tmp_path: Path) -> None:
    """An older run of a profile that disagrees marks the key flaky; when another profile has a cell of the same
    id, the mark follows the cell to its qualified id instead of being lost."""
    write_run(tmp_path, "gpu-1", "gpu", "1", [rec("gpu-1", "c", "S1-x", "fail", sig="s")])
    write_run(tmp_path, "gpu-2", "gpu", "2", [rec("gpu-2", "c", "S1-x", "pass")])
    write_run(tmp_path, "hist-1", "history", "3", [rec("hist-1", "c", "S1-x", "pass")])
    records, flaky = select_runs(tmp_path).latest()
    assert sorted(r["cell"] for r in records) == ["c@gpu", "c@history"]
    assert flaky == {("c@gpu", "S1-x", "baseline", "c1")}


def test_not_applicable_counts_come_from_the_not_applicable_records() -> None:
    """Only records set aside as not applicable count: one renamed from fail to env-broken at report time is a
    changed outcome, but not a not-applicable one (the count once mixed the two)."""
    from harness.publishing.report import changed_at_run_line

    records = [
        {"signature": "not-applicable", "outcome": "skip", "outcome_at_run": "fail"},
        {"signature": "not-applicable", "outcome": "skip"},  # set aside when it was written
        {"signature": "env-broken-ImportError", "outcome": "env-broken", "outcome_at_run": "fail"},
        {"signature": None, "outcome": "pass"},
    ]
    assert changed_at_run_line(records).startswith("2 records are not applicable; 1 of them had another outcome")


def test_the_published_not_applicable_line_matches_the_committed_records(repo_root: Path) -> None:
    from harness.knowledge.selection import select_runs
    from harness.publishing.report import changed_at_run_line

    records = select_runs(repo_root / "results").latest()[0]
    aside = [r for r in records if r.get("signature") == "not-applicable"]
    changed = [r for r in aside if r.get("outcome_at_run") not in (None, "skip")]
    line = changed_at_run_line(records)
    assert line.startswith(f"{len(aside)} records are not applicable; {len(changed)} of them")
    assert line in (repo_root / "results" / "COMPATIBILITY.md").read_text()
