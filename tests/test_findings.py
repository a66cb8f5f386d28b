"""Findings for maintainers: each committed finding's reproducer runs show its flip, its changed code names the
function that changed, the terminal list and the site show the same findings, and every flip of the table without
an upstream record has a finding or says why not.

These tests exist because a finding is what a maintainer acts on: a reproducer that does not flip between the two
releases, or a finding whose atlas flip no longer stands, must never be published as one. The reproducer runs
themselves (`compat-matrix findings ID --verify`, minutes each with uv) are committed records; these tests judge
them and the machinery on real files.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.define.registry import discover
from harness.knowledge.atlas import Atlas
from harness.knowledge.findings import load_all
from harness.knowledge.flips import flips_of_runs as newest_flips
from harness.knowledge.selection import select_runs
from harness.knowledge.store import Store
from harness.publishing.atlas import upstream_verdict
from harness.publishing.blame_section import run_units
from harness.publishing.findings import accounts_for, findings_rows, still_seen
from harness.tools.code_blame import changed_code
from harness.tools.code_blame.finding_verification import pinned_variant
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "results"
FIRST = "peft-0.21.0-fsdp1-full-state-dict-empty-adapter"


def committed() -> list:
    findings = load_all(RESULTS / "findings")
    assert findings, "results/findings/ holds no finding"
    return findings


def test_every_committed_finding_is_verified_by_its_own_runs() -> None:
    """The reproducer failed (exit 1) at the bad release and passed (exit 0) at the good one, with only the
    flipping package's pin moved, and each run's processes imported the release it was meant to."""
    for finding in committed():
        bad, good = finding.runs["bad"], finding.runs["good"]
        assert (bad["exit_code"], good["exit_code"]) == (1, 0), finding.id
        assert bad["line"].startswith("FAIL: ") and good["line"].startswith("ok: "), finding.id
        assert [p for p in bad["pins"] if p not in good["pins"]] == [f"{finding.package}=={finding.bad}"]
        assert [p for p in good["pins"] if p not in bad["pins"]] == [f"{finding.package}=={finding.good}"]
        assert (bad["versions"][finding.package], good["versions"][finding.package]) == (finding.bad, finding.good)
        text = (finding.folder / "repro.py").read_text()
        assert "harness" not in text.replace("test harness", ""), "a reproducer stands alone"
        import hashlib

        assert bad["script_sha256"] == hashlib.sha256(text.encode()).hexdigest(), f"{finding.id}: runs of another text"
        assert finding.verified


def test_every_committed_finding_still_shows_its_flip() -> None:
    for finding in committed():
        assert still_seen(finding, Store(RESULTS)) is None, finding.id


def test_the_first_finding_points_at_the_changed_function() -> None:
    [finding] = [f for f in committed() if f.id == FIRST]
    changed = finding.changed
    assert (changed["package"], changed["older"], changed["newer"]) == ("peft", "0.20.0", "0.21.0")
    first = changed["changed"][0]  # the last called in the failing run: the save
    assert (first["file"], first["qualname"]) == ("peft/utils/save_and_load.py", "get_peft_model_state_dict")
    assert first["diff"].startswith("--- peft 0.20.0\n+++ peft 0.21.0")


def test_a_blamed_finding_names_the_function_its_runs_prove() -> None:
    """`--verify --blame` put the changed functions back one set at a time: the blamed set's own run gave the good
    release's outcome at the bad release, the full set did too (or could not run), and the issue body shows the
    blamed function's diff and that run's line."""
    from harness.publishing.findings import issue_body

    blamed = [f for f in committed() if f.blame]
    assert {f.id for f in blamed} >= {FIRST}, [f.id for f in blamed]
    for finding in blamed:
        blame = finding.blame
        assert blame["blamed"] and set(blame["blamed"]) <= set(blame["candidates"]) | {
            f"{w} (whole module)" for w in blame["widened"]
        }, finding.id
        own = [r for r in blame["runs"] if run_units(r) == sorted(blame["blamed"])]
        assert own and own[0]["outcome"] == "older" and own[0]["line"].startswith("ok: "), finding.id
        # every smaller set tried without it kept the bad outcome or could not run
        assert all(r["outcome"] != "older" for r in blame["runs"] if len(run_units(r)) < len(blame["blamed"]))
        body = issue_body(finding, None, None)
        assert "### What causes it" in body and f"`{blame['blamed'][0]}`" in body, finding.id
    [first] = [f for f in blamed if f.id == FIRST]
    assert first.blame["blamed"] == ["peft/utils/save_and_load.py::get_peft_model_state_dict"]


def test_every_blame_was_made_where_its_finding_flips() -> None:
    """Putting code back proves a cause only where the release fails: on a machine where the finding's runs do not
    flip, any revert would give the good outcome. So each blame names the machine it ran on, and a verification
    of the finding on that same machine flipped."""
    for finding in committed():
        if not finding.blame:
            continue
        machine = finding.blame.get("machine")
        assert machine and "cpu_flags" in machine, f"{finding.id}: its blame does not say where it ran"
        flipped_there = [bad for bad, _ in finding.reproduced if bad.get("machine") == machine]
        assert flipped_there, f"{finding.id}: blamed on a machine where its runs never flipped"


def test_a_finding_that_flips_on_some_machines_only_says_where(tmp_path: Path) -> None:
    """bitsandbytes 0.49 takes another CPU path where the CPU has avx512_bf16: a reproducer may flip on one machine
    and not on another. The finding stays verified by the pair that flipped, shows that pair's lines, and says on
    which machines it did and did not flip, never hiding either."""
    from harness.knowledge.findings import load_finding
    from harness.publishing.findings import issue_body

    source = RESULTS / "findings" / "bitsandbytes-0.49.0-cpu-qlora-merge-off"
    folder = tmp_path / source.name
    folder.mkdir()
    for name in ("finding.toml", "repro.py"):
        (folder / name).write_text((source / name).read_text())
    import hashlib

    finding = load_finding(source)
    sha = hashlib.sha256((source / "repro.py").read_bytes()).hexdigest()
    with_bf16 = {"cpu_model": "Xeon A", "cpu_flags": ["avx2", "avx512f", "avx512_bf16"]}
    without = {"cpu_model": "Xeon B", "cpu_flags": ["avx2", "avx512f"]}

    def run(side: str, code: int, line: str, machine: dict, day: str) -> dict:
        version = finding.bad if side == "bad" else finding.good
        other = [p for p in finding.runs["bad"]["pins"] if not p.startswith(finding.package + "==")]
        return {"side": side, "package": finding.package, "version": version,
                "pins": [*other, f"{finding.package}=={version}"], "script_sha256": sha if side == "bad" else "x",
                "made_at": f"{day}T00:00:00+00:00", "machine": machine, "exit_code": code, "line": line,
                "versions": {finding.package: version}}  # fmt: skip

    runs = [
        run("bad", 1, "FAIL: off", with_bf16, "2026-11-27"),
        run("good", 0, "ok: right", with_bf16, "2026-11-27"),
        run("bad", 0, "ok: right", without, "2026-11-29"),
        run("good", 0, "ok: right", without, "2026-11-29"),
    ]
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    found = load_finding(folder)
    assert found.verified and found.runs["bad"]["line"] == "FAIL: off"
    words = found.machines_words()
    assert "flips on 2026-11-27 (Xeon A, avx2 avx512f avx512_bf16" in words, words
    assert "does not flip on 2026-11-29 (Xeon B, avx2 avx512f, no avx512_bf16" in words, words
    assert words in issue_body(found, None, None)
    assert found.cpu_condition == ("avx512_bf16",), "the flag on the machine it flipped on and not on the other"
    # Without the flipping pair it is not verified, and says so.
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs[2:]))
    assert not load_finding(folder).verified
    # A machine not recorded on one side: no condition is claimed.
    unrecorded = [{k: v for k, v in r.items() if k != "machine"} if r["made_at"].startswith("2026-11-29") else r
                  for r in runs]  # fmt: skip
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in unrecorded))
    assert load_finding(folder).cpu_condition == ()


def test_a_failure_that_flips_by_the_cpu_applies_if_the_cpu_has_it() -> None:
    """The committed bitsandbytes 0.49.0 finding flipped on the node's CPU (avx512_bf16, AMX) and not on this CPU:
    the judge's answer for bitsandbytes 0.49.0 is "applies if your CPU has" those flags, in every view."""
    from harness.knowledge.atlas import Atlas
    from harness.knowledge.judge import Query

    atlas = Atlas(RESULTS)
    [failure] = [
        f for f in atlas.failures if any(c.finding == "bitsandbytes-0.49.0-cpu-qlora-merge-off" for c in f.changes)
    ]
    table = next(t for t in atlas.tables["failures"] if t["id"] == failure.id)
    assert table["detail"].startswith("your CPU has avx512_bf16"), table["detail"]
    answers = atlas.judge(Query(versions={"bitsandbytes": "0.49.0"}, device="cpu", partial=True))
    mine = [a for a in answers if a["id"] == failure.id]
    assert mine and all(a["state"] == "applies-if" and "avx512_bf16" in a["condition"] for a in mine), mine


def test_cpu_features_are_read_from_cpuinfo() -> None:
    from harness.execution.hardware import cpu_features

    info = "processor : 0\nmodel name : Some CPU\nflags : fpu avx2 avx512f avx512_bf16 amx_tile\n"
    assert cpu_features(info) == {"cpu_model": "Some CPU", "cpu_flags": ["avx2", "avx512f", "avx512_bf16", "amx_tile"]}
    assert cpu_features("")["cpu_flags"] == []


def test_every_flip_of_the_table_without_an_upstream_record_is_accounted_for() -> None:
    selection = select_runs(RESULTS)
    specs = {s.id: s.spec for s in discover()}
    from harness.knowledge.flips import dated_verdicts, masking

    records = selection.latest()[0]
    verdicts = dated_verdicts([r for r in records if (r.get("pins") or {}).get("date")], specs)[2]
    unaccounted = []
    from harness.knowledge.flips import watched_flips
    from harness.publishing.atlas import change_upstream, configs_of

    every = [*records, *selection.probes]
    store = Store(RESULTS)
    for flip in [*newest_flips(store, selection.run_ids), *watched_flips(store)]:
        configs = configs_of(flip, every)  # a record about a feature is the upstream record of its configs only
        if flip.changes:
            # A sweep: every change it names is the upstream record's, or accounted for like a flip.
            if all(change_upstream(flip, c, configs) is not None for c in flip.changes) or masking(flip, verdicts):
                continue
        elif flip.older_state == flip.newer_state:
            continue  # a window swept with no change inside: nothing to account for
        elif upstream_verdict(flip, configs) is not None or masking(flip, verdicts):
            continue
        if not accounts_for(flip, store):
            unaccounted.append(f"{flip.scenario} {flip.family or ''} {flip.older}..{flip.newer}")
    assert not unaccounted, "flips with no upstream record, no finding and no reason why not: " + ", ".join(unaccounted)


def test_the_terminal_list_and_the_site_show_the_same_findings(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from harness.publishing.publish import build_matrix, write_site
    from tests.test_publish import headless_chromium

    proc = subprocess.run(
        [sys.executable, "-m", "harness", "findings"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    listed = [line.split(":", 1)[0] for line in proc.stdout.splitlines()]
    atlas = Atlas(RESULTS, {s.id: s.spec for s in discover()})
    document = build_matrix(atlas)
    document["findings"] = findings_rows(atlas.store)
    site = write_site(document, tmp_path / "site")
    browser = headless_chromium()
    try:
        browser.get(site.as_uri())
        shown = [li.get_attribute("data-id") for li in browser.find_elements(By.CSS_SELECTOR, "#findings li.finding")]
        heading = browser.find_element(By.CSS_SELECTOR, "#findings-section h2")
        glance = browser.find_element(By.ID, "glance-section")
        assert heading.location["y"] < glance.location["y"], "the findings come first"
    finally:
        browser.quit()
    assert shown == listed == [f.id for f in committed()]


def test_the_table_regenerates_findings_md() -> None:
    from harness.publishing.findings import findings_markdown

    text = findings_markdown(Atlas(RESULTS, {s.id: s.spec for s in discover()}))
    assert text == (RESULTS / "FINDINGS.md").read_text(), "results/FINDINGS.md is stale: run `nox -s report`"
    assert "## Without a finding, and why" in text and "## No longer seen" in text


def test_a_finding_whose_flip_is_gone_moves_to_no_longer_seen(tmp_path: Path) -> None:
    import shutil

    from harness.publishing.findings import findings_markdown

    results = tmp_path / "results"
    shutil.copytree(RESULTS / "findings" / FIRST, results / "findings" / FIRST)
    (results / "runs" / "history-20261126T013700Z-b500").mkdir(parents=True)
    (results / "runs" / "history-20261126T013700Z-b500" / "meta.json").write_text("{}")
    (results / "flips" / "history-20261126T013700Z-b500").mkdir(parents=True)
    (results / "flips" / "history-20261126T013700Z-b500" / "flips.json").write_text("[]")
    store = Store(results)
    [finding] = store.findings
    why = still_seen(finding, store)
    assert why is not None and "no flip of S7-saved-adapter" in why
    text = findings_markdown(Atlas(results, {}, store=store))
    assert f"- {FIRST}: no flip" in text.split("## No longer seen")[1]


def test_only_the_flipping_pin_moves() -> None:
    text = textwrap.dedent(
        """\
        # /// script
        # dependencies = ["torch==2.13.0", "peft==0.21.0", "peft-extra==1.0"]
        # ///
        print("peft==0.21.0 stays in the code")
        """
    )
    moved = pinned_variant(text, "peft", "0.20.0")
    assert '"peft==0.20.0"' in moved and '"peft-extra==1.0"' in moved and 'print("peft==0.21.0' in moved
    from harness.errors import UsageError

    with pytest.raises(UsageError, match="pins accelerate 0 times"):
        pinned_variant(text, "accelerate", "1.0")


def test_functions_are_compared_by_name_across_two_sources(tmp_path: Path) -> None:
    old = "def keep():\n    return 1\n\nclass A:\n    def save(self):\n        return [k for k in 'ab']\n"
    new = old.replace("[k for k in 'ab']", "[]") + "\n    def new(self):\n        pass\n"
    for side, source, calls in (
        ("good", old, ["keep", "A.save", "A.save.<locals>.<listcomp>"]),
        ("bad", new, ["keep", "A.save", "A.new"]),
    ):
        (tmp_path / side).mkdir()
        trace = {"pid": 1, "versions": {"pkg": side}, "sources": {"pkg/m.py": source},
                 "calls": [{"file": "pkg/m.py", "qualname": q, "line": 1} for q in calls]}  # fmt: skip
        (tmp_path / side / "trace-1.json").write_text(json.dumps(trace))
    result = changed_code.compare("pkg", ("1.0", tmp_path / "good"), ("2.0", tmp_path / "bad"))
    assert result.executed_both == 2 and [c.qualname for c in result.changed] == ["A.save"]
    assert result.only_newer == ["pkg/m.py::A.new"] and not result.native_below
    assert changed_code.enclosing("f.<locals>.<listcomp>") == "f" and changed_code.enclosing("<module>") == ""
