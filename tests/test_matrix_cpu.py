"""The real thing, small: `python -m harness matrix --profile ci` builds real cells with uv and trains tiny
models on CPU. Checks the records against the schema, the table against the records, and that a run killed
with SIGKILL resumes with no record lost or duplicated.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from harness.processes.proctree import processes_started_by
from harness.recording.records import SCHEMA_PATH, read_records, record_key
from tests.conftest import REPO_ROOT, matrix_command, write_profile
from tests.fault_ledger import record_fault

pytestmark = pytest.mark.matrix


def run_matrix(results: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        matrix_command("ci", str(results), *extra),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=1800,
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def only_run(results: Path) -> Path:
    runs = [p for p in (results / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1
    return runs[0]


def test_records_are_complete_and_valid(ci_run: Path) -> None:
    run_dir = only_run(ci_run)
    records = read_records(run_dir / "records.jsonl")
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete"
    schema = json.loads(SCHEMA_PATH.read_text())
    for record in records:
        jsonschema.validate(record, schema)
    from harness.define.profile import load_profile
    from harness.define.registry import discover
    from harness.planning.plan import matches, variants_for

    scenarios = {s.id: s for s in discover()}
    profile = load_profile("ci", REPO_ROOT / "matrix")
    # Explicit examples run every variant; a drawn config runs its baseline, and its fixes where that failed
    # (unless the scenario measures every variant). A scenario limited to some cells runs only there.
    expected = 0
    for sid, configs in meta["configs"].items():
        variants = len(variants_for(profile, scenarios[sid]))  # the profile may name a subset
        only = profile.settings_for(sid).cells
        for cell in (c for c in meta["cells"] if only is None or matches(c, only)):
            for planned in configs:
                every = planned["source"] not in ("hypothesis", "memory") or scenarios[sid].spec.get("drawn_variants")
                key = (cell, sid, "baseline", planned["config_id"])
                failed = any(record_key(r) == key and r["outcome"] == "fail" for r in records)
                expected += variants if (every or failed) else 1
    assert len(records) == expected
    assert len({record_key(r) for r in records}) == len(records)
    assert not [r for r in records if r["outcome"] in ("error", "crash", "timeout", "env-broken", "install-failed")]
    for record in records:
        assert record["versions"]["torch"].startswith("2.13.0")


def test_old_and_current_stack_really_differ(ci_run: Path) -> None:
    records = read_records(only_run(ci_run) / "records.jsonl")
    transformers = {r["cell"].split("_")[0]: r["versions"]["transformers"] for r in records}
    assert transformers["old"] == "4.41.2"
    assert transformers["current"].split(".")[0] >= "5"


def test_s3_table_shows_c_for_every_variant(ci_run: Path) -> None:
    table = (ci_run / "COMPATIBILITY.md").read_text()
    records = [r for r in read_records(only_run(ci_run) / "records.jsonl") if r["scenario"].startswith("S3-")]
    section = table.split("## S3-", 1)[1].split("\n## ", 1)[0]  # up to the next scenario's section
    header = next(line for line in section.splitlines() if line.startswith("| cell |"))
    for variant in {r["variant"] for r in records}:
        assert variant in header
    for row in (line for line in section.splitlines() if line.startswith("| `")):
        entries = row.split("|")[2:-1]
        assert entries and all("c=" in e for e in entries), row
    # c is a measurement: the baseline's hook sees exactly what is applied, GradScaler's is 1/scale.
    by_variant = {}
    for r in records:
        by_variant.setdefault(r["variant"], []).append(r["metrics"]["c"])
    assert all(abs(c - 1.0) < 1e-3 for c in by_variant["baseline"])
    assert all(abs(c - 2.0**-10) < 1e-6 for c in by_variant["grad_scaler"])


def test_resume_of_a_complete_run_only_appends_an_attempt(ci_run: Path) -> None:
    """`--resume` of a complete run runs nothing, keeps every record byte for byte, and leaves meta.json
    byte-identical apart from one appended attempt entry."""
    run_dir = only_run(ci_run)
    records_before = (run_dir / "records.jsonl").read_bytes()
    meta_before = (run_dir / "meta.json").read_text()
    proc = run_matrix(ci_run, "--resume", run_dir.name, "--no-report")
    assert ": 0 new records" in proc.stdout and f"resuming run {run_dir.name}" in proc.stdout
    assert (run_dir / "records.jsonl").read_bytes() == records_before
    after = json.loads((run_dir / "meta.json").read_text())
    appended = after["attempts"].pop()
    assert json.dumps(after, indent=1, sort_keys=True) + "\n" == meta_before
    assert appended["status"] == "complete" and appended["records_written"] == 0


def test_a_complete_run_is_never_resumed_by_default(tmp_path: Path, ci_run: Path) -> None:
    """On a fresh clone the committed runs are complete: the README command must do new work, not 'resume'."""
    shutil.copytree(ci_run / "runs", tmp_path / "runs")
    proc = run_matrix(tmp_path, "--scenario", "S3", "--cell", "old_*", "--no-report")
    assert "new run" in proc.stdout.splitlines()[0], proc.stdout
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 2
    written = re.search(r"run \S+: (\d+) new records", proc.stdout)
    assert written and int(written.group(1)) > 0, proc.stdout


#: What the SIGKILL test runs: the `ci` profile's S2 in both cells (drawn configs, a shrink, fixes, then the next
#: cell), the part of the profile where a record matched to the wrong job would change an outcome.
KILLED_SLICE = ("--scenario", "S2-qlora-grad-flags")


def test_sigkill_mid_run_loses_and_duplicates_nothing(tmp_path: Path, ci_run: Path) -> None:
    """SIGKILL of the orchestrator once a slice of the `ci` profile has 3 records; a plain re-run resumes it and
    ends with every key of the plain run's slice once, the records written before the kill kept as they were."""
    results = tmp_path / "results"
    command = matrix_command("ci", str(results), *KILLED_SLICE)
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records_path = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        found = list(results.glob("runs/*/records.jsonl"))
        if found and len(read_records(found[0], warn=False)) >= 3:
            records_path = found[0]
            break
        time.sleep(0.2)
    assert records_path is not None, "the run never produced records"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    survived = read_records(records_path, warn=False)
    time.sleep(3)  # the worker's watchdog notices the orchestrator is gone
    orphans = processes_started_by(proc.pid)
    assert orphans == []

    run_matrix(results, *KILLED_SLICE)
    final = read_records(records_path)
    reference = [r for r in read_records(only_run(ci_run) / "records.jsonl") if r["scenario"] == KILLED_SLICE[1]]
    reference_keys = {record_key(r) for r in reference}
    lost = len(reference_keys - {record_key(r) for r in final}) + len(final) - len({record_key(r) for r in final})
    runs = [p for p in (results / "runs").iterdir() if p.is_dir()]
    status = json.loads((records_path.parent / "meta.json").read_text())["status"]
    observed = f"{'resumed' if len(runs) == 1 else f'{len(runs)} runs'}, {status}"
    record_fault("SIGKILL of the orchestrator, rerun", "resumed, complete", observed, lost, len(orphans))
    assert len(survived) < len(reference_keys), "premise: the kill came before the slice was done"
    assert final[: len(survived)] == survived, "records written before the kill must be kept as they were"
    assert len({record_key(r) for r in final}) == len(final)
    assert {record_key(r) for r in final} == reference_keys
    assert len({r["cell"] for r in final}) == 2, "the re-run went on to the next cell"


def test_s2_real_failure_and_its_fix_on_the_old_stack(ci_run: Path) -> None:
    """The mini matrix must show a real failure and a fix that works, from real runs."""
    records = [r for r in read_records(only_run(ci_run) / "records.jsonl") if r["scenario"] == "S2-qlora-grad-flags"]
    old = [r for r in records if r["cell"].startswith("old_")]
    failing = {r["config_id"] for r in old if r["variant"] == "baseline" and r["outcome"] == "fail"}
    assert failing, "S2 must fail on the old stack's default path"
    assert {r["signature"] for r in old if r["variant"] == "baseline" and r["config_id"] in failing} == {
        "no-grad-element-0"
    }
    fix = {r["config_id"]: r["outcome"] for r in old if r["variant"] == "enable_input_require_grads"}
    assert all(fix[c] == "pass" for c in failing)
    misspelled = {r["config_id"]: r for r in old if r["variant"] == "seed_misspelled_api"}
    assert all(misspelled[c]["signature"] == "no-grad-element-0" for c in failing), "the seed's API does not exist"
    table = (ci_run / "COMPATIBILITY.md").read_text()
    assert "FAIL target `no-grad-element-0`" in table and "enable_input_require_grads" in table


def test_a_drawn_failure_is_shrunk_in_its_cell(ci_run: Path) -> None:
    """Issue check: a real failure (S2 on the old stack) shrunk from a larger config, both in the record."""
    records = read_records(only_run(ci_run) / "records.jsonl")
    shrunk = [r for r in records if r.get("shrink", {}).get("runs")]
    assert shrunk, "some drawn S2 config must fail on the old stack and be shrunk"
    for record in shrunk:
        assert record["config_source"] == "hypothesis" and record["variant"] == "baseline"
        assert record["minimal_config"] != record["config"]
        assert record["minimal_config_id"] != record["config_id"]
        assert not record["shrink"]["budget_spent"] and record["shrink"]["reached"]
        # Smaller where it can be: every numeric setting of the minimal config is at most the original's.
        for key, value in record["minimal_config"].items():
            if isinstance(value, int) and not isinstance(value, bool):
                assert value <= record["config"][key], key


def test_the_minimal_config_fails_the_same_way_on_its_own(ci_run: Path, tmp_path: Path) -> None:
    """A shrunk failure is remembered (the run's Hypothesis database); the next run draws it first as a config of
    its own, and there, in the same cell, its baseline fails with the same signature."""
    records = read_records(only_run(ci_run) / "records.jsonl")
    shrunk = next(r for r in records if r.get("shrink", {}).get("runs"))
    shutil.copytree(ci_run / "hypothesis-db", tmp_path / "hypothesis-db")
    scenario, cell, minimal = shrunk["scenario"], shrunk["cell"], shrunk["minimal_config_id"]
    run_matrix(tmp_path, "--scenario", scenario, "--cell", cell, "--config", minimal, "--no-report")
    again = read_records(only_run(tmp_path) / "records.jsonl")
    [baseline] = [r for r in again if r["variant"] == "baseline"]
    assert baseline["config_id"] == minimal and baseline["config"] == shrunk["minimal_config"]
    assert baseline["config_source"] == "memory", baseline["config_source"]
    assert (baseline["outcome"], baseline["signature"]) == ("fail", shrunk["signature"]), baseline["message"]


def test_repro_reproduces_the_failure_and_its_fix_passes(ci_run: Path) -> None:
    """Issue check: every distinct failure has a reproducer; one runs with `uv run` in a fresh environment."""
    from harness.publishing.repro import check_repro

    index = json.loads((ci_run / "repros" / "index.json").read_text())
    records = read_records(only_run(ci_run) / "records.jsonl")
    distinct = {(r["cell"], r["scenario"], r["variant"], r["signature"]) for r in records if r["outcome"] == "fail"}
    assert {(e["cell"], e["scenario"], e["variant"], e["signature"]) for e in index} == distinct
    for entry in index:
        assert (ci_run / "repros" / entry["file"]).is_file()
    entry = next(
        e
        for e in index
        if e["scenario"] == "S2-qlora-grad-flags" and e["variant"] == "baseline" and e["minimal_config_id"]
    )
    assert "enable_input_require_grads" in entry["passing_fixes"]
    repro = ci_run / "repros" / entry["file"]
    failing = check_repro(repro, entry, timeout_s=900)
    assert failing["returncode"] == 1, failing["output"]
    assert failing["observed"] == entry["signature"]
    fixed = check_repro(repro, entry, "enable_input_require_grads", timeout_s=900)
    assert fixed["returncode"] == 0 and fixed["observed"] == "pass", fixed["output"]


def test_single_process_scenario_packed_over_two_workers(tmp_path: Path) -> None:
    """The structure GPU packing and CPU slots use: S3's jobs dealt over two concurrent one-thread workers give
    the same records, with the same measurements, as one worker (in one cell: a second adds worker starts, not
    another way to deal the jobs)."""
    one_cell = ("--scenario", "S3", "--cell", "current_*", "--no-report")
    run_matrix(tmp_path / "packed", *one_cell, "--slots", "2")
    run_matrix(tmp_path / "single", *one_cell, "--slots", "1")
    packed = read_records(only_run(tmp_path / "packed") / "records.jsonl")
    reference = read_records(only_run(tmp_path / "single") / "records.jsonl")
    assert {record_key(r) for r in packed} == {record_key(r) for r in reference}
    assert {r["slot"]["index"] for r in packed} == {0, 1} and all(r["slot"]["of"] == 2 for r in packed)
    assert all(r["slot"]["threads"] == str(max(1, (os.cpu_count() or 1) // 2)) for r in packed)
    assert not any("slot" in r for r in reference)
    by_key = {record_key(r): r["metrics"]["c"] for r in reference}
    for record in packed:
        assert abs(record["metrics"]["c"] - by_key[record_key(record)]) < 1e-6


def test_site_json_and_markdown_show_the_facts_of_the_records(ci_run: Path) -> None:
    """Issue check: regenerated from the run, the site's data, matrix.json and the Markdown agree with the records."""
    records = read_records(only_run(ci_run) / "records.jsonl")
    document = json.loads((ci_run / "matrix.json").read_text())
    assert document["schema"] == "compat-matrix/matrix/v1" and len(document["records"]) == len(records)
    script = (ci_run / "site" / "data" / "matrix.js").read_text()
    embedded = json.loads(script.removeprefix("window.COMPAT_DATA = ").removesuffix(";\n"))
    assert embedded["entries"] == document["entries"] and embedded["glance"] == document["glance"]
    markdown = (ci_run / "COMPATIBILITY.md").read_text().split("## Summary", 1)[1].split("###", 1)[0]
    scenarios = next(line for line in markdown.splitlines() if line.startswith("| cell |")).split("|")[2:-1]
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[2:-1]
        for line in markdown.splitlines()
        if line.startswith("| `")
    }
    by_key = {"|".join(record_key(r)): r for r in records}
    for entry in document["entries"]:
        # An entry counts the records it lists: the row's own, pitfall configs apart, and where the judge says the
        # scenario fails there, only those of the setups it fails in (a passing setup is not the failure's n).
        own = [
            r
            for r in records
            if (r["cell"], r["scenario"], r["variant"]) == (entry["cell"], entry["scenario"], "baseline")
        ]
        baseline = [by_key[k] for k in entry["keys"] if by_key[k]["variant"] == "baseline"]
        assert {r["config_id"] for r in baseline} <= {r["config_id"] for r in own}
        left_out = [r for r in own if r not in baseline]
        assert all(r["config_id"] in entry["pitfalls"] or entry["judged"] == "fails" for r in left_out), entry
        assert sum(entry["baseline"].values()) == len(baseline) > 0
        for outcome, count in entry["baseline"].items():
            assert count == sum(1 for r in baseline if r["outcome"] == outcome)
        shown = rows[entry["cell"]][[s.strip() for s in scenarios].index(entry["scenario"])]
        # The headline's first line says whether the scenario's own target failure reproduced, apart from others.
        first = shown.split("<br>")[0]
        assert ("FAIL" in first) == (entry["target"]["state"] in ("target", "failures")), (entry, shown)
        assert entry["headline"][0].split(" (")[0] in first.replace("`", ""), (entry, shown)
    assert list((ci_run / "junit").glob("*.xml"))


def test_check_in_an_old_and_a_new_environment_agrees_with_the_table(ci_run: Path) -> None:
    """`python -m harness check`, run with the interpreter of the ci cells' own environments (an old stack and
    the newest), reports the target failures the table shows for those stacks and exits 1 only for the old."""
    from harness.environments.envs import default_envs_dir

    table = (ci_run / "COMPATIBILITY.md").read_text()
    for stack, expected_exit in (("old", 1), ("current", 0)):
        [python] = list(default_envs_dir().glob(f"{stack}_torch-2.13.0_bnb-latest-*/bin/python"))
        proc = subprocess.run(
            [str(python), "-m", "harness", "check", "--scenario", "S2-qlora-grad-flags", "--results-dir", str(ci_run)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=900,
        )
        assert proc.returncode == expected_exit, proc.stdout + proc.stderr
        # S2 really ran there: its section has a verdict over configs that ran, not a skip or an error.
        section = proc.stdout.split("\nS2-qlora-grad-flags: ", 1)[1].split("\n\n", 1)[0]
        assert not section.startswith("SKIP") and "ERROR" not in section, section
        verdict = re.search(r"(FAIL target no-grad-element-0|target not reproduced) \((\d+)/(\d+)\)", section)
        assert verdict and int(verdict.group(3)) >= 1, section
        assert verdict.group(1).startswith("FAIL") == (expected_exit == 1), section
        assert "ran: cpu, world size 1" in section, section
        row = next(line for line in table.splitlines() if line.startswith(f"| `{stack}_"))
        table_says = "FAIL target `no-grad-element-0`" in row
        assert table_says == (expected_exit == 1), row
        assert ("target failures in this environment: S2-qlora-grad-flags (no-grad-element-0)" in proc.stdout) == (
            expected_exit == 1
        ), proc.stdout
        # The judge's answer for these releases, this check's runs included: the same one lookup and audit give.
        judged = proc.stdout.split("what the atlas says of these releases", 1)[1]
        assert ("APPLIES (exact)" in judged) == (expected_exit == 1), judged


def test_upstream_report_for_a_reproducer(ci_run: Path) -> None:
    """A ready-to-file issue body: the cell's versions, the PEP 723 reproducer, expected and actual behaviour."""
    index = json.loads((ci_run / "repros" / "index.json").read_text())
    entry = next(e for e in index if e["scenario"] == "S2-qlora-grad-flags" and e["variant"] == "baseline")
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "upstream-report", entry["file"], "--results-dir", str(ci_run)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    body = proc.stdout
    for heading in ("### System Info", "### Reproduction", "### Expected behavior", "### Actual behavior"):
        assert heading in body
    assert "- `transformers`: 4.41.2" in body and "# /// script" in body
    assert "element 0 of tensors does not require grad" in body and "enable_input_require_grads" in body


WORLD_SIZE_AXIS = """
[profile]
description = "world size as an axis: the ci profile's current stack at 1 and 2 ranks"
device = "cpu"
world_size = [1, 2]
scenarios = ["S1-*", "S3-*"]
examples_per_scenario = 0
hypothesis_seed = 20261121

[axes]
torch = ["2.13.0"]
bitsandbytes = ["latest"]

[stacks.current]
transformers = "latest"
peft = "latest"
accelerate = "latest"

[install]
extra = ["hypothesis"]

[scenario."S1-dora-fsdp-checkpoint"]
variants = ["baseline"]

[scenario."S3-lora-sgd-scaling"]
variants = ["baseline"]
"""


def test_world_size_axis_expands_cells_and_the_table_shows_each(tmp_path: Path) -> None:
    """Issue check: `world_size = [1, 2]` gives a cell per world size (one environment), each record says its
    world size, the table shows both cells, and a single-process scenario runs once per stack."""
    profile = write_profile(tmp_path, WORLD_SIZE_AXIS, "ws")
    proc = run_matrix_profile(profile, tmp_path / "results")
    records = read_records(only_run(tmp_path / "results") / "records.jsonl")
    by_cell: dict[str, dict[str, set]] = {}
    for r in records:
        seen = by_cell.setdefault(r["cell"], {})
        seen.setdefault(r["scenario"], set()).add((r["outcome"], r["hardware"]["world_size"]))
    one, two = "current_torch-2.13.0_bnb-latest_ws-1", "current_torch-2.13.0_bnb-latest_ws-2"
    assert set(by_cell) == {one, two}, proc.stdout
    assert by_cell[one]["S1-dora-fsdp-checkpoint"] == {("skip", 1)}, "S1 needs 2 ranks: skipped, saying so"
    assert {ws for _, ws in by_cell[two]["S1-dora-fsdp-checkpoint"]} == {2}
    assert "fail" in {o for o, _ in by_cell[two]["S1-dora-fsdp-checkpoint"]}, "at 2 ranks S1 really runs"
    assert not any("ranks" in (r["message"] or "") for r in records if r["cell"] == two)
    assert "S3-lora-sgd-scaling" in by_cell[one] and "S3-lora-sgd-scaling" not in by_cell[two]
    skip = next(r for r in records if r["cell"] == one and r["scenario"].startswith("S1"))
    assert "needs at least 2 ranks" in skip["message"]
    table = (tmp_path / "results" / "COMPATIBILITY.md").read_text()
    assert one in table and two in table
    assert "world size 2" in table


def run_matrix_profile(profile: Path, results: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        matrix_command(profile, results, "--no-example-db"), capture_output=True, text=True, cwd=REPO_ROOT, timeout=1800
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_a_config_that_would_silently_degrade_is_not_a_pass(ci_run: Path) -> None:
    """The seed's QLoRA config on the old stack, where transformers 4.41 refuses 4-bit loading on CPU: it once
    trained an unquantized base and counted as a QLoRA pass. Its record is not applicable now and says why; on the
    newest stack the same config measures its 4-bit weights, and every job that ran records what ran."""
    records = read_records(only_run(ci_run) / "records.jsonl")
    s2 = [r for r in records if r["scenario"] == "S2-qlora-grad-flags" and (r["config"] or {}).get("base") == "4bit"]
    old = [r for r in s2 if r["cell"].startswith("old_")]
    assert old, "the ci profile runs the seed's 4-bit config on the old stack"
    for record in old:
        assert (record["outcome"], record["signature"]) == ("skip", "not-applicable"), record["outcome"]
        assert "refuses 4-bit loading on cpu" in record["message"], record["message"]
        assert record["setup"]["not_applicable"] == record["message"]
    current = [r for r in s2 if r["cell"].startswith("current_") and r["variant"] == "baseline"]
    assert current and all(r["setup"]["quantized_weights"] == r["setup"]["linear4bit_modules"] > 0 for r in current)
    ran = [r for r in records if r["outcome"] in ("pass", "fail")]
    assert ran and all((r.get("setup") or {}).get("world_size") for r in ran), "every job that ran says what ran"
    assert all(r["setup"]["world_size"] == r["hardware"]["world_size"] for r in ran)
    table = (ci_run / "COMPATIBILITY.md").read_text()
    assert "refuses 4-bit loading on cpu" in table and "## Not applicable here" in table
