"""`lookup` is a view of the one judge: over a small atlas written here (two install days and the flip between them),
an exact record answers "exact", releases between measured ones "bracketed" by them, a gap or a release no record
holds "undecided" with the command that measures it, a prefix that spans releases that differ says so, another
failure is never evidence that a failure holds, and `--scenario S1` means S1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_report import write_run

from harness.knowledge.atlas import Atlas
from harness.tools.answers.lookup import parse_query, query_of, render

S1 = "S1-dora-fsdp-checkpoint"
S10 = "S10-adapter-roundtrip"
SPEC = {
    "title": "DoRA + FSDP + gradient checkpointing: CheckpointError",
    "target": ["checkpoint-recompute-dtype*"],
    "setup": {"engine": "fsdp1", "adapter": "dora"},
    "requires": ["torch", "transformers", "peft"],
    "world_size": 2,
    "variants": {"baseline": ("baseline", ""), "use_reentrant": ("workaround", ""), "cast_forward_inputs": ("fix", "")},
}
S10_SPEC = {"title": "Adapter round trip: x", "target": ["check-roundtrip-*"], "requires": ["torch", "peft"],
            "world_size": 1, "variants": {"baseline": ("baseline", "")}}  # fmt: skip
FAILS = "checkpoint-recompute-dtype[float32->bfloat16]"
DAYS = {
    "2024-07-25": {"torch": "2.4.0", "transformers": "4.43.2", "peft": "0.12.0", "accelerate": "0.33.0"},
    "2024-09-26": {"torch": "2.4.1", "transformers": "4.45.0", "peft": "0.13.0", "accelerate": "0.34.2"},
    "2024-12-07": {"torch": "2.5.1", "transformers": "4.46.3", "peft": "0.14.0", "accelerate": "1.2.0"},
}


def record(day: str, outcome: str, variant: str = "baseline", scenario: str = S1, signature: str | None = None) -> dict:
    return {
        "run_id": "history-1", "cell": f"era_date-{day}", "scenario": scenario, "variant": variant,
        "config_id": "c1", "config": {"path": "manual"}, "outcome": outcome,
        "signature": signature or (FAILS if outcome == "fail" else None), "versions": DAYS[day],
        "pins": {"date": day}, "hardware": {"device": "cpu", "world_size": 2}, "started_at": day,
    }  # fmt: skip


def atlas(tmp_path: Path, third: str = "pass") -> Atlas:
    """S1 fails on 2024-07-25 (its fix passes), holds on 2024-09-26 (peft 0.13.0 ended it, 0.12.1 not measured),
    and on 2024-12-07 it passes or fails another way (`third`)."""
    records = [
        record("2024-07-25", "fail"), record("2024-07-25", "pass", "cast_forward_inputs"),
        record("2024-09-26", "pass"),
        record("2024-12-07", third, signature="timeout" if third == "fail" else None),
        record("2024-07-25", "pass", scenario=S10),
    ]  # fmt: skip
    write_run(tmp_path, "history-1", "history", "1", records)
    flip = {"scenario": S1, "older": "2024-07-25", "newer": "2024-09-26", "older_state": "target",
            "newer_state": "not-reproduced", "signature": FAILS, "changed": {"peft": ["0.12.0", "0.13.0"]},
            "package": "peft", "release": "0.13.0", "last_release_before": "0.12.0", "config_ids": ["c1"]}  # fmt: skip
    (tmp_path / "flips" / "history-1").mkdir(parents=True)
    (tmp_path / "flips" / "history-1" / "flips.json").write_text(json.dumps([flip]))
    return Atlas(tmp_path, {S1: SPEC, S10: S10_SPEC})


def ask(found: Atlas, *items: str, setup: dict | None = None, scenarios: tuple[str, ...] = (S1,)) -> str:
    return render(found, query_of(parse_query(list(items)), setup or {}, "cpu", None), list(scenarios), list(items))


def test_an_exact_record_answers_exact_with_its_way_out(tmp_path: Path) -> None:
    """peft imports accelerate: exact means a record at exactly these releases of accelerate too."""
    found = atlas(tmp_path)
    text = ask(found, "torch==2.4.0", "transformers==4.43.2", "peft==0.12.0", "accelerate==0.33.0")
    assert "APPLIES (exact): a loop by hand · FSDP1 · DoRA" in text
    assert "at these releases: the target shows on 1 of 1 configs" in text
    assert "upgrade peft to 0.13.0 (measured): ends it" in text
    assert "fix: FSDP: MixedPrecision(cast_forward_inputs=True): fixes it here (a record at these releases)" in text
    without = ask(found, "torch==2.4.0", "transformers==4.43.2", "peft==0.12.0")
    assert "APPLIES (bracketed)" in without and "(accelerate not given)" in without


def test_releases_between_measured_ones_are_bracketed_and_a_gap_is_undecided(tmp_path: Path) -> None:
    found = atlas(tmp_path)
    between = ask(found, "torch==2.4.0", "transformers==4.44.0", "peft==0.12.0")
    assert "APPLIES (bracketed)" in between and "peft 0.12.0 to 0.12.0 measured failing" in between
    assert "at these releases: no record" in between
    gap = ask(found, "torch==2.4.0", "transformers==4.43.2", "peft==0.12.1")
    assert "UNDECIDED (unmeasured)" in gap and "between 0.12.0 and 0.13.0, where the change was found" in gap
    assert "compat-matrix lookup torch==2.4.0 transformers==4.43.2 peft==0.12.1 --measure" in gap
    newer = ask(found, "torch==2.6.0", "transformers==4.46.3", "peft==0.14.0")
    assert "UNDECIDED" in newer and "torch newer than 2.5.1" in newer


def test_a_prefix_that_names_releases_that_differ_says_so(tmp_path: Path) -> None:
    text = ask(atlas(tmp_path), "torch==2.4", "peft==0")
    assert "UNDECIDED" in text and "0 names releases that differ" in text


def test_another_failure_is_no_evidence_that_it_holds(tmp_path: Path) -> None:
    """Where the configs failed another way (a timeout), the answer is undecided, never a pass."""
    text = ask(
        atlas(tmp_path, third="fail"), "torch==2.5.1", "transformers==4.46.3", "peft==0.14.0", "accelerate==1.2.0"
    )
    assert "UNDECIDED (exact)" in text and "failed another way" in text
    assert "no known failure of this scenario applies" not in text


def test_the_setup_narrows_the_answer(tmp_path: Path) -> None:
    found = atlas(tmp_path)
    assert "APPLIES" not in ask(found, "torch==2.4.0", "transformers==4.43.2", "peft==0.12.0",
                                setup={"engine": "zero3"})  # fmt: skip
    assert "APPLIES" in ask(found, "torch==2.4.0", "transformers==4.43.2", "peft==0.12.0",
                            setup={"engine": "fsdp1", "loop": "hand"})  # fmt: skip


def test_scenario_s1_means_s1_not_s10() -> None:
    from harness.define.registry import select

    assert [s.id for s in select(["S1"])] == [S1]


def test_version_prefixes_and_bad_input() -> None:
    assert parse_query(["torch==2.4", "PEFT==0.12"]) == {"torch": "2.4", "peft": "0.12"}
    done = subprocess.run([sys.executable, "-m", "harness", "lookup", "torch=2.4"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "expected PACKAGE==VERSION" in done.stderr
