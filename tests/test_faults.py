"""Fault injection into real runs: every fault becomes a classified record, no record is lost, no process
is left behind. Faults come from `tests/fault_scenarios/f1_faults.py` (real torchrun ranks, real gloo)
run through the real matrix command with `tests/fault_profiles/faults.toml`. The suite prints a summary
(faults injected, classified correctly, records lost, orphan processes) at the end of the pytest run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.processes.proctree import processes_started_by
from harness.recording.records import read_records, record_key
from tests.conftest import REPO_ROOT, matrix_command
from tests.fault_ledger import record_fault

pytestmark = pytest.mark.matrix
PROFILE = REPO_ROOT / "tests" / "fault_profiles" / "faults.toml"
EXPECTED = {
    "baseline": ("pass", None),
    "hang_in_collective": ("timeout", "timeout"),
    "rank_abort": ("crash", "crash-SIGABRT"),
    "segfault": ("crash", "crash-SIGSEGV"),
    "oom": ("crash", "crash-oom"),
    "flaky": ("flaky", None),
    "deterministic_fail": ("fail", None),
    "gil_spin": ("timeout", "timeout"),  # the harness alive: its timeout kills a worker that holds the GIL
}


def harness(results: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, str]:
    command = [sys.executable, "-m", "harness", "matrix", "--results-dir", str(results), *extra]
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=1500)
    return proc, out, err


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory) -> tuple[Path, int, list[dict]]:
    results = tmp_path_factory.mktemp("faults")
    marks = tmp_path_factory.mktemp("marks")
    env = os.environ | {
        "COMPAT_MATRIX_EXTRA_SCENARIOS": "tests.fault_scenarios.f1_faults",
        "COMPAT_MATRIX_SCENARIO_FAULT_DIR": str(marks),
    }
    proc, out, err = harness(results, "--profile", str(PROFILE), env=env)
    assert proc.returncode == 0, out + err
    time.sleep(2)  # a worker's watchdog would notice a dead orchestrator within a second
    records = read_records(next(results.glob("runs/*/records.jsonl")))
    return results, len(processes_started_by(proc.pid)), records


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_each_injected_fault_is_classified(fault_run, variant: str) -> None:
    _, orphans, records = fault_run
    [record] = [r for r in records if r["cell"].startswith("current_") and r["variant"] == variant]
    outcome, signature = EXPECTED[variant]
    observed = record["outcome"] if signature is None else f"{record['outcome']}/{record['signature']}"
    expected = outcome if signature is None else f"{outcome}/{signature}"
    record_fault(f"F1 {variant}", expected, observed, orphans=orphans if variant == "hang_in_collective" else 0)
    assert record.get("scenario_digest"), "every record says which scenario code made it"
    assert observed == expected, record
    assert orphans == 0
    if variant in ("rank_abort", "segfault"):
        assert "rank 1:" in record["stderr_tail"], "the dying rank's last stderr lines are kept"
    if variant in ("hang_in_collective", "gil_spin"):
        # Hangs explain themselves: every rank's Python stack at the kill (faulthandler, which answers even while
        # a rank holds the GIL in C), the collective each rank waits in, and at most two job timeouts spent.
        assert set(record["rank_stacks"]) == {"0", "1"}, record.get("rank_stacks")
        assert len(record.get("attempts", [None])) <= 2 and record["duration_s"] <= 2 * 12 + 5
    if variant == "hang_in_collective":
        assert record["waiting_in"] == {"0": "all_reduce", "1": None}, record["waiting_in"]
        assert "in run" in record["rank_stacks"]["1"]  # rank 1 sleeps in the scenario, outside any collective
        assert "rank 0 in all_reduce" in record["message"]
    if variant == "gil_spin":
        assert all("in run" in stack for stack in record["rank_stacks"].values())
    if variant == "flaky":
        assert [a["outcome"] for a in record["attempts"]] == ["fail", "pass"]
    if variant == "deterministic_fail":
        assert [a["outcome"] for a in record["attempts"]] == ["fail", "fail"]


def test_impossible_pin_is_install_failed_and_the_matrix_goes_on(fault_run) -> None:
    _, _, records = fault_run
    broken = [r for r in records if r["cell"].startswith("broken_")]
    observed = {r["outcome"] for r in broken}
    record_fault("impossible pin (peft==0.0.99)", "install-failed", "/".join(sorted(observed)))
    assert observed == {"install-failed"} and len(broken) == len(EXPECTED)
    assert all("0.0.99" in r["message"] for r in broken)
    assert any(r["cell"].startswith("current_") for r in records), "the next cell still ran"


def test_no_record_is_lost(fault_run) -> None:
    results, _, records = fault_run
    meta = json.loads(next(results.glob("runs/*/meta.json")).read_text())
    expected = len(meta["cells"]) * len(EXPECTED)
    lost = expected - len({record_key(r) for r in records})
    record_fault("every job has one record", f"{expected} records", f"{len(records)} records", lost=max(lost, 0))
    assert lost == 0 and len(records) == expected


def test_broken_wheelhouse_is_install_failed(tmp_path: Path) -> None:
    empty = tmp_path / "wheels"
    empty.mkdir()
    env = os.environ | {"COMPAT_MATRIX_EXTRA_SCENARIOS": "tests.fault_scenarios.f1_faults"}
    proc, out, err = harness(
        tmp_path / "results",
        "--profile",
        str(PROFILE),
        "--offline",
        "--wheelhouse",
        str(empty),
        "--envs-dir",
        str(tmp_path / "envs"),
        "--cell",
        "current_*",
        env=env,
    )
    assert proc.returncode == 0, out + err
    records = read_records(next((tmp_path / "results").glob("runs/*/records.jsonl")))
    observed = {r["outcome"] for r in records}
    record_fault("empty wheelhouse, --offline", "install-failed", "/".join(sorted(observed)))
    assert observed == {"install-failed"}


def _as_a_background_job() -> None:
    """What a shell without job control gives a background command (`nohup ... &`, a job script): SIGINT ignored.
    The harness must stop on SIGINT all the same, so the test does not depend on what its own runner inherited."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: What the SIGINT test runs: the `ci` profile's S3 in both cells (two workers' starts, a measured metric per job).
INTERRUPTED_SLICE = ("--scenario", "S3-*")


def test_sigint_stops_cleanly_with_a_partial_table(ci_run: Path, tmp_path: Path) -> None:
    """SIGINT, with SIGINT ignored as a background job has it, once a slice of the `ci` profile has 5 records: exit
    130, the run marked interrupted, the partial table written, nothing left running; a plain re-run resumes it and
    ends with every key of the plain run's slice once, the records written before the signal kept as they were."""
    results = tmp_path / "results"
    command = matrix_command("ci", str(results), *INTERRUPTED_SLICE)
    proc = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=_as_a_background_job,
    )
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        found = list(results.glob("runs/*/records.jsonl"))
        if found and len(read_records(found[0], warn=False)) >= 5:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    time.sleep(2)
    orphans = len(processes_started_by(proc.pid))
    meta = json.loads(next(results.glob("runs/*/meta.json")).read_text())
    observed = f"exit {proc.returncode}, {meta['status']}"
    record_fault("SIGINT mid-run", "exit 130, interrupted", observed, orphans=orphans)
    assert proc.returncode == 130, out + err
    assert meta["status"] == "interrupted"
    assert (results / "COMPATIBILITY.md").is_file(), "the partial table is written"
    assert orphans == 0
    survived = read_records(next(results.glob("runs/*/records.jsonl")))
    rerun, out, err = harness(results, "--profile", "ci", *INTERRUPTED_SLICE)
    assert rerun.returncode == 0, out + err
    final = read_records(next(results.glob("runs/*/records.jsonl")))
    assert final[: len(survived)] == survived and len({record_key(r) for r in final}) == len(final)
    plain = {record_key(r) for r in records_of_run(ci_run) if r["scenario"].startswith("S3-")}
    assert len(survived) < len(plain), "premise: the signal came before the slice was done"
    assert {record_key(r) for r in final} == plain, "the re-run finished the slice, nothing more"


def test_sigint_stops_a_bisect_between_or_inside_its_probes(tmp_path: Path) -> None:
    """A bisect (or flips) runs each probe as a matrix run, which keeps its records on Ctrl-C and returns: the
    search must stop there too (exit 130, no verdict from an unfinished probe), not go on to the next release
    and end "no flip" with exit 0. Started with SIGINT ignored, as a background job is."""
    resume_profile = REPO_ROOT / "tests" / "fault_profiles" / "resume.toml"
    command = [
        *(sys.executable, "-m", "harness", "bisect", "--profile", str(resume_profile), "--package", "peft"),
        *("--scenario", "S3", "--good", "0.12.0", "--bad", "0.15.0", "--results-dir", str(tmp_path / "r")),
    ]
    log = tmp_path / "bisect.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_as_a_background_job,
        )  # fmt: skip
    deadline = time.monotonic() + 900
    while "bisect: peft==0.12.0" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, log.read_text()  # five more probes to go: it cannot have finished
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    time.sleep(2)
    orphans = len(processes_started_by(proc.pid))
    verdicts = list((tmp_path / "r").glob("bisect/*/verdict.json"))
    shown = "no verdict" if not verdicts else f"{len(verdicts)} verdicts"
    record_fault("SIGINT during a bisect", "exit 130, no verdict", f"exit {proc.returncode}, {shown}",
                 orphans=orphans)  # fmt: skip
    assert proc.returncode == 130, log.read_text()[-3000:]
    assert verdicts == [] and orphans == 0


def _installers_of(pid: int) -> list[str]:
    """Command lines of the package installers (uv, pip) that the harness `pid` is running."""
    lines = []
    for child in processes_started_by(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv)
        if " install " in f" {text} ":
            lines.append(text)
    return lines


def test_kill9_during_an_environment_build_then_an_immediate_rerun(ci_run: Path, tmp_path: Path) -> None:
    """kill -9 of the harness while uv installs a cell's environment: no process of the first run survives 5 s,
    and a re-run started at once waits for the dying build, discards the half-built environment, and completes
    with the outcomes of an uninterrupted run (the session's plain `ci` run)."""
    results, envs = tmp_path / "results", tmp_path / "envs"
    slice_ = ("--cell", "old_*", "--scenario", "S2-qlora-grad-flags")
    command = matrix_command("ci", results, "--envs-dir", envs, *slice_)
    log = tmp_path / "run.log"
    with open(log, "ab") as out:
        first = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while not _installers_of(first.pid) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _installers_of(first.pid), "premise: the first run was caught installing\n" + log.read_text()[-3000:]
    first.kill()
    first.wait()
    with open(log, "ab") as out:
        rerun = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 5
    while processes_started_by(first.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_started_by(first.pid)
    code = rerun.wait(timeout=1500)
    records = read_records(next(results.glob("runs/*/records.jsonl")))
    plain = {record_key(r): (r["outcome"], r["signature"]) for r in records_of_run(ci_run)}
    differ = [record_key(r) for r in records if plain.get(record_key(r)) != (r["outcome"], r["signature"])]
    record_fault(
        "kill -9 during an environment build, re-run",
        "exit 0, same outcomes",
        f"exit {code}, {'same outcomes' if not differ else f'{len(differ)} differ'}",
        orphans=len(left),
        wrong=len(differ),
    )
    assert left == [], f"processes of the killed run alive after 5 s: {left}"
    assert code == 0, log.read_text()[-3000:]
    assert records and not differ, differ[:10]
    assert {r["outcome"] for r in records} >= {"pass", "fail"}, "the comparison covers a failure and its fix"
    assert not list(envs.glob(".discard-*")), "the half-built environment was removed"


def records_of_run(results: Path) -> list[dict]:
    return [r for path in results.glob("runs/*/records.jsonl") for r in read_records(path, warn=False)]


def test_truncated_last_line_is_repaired_on_resume(tmp_path: Path) -> None:
    from harness.recording.records import RecordWriter

    path = tmp_path / "records.jsonl"
    good = {"cell": "c", "scenario": "S1-x", "variant": "baseline", "config_id": "1", "outcome": "pass"}
    path.write_text(json.dumps(good) + "\n" + '{"cell": "c", "scenario": "S1-x", "vari')
    with RecordWriter(path) as writer:
        writer.append(good | {"config_id": "2"})
    records = read_records(path)
    observed = f"{len(records)} records, valid" if all(isinstance(r, dict) for r in records) else "damaged"
    record_fault("truncated last JSONL line", "2 records, valid", observed)
    assert [r["config_id"] for r in records] == ["1", "2"]


def test_sigint_stops_run_script_started_as_a_background_job(tmp_path: Path) -> None:
    """run-script (and so bisect-script's runs) with SIGINT ignored, as `nohup ... &` starts it: SIGINT still
    stops it with exit 130, and the script it started does not outlive it."""
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run-script", str(script), "--timeout", "300"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=_as_a_background_job,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        "sleeps.py" in " ".join(_cmdline(p)) for p in processes_started_by(proc.pid)
    ):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    time.sleep(1)
    orphans = processes_started_by(proc.pid)
    record_fault(
        "SIGINT to run-script started with SIGINT ignored", "exit 130", f"exit {proc.returncode}", orphans=len(orphans)
    )
    assert proc.returncode == 130, out + err
    assert orphans == []


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return []
