"""Bad input gets one clear line naming the file and key (or the flag), exit 2 and nothing written; signals
get 130 (SIGINT) or 143 (SIGTERM) with the run marked interrupted. Each case here once gave a traceback, a
silent pass or the wrong exit code."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.recording import runs
from tests.conftest import REPO_ROOT, write_profile
from tests.fault_ledger import record_fault

CI_PROFILE = REPO_ROOT / "matrix" / "ci.toml"


HARNESS = [sys.executable, "-m", "harness"]


def harness(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*HARNESS, *argv], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)


def expect_exit_2(case: str, proc: subprocess.CompletedProcess, *named: str) -> None:
    record_fault(f"bad input: {case}", "exit 2", f"exit {proc.returncode}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    for text in named:
        assert text in proc.stderr, proc.stderr


def run_dirs(results: Path) -> list[Path]:
    return [p for p in (results / "runs").glob("*") if p.is_dir()] if (results / "runs").is_dir() else []


def interrupted_run(results: Path, records: str, draws: dict | None = None) -> Path:
    """A run of the ci profile whose writer died (meta says running, nobody holds its lock)."""
    run_dir = results / "runs" / "ci-20261124T000000Z-dead"
    run_dir.mkdir(parents=True)
    meta = {
        "run_id": run_dir.name,
        "profile": "ci",
        "profile_digest": runs.profile_digest(CI_PROFILE),
        "status": "running",
        "shard": None,
        "started_at": "2026-11-24T00:00:00+00:00",
        "configs": {},
        "draws": draws or {},
        "hypothesis_profile": "ci",
        "attempts": [],
    }
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "records.jsonl").write_text(records)
    return run_dir


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != runs.LOCK_NAME}


def test_a_json_line_that_is_not_a_record(tmp_path: Path) -> None:
    results = tmp_path / "r"
    run_dir = interrupted_run(results, "{}\n")
    before = snapshot(run_dir)
    resumed = harness("matrix", "--profile", "ci", "--resume", run_dir.name, "--results-dir", str(results))
    expect_exit_2("{} in records.jsonl (matrix)", resumed, "records.jsonl:1", "not a record")
    report = harness("report", "--results-dir", str(results))
    expect_exit_2("{} in records.jsonl (report)", report, "records.jsonl:1", "not a record")
    assert snapshot(run_dir) == before and run_dirs(results) == [run_dir]


def test_examples_on_a_resumed_run_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "r"
    run_dir = interrupted_run(results, "", draws={"S3-lora-sgd-scaling": {"count": 3, "seed": 1, "max_examples": 3}})
    before = snapshot(run_dir)
    proc = harness("matrix", "--profile", "ci", "--examples", "8", "--results-dir", str(results))
    expect_exit_2("--examples on a resumed run", proc, "--examples 8", run_dir.name, "--fresh")
    assert snapshot(run_dir) == before and run_dirs(results) == [run_dir]


def test_a_cell_glob_matching_nothing_creates_nothing(tmp_path: Path) -> None:
    results = tmp_path / "r"
    proc = harness("matrix", "--profile", "ci", "--cell", "nomatch*", "--results-dir", str(results))
    expect_exit_2("--cell matching no cell", proc, "--cell nomatch*", "old_")
    assert run_dirs(results) == []


def test_unwritable_envs_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # root ignores permission bits: nothing can be created under a regular file
    results = tmp_path / "r"
    proc = harness("matrix", "--profile", "ci", "--envs-dir", str(blocker / "envs"), "--results-dir", str(results))
    expect_exit_2("unwritable environments directory", proc, "not writable", str(blocker / "envs"))
    assert run_dirs(results) == []


def test_report_into_an_unwritable_place(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = harness("report", "--results-dir", str(REPO_ROOT / "results"), "--output", str(blocker / "table.md"))
    expect_exit_2("report into an unwritable place", proc, "cannot write the report", str(blocker))


@pytest.mark.parametrize(
    ("case", "extra", "named"),
    [
        (
            "unknown [scenario] section",
            '\n[scenario."S2-qlora-grad-flag"]\nexamples = 2\n',
            ['scenario."S2-qlora-grad-flag"', "unknown scenario"],
        ),
        (
            "negative examples",
            '\n[scenario."S3-lora-sgd-scaling"]\nexamples = -1\n',
            ["scenario.S3-lora-sgd-scaling.examples", "0 or more"],
        ),
    ],
)
def test_bad_scenario_sections(tmp_path: Path, case: str, extra: str, named: list[str]) -> None:
    path = write_profile(tmp_path, CI_PROFILE.read_text() + extra, "ci-typo")
    results = tmp_path / "r"
    proc = harness("matrix", "--profile", str(path), "--results-dir", str(results))
    expect_exit_2(case, proc, str(path), *named)
    assert run_dirs(results) == []


def test_unknown_scenario_in_a_profile_names_file_and_key(tmp_path: Path) -> None:
    text, replaced = re.subn(r"(?m)^scenarios = \[.*\]$", 'scenarios = ["S9-nope"]', CI_PROFILE.read_text())
    assert replaced == 1, "the ci profile's scenarios line moved: this test would run a whole matrix"
    path = write_profile(tmp_path, text, "ci-unknown")
    proc = harness("matrix", "--profile", str(path), "--results-dir", str(tmp_path / "r"))
    expect_exit_2("unknown scenario in a profile", proc, str(path), "profile.scenarios", "S9-nope")


def test_unknown_hypothesis_profile_names_file_and_key(tmp_path: Path) -> None:
    text = CI_PROFILE.read_text().replace('hypothesis_profile = "ci"', 'hypothesis_profile = "sometimes"')
    path = write_profile(tmp_path, text, "ci-hyp")
    proc = harness("matrix", "--profile", str(path), "--results-dir", str(tmp_path / "r"))
    expect_exit_2("unknown hypothesis_profile in a profile", proc, str(path), "profile.hypothesis_profile")


def test_empty_home_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COMPAT_MATRIX_ENVS", "XDG_CACHE_HOME")} | {"HOME": ""}
    proc = harness("matrix", "--profile", "ci", "--results-dir", str(tmp_path / "r"), env=env)
    expect_exit_2("HOME empty", proc, "HOME", "--envs-dir")
    assert not Path("/.cache/compat-matrix").exists() or not run_dirs(tmp_path / "r")


@pytest.mark.matrix
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_before_the_first_record(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    """Stopped while the worker is still starting: the right exit code, the run marked interrupted with the
    signal, no traceback, and no table claiming there are no runs."""
    results = tmp_path / "r"
    command = [
        *HARNESS,
        "matrix",
        "--profile",
        "ci",
        "--scenario",
        "S3",
        "--cell",
        "old_*",
        "--results-dir",
        str(results),
    ]
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(results.glob("runs/*/worker/**/launch-*")):
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    [run_dir] = run_dirs(results)
    meta = json.loads((run_dir / "meta.json").read_text())
    observed = f"exit {proc.returncode}, {meta['status']}"
    record_fault(f"{sig.name} before the first record", f"exit {code}, interrupted", observed)
    assert proc.returncode == code, out + err
    assert meta["status"] == "interrupted" and meta["attempts"][-1]["signal"] == sig.name
    assert "Traceback" not in err and "no runs" not in out + err, out + err
    assert runs.effective_status(run_dir) == "interrupted"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--profile", "history", "--date", "2024-13-01"), "--date '2024-13-01'"),
        (("--profile", "history", "--date", "2024-07-25", "--resume", "history-x"), "--date chooses the days"),
        (("--profile", "ci", "--date", "2024-07-25"), "profile ci has no date axis"),
    ],
)
def test_bad_date_options(tmp_path: Path, argv: tuple[str, ...], named: str) -> None:
    results = tmp_path / "results"
    proc = harness("matrix", *argv, "--results-dir", str(results), "--no-report")
    expect_exit_2(f"matrix {' '.join(argv[2:])}", proc, named)
    assert run_dirs(results) == []
