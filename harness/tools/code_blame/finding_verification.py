"""Findings for maintainers, verified: each finding's standalone reproducer run with `uv run` from its own pins at the
first bad release and, with only that pin moved, at the last good one, both runs traced (the functions of the
flipping package each executed) and recorded; then the code both runs executed that differs between the releases.

A finding lives in `results/findings/<id>/`: `finding.toml` (where it came from and what was searched upstream:
facts no run measures), `repro.py` (PEP 723, no harness import), and what verifying it writes: `runs.jsonl` (every
verification run: side, pins, exit code, the reproducer's last line, the versions its processes imported) and
`changed.json` (`changed_code.py`). The issue body and FINDINGS.md are made from these
(`harness/publishing/findings.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.environments.overlay import uv_binary
from harness.errors import UsageError
from harness.knowledge.findings import Finding, load_finding, pair_flips
from harness.paths import FINDINGS_FOLDER, REPO_ROOT
from harness.recording.machine import describe_machine
from harness.recording.runs import now_iso
from harness.tools.code_blame import changed_code

TRACER_DIR = REPO_ROOT / "runtime" / "call_trace"
#: How long one reproducer run may take (a cold uv environment included).
RUN_TIMEOUT_S = 1800.0
_TAIL = 3000


def pinned_variant(text: str, package: str, version: str) -> str:
    """The reproducer's text with only `package`'s PEP 723 pin moved to `version` (every other pin held)."""
    block = re.search(r"(?ms)^# /// script$.*?^# ///$", text)
    if block is None:
        raise UsageError("the reproducer has no '# /// script' block")
    pin = re.compile(rf'"{re.escape(package)}==[^"]+"')
    moved, count = pin.subn(f'"{package}=={version}"', block.group(0))
    if count != 1:
        raise UsageError(f"the reproducer pins {package} {count} times in its PEP 723 block, not once")
    return text[: block.start()] + moved + text[block.end() :]


def pins_of(text: str) -> list[str]:
    """The `dependencies` of the reproducer's PEP 723 block, as written."""
    from harness.execution.script_launch import script_dependencies

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(text)
    try:
        return script_dependencies(Path(handle.name))
    finally:
        os.unlink(handle.name)


def run_traced(text: str, package: str, trace_dir: Path, timeout_s: float = RUN_TIMEOUT_S) -> dict[str, Any]:
    """One `uv run --script` of the reproducer's text, every process traced for `package`'s functions."""
    from harness.define.packages import import_name

    trace_dir.mkdir(parents=True, exist_ok=True)
    env = _uv_env() | {
        "PYTHONPATH": str(TRACER_DIR),
        "COMPAT_MATRIX_TRACE_PACKAGE": import_name(package),
        "COMPAT_MATRIX_TRACE_DIR": str(trace_dir),
    }
    with tempfile.TemporaryDirectory(prefix="finding-") as scratch:
        script = Path(scratch) / "repro.py"
        script.write_text(text)
        started = time.monotonic()
        try:
            proc = subprocess.run(
                [uv_binary(), "run", "--quiet", "--script", str(script)], capture_output=True, text=True,
                env=env, cwd=scratch, timeout=timeout_s, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = None, str(exc.stdout or ""), str(exc.stderr or "")
    lines = [line for line in out.splitlines() if line.strip()]
    _, _, versions = changed_code.read_traces(trace_dir)
    return {
        "exit_code": code,
        "line": lines[-1] if lines else None,
        "seconds": round(time.monotonic() - started, 1),
        "versions": versions,
        "stdout_tail": out[-_TAIL:],
        "stderr_tail": err[-_TAIL:],
    }


def _uv_env() -> dict[str, str]:
    """The environment a reproducer's `uv run` gets: this one, without PYTHONPATH, with pip's find-links for uv."""
    env = dict(os.environ)
    if env.get("PIP_FIND_LINKS") and not env.get("UV_FIND_LINKS"):
        env["UV_FIND_LINKS"] = env["PIP_FIND_LINKS"]  # the CPU torch wheel on disk (uv ignores pip.conf)
    env.pop("PYTHONPATH", None)
    return env


def run_on_node(text: str, package: str, version: str, wheels: Path, trace_dir: Path) -> dict[str, Any]:
    """One run of the reproducer on an air-gapped node: this interpreter over the node's own stack, with a `--target`
    overlay first on PYTHONPATH (as the node's rounds layer releases) of `package` at `version` and every other wheel
    in `wheels` (the reproducer's other pins where the node's own releases differ, and what they need), every process
    traced. The run's `machine` says which GPUs ran it and what the overlay held; its `versions`, what the processes
    imported."""
    import sys

    from harness.define.packages import import_name
    from harness.execution import hardware

    trace_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="finding-") as scratch:
        site, overlay = node_overlay(package, version, wheels, Path(scratch) / "site")
        env = dict(os.environ) | {
            "PYTHONPATH": os.pathsep.join(p for p in (str(TRACER_DIR), str(site), os.environ.get("PYTHONPATH")) if p),
            "COMPAT_MATRIX_TRACE_PACKAGE": import_name(package),
            "COMPAT_MATRIX_TRACE_DIR": str(trace_dir),
        }
        script = Path(scratch) / "repro.py"
        script.write_text(text)
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=scratch,
                                  timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = None, str(exc.stdout or ""), str(exc.stderr or "")
    lines = [line for line in out.splitlines() if line.strip()]
    _, _, versions = changed_code.read_traces(trace_dir)
    gpus = hardware.visible_gpus()
    return {
        "exit_code": code,
        "line": lines[-1] if lines else None,
        "seconds": round(time.monotonic() - started, 1),
        "versions": versions,
        "machine": {"gpus": len(gpus), "gpu": sorted(set(gpus)), "overlay": overlay},
        "stdout_tail": out[-_TAIL:],
        "stderr_tail": err[-_TAIL:],
    }


def node_overlay(package: str, version: str, wheels: Path, site: Path) -> tuple[Path, list[str]]:
    """The `--target` overlay a node run puts first on PYTHONPATH: `package` at `version` and every other wheel in
    `wheels`; returns it and the wheels it holds."""
    import sys

    from harness.define.packages import import_name

    prefix = import_name(package)
    found = sorted(wheels.glob(f"{prefix}-{version}-*.whl"))
    if not found:
        raise UsageError(f"no wheel of {package} {version} in {wheels}")
    others = sorted(w for w in wheels.glob("*.whl") if not w.name.startswith(f"{prefix}-"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile", "--target",
         str(site), str(found[0]), *map(str, others)], check=True, capture_output=True, text=True,
    )  # fmt: skip
    return site, [found[0].name, *(w.name for w in others)]


def verify(folder: Path, say: Any = print, node_wheels: Path | None = None, blame: bool = False) -> dict[str, Any]:
    """Run the finding's reproducer at the first bad and the last good release, traced, and record both runs and
    the changed code. Returns the two runs. A reproducer that needs GPUs runs where they are: with `node_wheels`,
    on the node's own stack (`run_on_node`); without, only where this machine has as many GPUs."""
    finding = load_finding(folder)
    if finding.gpus and node_wheels is None:
        from harness.execution import hardware

        have = len(hardware.visible_gpus())
        if have < finding.gpus:
            raise UsageError(
                f"{finding.id}'s reproducer needs {finding.gpus} GPUs, this machine has {have}: run "
                f"`python3 -m harness findings {finding.id} --verify --node-wheels DIR` on a GPU node, DIR holding "
                f"the {finding.package} {finding.bad} and {finding.good} wheels (docs/findings.md)"
            )
    text = (folder / "repro.py").read_text()
    bad_text = pinned_variant(text, finding.package, finding.bad)
    if bad_text != text:
        raise UsageError(f"{folder.name}/repro.py must pin {finding.package}=={finding.bad} (the first bad)")
    good_text = pinned_variant(text, finding.package, finding.good)
    sides: dict[str, dict[str, Any]] = {}
    machine = _machine(node_wheels is not None)
    with tempfile.TemporaryDirectory(prefix="finding-traces-") as traces:
        for side, version, body in (("bad", finding.bad, bad_text), ("good", finding.good, good_text)):
            say(f"{finding.id}: {finding.package}=={version} ({side}) ...")
            if node_wheels is not None:
                found = run_on_node(body, finding.package, version, node_wheels, Path(traces) / side)
            else:
                found = run_traced(body, finding.package, Path(traces) / side)
            run = {
                "side": side, "package": finding.package, "version": version, "pins": pins_of(body),
                "script_sha256": hashlib.sha256(body.encode()).hexdigest(), "made_at": now_iso(),
                **found, "machine": machine | (found.get("machine") or {}),
            }  # fmt: skip
            sides[side] = run
            with open(folder / "runs.jsonl", "a") as handle:
                handle.write(json.dumps(run) + "\n")
            say(f"  exit {found['exit_code']} in {found['seconds']} s: {found['line']}")
        changed = changed_code.compare(
            finding.package, (finding.good, Path(traces) / "good"), (finding.bad, Path(traces) / "bad")
        )
        flipped = pair_flips(finding, sides["bad"], sides["good"])
        if blame:
            if flipped:
                _blame(folder, finding, (bad_text, good_text), changed, Path(traces), sides, say, node_wheels)
            else:  # reverting code where the release does not fail proves nothing: any revert would "pass"
                say(
                    f"  not blamed: on this machine ({describe_machine(machine)}) the runs do not flip as the atlas did"
                )
    names = ", ".join(f"{c.file}::{c.qualname}" for c in changed.changed) or "none"
    say(f"  {changed.executed_both} {finding.package} functions ran in both; changed between the releases: {names}")
    if flipped:  # the code two runs that did not flip executed explains no failure: the committed one stays
        (folder / "changed.json").write_text(json.dumps(changed.as_json(), indent=1) + "\n")
    else:
        say("  changed.json kept: these runs did not flip")
    return sides


def _machine(on_node: bool) -> dict[str, Any]:
    """The machine a verification ran on: a library may take another path by the CPU (bitsandbytes 0.49's CPU
    4-bit path differs with avx512_bf16), so each run says which it was."""
    from harness.execution import hardware

    return hardware.describe("cuda" if on_node else "cpu")


def _blame(
    folder: Path, finding: Finding, texts: tuple[str, str], changed: Any, traces: Path, sides: dict[str, Any], say: Any,
    node_wheels: Path | None = None,
) -> None:  # fmt: skip
    """Put the changed functions back at the bad release until the smallest set that gives the good outcome is left
    (`blame.py`), then the blamed functions the other way into the good release's run; blame.json. With
    `node_wheels`, each run is the node's interpreter over that side's overlay, as `run_on_node` runs it."""
    import sys

    from harness.tools.code_blame import blame as blaming

    bad_text, good_text = texts
    good_traces, bad_traces = traces / "good", traces / "bad"
    _, older_sources, _ = changed_code.read_traces(good_traces)
    _, newer_sources, _ = changed_code.read_traces(bad_traces)
    failing_side = "bad" if finding.direction == "starts" else "good"
    failing = sides[failing_side]
    refused = blaming.refused_calls(changed, failing.get("stderr_tail") or "", older_sources)
    # The order the failing run reaches them: what its error refuses, its traceback, then the last called first.
    candidates = refused + blaming.in_failing_order(
        [blaming.Candidate(c.file, c.qualname) for c in changed.changed],
        changed_code.read_lateness(traces / failing_side), failing.get("stderr_tail") or "", finding.package,
    )  # fmt: skip
    older_calls, newer_calls = changed_code.read_call_edges(good_traces), changed_code.read_call_edges(bad_traces)
    env = _uv_env()
    with tempfile.TemporaryDirectory(prefix="finding-blame-") as scratch:

        def runner(text: str, name: str) -> Any:
            script = Path(scratch) / name
            script.write_text(text)
            command, run_env = [uv_binary(), "run", "--quiet", "--script", str(script)], env
            if node_wheels is not None:  # the node: its interpreter over this side's overlay, no index
                version = finding.bad if name == "bad.py" else finding.good
                site, _ = node_overlay(finding.package, version, node_wheels, Path(scratch) / f"site-{name}")
                command = [sys.executable, str(script)]
                run_env = dict(os.environ) | {"PYTHONPATH": str(site)}

            def run(plan: dict) -> dict:
                found = blaming.run_reverted(command, run_env, plan, (sides["good"], sides["bad"]), cwd=Path(scratch))
                say(f"  put back {len(plan['functions'])} function(s), {len(plan['modules'])} module(s) in the "
                    f"{name.removesuffix('.py')} run: {found['outcome']} in {found['seconds']} s")  # fmt: skip
                return found

            return run

        result = blaming.blame(
            finding.package, finding.good, finding.bad, candidates, older_sources, runner(bad_text, "bad.py"),
            widen=lambda c, error: blaming.helpers_of(c, older_sources, newer_sources, older_calls, error),
        )  # fmt: skip
        if result.blamed:
            blaming.converse(
                result, newer_sources, runner(good_text, "good.py"),
                widen=lambda c, error: blaming.helpers_of(c, newer_sources, older_sources, newer_calls, error),
            )  # fmt: skip
    result.machine = dict(sides["bad"].get("machine") or {})
    blaming.write(result, folder)
    say(f"  blame: {result.verdict} ({len(result.runs)} runs, {result.seconds} s)")


def findings_root(results_dir: Path) -> Path:
    return results_dir / FINDINGS_FOLDER


def command(args: Any) -> int:
    """`compat-matrix findings [ID] [--verify]`: list the findings, print one's issue body, or verify it."""
    from harness.knowledge.atlas import Atlas
    from harness.knowledge.store import Store
    from harness.publishing.findings import findings_list_lines, issue_body

    root = findings_root(args.results_dir)
    if not args.finding:
        if args.verify:
            raise UsageError("--verify needs a finding id (compat-matrix findings lists them)")
        for line in findings_list_lines(Store(args.results_dir)):
            print(line)
        return 0
    folder = root / args.finding
    if not (folder / "finding.toml").is_file():
        known = ", ".join(sorted(p.parent.name for p in root.glob("*/finding.toml"))) or "none"
        raise UsageError(f"no finding {args.finding!r} under {root} (known: {known})")
    if args.verify or args.node_wheels or args.blame:
        verify(folder, node_wheels=args.node_wheels, blame=args.blame)
        return 0
    from harness.define.registry import discover

    finding: Finding = load_finding(folder)
    specs = {s.id: s.spec for s in discover()}
    print(issue_body(finding, Atlas(args.results_dir, specs), specs.get(finding.scenario)), end="")
    return 0
