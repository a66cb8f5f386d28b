"""Run a user's own script once in a built environment, the way the user launches it, and say what happened.

A script fails by a non-zero exit or an exception; exit 77 (the automake convention) means "not applicable to
this stack" and is a skip. With `nproc > 1` (or `torchrun=True`: a distributed script at one rank) it starts
under torchrun with that many ranks (gloo or NCCL is the script's own choice), each rank's output in its own
file. A run that outlives its timeout gets SIGABRT first:
with PYTHONFAULTHANDLER set, every rank writes its threads' Python stacks to its stderr before it dies, so a
hang is a record with each rank's stack, not a silence.

The failure's signature is the harness's own (`signatures.exception_signature` over the last traceback's
exception line), so a script's failure is named the way a scenario's is, and two runs fail "the same way" when
their signatures are equal, or, with `--match`, when their error text matches the user's pattern.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import tomllib
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.execution.launcher import waiting_in
from harness.paths import REPO_ROOT
from harness.processes import guard
from harness.processes.proctree import ORCHESTRATOR_VAR, TOKEN_VAR, kill_token, processes_with_token, send_signal
from harness.recording.signatures import (
    crash_signature,
    exception_signature,
    machine_limits,
    plain_exit_signature,
)

#: Changes whenever how a run is judged or what it records changes: runs recorded under another one are not
#: reused. 4: each run carries the setup measured in its ranks (`measured_setup`) and the failure's whole text.
#: 5: under torchrun a failure is the failing rank's own (torchrun's ChildFailedError never is), a plain non-zero
#: exit is named by its last line of output, and every failing rank's error is kept (`rank_errors`).
CLASSIFIER_VERSION = 7
#: 6: the failure is what ended the script (`runtime/script_probe/compat_matrix_run.py` notes it in each process):
#: its uncaught exception or its `sys.exit` message, never a traceback a library printed and went past (kept as a
#: note); the run says where in the script it ended (`script_lines`); a native library that cannot load here is
#: the machine's limit (`machine_limits`).
#: 7: a plain non-zero exit is named by the last line the script itself printed (the runner's `said`), never a
#: library's warning or caught traceback on either stream; only what ended the script can make a run unusable.
#: The folder whose sitecustomize.py measures what a script ran, and where it writes its facts.
PROBE_DIR = REPO_ROOT / "runtime" / "script_probe"
#: The module (in PROBE_DIR) that runs the script and notes what ended it.
RUNNER = "compat_matrix_run"
SETUP_DIR_VAR = "COMPAT_MATRIX_SETUP_DIR"
#: The exit code a script uses to say "this stack cannot run me" (automake's SKIP).
SKIP_EXIT = 77
#: How long the ranks get to write their stacks after SIGABRT before they are killed.
STACK_GRACE_S = 5.0
#: What a run keeps of each stream.
TAIL_CHARS = 6000
_PEP723 = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
_RANK_PREFIX = re.compile(r"(?m)^\[(?:default)?rank\d+\]:\s?")
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")


@dataclass(frozen=True)
class ScriptRun:
    """One run of the script: its outcome (pass | fail | timeout | skip; install-failed where its stack could not
    be built, so it never started), and the evidence behind it."""

    outcome: str
    exit_code: int | None
    seconds: float
    signature: str | None = None
    #: The exception line ('TypeError: ... unexpected keyword ...'), or the last stderr line without one.
    error: str | None = None
    traceback: str = ""
    stderr_tail: str = ""
    #: rank -> its Python stacks when it was stopped (timeouts only).
    rank_stacks: dict[str, str] = field(default_factory=dict)
    #: rank -> the collective its main thread waited in, where its stack tells.
    waiting_in: dict[str, str | None] = field(default_factory=dict)
    #: What really ran, measured inside the script's ranks (`measured_setup`): never what the script declares.
    setup: dict[str, object] = field(default_factory=dict)
    #: The failure's whole text: the exception line and every line of its message (`error` is its first line).
    error_text: str | None = None
    #: Under torchrun: each failing rank's own error (its exception line, or its last line of output), the first
    #: failure in time first (torchrun's "first observed failure").
    rank_errors: dict[str, str] = field(default_factory=dict)
    #: What ended the script, as its process noted it: "exception", "exit" (sys.exit) or "end"; None where no
    #: process could say (killed, or a run from before the runner).
    ended: str | None = None
    #: Where in the script it ended: the lines of the script's own frames, outermost first (the module-level
    #: statement, then the function calls inside the script); empty where it ended outside any frame of it.
    script_lines: list[int] = field(default_factory=list)
    #: Tracebacks a library printed and went past (their exception lines): never the failure, kept as notes.
    notes: list[str] = field(default_factory=list)
    #: What this machine cannot load ('bitsandbytes could not load its native library here (GLIBCXX_3.4.32)').
    machine_limits: list[str] = field(default_factory=list)


def script_dependencies(path: Path) -> list[str]:
    """The `dependencies` of a PEP 723 script's `# /// script` block (none for a plain file)."""
    blocks = [m for m in _PEP723.finditer(path.read_text()) if m.group("type") == "script"]
    if not blocks:
        return []
    if len(blocks) > 1:
        raise ValueError(f"{path}: more than one '# /// script' block")
    content = "".join(
        line[2:] if line.startswith("# ") else line[1:] for line in blocks[0].group("content").splitlines(True)
    )
    return list(tomllib.loads(content).get("dependencies", []))


def run_script(
    python: Path,
    script: Path,
    *,
    nproc: int = 1,
    torchrun: bool | None = None,
    timeout_s: float = 600.0,
    pythonpath: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> ScriptRun:
    """Run `script` with `python` (and an overlay first on PYTHONPATH), in a scratch working directory."""
    with tempfile.TemporaryDirectory(prefix="bisect-script-") as scratch:
        work = Path(scratch)
        logs = work / "torchrun-logs"
        # The script runs as `python script.py` would, through the probe's runner, which notes what ended it.
        command = [str(python), "-m", RUNNER, str(script.resolve())]
        distributed = nproc > 1 if torchrun is None else torchrun
        if distributed:
            command = [
                str(python), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                f"--log-dir={logs}", "--redirects=3", "-m", RUNNER, str(script.resolve()),
            ]  # fmt: skip
        env = dict(os.environ) | (extra_env or {})
        env.pop("PYTHONPATH", None)
        # The probe first: it only watches (runtime/script_probe/sitecustomize.py), the stack's overlay follows.
        setup_dir = work / "setup"
        setup_dir.mkdir()
        env["PYTHONPATH"] = os.pathsep.join([str(PROBE_DIR), *([pythonpath] if pythonpath else [])])
        env[SETUP_DIR_VAR] = str(setup_dir)
        if distributed:
            env["COMPAT_MATRIX_SETUP_RANKS_ONLY"] = "1"  # the launcher is no rank: it writes no facts
        token = uuid.uuid4().hex
        env |= {
            "PYTHONFAULTHANDLER": "1",
            "PYTHONUNBUFFERED": "1",
            ORCHESTRATOR_VAR: str(os.getpid()),
            TOKEN_VAR: token,
        }
        guard.ensure_started()
        start = time.monotonic()
        out_path, err_path = work / "stdout.log", work / "stderr.log"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                command, cwd=work, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop_with_stacks(proc, token)
            except BaseException:
                # Ctrl-C, SIGTERM: nothing the run started outlives it (torchrun's ranks run in sessions of their own).
                kill_token(token, grace_s=2)
                proc.wait()
                raise
        seconds = time.monotonic() - start
        stderr = err_path.read_text(errors="replace")
        stdout = out_path.read_text(errors="replace")
        ranks = _rank_logs(logs) if distributed else {}
        rank_stdout = _rank_logs(logs, "stdout.log") if distributed else {}
        found = _classify(proc.returncode, timed_out, seconds, stderr, ranks, stdout, rank_stdout)
        found = what_ended(found, ended_records(setup_dir), stderr if not ranks else "\n".join(ranks.values()))
        return replace(found, setup=measured_setup(setup_dir))


def ended_records(folder: Path) -> dict[str, dict[str, object]]:
    """rank -> what ended it, as the runner noted (`ended-<rank>.json`); {} where none could say."""
    found: dict[str, dict[str, object]] = {}
    for path in sorted(folder.glob("ended-*.json")):
        try:
            found[path.stem.removeprefix("ended-")] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def what_ended(found: ScriptRun, ended: dict[str, dict[str, object]], text: str) -> ScriptRun:
    """The run named by what ended the script, where a process noted it: its uncaught exception, or its `sys.exit`
    message; a traceback earlier in the output that is not that exception is a library's, printed and gone past (a
    note, never the failure). Under torchrun the failing rank's own (`rank_errors`' first, else any that failed)."""
    if found.outcome in ("timeout", "skip") and not ended:
        return found
    failing = [r for r in (found.rank_errors or {}) if r in ended] or sorted(ended)
    entry = next((ended[r] for r in failing if ended[r].get("kind") != "end"), None) or (
        ended[failing[0]] if failing else None
    )
    lines = [int(f["line"]) for f in (entry or {}).get("frames") or [] if isinstance(f, dict) and "line" in f]  # type: ignore[union-attr]
    ender = _ender_line(entry)
    notes = _printed_and_passed(text, ender)
    limits = machine_limits(text)
    found = replace(found, ended=str(entry.get("kind")) if entry else None, script_lines=lines, notes=notes,
                    machine_limits=limits)  # fmt: skip
    if not entry or found.outcome in ("pass", "timeout", "skip"):
        return found
    if entry.get("kind") == "exception" and ender:
        exc_type, _, message = ender.partition(": ")
        traceback = str(entry.get("traceback") or "")
        signature = exception_signature(exc_type, message, f"{traceback}\n{text[-TAIL_CHARS:]}")
        whole = str(entry.get("exception") or ender)
        return replace(found, signature=signature, error=ender, traceback=traceback[-TAIL_CHARS:], error_text=whole)
    if entry.get("kind") == "exit" and isinstance(entry.get("code"), str):
        said = [line for line in str(entry["code"]).splitlines() if line.strip()]
        last = said[-1] if said else None
        code = found.exit_code if found.exit_code is not None else 1
        return replace(found, signature=plain_exit_signature(code, last), error=last, traceback="",
                       error_text="\n".join(said) or None)  # fmt: skip
    if entry.get("kind") == "exit" and isinstance(entry.get("code"), int):
        # sys.exit(1) after printing: the failure is the exit and the last line the script itself printed (stdout or
        # stderr), never a warning or a traceback a library printed above or after it.
        last = str(entry["said"]) if entry.get("said") else None
        if "said" not in entry:  # a runner from before it noted the script's own lines
            if not found.traceback:
                return found
            last = _said_last(text, "")
        code = found.exit_code if found.exit_code is not None else entry["code"]
        return replace(found, signature=plain_exit_signature(code, last),  # type: ignore[arg-type]
                       error=last or f"exit code {code}: the script printed no line of its own", traceback="",
                       error_text=last)  # fmt: skip
    return found


def _ender_line(entry: dict[str, object] | None) -> str | None:
    """The ending exception's first line as Python prints it ('TypeError: ...'), or None."""
    if not entry or entry.get("kind") != "exception":
        return None
    text = str(entry.get("exception") or entry.get("type") or "").strip()
    return text.splitlines()[0] if text else None


def shown_note(line: str) -> str:
    """A printed exception line as a note: one per kind of printout (an environment's own path is not part of what
    was printed: '/root/.cache/.../site-packages/bitsandbytes/...' reads '.../site-packages/bitsandbytes/...')."""
    return re.sub(r"(?:/[^\s/()]+)+/site-packages/", ".../site-packages/", line)[:300]


def _printed_and_passed(text: str, ender: str | None) -> list[str]:
    """The exception lines of the tracebacks in the output that are not the one that ended the script (printed by a
    library that caught them, then went on), in order, each once."""
    found: list[str] = []
    for block in text.split(_TRACEBACK)[1:]:
        lines = block.splitlines()
        for line in lines:
            if line.startswith((" ", "\t")) or not line.strip():
                continue
            if _EXCEPTION_LINE.match(line.strip()):
                shown = shown_note(line.strip())
                if line.strip() != ender and shown not in found:
                    found.append(shown)
                break
    return found


def _stop_with_stacks(proc: subprocess.Popen, token: str) -> None:
    """SIGABRT every process of the launch (ranks dump their stacks through faulthandler), then kill them all:
    they carry the launch's token, so ranks torchrun started in sessions of their own are found too."""
    members = processes_with_token(token)
    for pid in [p for p in members if p != proc.pid] + [proc.pid]:  # the ranks first: torchrun would SIGTERM them
        send_signal(pid, signal.SIGABRT)
    try:
        proc.wait(timeout=STACK_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    kill_token(token, grace_s=0)
    proc.wait()


def _rank_logs(logs: Path, name: str = "stderr.log") -> dict[str, str]:
    """rank -> its stderr (or `name`), from torchrun's log directory (`<run>/attempt_<k>/<rank>/stderr.log`; the
    layout has been stable since torch 1.10, the run folder's name has not)."""
    found: dict[str, str] = {}
    for path in sorted(logs.glob(f"**/attempt_*/*/{name}")):
        found[path.parent.name] = path.read_text(errors="replace")
    return dict(sorted(found.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0))


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.S)
_FAILED_RANK = re.compile(r"(?m)^\s*rank\s*:\s*(\d+).*\n\s*exitcode\s*:\s*(-?\d+)")


def failed_ranks(launcher_stderr: str) -> list[str]:
    """The ranks torchrun's failure summary lists, the first observed failure first (its "Root Cause" block), then
    the others in rank order; none where the summary is absent."""
    listed = sorted({rank for rank, _ in _FAILED_RANK.findall(launcher_stderr)}, key=int)
    root = _ROOT_CAUSE.search(launcher_stderr)
    first = [root.group(1)] if root else []
    return first + [rank for rank in listed if rank not in first]


def _rank_failures(
    ranks: dict[str, str], rank_stdout: dict[str, str], launcher_stderr: str
) -> list[tuple[str, tuple[str, str, str] | None, str | None]]:
    """(rank, its last traceback or None, its last line of output) for each rank that failed, the first failure in
    time first. Ranks torchrun does not list (it lists none when its summary is missing) follow, where their output
    holds a traceback."""
    listed = failed_ranks(launcher_stderr)
    order = listed + [rank for rank in ranks if rank not in listed]
    found = []
    for rank in order:
        err = _RANK_PREFIX.sub("", ranks.get(rank, ""))
        out = _RANK_PREFIX.sub("", rank_stdout.get(rank, ""))
        traceback = last_traceback(err) or last_traceback(out)
        if traceback or rank in listed:
            found.append((rank, traceback, _said_last(err, out)))
    return found


def _classify(
    code: int | None,
    timed_out: bool,
    seconds: float,
    stderr: str,
    ranks: dict[str, str],
    stdout: str = "",
    rank_stdout: dict[str, str] | None = None,
) -> ScriptRun:
    tail = stderr[-TAIL_CHARS:]
    if timed_out:
        texts = ranks or {"0": stderr}
        stacks = {rank: _stacks_in(text) for rank, text in texts.items()}
        stacks = {rank: text for rank, text in stacks.items() if text}
        return ScriptRun(
            "timeout", code, seconds, "timeout", "the script did not finish in time", stderr_tail=tail,
            rank_stacks=stacks, waiting_in={r: w for r, w in waiting_in(stacks).items()},  # type: ignore[arg-type]
        )  # fmt: skip
    if code == 0:
        return ScriptRun("pass", code, seconds, stderr_tail=tail)
    # torchrun exits 1 whatever its ranks' codes; its failure summary lists each failed rank's exit code.
    rank_codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)) if ranks else set()
    if code == SKIP_EXIT or (rank_codes and rank_codes == {str(SKIP_EXIT)}):
        said = [_last_line(_RANK_PREFIX.sub("", t)) for t in ranks.values()] if ranks else [_last_line(stderr)]
        return ScriptRun("skip", code, seconds, error=next((s for s in said if s), None), stderr_tail=tail)
    if ranks:
        return _classify_ranks(code, seconds, stderr, ranks, rank_stdout or {})
    found = last_traceback(stderr)
    if found:
        return _from_traceback(found, stderr, code, seconds, tail)
    return _plain_exit(code, seconds, _said_last(stderr, stdout), tail)


def _classify_ranks(
    code: int | None, seconds: float, stderr: str, ranks: dict[str, str], rank_stdout: dict[str, str]
) -> ScriptRun:
    """A failure under torchrun is the failing rank's own: its exception, or, for a plain non-zero exit, its last
    line of output; the first failure in time names the run, every failing rank's error is kept. torchrun's own
    ChildFailedError (its stderr's traceback) is never the name: it is the same for every rank failure."""
    tail = stderr[-TAIL_CHARS:]
    failures = _rank_failures(ranks, rank_stdout, stderr)
    errors = {}
    for rank, traceback, last in failures:
        if traceback:
            errors[rank] = f"{traceback[1]}: {traceback[2]}" if traceback[2] else traceback[1]
        elif last:
            errors[rank] = last
    if not failures:  # no rank's output says anything: what torchrun saw (a signal, an exit code)
        crash = crash_signature({"message": stderr, "stderr_tail": tail})
        return ScriptRun("fail", code, seconds, crash, _root_cause_line(stderr), stderr_tail=tail)
    rank, traceback, last = failures[0]
    if traceback:
        text = _RANK_PREFIX.sub("", ranks.get(rank, "") or rank_stdout.get(rank, ""))
        found = _from_traceback(traceback, text, code, seconds, tail)
    else:
        found = _plain_exit(_rank_exit_code(stderr, rank, code), seconds, last, tail)
    return replace(found, rank_errors=errors)


def _from_traceback(found: tuple[str, str, str], text: str, code: int | None, seconds: float, tail: str) -> ScriptRun:
    traceback, exc_type, message = found
    # The failure's name may be below the message's first line (bitsandbytes' banner): the names look at the whole
    # text, the unclassified hash at the first line only, as before.
    signature = exception_signature(exc_type, message, f"{traceback}\n{text[-TAIL_CHARS:]}")
    line = f"{exc_type}: {message}" if message else exc_type
    whole = exception_text(text)
    return ScriptRun("fail", code, seconds, signature, line, traceback[-TAIL_CHARS:], tail, error_text=whole or line)


def _plain_exit(code: int | None, seconds: float, last: str | None, tail: str) -> ScriptRun:
    """A non-zero exit without a traceback: named by its exit code and its last line of output, which is what the
    user saw (`exit-1-<hash of the line>`; two runs fail the same way when they print the same line)."""
    if code is not None and code < 0:
        return ScriptRun("fail", code, seconds, f"crash-{_signal_name(code)}", last, stderr_tail=tail)
    return ScriptRun("fail", code, seconds, plain_exit_signature(code, last), last, stderr_tail=tail, error_text=last)


def _rank_exit_code(launcher_stderr: str, rank: str, default: int | None) -> int | None:
    for listed, code in _FAILED_RANK.findall(launcher_stderr):
        if listed == rank:
            return int(code)
    return default


def _root_cause_line(launcher_stderr: str) -> str | None:
    root = launcher_stderr.rsplit("Root Cause", 1)[-1] if "Root Cause" in launcher_stderr else ""
    found = re.search(r"exitcode\s*:\s*(-?\d+)[^\n]*", root)
    return found.group(0).strip() if found else _last_line(launcher_stderr)


def last_traceback(text: str) -> tuple[str, str, str] | None:
    """The last Python traceback in `text`: (its text, the exception type, the message's first line)."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    block = text[start:]
    lines = block.splitlines()
    for index, line in enumerate(lines[1:], start=1):
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            exc_type = match.group("type")
            message = "\n".join([match.group("message") or "", *lines[index + 1 : index + 4]]).strip()
            return "\n".join(lines[: index + 1]), exc_type, message.splitlines()[0] if message else ""
    return None


#: An exception's line as Python prints it ('RuntimeError: 0 active drivers', 'torch.OutOfMemoryError: ...').
_RAISED = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)(?::\s|$)")


def cause_line(text: str) -> str | None:
    """The line that says why a stack could not be built or run, from the installer's or the run's whole text: the
    exception that ended the last traceback in it (a build's, indented inside the installer's output as uv prints
    it: "RuntimeError: 0 active drivers ([]). There should only be one."; its header may be cut away), else the
    resolver's reason ("Because ...") or hint, else its first error line."""
    lines = text.splitlines()
    marks = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if marks:
        indent = len(lines[marks[-1]]) - len(lines[marks[-1]].lstrip())
        for line in lines[marks[-1] + 1 :]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent and _RAISED.match(line.strip()):
                return line.strip()[:300]
    raised = [line.strip() for line in lines if _RAISED.match(line.strip())]
    if raised:
        return raised[-1][:300]
    for marker in ("╰─▶", "hint:"):
        found = [line.strip() for line in lines if marker in line]
        if found:
            return found[0].replace("╰─▶", "").strip()[:300]
    said = [line.strip() for line in lines if line.strip()]
    return next((line for line in said if "error" in line.lower()), said[0] if said else None)


def exception_text(text: str) -> str | None:
    """The last traceback's exception with its whole message (every line after the traceback's frames, up to the
    next traceback or the end), as a user reads it at the bottom of their terminal."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    lines = text[start:].splitlines()[1:]
    for index, line in enumerate(lines):
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        if _EXCEPTION_LINE.match(line.strip()):
            body = []
            for follower in lines[index:]:
                if follower.startswith(("[W", "[E", "E1", "W1", "I1")) or "torch.distributed.elastic" in follower:
                    break  # torchrun's own log lines, not the exception's
                body.append(follower)
            return "\n".join(body).strip()[:TAIL_CHARS] or None
    return None


def measured_setup(folder: Path) -> dict[str, object]:
    """What the ranks measured (runtime/script_probe/sitecustomize.py), summed up over every rank that reported:
    device, GPUs, world size and backend; where accelerate prepared the model, the distributed type, mixed
    precision, the FSDP plugin's version, what really wrapped the model ('fsdp1', 'fsdp2', 'deepspeed', 'ddp'),
    the state dict type when prepared and when saved, the ZeRO stage. A field the ranks disagree on lists every
    value; one nobody measured is absent."""
    ranks = []
    for path in sorted(folder.glob("rank-*.json")):
        try:
            ranks.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not ranks:
        return {}
    summary: dict[str, object] = {"ranks_reporting": len(ranks)}
    devices = [r.get("device") or {} for r in ranks]
    prepares = [p for r in ranks for p in (r.get("accelerate") or {}).get("prepare", [])]
    # A script that calls deepspeed.initialize itself: the engine's ZeRO stage, measured the same way.
    prepares += [p for r in ranks for p in (r.get("deepspeed") or {}).get("initialize", [])]
    saves = [s for r in ranks for s in (r.get("accelerate") or {}).get("get_state_dict", [])]
    fields = {
        "device": [d.get("kind") for d in devices],
        "gpu_count": [d.get("gpu_count") for d in devices],
        "gpu_names": [", ".join(d.get("gpu_names") or []) or None for d in devices],
        "world_size": [d.get("world_size") for d in devices],
        "backend": [d.get("backend") for d in devices],
        "distributed_type": [p.get("distributed_type") for p in prepares],
        "mixed_precision": [p.get("mixed_precision") for p in prepares],
        "fsdp_plugin_version": [p.get("fsdp_plugin_version") for p in prepares],
        "wrapped_by": [w for p in prepares for w in p.get("wrapped_by") or []],
        "state_dict_type": [p.get("state_dict_type") for p in prepares],
        "state_dict_type_at_save": [s.get("state_dict_type") for s in saves],
        "zero_stage": [p.get("zero_stage") for p in prepares],
    }
    for name, values in fields.items():
        seen = sorted({v for v in values if v is not None}, key=str)
        if seen:
            summary[name] = seen[0] if len(seen) == 1 else seen
    return summary


def _stacks_in(text: str) -> str:
    found = re.search(r"(?m)^(?:Fatal Python error|Current thread|Thread) ", text)
    return text[found.start() :][-TAIL_CHARS:] if found else ""


_NOISE = re.compile(r"^(\s|\S+:\d+: \w*Warning: |\[[WIE]\d{4} |warnings\.warn\()")


def _said_last(stderr: str, stdout: str) -> str | None:
    """What a process that exited without a traceback last said: its last line on stderr that is not a warning
    (a `file:line: ...Warning:` line, the source line indented under it, a C++ `[W1127 ...]` log line), else its
    last line on stdout."""
    said = [line for line in stderr.splitlines() if line.strip() and not _NOISE.match(line)]
    return said[-1][:300] if said else _last_line(stdout)


def _last_line(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


def _signal_name(code: int | None) -> str:
    try:
        return signal.Signals(-(code or 0)).name
    except ValueError:
        return f"signal-{code}"
