"""Blame as the last step of `bisect-script`: once a flip names a release of a pure Python package, the script runs
traced at the last release before and at the named one (each over the flip's older stack, everything else held, as
its moves ran), the changed functions both runs executed are the candidates (`changed_code.py`), and `blame.py`
puts them back at the named release until the smallest set that gives the other outcome is left. Where the runs do
not flip here, or the package holds native code (torch: what runs below its Python functions is not seen), it says
so and blames nothing. `blame.json` and `changed.json` go beside the verdict; the issue body shows them."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.define.packages import import_name
from harness.recording.flip import Flip
from harness.tools.code_blame import blame as blaming
from harness.tools.code_blame import changed_code
from harness.tools.code_blame.finding_verification import TRACER_DIR
from harness.tools.script_verdicts.script_bisect import End, ScriptBisect, parse_end
from harness.tools.script_verdicts.script_stacks import Stack
from harness.tools.script_verdicts.stack_run import StackRun

#: File endings of native code: a package holding any is not blamed by reverting its Python.
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")
_FILES = (
    "import importlib.metadata as m, sys\n"
    "files = m.files(sys.argv[1]) or []\n"
    "print('\\n'.join(str(f) for f in files if str(f).endswith({suffixes!r})))\n"
)


@dataclass
class Side:
    """One end of the blamed pair: its release, its stack, and the traced run's state (pass, target, ...)."""

    release: str
    stack: Stack
    state: str = ""
    line: str | None = None
    seconds: float = 0.0
    error_text: str = ""


def native_files(stack: Stack, package: str) -> list[str] | None:
    """The compiled files `package` installed in `stack` (None: the stack cannot say)."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if stack.pythonpath:
        env["PYTHONPATH"] = stack.pythonpath
    code = _FILES.format(suffixes=NATIVE_SUFFIXES)
    try:
        proc = subprocess.run([str(stack.python), "-c", code, package], capture_output=True, text=True, env=env,
                              timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [line for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else None


def blame_flip(bisect: ScriptBisect, flip: Flip, older: End, newer: End) -> dict[str, Any]:
    """Blame one named flip; returns what blame.json holds (with a `verdict` in words in every case)."""
    package, new, old = str(flip.package), str(flip.release), str(flip.last_release_before)
    say = bisect.say
    base = bisect.stack_for(older)
    if base.python is None:
        return _not_blamed(flip, f"the stack of {older.label} could not be built: {base.failure}")

    def at(version: str) -> Stack:
        return base if base.versions.get(package) == version else bisect.moved(base, package, version, older, newer)

    sides = {"older": Side(old, at(old)), "newer": Side(new, at(new))}
    for side in sides.values():
        if side.stack.python is None:
            return _not_blamed(flip, f"{package} {side.release} over {older.label} could not be built: "
                                     f"{side.stack.failure}")  # fmt: skip
    native = native_files(sides["newer"].stack, package)
    if native is None or native:
        why = (
            f"it installs native code ({', '.join(native[:3])})" if native else "its installed files could not be read"
        )
        return _not_blamed(flip, f"{package} is not pure Python here: {why}; reverting its Python proves nothing")
    say(f"blame: {package} {new} against {old} over {older.label}")
    with tempfile.TemporaryDirectory(prefix="script-blame-") as scratch:
        traces = Path(scratch)
        for name, side in sides.items():
            found = _run(bisect, side.stack, f"traced {name}", trace=traces / name, package=package)
            side.state, side.line, side.seconds = found.state, found.run.error or found.run.outcome, found.run.seconds
            side.error_text = f"{found.run.error_text or found.run.error or ''}\n{found.run.traceback}"
            say(f"  traced at {package} {side.release}: {found.run.outcome} ({side.state}) in {found.run.seconds} s")
        if (sides["older"].state, sides["newer"].state) != (flip.older_state, flip.newer_state):
            shown = ", ".join(f"{s.release}: {s.state or 'no state'}" for s in sides.values())
            return _not_blamed(flip, f"the traced runs did not flip here ({shown})", sides)
        changed = changed_code.compare(package, (old, traces / "older"), (new, traces / "newer"))
        _, older_sources, _ = changed_code.read_traces(traces / "older")
        _, newer_sources, _ = changed_code.read_traces(traces / "newer")
        failing_side = next(name for name, s in sides.items() if s.state == "target")
        failing = sides[failing_side]
        refused = blaming.refused_calls(changed, failing.error_text, older_sources)
        # The order the failing run reaches them: what its error refuses first, then its traceback, then the last
        # called (`blame.in_failing_order`).
        candidates = refused + blaming.in_failing_order(
            [blaming.Candidate(c.file, c.qualname) for c in changed.changed],
            changed_code.read_lateness(traces / failing_side), failing.error_text, import_name(package),
        )  # fmt: skip
        say(
            f"  {changed.executed_both} {package} functions ran in both; {len(candidates) - len(refused)} changed"
            + (f"; {len(refused)} refused the failing run's call: {', '.join(map(str, refused))}" if refused else "")
        )
        older_calls = changed_code.read_call_edges(traces / "older")
        newer_calls = changed_code.read_call_edges(traces / "newer")

        def runner(side: Side) -> Any:
            def run(plan: dict) -> dict[str, Any]:
                found = _reverted(bisect, side.stack, plan, flip)
                why = f" ({found['error']})" if found["outcome"] == blaming.NEITHER and found.get("error") else ""
                say(f"  put back {len(plan['functions'])} function(s), {len(plan['modules'])} module(s) at "
                    f"{package} {side.release}: {found['outcome']} in {found['seconds']} s{why}")  # fmt: skip
                return found

            return run

        result = blaming.blame(
            package, old, new, candidates, older_sources, runner(sides["newer"]),
            widen=lambda c, error: blaming.helpers_of(c, older_sources, newer_sources, older_calls, error),
        )  # fmt: skip
        if result.blamed:
            blaming.converse(
                result, newer_sources, runner(sides["older"]),
                widen=lambda c, error: blaming.helpers_of(c, newer_sources, older_sources, newer_calls, error),
            )  # fmt: skip
    from harness.execution import hardware

    result.machine = hardware.describe("cpu")
    return result.as_json() | {
        "seconds": result.seconds, "flip": [flip.older, flip.newer], "changed": changed.as_json(),
        "sides": {name: _side_json(s) for name, s in sides.items()},
    }  # fmt: skip


def blame_verdict(bisect: ScriptBisect, verdict: dict[str, Any]) -> dict[str, Any] | None:
    """Blame the verdict's first named flip (the one its issue body is about); blame.json and changed.json beside
    it. None where no flip names a release."""
    named = [f for f in (Flip.from_json(x) for x in verdict["flips"]) if f.package and f.release]
    if not named:
        return None
    flip = named[0]
    if not flip.last_release_before:
        found = _not_blamed(flip, "no release before the named one was measured: nothing to put back")
    else:
        found = blame_flip(bisect, flip, _end(flip.older), _end(flip.newer))
    changed = found.pop("changed", None)
    if changed is not None:
        (bisect.out_dir / "changed.json").write_text(json.dumps(changed, indent=1) + "\n")
    (bisect.out_dir / "blame.json").write_text(json.dumps(found, indent=1) + "\n")
    bisect.say(f"  blame: {found['verdict']} ({len(found.get('runs') or [])} runs, {found.get('seconds', 0)} s)")
    return found


def prepared(bisect: ScriptBisect, verdict: dict[str, Any]) -> ScriptBisect:
    """A ScriptBisect that judges runs as the verdict did: its target, and the runs it recorded (a later failure
    than the target's counts as a pass only against them)."""
    target = verdict.get("target") or {}
    bisect.target, bisect.target_error = target.get("signature"), target.get("error")
    bisect.observations = [StackRun.from_json(data) for data in bisect.earlier.values()]
    for observation in bisect.observations:
        observation.state = bisect.state_of(observation)
    return bisect


def _end(label: str) -> End:
    return parse_end("flip", label)


def _run(bisect: ScriptBisect, stack: Stack, label: str, *, trace: Path | None = None, package: str = "",
         extra_env: dict[str, str] | None = None, first: str | None = None) -> StackRun:  # fmt: skip
    """One run of the script in `stack`, judged as the verdict judges its runs (not recorded in runs.jsonl: a blame
    run is not a stack's run). `first`: a runtime folder put on the path before the stack's own."""
    from harness.execution.script_launch import run_script

    env = dict(extra_env or {})
    path = [first] if first else []
    if trace is not None:
        trace.mkdir(parents=True, exist_ok=True)
        env |= {"COMPAT_MATRIX_TRACE_PACKAGE": import_name(package), "COMPAT_MATRIX_TRACE_DIR": str(trace)}
        path.insert(0, str(TRACER_DIR))
    pythonpath = os.pathsep.join([*path, *([stack.pythonpath] if stack.pythonpath else [])]) or None
    assert stack.python is not None
    run = run_script(stack.python, bisect.script, nproc=bisect.nproc, torchrun=bisect.torchrun,
                     timeout_s=bisect.timeout_s, pythonpath=pythonpath, extra_env=env)  # fmt: skip
    found = StackRun.of("blame", label, run, {}, "")
    found.state = bisect.state_of(found)
    return found


def _reverted(bisect: ScriptBisect, stack: Stack, plan: dict, flip: Flip) -> dict[str, Any]:
    """One run with `plan` put back (`runtime/revert`), as `blame.blame` asks of its runner: the older release's
    state, the newer's, or neither (another failure, a timeout, a revert that could not be applied)."""
    with blaming.reverting(plan) as (env, read_failed):
        found = _run(bisect, stack, "reverted", extra_env=env, first=str(blaming.REVERT_DIR))
        failed = read_failed()
    state = found.state
    outcome = blaming.OLDER if state == flip.older_state else blaming.NEWER if state == flip.newer_state else None
    line = found.run.error or found.run.outcome
    return {"outcome": outcome or blaming.NEITHER, "line": line, "seconds": found.run.seconds,
            "failed": failed, "error": line if outcome is None else None}  # fmt: skip


def _side_json(side: Side) -> dict[str, Any]:
    return {"release": side.release, "stack": side.stack.label, "state": side.state, "line": side.line,
            "seconds": side.seconds}  # fmt: skip


def _not_blamed(flip: Flip, why: str, sides: dict[str, Side] | None = None) -> dict[str, Any]:
    return {
        "package": flip.package, "older": flip.last_release_before, "newer": flip.release, "candidates": [],
        "blamed": [], "runs": [], "flip": [flip.older, flip.newer], "verdict": f"not blamed: {why}",
        **({"sides": {name: _side_json(s) for name, s in sides.items()}} if sides else {}),
    }  # fmt: skip


def command(args: Any) -> int:
    """`compat-matrix blame-script FOLDER`: blame a committed CPU verdict's named release, then write its issue body
    again with the section."""
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.errors import UsageError
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts.script_bisect import write_issue

    folder = Path(args.folder)
    if not (folder / "verdict.json").is_file() or not (folder / "script.py").is_file():
        raise UsageError(f"{folder}: not a bisect-script verdict folder (needs verdict.json and script.py)")
    verdict = json.loads((folder / "verdict.json").read_text())
    if (verdict.get("device") or {}).get("kind", "cpu") != "cpu":
        raise UsageError(f"{folder.name} was measured on a GPU node: its blame runs there (not yet planned here)")
    history = load_profile("history", MATRIX_DIR)
    options = InstallOptions(envs_dir=default_envs_dir())
    bisect = ScriptBisect(
        folder / "script.py", folder, history, options, nproc=int(verdict["nproc"]),
        torchrun=bool(verdict.get("torchrun")), timeout_s=float(verdict.get("timeout_s") or 600.0),
        match=verdict.get("match"),
    )  # fmt: skip
    if bisect.script_sha != verdict.get("script_sha256"):
        raise UsageError(f"{folder}/script.py is not the script the verdict ran (its sha256 differs)")
    found = blame_verdict(prepared(bisect, verdict), verdict)
    if found is None:
        if getattr(args, "named_only", False):  # bisect-script --blame: a verdict without a release is not an error
            print(f"  blame: {folder.name} names no release, so nothing is blamed")
            return 0
        raise UsageError(f"{folder.name}: the verdict names no release, so there is nothing to blame")
    return write_issue(verdict, bisect)
