"""The answer at a glance: the table's first section names rows by versions, keeps every entry short, and shows
as the change to try the first fix the detailed summary lists (a real fix before a workaround)."""

from __future__ import annotations

from pathlib import Path

from test_report import rec, write_run

from harness.knowledge.selection import select_runs
from harness.publishing.glance import ENTRY_LIMIT, column_labels
from harness.publishing.report import render_markdown

SPEC = {"target": ["t"], "variants": {"a_workaround": ["workaround"], "z_fix": ["fix"]}}


def versions(torch: str, peft: str) -> dict:
    return {"versions": {"torch": torch, "peft": peft}, "hardware": {"device": "cpu", "world_size": 2}}


def test_rows_are_versions_entries_are_short_and_the_fix_is_the_first_listed(tmp_path: Path) -> None:
    old, new = versions("2.4.0", "0.12.0"), versions("2.13.0+cpu", "0.21.0")
    records = [
        rec("cpu-1", "old_cell", "S1-x", "fail", sig="t") | old,
        rec("cpu-1", "old_cell", "S1-x", "pass", variant="a_workaround") | old,
        rec("cpu-1", "old_cell", "S1-x", "pass", variant="z_fix") | old,
        rec("cpu-1", "new_cell", "S1-x", "pass") | new,
    ]
    write_run(tmp_path, "cpu-1", "cpu", "1", records)
    text = render_markdown(select_runs(tmp_path), {"S1-x": SPEC})
    glance = text.split("## The answer at a glance", 1)[1].split("## Provenance", 1)[0]
    rows = [line for line in glance.splitlines() if line.startswith("| ") and not line.startswith("| versions")]
    # Newest first, named by the versions that ran, never by cell ids.
    assert rows == ["| torch 2.13.0 peft 0.21.0 | ✓ 0/1 |", "| torch 2.4.0 peft 0.12.0 | ✗ 1/1 · try z_fix |"]
    assert "old_cell" not in glance and "### CPU, up to 2 ranks" in glance
    # A column's name is one click from its scenario's section.
    assert "| versions | [S1](#scenario-S1-x) |" in glance and '<a id="scenario-S1-x"></a>' in text
    summary = text.split("## Summary", 1)[1]
    assert "fixed by: z_fix · a_workaround (workaround)" in summary  # the fix the glance shows is listed first
    assert all(len(cell.strip()) <= ENTRY_LIMIT for row in rows for cell in row.strip("|").split("|"))


def test_columns_of_one_mode_are_told_apart_by_their_own_words() -> None:
    labels = column_labels(["S1-dora-fsdp", "S2-qlora-fsdp-grad-flags", "S2-qlora-grad-flags", "S3-lora"])
    assert labels == ["S1", "S2 fsdp", "S2", "S3"]


def test_a_fix_per_config_is_not_no_fix(tmp_path: Path) -> None:
    """Two configs show the target and each has its own fix (S7: the loop's ZeRO-3 save and the Trainer's): the
    glance says so instead of 'no fix measured'; with one config left unfixed, which change fixed the other; with none
    fixed, 'no fix measured'."""
    stack = versions("2.4.1", "0.13.0")

    def of(config: str, outcome: str, variant: str = "baseline", sig: str | None = None) -> dict:
        return rec("cpu-1", "cell", "S7-x", outcome, variant=variant, sig=sig) | stack | {"config_id": config}

    spec = {"target": ["t"], "variants": {"loop_fix": ["fix"], "trainer_fix": ["fix"]}}
    records = [
        of("c1", "fail", sig="t"),
        of("c2", "fail", sig="t"),
        of("c1", "pass", "loop_fix"),
        of("c1", "skip", "trainer_fix", "not-applicable"),
        of("c2", "skip", "loop_fix", "not-applicable"),
        of("c2", "pass", "trainer_fix"),
    ]
    write_run(tmp_path, "cpu-1", "cpu", "1", records)
    assert "| ✗ 2/2 · a fix per config |" in render_markdown(select_runs(tmp_path), {"S7-x": spec})
    records[-1] = of("c2", "fail", "trainer_fix", "t")
    write_run(tmp_path / "again", "cpu-1", "cpu", "1", records)
    assert "| ✗ 2/2 · partly loop_fix (1/2) |" in render_markdown(select_runs(tmp_path / "again"), {"S7-x": spec})
    records[2] = of("c1", "fail", "loop_fix", "t")
    write_run(tmp_path / "none", "cpu-1", "cpu", "1", records)
    assert "| ✗ 2/2 · no fix measured |" in render_markdown(select_runs(tmp_path / "none"), {"S7-x": spec})


def test_a_later_run_without_an_optional_package_keeps_it_in_the_row(tmp_path: Path) -> None:
    """S7's GPU run installed no bitsandbytes in a cell whose S2 run had it: the row and the versions table still
    name the bitsandbytes that S2 ran with."""
    with_bnb = {"versions": {"torch": "2.11.0", "peft": "0.18.0", "bitsandbytes": "0.48.2"}}
    without = {"versions": {"torch": "2.11.0", "peft": "0.18.0"}}
    write_run(tmp_path, "gpu-2", "gpu", "1", [rec("gpu-2", "day", "S2-x", "pass") | with_bnb])
    write_run(tmp_path, "gpu-1", "gpu", "1", [rec("gpu-1", "day", "S7-x", "pass") | without])  # read first
    text = render_markdown(select_runs(tmp_path), {"S2-x": SPEC, "S7-x": SPEC})
    glance = text.split("## The answer at a glance", 1)[1].split("## Provenance", 1)[0]
    assert "| torch 2.11.0 peft 0.18.0 bnb 0.48.2 | ✓ 0/1 | ✓ 0/1 |" in glance
    assert "| `day` | - | 2.11.0 | - | 0.18.0 | - | - | 0.48.2 |" in text


def test_no_check_mark_without_a_config_that_could_show_the_target(tmp_path: Path) -> None:
    """A day where every config that could show the target could not run (bitsandbytes without a library for the
    node's CUDA) reads as what stopped it, never as a ✓ 0/0 a QLoRA user takes for "works"."""
    gpu = {"versions": {"torch": "2.11.0", "peft": "0.16.0"}, "hardware": {"device": "cuda", "world_size": 1}}
    broken = rec("gpu-1", "era_date-2025-07-04", "S2-x", "env-broken", sig="bnb-no-library-for-this-cuda") | gpu
    write_run(tmp_path, "gpu-1", "gpu-history", "1", [broken])
    text = render_markdown(select_runs(tmp_path), {"S2-x": SPEC})
    glance = text.split("## The answer at a glance", 1)[1].split("## Provenance", 1)[0]
    assert "✓ 0/0" not in glance and "| env |" in glance
    assert "ENV-BROKEN `bnb-no-library-for-this-cuda`" in text.split("## Summary", 1)[1]


def test_the_committed_table_and_site_data_have_no_check_mark_over_nothing(repo_root: Path) -> None:
    table = (repo_root / "results" / "COMPATIBILITY.md").read_text()
    assert "✓ 0/0" not in table
    site_data = repo_root / "results" / "matrix.json"
    if site_data.is_file():  # built by the report stage, not committed
        assert "✓ 0/0" not in site_data.read_text()


def test_every_change_of_every_scenario_has_words() -> None:
    """The one table of fix words (scenarios/fix_words.py) covers every change a scenario measures, so the glance,
    lookup, check, the advisories and the page never fall back to an identifier."""
    from harness.define.registry import discover
    from scenarios.fix_words import fix_words, unknown_changes

    variants = [name for s in discover() for name in s.spec["variants"]]
    assert unknown_changes(variants) == []
    assert fix_words("flip_use_orig_params+decoder_layer_wrap+uniform_dtype") == (
        "FSDP: use_orig_params flipped, wrap each decoder layer, one dtype"
    )
    assert fix_words("use_reentrant+zero2") == "checkpointing: use_reentrant=True; DeepSpeed: ZeRO-2 instead of ZeRO-3"
