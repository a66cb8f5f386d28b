"""What the atlas knows, in one place (`harness/knowledge/`): a config that fails on every release is a
pitfall of its setup, listed once and never counted as a version failure; lookup answers per setup, with the releases
the flips and sweeps measured."""

from __future__ import annotations

import json
from pathlib import Path

from test_report import write_run

from harness.define import setup as vocabulary
from harness.define.registry import discover
from harness.knowledge import pitfalls as knowledge
from harness.knowledge.atlas import Atlas
from harness.knowledge.evidence import SHOWS, device_class, state
from harness.knowledge.selection import select_runs
from harness.publishing.glance import glance_tables, pitfalls_markdown
from harness.tools.answers.lookup import query_of, render

RESULTS = Path(__file__).resolve().parents[1] / "results"
S9W = "S9-identity-world-size"
SPEC = {
    "target": ["check-identity-world-size"],
    "variants": {"baseline": ("baseline", ""), "global_token_mean": ("fix", "")},
    "own_code": {"path=hand": "your own loop: each rank's own token mean"},
}
STACKS = {
    "2025-07-04": {"torch": "2.7.1", "transformers": "4.53.0", "accelerate": "1.8.1"},
    "2025-08-02": {"torch": "2.7.1", "transformers": "4.54.1", "accelerate": "1.9.0"},
    "2025-11-14": {"torch": "2.9.1", "transformers": "4.57.1", "accelerate": "1.11.0"},
    "2026-04-15": {"torch": "2.11.0", "transformers": "5.5.4", "accelerate": "1.13.0"},
}
CONFIGS = {
    "hand": {"path": "hand", "engine": "fsdp1", "adapter": "lora"},
    "trainer": {"path": "trainer", "engine": "ddp", "adapter": "lora"},
}


def rec(day: str, config: str, outcome: str, variant: str = "baseline", device: str = "cpu", run: str = "h") -> dict:
    return {
        "cell": f"era_date-{day}", "pins": {"date": day}, "scenario": S9W, "variant": variant,
        "config": CONFIGS[config], "config_id": config, "outcome": outcome,
        "signature": "check-identity-world-size" if outcome == "fail" else None,
        "versions": STACKS[day], "hardware": {"device": device, "world_size": 2}, "run_id": run,
        "metrics": {"off_by": 0.39} if outcome == "fail" else {},
    }  # fmt: skip


def atlas() -> list[dict]:
    """The loop by hand fails on every day (its fix passes); the Trainer fails until 2025-08-02, then holds."""
    records = []
    for day in STACKS:
        records += [rec(day, "hand", "fail"), rec(day, "hand", "pass", "global_token_mean")]
        records.append(rec(day, "trainer", "fail" if day < "2025-08-02" else "pass"))
    return records


def test_a_config_that_fails_on_every_release_is_a_pitfall_and_leaves_the_count(tmp_path: Path) -> None:
    found = knowledge.pitfalls(atlas(), {S9W: SPEC})
    [(key, pitfall)] = found.items()
    assert key == knowledge.pitfall_key(S9W, "cpu", "hand")
    assert (pitfall.stacks, pitfall.first_day, pitfall.last_day, pitfall.fixes) == (
        4, "2025-07-04", "2026-04-15", ["global_token_mean"],
    )  # fmt: skip
    write_run(tmp_path, "h", "history", "1", atlas())
    [table] = glance_tables(Atlas(tmp_path, {S9W: SPEC}))
    entries = {row["day"]: row["entries"][0]["text"] for row in table["rows"]}
    assert entries["2026-04-15"] == "✓ 0/1 · ⚠ 1 pitfall"  # the newest day: the Trainer holds, the loop is apart
    assert entries["2025-07-04"].startswith("✗ 1/1")  # the Trainer's own failure still counts
    listed = "\n".join(pitfalls_markdown(found, {S9W: SPEC}))
    assert listed.count("your own loop") == 1 and "4 stacks, 2025-07-04 to 2026-04-15" in listed


def test_a_config_that_passed_anywhere_or_failed_another_way_is_no_pitfall() -> None:
    """A pass in a probe (a flip's move or sweep) is a release where it works; a day that failed another way is a
    history of versions: either makes the failure a version's, counted as such."""
    passed_in_probe = [{**rec("2025-08-02", "hand", "pass"), "pins": {}, "run_id": "probe"}]
    assert knowledge.pitfalls(atlas(), {S9W: SPEC}, passed_in_probe) == {}
    other = [r if (r["pins"]["date"], r["config_id"], r["variant"]) != ("2025-07-04", "hand", "baseline")
             else {**r, "signature": "unclassified-RuntimeError"} for r in atlas()]  # fmt: skip
    assert knowledge.pitfalls(other, {S9W: SPEC}) == {}
    # On GPUs it is measured apart: the CPU pitfall says nothing of a GPU that passes, nor the other way round.
    on_gpu = [rec(day, "hand", "pass", device="cuda") for day in STACKS]
    assert list(knowledge.pitfalls(atlas() + on_gpu, {S9W: SPEC})) == [knowledge.pitfall_key(S9W, "cpu", "hand")]


def test_two_releases_are_not_every_release() -> None:
    few = [r for r in atlas() if r["pins"]["date"] in ("2025-07-04", "2025-08-02")]
    assert knowledge.pitfalls(few, {S9W: SPEC}) == {}


def test_lookup_answers_per_setup_with_the_release_that_ends_it(tmp_path: Path) -> None:
    """An exact row: the Trainer fails (and a release ended it, measured), the loop by hand is a pitfall of that setup,
    said where the user names a setup it could be; --setup narrows the answer to the user's setup."""
    write_run(tmp_path, "h", "history", "1", atlas())
    flip = {"scenario": S9W, "older": "2025-07-04", "newer": "2025-08-02", "older_state": "target",
            "newer_state": "not-reproduced", "changed": {"transformers": ["4.53.0", "4.54.1"]},
            "package": "transformers", "release": "4.54.0", "last_release_before": "4.53.3",
            "config_ids": ["trainer"], "signature": "check-identity-world-size"}  # fmt: skip
    (tmp_path / "flips" / "h").mkdir(parents=True)
    (tmp_path / "flips" / "h" / "flips.json").write_text(json.dumps([flip]))
    found = Atlas(tmp_path, {S9W: SPEC})

    def ask(version: str, *words: str) -> str:
        query = query_of({"transformers": version}, vocabulary.parse_words(words), "cpu", None)
        return render(found, query, [S9W], [f"transformers=={version}"])

    text = ask("4.53.0")
    assert "APPLIES (bracketed): the Trainer · DDP · LoRA" in text  # torch and accelerate not given: not exact
    assert "upgrade transformers to 4.54.0 (measured): ends it" in text
    assert "PITFALL" not in text  # no setup named: a pitfall is said to the setup it is of
    assert "PITFALL: a loop by hand · FSDP1 · LoRA: a pitfall, not a version failure: your own loop" in ask(
        "4.53.0", "fsdp1"
    )
    assert "APPLIES" not in ask("4.53.0", "fsdp1")  # the Trainer's DDP failure is another setup's
    held = ask("5.5.4")
    assert "no known failure of this scenario applies here" in held and "APPLIES" not in held


def test_the_newest_glance_rows_count_no_config_that_fails_on_every_release() -> None:
    """On the committed table: no entry of the newest row of each CPU and GPU table counts a config that showed its
    target on every install day of its device and never passed; those are listed once, under the glance."""
    selection = select_runs(RESULTS)
    specs = {s.id: s.spec for s in discover()}
    found = selection.pitfalls(specs)
    assert found, "the loops written by hand (S9) fail on every release: the table lists them as pitfalls"
    records = selection.latest()[0]
    for table in glance_tables(Atlas(RESULTS, specs)):
        dated = [row for row in table["rows"] if row["day"]]
        if not dated:
            continue
        newest = dated[0]
        for entry in newest["entries"]:
            counted = [
                r for r in records
                if r["cell"] == newest["cell"] and r["scenario"] == entry["scenario"] and r["variant"] == "baseline"
                and r["config_id"] not in entry["pitfalls"] and r["outcome"] == "fail"
                and state(r, specs[r["scenario"]]) == SHOWS  # its target: a config failing otherwise is no pitfall
            ]  # fmt: skip
            for failing in counted:  # each failure counted here passed somewhere, or failed otherwise on a day
                key = (failing["scenario"], failing["config_id"])
                same = [
                    r for r in [*records, *selection.probes]
                    if (r["scenario"], r["config_id"], r["variant"]) == (*key, "baseline")
                    and device_class(r) == device_class(failing)
                ]  # fmt: skip
                stacks = {tuple(sorted((r.get("versions") or {}).items())) for r in same if r["outcome"] == "fail"}
                assert any(r["outcome"] != "fail" or r.get("signature") != failing["signature"] for r in same) or (
                    len(stacks) < knowledge.PITFALL_STACKS
                ), (table["title"], failing["scenario"], failing["config_id"])
            # The entry counts every record at exactly the row's releases (other runs' too): its pitfalls are those of
            # the row's own cell and any such run's, each a pitfall of that scenario on that device.
            assert set(entry["pitfalls"]) >= {
                r["config_id"] for r in records
                if r["cell"] == newest["cell"] and r["scenario"] == entry["scenario"] and knowledge.is_pitfall(r, found)
            }  # fmt: skip
            device = "cuda" if table["device"] == "GPU" else "cpu"
            assert all(knowledge.pitfall_key(entry["scenario"], device, c) in found for c in entry["pitfalls"])
    markdown = "\n".join(pitfalls_markdown(found, specs))
    for pitfall in found.values():
        assert markdown.count(vocabulary.words(vocabulary.setup_of(pitfall.config, specs.get(pitfall.scenario)))) >= 1
    assert len(markdown.splitlines()) == len(found) + 6  # each pitfall once
