"""`bisect-script` against real environments and real runs of small scripts.

The scripts use `packaging`, whose 22.0 release made `parse()` of a non-PEP 440 string an error (before it
returned a LegacyVersion): a real release that breaks a real call, cheap to install, so the search (ends,
moves, binary search, a different failure on the way) is exercised end to end without the ML stack. The
torchrun hang test builds a CPU torch environment and is marked `matrix`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.execution.script_launch import ScriptRun, last_traceback, run_script, script_dependencies
from harness.tools.script_verdicts.script_bisect import _neighbour_flips, move_order, parse_end
from harness.tools.script_verdicts.stack_run import StackRun

REPO = Path(__file__).resolve().parent.parent

BREAKS_AT_22 = textwrap.dedent(
    '''
    # /// script
    # dependencies = ["packaging"]
    # ///
    """parse() of a non-PEP 440 string: a LegacyVersion before packaging 22.0, InvalidVersion from it."""
    from packaging.version import parse

    print(parse("not-a-version"))
    '''
)

DIFFERENT_ON_THE_WAY = textwrap.dedent(
    '''
    # /// script
    # dependencies = ["packaging"]
    # ///
    """The same break at 22.0, but every 21.x release fails another way first."""
    import packaging
    from packaging.version import parse

    if packaging.__version__.startswith("21."):
        raise RuntimeError("a different failure in the 21 series")
    print(parse("not-a-version"))
    '''
)


def bisect_script(tmp_path: Path, text: str, *extra: str) -> tuple[dict, str]:
    script = tmp_path / "user_script.py"
    script.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "bisect-script", str(script), "--results-dir", str(tmp_path / "results"),
         "--good", "packaging==20.0", "--bad", "packaging==23.0", *extra],
        capture_output=True, text=True, cwd=REPO, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads((tmp_path / "results" / "script-bisect" / "user_script" / "verdict.json").read_text())
    return verdict, proc.stdout


def test_names_the_release_where_the_failure_starts(tmp_path: Path) -> None:
    verdict, out = bisect_script(tmp_path, BREAKS_AT_22)
    assert verdict["target"]["error"].startswith("packaging.version.InvalidVersion")
    (flip,) = verdict["flips"]
    assert (flip["package"], flip["first_release"], flip["last_release_before"]) == ("packaging", "22.0", "21.3")
    assert flip["direction"] == "started"
    # Both ends are known before the sweep: it measures the releases between them (every one here: each packaging
    # release is a minor of its own), within the bound it states, and finds the one change (none stepped over).
    assert not flip["stepped_over"]
    assert [(c["direction"], c["release"], c["last_before"]) for c in flip["changes"]] == [("started", "22.0", "21.3")]
    assert len(flip["bisect_runs"]) <= flip["sweep"]["bound"] - 2
    assert verdict["cost"]["runs_after_scan"] <= flip["sweep"]["bound"] + 3
    assert "started with packaging 22.0 (last pass: 21.3)" in out
    issue = (tmp_path / "results" / "script-bisect" / "user_script" / "issue.md").read_text()
    assert "since packaging 22.0 (last good: 21.3)" in issue and 'parse("not-a-version")' in issue
    # Every run is on disk, and a second invocation reuses all of them: same verdict, no new run.
    runs = (tmp_path / "results" / "script-bisect" / "user_script" / "runs.jsonl").read_text().splitlines()
    assert len(runs) == verdict["cost"]["runs"] + sum(1 for r in runs if json.loads(r)["outcome"] == "install-failed")
    again, _ = bisect_script(tmp_path, BREAKS_AT_22)
    assert again["cost"]["runs"] == 0 and again["cost"]["runs_reused"] >= verdict["cost"]["runs"]
    assert again["flips"][0]["first_release"] == "22.0"
    assert [r["state"] for r in again["flips"][0]["bisect_runs"]] == [r["state"] for r in flip["bisect_runs"]]


def test_the_binary_search_is_still_there_for_one_change(tmp_path: Path) -> None:
    """--bisect: one change assumed, ceil(log2 n) runs (how the committed verdicts made before the sweep ran)."""
    verdict, _ = bisect_script(tmp_path, BREAKS_AT_22, "--bisect")
    (flip,) = verdict["flips"]
    assert (flip["first_release"], flip["last_release_before"]) == ("22.0", "21.3") and "sweep" not in flip
    assert len(flip["bisect_runs"]) <= math.ceil(math.log2(len(flip["candidates"])))


def test_a_different_failure_on_the_way_is_reported_as_different(tmp_path: Path) -> None:
    verdict, out = bisect_script(tmp_path, DIFFERENT_ON_THE_WAY)
    (flip,) = verdict["flips"]
    assert flip["first_release"] == "22.0"
    assert flip["last_release_before"].startswith("20.")
    others = [r for r in flip["bisect_runs"] if r["state"] == "other"]
    assert others and all(r["version"].startswith("21.") for r in others)
    assert all(r["error"] == "RuntimeError: a different failure in the 21 series" for r in others)
    assert "fail differently" in flip["note"]
    assert [f["error"] for f in verdict["different_failures"]] == ["RuntimeError: a different failure in the 21 series"]
    assert "a different failure (in a probe): RuntimeError" in out
    # Never the failure asked about:
    assert verdict["target"]["error"].startswith("packaging.version.InvalidVersion")


TWO_FAILURES = textwrap.dedent(
    '''
    # /// script
    # dependencies = ["packaging"]
    # ///
    """One failure before packaging 21, another through the 21 series, none from 22.0 on."""
    import packaging

    major = int(packaging.__version__.split(".")[0])
    if major < 21:
        raise ValueError("the old failure")
    if major == 21:
        raise RuntimeError("the new failure")
    print("fine")
    '''
)


def test_every_failure_the_scan_saw_gets_an_answer(tmp_path: Path) -> None:
    """Stacks in order that fail one way, then another way, then pass: the failure asked about (the newest) and the
    older one both get the release where they ended, by the same evidence rule (a stack failing the other way at a
    later line of the script got past the older failure: evidence that it ended there, and said so); the scan line
    says 'fail (another failure)', never 'other'."""
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts.script_bisect import End, ScriptBisect, run, summary_lines

    script = tmp_path / "two_failures.py"
    script.write_text(TWO_FAILURES)
    history = load_profile("history", MATRIX_DIR)
    said: list[str] = []
    bisect = ScriptBisect(
        script, tmp_path / "out", history, InstallOptions(envs_dir=default_envs_dir()), say=said.append
    )
    ends = [End(pins={"packaging": v}) for v in ("20.0", "21.0", "23.0")]
    verdict = run(bisect, ends, None)
    assert verdict["target"]["error"] == "RuntimeError: the new failure"
    (asked,) = verdict["flips"]
    assert (asked["direction"], asked["package"], asked["first_release"]) == ("ended", "packaging", "22.0")
    assert asked["last_release_before"].startswith("21.")
    (old,) = [f for f in verdict["different_failures"] if f["error"] == "ValueError: the old failure"]
    (answer,) = old["flips"]
    # The 21 series fails too, but at a later line of the script: it got past the old failure, so that failure ended
    # with 21.0 (where the new one, later in the script, takes over), not with 22.0.
    assert (answer["direction"], answer["package"], answer["first_release"]) == ("ended", "packaging", "21.0")
    assert answer["last_release_before"].startswith("20.")
    assert "later in the script, takes over" in answer["note"]
    lines = summary_lines(verdict)
    scan = next(line for line in lines if line.strip().startswith("scan:"))
    assert "packaging==20.0:fail (another failure)" in scan and ":other" not in scan
    assert any(
        "ended with packaging 21.0 (the first release that gets past it; the last that fails: 20." in line
        for line in lines
    ), lines


def test_a_hang_is_a_timeout_with_the_stack(tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text("import time\n\ndef wait_for_peer():\n    time.sleep(600)\n\nwait_for_peer()\n")
    found = run_script(Path(sys.executable), script, timeout_s=5)
    assert found.outcome == "timeout" and found.signature == "timeout"
    assert "wait_for_peer" in found.rank_stacks["0"]


def test_exit_77_is_not_applicable_and_a_crash_is_named(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys\nsys.exit(77)\n")
    assert run_script(Path(sys.executable), script, timeout_s=60).outcome == "skip"
    script.write_text("import os\nos.abort()\n")
    crashed = run_script(Path(sys.executable), script, timeout_s=60)
    assert (crashed.outcome, crashed.signature) == ("fail", "crash-SIGABRT")


@pytest.mark.matrix
def test_torchrun_hang_gives_every_ranks_stack(tmp_path: Path) -> None:
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts.script_stacks import pinned_stack

    ci = load_profile("ci", MATRIX_DIR)
    torch_pin = ci.axes["torch"][0]
    stack = pinned_stack(ci, "torch", {"torch": torch_pin}, [], InstallOptions(envs_dir=default_envs_dir()))
    assert stack.python is not None, stack.failure
    script = tmp_path / "two_ranks.py"
    script.write_text(
        "import time\nimport torch.distributed as dist\n\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 0:\n    dist.barrier()  # rank 1 never joins\nelse:\n    time.sleep(600)\n"
    )
    # Both ranks are past init in about 4 s on 2 cores, 5 s beside six busy loops: a 45 s timeout (was 90) still
    # finds rank 0 in its barrier with ten times that to spare; if not, the test says where rank 0 was.
    found = run_script(stack.python, script, nproc=2, timeout_s=45)
    assert found.outcome == "timeout"
    assert set(found.rank_stacks) == {"0", "1"}
    assert found.waiting_in["0"] == "barrier", found.rank_stacks.get("0")
    assert "time.sleep" not in found.rank_stacks["1"] or "two_ranks.py" in found.rank_stacks["1"]


@pytest.mark.matrix
def test_a_rank_that_prints_a_line_and_exits_names_the_failure_not_torchrun(tmp_path: Path) -> None:
    """Under torchrun the failure is the failing rank's own: a rank that prints a line and exits 1 is that line,
    never torchrun's ChildFailedError banner (the same for every rank failure); the rank that failed first names
    it, every failing rank's text is kept, and the issue title reads the line."""
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.paths import MATRIX_DIR
    from harness.publishing.upstream import issue_title
    from harness.tools.script_verdicts.script_stacks import pinned_stack

    ci = load_profile("ci", MATRIX_DIR)
    stack = pinned_stack(ci, "torch", {"torch": ci.axes["torch"][0]}, [], InstallOptions(envs_dir=default_envs_dir()))
    assert stack.python is not None, stack.failure
    script = tmp_path / "saves_nothing.py"
    script.write_text(
        "import sys, time\nimport torch.distributed as dist\n\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    print('saved adapter has 0 tensors, 0 trained lora_B of 4 (40 bytes)', flush=True)\n"
        "    sys.exit(1)\n"
        "time.sleep(120)  # rank 0 would go on; torchrun stops it once rank 1 failed\n"
    )
    found = run_script(stack.python, script, nproc=2, timeout_s=100)
    assert found.outcome == "fail", found
    assert found.error == "saved adapter has 0 tensors, 0 trained lora_B of 4 (40 bytes)", found
    assert found.signature.startswith("exit-1-") and "ChildFailedError" not in (found.signature + found.error)
    assert next(iter(found.rank_errors)) == "1" and found.rank_errors["1"] == found.error
    title = issue_title(found.error, "since peft 0.21.0 (last good: 0.20.0)")
    assert title.startswith("saved adapter has 0 tensors") and "ChildFailedError" not in title


def test_a_plain_exit_is_named_by_its_last_line(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('the loss went to nan at step 3')\nsys.exit(3)\n")
    found = run_script(Path(sys.executable), script, timeout_s=60)
    assert (found.outcome, found.error) == ("fail", "the loss went to nan at step 3")
    assert found.signature.startswith("exit-3-")
    script.write_text("import sys\nprint('the loss went to nan at step 7')\nsys.exit(3)\n")
    assert run_script(Path(sys.executable), script, timeout_s=60).signature == found.signature  # numbers normalised
    script.write_text("import sys\nsys.exit(3)\n")
    assert run_script(Path(sys.executable), script, timeout_s=60).signature == "crash-exit-3"


def test_pep723_dependencies_and_tracebacks(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(BREAKS_AT_22)
    assert script_dependencies(script) == ["packaging"]
    text = 'noise\nTraceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: bad 3\nmore\n'
    _, exc_type, message = last_traceback(text)
    assert (exc_type, message) == ("ValueError", "bad 3")


def test_ends_and_bad_input(tmp_path: Path) -> None:
    assert parse_end("--good", "2024-09-26").day == "2024-09-26"
    assert parse_end("--good", "peft==0.13.2, torch==2.4.1").pins == {"peft": "0.13.2", "torch": "2.4.1"}
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    for extra, says in (
        (["--good", "peft>=0.13", "--bad", "peft==0.14.0"], "exact pins"),
        (["--good", "2024-13-40", "--bad", "2024-01-01"], "not a real day"),
        (["--good", "2024-01-01"], "go together"),
        (["--good", "2024-01-01", "--bad", "peft==0.13.2"], "both be days or both be pins"),
        (["--nproc", "0"], "at least 1"),
        (["--match", "("], "--match"),
        (["--from", "2030-01-01"], "no atlas day"),
        (["--from", "2026-01-01", "--to", "2025-01-01"], "is after --to"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "harness", "bisect-script", str(script), *extra],
            capture_output=True, text=True, cwd=REPO,
        )  # fmt: skip
        assert proc.returncode == 2 and says in proc.stderr, (extra, proc.stderr)
        assert not (REPO / "results" / "script-bisect" / "s").exists(), extra  # a refusal leaves no verdict folder
    missing = subprocess.run(
        [sys.executable, "-m", "harness", "bisect-script", str(tmp_path / "nope.py")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr


def _seen(label: str, state: str, versions: dict[str, str], error: str = "", traceback: str = "") -> StackRun:
    run = ScriptRun("fail", None, 1.0, error=error, traceback=traceback)
    found = StackRun("scan", label, run, {"versions": versions}, label)
    found.state = state
    return found


def test_flips_skip_unusable_and_different_days_and_moves_follow_the_traceback() -> None:
    scan = [
        _seen("d1", "pass", {"peft": "0.9.0", "accelerate": "0.27.2"}),
        _seen("d2", "other", {"peft": "0.10.0", "accelerate": "0.28.0"}),
        _seen("d3", "unusable", {}),
        _seen("d4", "target", {"peft": "0.11.0", "accelerate": "0.30.1", "tokenizers": "0.19.1"}),
        _seen("d5", "target", {"peft": "0.12.0", "accelerate": "0.33.0"}),
    ]
    (flip,) = _neighbour_flips(scan)
    assert (flip.older, flip.newer) == ("d1", "d4")  # d2 fails differently, d3 could not run: no evidence
    failing = _seen(
        "d4", "target", {}, "TypeError: Accelerator.__init__() got an unexpected keyword argument",
        traceback='  File "/x/lib/python3.11/site-packages/tokenizers/__init__.py", line 3, in f\n',
    )  # fmt: skip
    # The traceback's package first, then what the error names, then the atlas packages.
    assert move_order(flip.changed, failing) == ["tokenizers", "accelerate", "peft"]


def test_committed_verdicts_hold_what_ran() -> None:
    """Each committed verdict names a package and release, keeps every run it counts, and its script is the
    byte-exact file it ran (and the example of the same text under examples/own-failures/)."""
    import hashlib

    folders = sorted((REPO / "results" / "script-bisect").glob("*/verdict.json"))
    named_verdicts = [p for p in folders if any(f["package"] for f in json.loads(p.read_text())["flips"])]
    assert len(named_verdicts) >= 3
    examples = {p.read_bytes() for p in (REPO / "examples").glob("**/*.py")}
    for path in folders:
        verdict = json.loads(path.read_text())
        script = (path.parent / "script.py").read_bytes()
        assert hashlib.sha256(script).hexdigest() == verdict["script_sha256"], path
        assert script in examples, f"{path.parent.name}: its script is not among examples/"
        for flip in verdict["flips"]:
            assert not flip["package"] or flip["first_release"], f"{path.parent.name}: a package without its release"
        runs = [json.loads(line) for line in (path.parent / "runs.jsonl").read_text().splitlines()]
        made = [r for r in runs if r["outcome"] != "install-failed"]
        # a rerun of the same script reuses the runs already kept (cost.runs_reused): every run counted is kept
        assert len(made) == verdict["cost"]["runs"] + verdict["cost"].get("runs_reused", 0), path
        assert all(r["script_sha256"] == verdict["script_sha256"] for r in runs)


def test_run_script_command_writes_what_ran(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("raise ValueError('bad rank setup 3')\n")
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run-script", str(script), "--json", str(out)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0 and "fail" in proc.stdout
    data = json.loads(out.read_text())
    assert (data["outcome"], data["error"]) == ("fail", "ValueError: bad rank setup 3")
    assert data["signature"].startswith("unclassified-ValueError-") and "python" in data["versions"]


def test_a_match_that_no_run_shows_names_nothing(tmp_path: Path) -> None:
    verdict, out = bisect_script(tmp_path, BREAKS_AT_22, "--match", "CheckpointError")
    assert verdict["flips"] == [] and "no run matches --match 'CheckpointError': nothing to bisect" in out
    # The InvalidVersion failure is there, and is reported as a different one, not taken for the one asked about.
    assert [s["state"] for s in verdict["scan"]] == ["pass", "other"]
    assert not (tmp_path / "results" / "script-bisect" / "user_script" / "issue.md").exists()


def test_committed_issue_bodies_name_a_stack_that_ran(repo_root: Path) -> None:
    """Every committed verdict's issue body regenerates byte for byte, and its System Info lists the versions of a
    run in runs.jsonl that failed (and, beside them, of one that passed): never a day's stack with the package's
    release swapped in by hand."""
    import json

    from harness.publishing.upstream import ran_pair, script_report
    from harness.recording.flip import Flip

    folders = [d for d in sorted((repo_root / "results" / "script-bisect").iterdir()) if (d / "issue.md").is_file()]
    assert folders
    for folder in folders:
        body = script_report(folder)
        assert body == (folder / "issue.md").read_text(), f"{folder.name}: issue.md is stale"
        verdict = json.loads((folder / "verdict.json").read_text())
        flip = next(f for f in verdict["flips"] if f["package"] and f["first_release"])
        runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines() if line.strip()]
        failing, passing = ran_pair(Flip.from_json(flip), runs)
        assert failing is not None and failing["outcome"] in ("fail", "timeout"), folder.name
        assert failing["key"] in {r["key"] for r in runs}
        versions = failing["stack"]["versions"]
        good = (passing or {}).get("stack", {}).get("versions", {})
        for name in ("torch", "transformers", "peft", "accelerate"):
            assert f"| `{name}` | {versions[name]} | {good.get(name, '-')} |" in body, (folder.name, name)


def test_every_committed_issue_title_reads_in_a_second(repo_root: Path) -> None:
    """An issue body opens with the exception's first sentence and the release, in at most 120 characters (the
    whole message is under "Actual behavior")."""
    bodies = sorted((repo_root / "results" / "script-bisect").glob("*/issue.md"))
    assert bodies
    for body in bodies:
        title = body.read_text().splitlines()[1]
        assert title.startswith("**") and len(title) <= 120, (body.parent.name, len(title))
        assert "/root/" not in title and "/work/" not in title, body.parent.name  # no machine path in a title


def test_a_fix_is_said_as_the_first_release_that_passes_and_the_last_that_fails(repo_root: Path) -> None:
    """lora-bias-merge ended with peft 0.16.0: the printed verdict and the issue body call 0.16.0 the first release
    that passes and 0.15.2 the last that fails (never 'the last passing one' for the first that passes)."""
    import json

    from harness.publishing.upstream import script_report
    from harness.tools.script_verdicts.script_bisect import summary_lines

    folder = repo_root / "results" / "script-bisect" / "lora-bias-merge"
    said = "\n".join(summary_lines(json.loads((folder / "verdict.json").read_text())))
    assert "ended with peft 0.16.0 (the first release that passes; the last that fails: 0.15.2)" in said, said
    body = script_report(folder)
    assert "The last release that fails (`2025-03-20 + peft==0.15.2`) and the first release that passes" in body
    assert "the last release that fails is 0.15.2, the first release that passes is 0.16.0" in body
    assert "last passing one" not in body


#: The end of what uv printed when a torch move's environment could not be built (2024-12-07 + torch 2.6.0, deepspeed
#: 0.16.1's sdist importing triton as it builds; the run of 2026-12-05): the cause is the build's last line.
_BUILD_FAILED_TAIL = """\
           File "/root/.cache/compat-matrix/envs/date-2025-03-20_torch-2.6.0/lib/python3.11/site-packages/triton/runtime/driver.py", line 20, in _initialize_obj
             self._obj = self._init_fn()
                         ^^^^^^^^^^^^^^^
           File "/root/.cache/compat-matrix/envs/date-2025-03-20_torch-2.6.0/lib/python3.11/site-packages/triton/runtime/driver.py", line 8, in _create_driver
             raise RuntimeError(f"{len(actives)} active drivers ({actives}). There should only be one.")
         RuntimeError: 0 active drivers ([]). There should only be one.
hint: Build failures usually indicate a problem with the package or the build environment
"""  # noqa: E501


def test_every_unusable_move_is_printed_with_its_cause_line() -> None:
    """A build failure runs long (uv's output holds the sdist's whole traceback): its summary keeps its first lines and
    its last, so the cause survives (the old summary kept the first 1500 characters, and the record was cut inside the
    traceback, before the exception); the run's error is that cause line, and the printed verdict lists every
    unusable move and probe with it."""
    from harness.environments.envs import summarise_install_error
    from harness.execution.script_launch import cause_line
    from harness.tools.script_verdicts.script_bisect import summary_lines

    frames = "".join(
        f'           File "/root/.cache/x/site-packages/setuptools/build_meta.py", line {n}, in run_setup\n'
        "             exec(code, locals())\n"
        for n in range(60)
    )
    uv = (
        "Resolved 58 packages in 2.1s\nerror: Failed to build `deepspeed==0.16.1`\n"
        "  cause: The build backend returned an error\n         [stderr]\n         Traceback (most recent call last):\n"
        + frames
        + _BUILD_FAILED_TAIL
    )
    summary = summarise_install_error(uv)
    assert len(summary) <= 1600 and summary.startswith("error: Failed to build `deepspeed==0.16.1`"), summary[:200]
    assert "RuntimeError: 0 active drivers ([]). There should only be one." in summary
    assert cause_line(summary) == "RuntimeError: 0 active drivers ([]). There should only be one."
    assert cause_line(uv) == cause_line(summary)
    resolver = "  × No solution found when resolving dependencies:\n  ╰─▶ Because tokenizers==0.21.0 is excluded ..."
    assert cause_line(resolver) == "Because tokenizers==0.21.0 is excluded ..."
    move = {"package": "torch", "version": "2.6.0", "state": "unusable", "outcome": "install-failed",
            "error": cause_line(summary)}  # fmt: skip
    flip = {"older": "2024-12-07", "newer": "2025-03-20", "older_state": "target", "newer_state": "pass",
            "changed": {}, "moves": [move], "package": "peft", "first_release": "0.15.0",
            "last_release_before": "0.14.0", "candidates": ["0.15.0"], "bisect_runs": [], "held": {}}  # fmt: skip
    verdict = {"script": "s.py", "nproc": 1, "match": None, "target": {"error": "x", "signature": "exit-1-a"},
               "scan": [{"label": "2024-12-07", "state": "target", "outcome": "fail", "signature": "exit-1-a"},
                        {"label": "2025-03-20", "state": "pass", "outcome": "pass", "signature": None}],
               "flips": [flip], "different_failures": [],
               "cost": {"runs": 4, "runs_reused": 0, "environments_built": 0, "environments_reused": 2,
                        "overlays_built": 0, "overlays_reused": 2, "runs_after_scan": 3,
                        "phase_seconds": {}}}  # fmt: skip
    printed = summary_lines(verdict)
    assert (
        "  unusable (no evidence either way): 2024-12-07 + torch==2.6.0: "
        "RuntimeError: 0 active drivers ([]). There should only be one." in printed
    ), printed


def test_the_environments_to_build_and_their_cost_are_said_before_any_is_built(tmp_path: Path) -> None:
    """A cold scan builds one environment per atlas day (several GB each): bisect-script says which it will build,
    their disk and time estimate, and the free disk, before the first one; a day built already is not counted."""
    from harness.define.profile import load_profile
    from harness.environments import disk, envs
    from harness.environments.envs import InstallOptions
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts import script_stacks
    from harness.tools.script_verdicts.script_bisect import End, ScriptBisect, run
    from harness.tools.script_verdicts.script_stacks import LocalStacks, Stack

    history = load_profile("history", MATRIX_DIR)
    options = InstallOptions(envs_dir=tmp_path / "envs")
    ends = [End(day="2024-09-26"), End(day="2024-12-07"), End(pins={"packaging": "22.0"})]
    local = LocalStacks(history, [], options)
    assert local.to_build(ends) == ["2024-09-26", "2024-12-07", "packaging==22.0"]
    built = envs.env_dir_for(script_stacks._day_cell(history, "2024-09-26"), history, options)
    built.mkdir(parents=True)
    (built / envs.MARKER).write_text("{}")
    assert local.to_build(ends) == ["2024-12-07", "packaging==22.0"]

    events: list[str] = []

    class Source(LocalStacks):
        def scan(self, end: End) -> Stack:
            events.append(f"built {end.label}")
            return Stack(end.label, None, {}, "dated", failure="not built in this test")

    script = tmp_path / "s.py"
    script.write_text("print('ok')\n")
    bisect = ScriptBisect(script, tmp_path / "out", history, options, source=Source(history, [], options),
                          say=events.append)  # fmt: skip
    run(bisect, ends[:2], None)
    said = next(i for i, e in enumerate(events) if e.startswith("  to build first: 1 of the 2 stacks"))
    assert said < events.index("built 2024-09-26"), events
    line = events[said]
    # The disk as every command estimates it (`disk.estimate`): a day whose torch is not known counts a whole stack.
    whole = disk.FALLBACK_STACK["cuda"] / disk.GB
    assert "(2024-12-07)" in line and f"up to {whole:.1f} GB of disk" in line, line
    assert events[said + 1].startswith("  free disk here: "), events
    # Two days the records show on one torch release: its stack once, then the second day's own files.
    shared = LocalStacks(history, [], options, {"2024-12-07": "2.5.1", "2025-03-20": "2.5.1"})
    two = [End(day="2024-12-07"), End(day="2025-03-20")]
    need = disk.estimate(shared.planned(two), options.envs_dir, None)
    assert need.new_torches == ["2.5.1 (cuda)"] and need.unknown_torch == 0, need
    assert "an estimate of about " in script_stacks.build_cost_lines(shared.to_build(two), 2, need)[0]
    assert script_stacks.build_cost_lines([], 2, need) == [
        "  every one of the 2 stacks to scan is built already: no environment to build"
    ]
    short = script_stacks.build_cost_lines(["a", "b"], 2, disk.DiskNeed(0, 2, 12 * disk.GB, free=int(1e9)))
    assert "less than the" in short[-1] and "may run out" in short[-1], short
