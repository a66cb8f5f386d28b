"""A resumed, interrupted or concurrent run must never change a result.

These tests compare what users read (each key's outcome, signature and metrics), not only which keys exist,
against an uninterrupted run of the same profile and seed. The profile (`tests/fault_profiles/resume.toml`)
is one real cell where S2's baseline fails and its fixes pass and where every S3 variant measures another
factor `c`: a result matched to the wrong job changes something a user would see.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from harness.processes.proctree import processes_started_by
from harness.recording.records import read_records, record_key
from tests.conftest import REPO_ROOT, matrix_command
from tests.fault_ledger import record_fault

pytestmark = pytest.mark.matrix
PROFILE = REPO_ROOT / "tests" / "fault_profiles" / "resume.toml"
GIL_PROFILE = REPO_ROOT / "tests" / "fault_profiles" / "gil.toml"
METHODS = ("truncated-last-line", "kill-9", "sigint")
#: The harness's two kinds of pause point: after the next record is durable, once a scenario's workers are ready.
KINDS = ("records", "workers-ready")
#: Interruptions of the loop: by default each method at each kind of point once (six); what a seventh adds is one
#: more restart of the same kind (issue 76: twenty took 220 s of the suite). COMPAT_MATRIX_RESUME_POINTS=20 runs more.
POINTS = int(os.environ.get("COMPAT_MATRIX_RESUME_POINTS", str(len(METHODS) * len(KINDS))))


def start(results: Path, *extra: str, profile: Path = PROFILE, env: dict[str, str] | None = None) -> subprocess.Popen:
    command = [
        *matrix_command(str(profile), str(results)),
        "--no-report",
        *extra,
    ]
    log = open(results.parent / f"{results.name}.log", "ab")
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    return proc


def records_of(results: Path) -> list[dict[str, Any]]:
    return [r for path in sorted(results.glob("runs/*/records.jsonl")) for r in read_records(path, warn=False)]


def visible(record: dict[str, Any]) -> dict[str, Any]:
    """What a reader of the table sees of a record: outcome, signature and the measured metrics (timings,
    which differ from run to run by nature, left out)."""
    metrics = {k: v for k, v in (record.get("metrics") or {}).items() if not k.endswith("_s")}
    return {"outcome": record["outcome"], "signature": record["signature"], "metrics": metrics}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        numbers = isinstance(a, int | float) and isinstance(b, int | float)
        return numbers and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def wrong_outcomes(records: list[dict[str, Any]], reference: dict[tuple[str, ...], dict[str, Any]]) -> list[str]:
    """Every key whose visible result differs from the uninterrupted run (or is missing, or doubled)."""
    wrong = []
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for record in records:
        by_key.setdefault(record_key(record), []).append(record)
    for key, expected in reference.items():
        got = by_key.get(key, [])
        if len(got) != 1:
            wrong.append(f"{key}: {len(got)} records")
        elif not same(visible(got[0]), visible(expected)):
            wrong.append(f"{key}: {visible(got[0])} != {visible(expected)}")
    wrong += [f"{key}: not in the reference" for key in by_key if key not in reference]
    return wrong


def wait_for(condition, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc is not None and proc.poll() is not None:
            return condition()
        time.sleep(0.05)
    return False


def survivors(pid: int, within_s: float = 5.0) -> list[int]:
    """Processes the dead harness `pid` started that are still alive after `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and processes_started_by(pid):
        time.sleep(0.1)
    return processes_started_by(pid)


def cut_last_line_in_half(path: Path) -> None:
    """What a writer killed in the middle of a line leaves behind."""
    data = path.read_bytes()
    body = data[:-1] if data.endswith(b"\n") else data
    start = body.rfind(b"\n") + 1
    path.write_bytes(data[: start + max(1, (len(body) - start) // 2)])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[tuple[str, ...], dict[str, Any]]:
    results = tmp_path_factory.mktemp("reference") / "r"
    proc = start(results)
    assert proc.wait(timeout=900) == 0, (results.parent / "r.log").read_text()
    records = records_of(results)
    assert len({record_key(r) for r in records}) == len(records)
    assert {r["outcome"] for r in records} >= {"pass", "fail"}, "the profile must show a failure and a pass"
    return {record_key(r): r for r in records}


def paused(proc: subprocess.Popen, marker: Path, timeout_s: float = 600) -> bool:
    """Whether the harness reached its pause point (it wrote the marker and stopped itself) in time."""
    return wait_for(lambda: marker.is_file() and _state(proc.pid) == "T", timeout_s, proc)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def schedule(points: int, total: int) -> list[tuple[str, str, int]]:
    """(method, kind of pause point, record target) of each interruption. Method and kind cycle together (3 and 2
    are coprime), so six points hold every pair; the record points are spread over the run's `total` records (its
    drawn configs, its shrinking, its later scenario), not bunched at its start."""
    at_records = (points + 1) // 2
    targets = iter(max(1, round(j * total / (at_records + 1))) for j in range(1, at_records + 1))
    return [
        (METHODS[i % len(METHODS)], KINDS[i % len(KINDS)], next(targets) if KINDS[i % len(KINDS)] == "records" else 0)
        for i in range(points)
    ]


def test_schedule_holds_every_method_at_every_kind_of_point() -> None:
    """The default schedule is the coverage the loop below claims: each pair once, the record points in order."""
    planned = schedule(POINTS, 50)
    if POINTS >= len(METHODS) * len(KINDS):
        assert {(method, kind) for method, kind, _ in planned} == {(m, k) for m in METHODS for k in KINDS}
    targets = [target for _, kind, target in planned if kind == "records"]
    assert targets == sorted(targets) and all(0 < t < 50 for t in targets)


def test_interruptions_at_every_kind_of_point_change_no_result(reference, tmp_path: Path) -> None:
    """Truncated last line, kill -9 and SIGINT, each at both kinds of pause point (after a record, spread over the
    run; once a scenario's workers are ready), each followed by a plain re-run of the README command; the run is
    then finished with --resume: every key ends with the outcome, signature and metrics of the uninterrupted run.

    The points are the harness's own pause points (`harness/pause_points.py`), not moments found by timing, so a
    fast machine reaches as many as a slow one."""
    results = tmp_path / "r"
    interruptions, orphans, exits = 0, 0, []
    for point, (method, kind, target) in enumerate(schedule(POINTS, len(reference))):
        before = records_of(results)
        if len(before) >= len(reference):
            pytest.fail(
                f"premise: the run has all {len(reference)} records after {interruptions} interruptions, so "
                f"point {point + 1} of {POINTS} cannot be reached; make the resume profile larger"
            )
        where = "point:workers-ready" if kind == "workers-ready" else f"records:{max(target, len(before) + 1)}"
        marker = tmp_path / f"paused-{point}"
        env = os.environ | {"COMPAT_MATRIX_TEST_PAUSE": where, "COMPAT_MATRIX_TEST_PAUSED_FILE": str(marker)}
        proc = start(results, env=env)
        if not paused(proc, marker):
            proc.kill()
            proc.wait()
            pytest.fail(
                f"premise: point {point + 1} ({where}) was not reached; the harness exited {proc.returncode}:\n"
                + (tmp_path / "r.log").read_text()[-3000:]
            )
        interruptions += 1
        if method == "sigint":
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGCONT)
            exits.append(proc.wait(timeout=120))
        else:
            proc.kill()
            proc.wait()
        orphans += len(survivors(proc.pid))
        after = records_of(results)
        assert after[: len(before)] == before, f"{method}: records written before the interruption changed"
        if method == "truncated-last-line" and after:
            cut_last_line_in_half(next(results.glob("runs/*/records.jsonl")))
    runs = [p for p in (results / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, "every re-run resumed the one unfinished run"
    final = start(results, "--resume", runs[0].name)
    assert final.wait(timeout=900) == 0, (tmp_path / "r.log").read_text()[-3000:]
    runs = [p for p in (results / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, "--resume finished the same run"
    wrong = wrong_outcomes(records_of(results), reference)
    meta = json.loads((runs[0] / "meta.json").read_text())
    record_fault(
        f"{interruptions} interruptions (cut line, kill -9, SIGINT)",
        "0 keys differ",
        f"{len(wrong)} keys differ",
        orphans=orphans,
        wrong=len(wrong),
    )
    assert not wrong, "\n".join(wrong[:20])
    assert orphans == 0
    assert all(code == 130 for code in exits), exits
    # Every attempt that touched the run is in its history (one killed before it got that far is not).
    statuses = [a["status"] for a in meta["attempts"]]
    assert meta["status"] == "complete" and statuses[-1] == "complete"
    assert set(statuses[:-1]) <= {"interrupted", "killed"} and statuses.count("interrupted") == len(exits)
    assert len(exits) + 1 <= len(statuses) <= interruptions + 1


def test_two_concurrent_invocations_never_share_a_run(reference, tmp_path: Path) -> None:
    """Two invocations started in the same instant, then a third while the first is writing: one writer per
    run; the others say who holds it and exit 2; no duplicate key, no key with two outcomes."""
    results = tmp_path / "r"
    first, second = start(results), start(results)
    assert wait_for(lambda: len(records_of(results)) >= 1, 600)
    third = start(results)
    third_code = third.wait(timeout=300)
    codes = sorted([first.wait(timeout=900), second.wait(timeout=900)])
    log = (tmp_path / "r.log").read_text()
    wrong = wrong_outcomes(records_of(results), reference)
    record_fault(
        "two invocations at once, a third later", "exits [0, 2, 2]", f"exits {[*codes, third_code]}", wrong=len(wrong)
    )
    assert codes == [0, 2] and third_code == 2, log
    assert log.count("is being written by pid") == 2, log
    assert len([p for p in (results / "runs").iterdir() if p.is_dir()]) == 1
    assert not wrong, "\n".join(wrong[:20])


def test_kill9_while_a_job_holds_the_gil_leaves_nothing_running(tmp_path: Path) -> None:
    """Both ranks spin in a regex (C code, GIL held) so no watchdog thread can run; kill -9 of the harness
    must still leave no process of the run after 5 s."""
    results = tmp_path / "r"
    env = os.environ | {"COMPAT_MATRIX_EXTRA_SCENARIOS": "tests.fault_scenarios.f1_faults"}
    proc = start(results, profile=GIL_PROFILE, env=env)

    def spinning() -> bool:
        events = list(results.glob("runs/*/worker/**/launch-*/events.rank*.jsonl"))
        return len(events) == 2 and all('"event": "start"' in e.read_text() for e in events)

    assert wait_for(spinning, 600, proc), (tmp_path / "r.log").read_text()[-3000:]
    time.sleep(1.0)
    started = processes_started_by(proc.pid)
    assert len(started) >= 3, "torchrun and its two ranks are running"
    proc.kill()
    proc.wait()
    left = survivors(proc.pid, within_s=5.0)
    record_fault(
        "kill -9 of the harness, job holding the GIL",
        "0 survivors after 5 s",
        f"{len(left)} survivors after 5 s",
        orphans=len(left),
    )
    assert left == []


def test_a_resumed_run_keeps_the_slice_it_ran(tmp_path: Path) -> None:
    """A run started with `--scenario S3` and resumed with `--resume` alone continues S3: it must not add
    every other scenario of the profile (S2 here) to a run its user sliced on purpose."""
    results = tmp_path / "results"
    first = subprocess.run(
        [*matrix_command(str(PROFILE), str(results)), "--no-report", "--scenario", "S3-*", "--examples", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    (run_dir,) = (p for p in (results / "runs").iterdir() if p.is_dir())
    before = (run_dir / "records.jsonl").read_bytes()
    resumed = subprocess.run(
        [*matrix_command(str(PROFILE), str(results)), "--no-report", "--resume", run_dir.name],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "with the slice it ran: 1 scenario (S3-lora-sgd-scaling), 1 cell" in resumed.stdout, resumed.stdout
    assert ": 0 new records" in resumed.stdout, resumed.stdout
    assert (run_dir / "records.jsonl").read_bytes() == before
    assert {r["scenario"] for r in read_records(run_dir / "records.jsonl")} == {"S3-lora-sgd-scaling"}
