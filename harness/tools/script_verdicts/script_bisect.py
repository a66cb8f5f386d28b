"""Bring your own failure: run a user's script across the atlas's dated stacks (or between two stacks of their
own) and name the package and release where its failure starts or ends.

Three phases, each a list of real runs of the script:
1. **scan**: one run per atlas day (the history profile's install days, the same environments the atlas ran
   in), or the user's two ends. Each run is *target* (the failure asked about: the bad end's signature, or
   the user's `--match`), *pass*, *other* (a different failure: reported, never taken for the target) or
   *unusable* (the stack could not be installed, or the script exited 77: not applicable).
2. **moves**: for each pair of neighbouring known days whose states differ, the older stack with one package
   moved to the newer day's release (an overlay, `script_stacks.overlay`), packages named by the failing
   traceback first, until one move alone reproduces the newer state.
3. **bisect**: that package's releases between the two, binary search with both ends already known, so n
   releases take ceil(log2 n) runs (plus one per release stepped over because it fails differently or does
   not install).

Every run is appended to `<out>/runs.jsonl` as it ends and is reused by a later invocation of the same script
(same text, launch and stack), so an interrupted bisect resumes and a repeated one costs nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.define.packages import AXIS_PACKAGES, import_name
from harness.define.profile import DATE_AXIS, Profile
from harness.environments import disk
from harness.environments.envs import InstallOptions
from harness.errors import UsageError
from harness.execution.script_launch import (
    CLASSIFIER_VERSION,
    ScriptRun,
    cause_line,
    run_script,
    script_dependencies,
    shown_note,
)
from harness.paths import SCRIPT_BISECT_FOLDER, meta_file, profile_runs, records_file
from harness.recording.flip import Flip
from harness.recording.runs import now_iso
from harness.recording.signatures import cannot_run_here
from harness.tools.release_search import flip_search
from harness.tools.script_verdicts import script_stacks
from harness.tools.script_verdicts.script_stacks import LocalStacks, Stack
from harness.tools.script_verdicts.stack_run import StackRun, earlier_runs
from harness.tools.script_verdicts.verdict_text import KNOWN, summary_lines
from harness.versions import releases

#: The one rule's answers in a script verdict's words.
_SCRIPT_STATE = {
    flip_search.SHOWS: "target",
    flip_search.ABSENT: "pass",
    flip_search.UNUSABLE: "unusable",
    flip_search.NO_EVIDENCE: "other",
}
#: Moves per flip before the search gives up naming one package: the traceback's and the error's packages and the
#: atlas packages come first, so the tail is packages that rarely explain a flip (the verdict lists them).
MOVE_BOUND = 10
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: A move's label lists at most this many packages that moved with it by name.
DRAGGED_SHOWN = 6
#: Libraries whose release moves with the stack under test (named in a long label, as the atlas packages are).
ERA_LIBRARIES = ("tokenizers", "huggingface-hub", "safetensors")


@dataclass(frozen=True)
class End:
    """One end the user named: an install day, or pins ('transformers==4.39.3,accelerate==1.0.0')."""

    day: str | None = None
    pins: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.day or ",".join(f"{p}=={v}" for p, v in self.pins.items())


def parse_end(option: str, text: str) -> End:
    """A day (YYYY-MM-DD) or comma-separated exact pins; anything else is a usage error."""
    text = text.strip()
    if _DAY.match(text):
        try:
            dt.date.fromisoformat(text)
        except ValueError:
            raise UsageError(f"{option} {text!r}: not a real day") from None
        return End(day=text)
    pins: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, version = part.partition("==")
        try:
            Version(version)
        except InvalidVersion:
            sep = ""
        if not sep or not name:
            raise UsageError(f"{option} {text!r}: give a day (2024-09-26) or exact pins (peft==0.13.2,torch==2.4.1)")
        pins[str(canonicalize_name(name))] = version
    if not pins:
        raise UsageError(f"{option}: empty")
    return End(pins=pins)


class Unplanned(Exception):
    """The search needs a run that a GPU round has not made yet (its stack is not planned, or planned and not run):
    the connected machine plans it into the next round, the node stops there."""

    def __init__(self, request: dict[str, str]) -> None:
        super().__init__(f"not run yet: {request}")
        self.request = request


@dataclass
class Cost:
    environments_built: int = 0
    environments_reused: int = 0
    overlays_built: int = 0
    overlays_reused: int = 0
    runs: int = 0
    runs_reused: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)


class ScriptBisect:
    """One invocation: the script, how it launches, where its runs go, and what they cost."""

    def __init__(
        self,
        script: Path,
        out_dir: Path,
        history: Profile,
        options: InstallOptions,
        *,
        nproc: int = 1,
        torchrun: bool = False,
        timeout_s: float = 600.0,
        match: str | None = None,
        fresh: bool = False,
        say: Callable[[str], None] = print,
        source: Any = None,
        device: dict[str, Any] | None = None,
        search: str = "sweep",
        day_torch: dict[str, str] | None = None,
    ) -> None:
        if not script.is_file():
            raise UsageError(f"{script}: no such file")
        try:
            self.extras = script_dependencies(script)
        except ValueError as exc:  # tomllib.TOMLDecodeError is one, as is "two blocks"
            raise UsageError(f"{script}: its PEP 723 block does not parse: {exc}") from None
        self.script, self.out_dir, self.history, self.options = script, out_dir, history, options
        if search not in SEARCHES:
            raise UsageError(f"search {search!r}: one of {', '.join(SEARCHES)}")
        #: How a named package's releases are searched: "sweep" (every change, `flip_search.next_sweep`) or
        #: "bisect" (one change assumed; the committed verdicts made before the sweep replay with it).
        self.search = search
        self.nproc, self.timeout_s, self.say = nproc, timeout_s, say
        self.torchrun = torchrun or nproc > 1
        try:
            self.match = re.compile(match) if match else None
        except re.error as exc:
            raise UsageError(f"--match {match!r}: {exc}") from None
        text = script.read_bytes()
        self.script_sha = hashlib.sha256(text).hexdigest()
        self.cost = Cost()
        self.observations: list[StackRun] = []
        self.target: str | None = None
        self.target_error: str | None = None
        out_dir.mkdir(parents=True, exist_ok=True)
        self.runs_path = out_dir / "runs.jsonl"
        self.earlier = {} if fresh else earlier_runs(self.runs_path)
        #: Where stacks come from: this machine's environments, or a GPU round's plan (gpu_node/node_script.py).
        self.source = source or LocalStacks(history, self.extras, options, day_torch)
        #: The machine the runs happen on ({"kind": "cpu"} here; a node's GPUs), written into each run's facts.
        self.device = device or {"kind": "cpu"}
        #: The runs the search expects to need next, most likely first (what a GPU round carries beyond the one
        #: it must): set by the moves and the bisect as they start.
        self.expected: list[dict[str, str]] = []
        #: A GPU node's calls that made the runs (gpu_node/node_script.py), for the verdict's cost.
        self.device_calls: list[dict[str, Any]] = []
        #: Told of each run as it is recorded (a node keeps its call's account current: a killed call loses none).
        self.after_run: Callable[[StackRun], None] | None = None
        if fresh and self.runs_path.exists():
            self.runs_path.rename(out_dir / f"runs-{now_iso().replace(':', '')}.jsonl")

    # -- running ---------------------------------------------------------------------------------------------
    def observe(self, phase: str, stack: Stack) -> StackRun:
        """Run the script in `stack` (or take the same run from an earlier invocation) and record it."""
        self._count_stack(stack, phase)
        facts = {
            "kind": stack.kind,
            "mode": stack.mode,
            "overlaid": stack.overlaid,
            "versions": stack.versions,
            "reused": stack.reused,
            "build_seconds": round(stack.seconds, 1),
            "failure": stack.failure,
            "left_out": stack.left_out,
            "device": self.device,
        }
        key = self.key_of(stack)
        if key in self.earlier:
            found = StackRun.from_json({**self.earlier[key], "phase": phase, "label": stack.label, "reused": True})
            self.cost.runs_reused += 1
        elif stack.identity is not None and stack.python is None and not stack.failure:
            raise Unplanned(stack.request or {"label": stack.label})
        elif stack.failure or stack.python is None:
            # Its cause line names it (the build's exception, the resolver's reason); the whole summary is the stack's.
            why = cause_line(stack.failure or "") or "the stack could not be built"
            found = StackRun(phase, stack.label, ScriptRun("install-failed", None, 0.0, error=why), facts, key)
        else:
            run = run_script(
                stack.python,
                self.script,
                nproc=self.nproc,
                torchrun=self.torchrun,
                timeout_s=self.timeout_s,
                pythonpath=stack.pythonpath,
            )
            self.cost.runs += 1
            found = StackRun.of(phase, stack.label, run, facts, key)
        if not (found.reused and stack.identity is not None):
            found.stack = facts  # (a planned stack's run keeps the facts of the node that ran it)
        if not found.reused:
            with open(self.runs_path, "a") as handle:
                handle.write(
                    json.dumps({**found.as_json(), "script_sha256": self.script_sha, "nproc": self.nproc}) + "\n"
                )
            if self.after_run is not None:
                self.after_run(found)
        found.state = self.state_of(found)
        self.observations.append(found)
        what = found.run.error or ""
        self.say(
            f"  {phase:<6} {stack.label:<40} {found.run.outcome:<14} {found.state:<9} "
            f"{found.run.seconds:6.1f} s{' (earlier run)' if found.reused else ''}  {what[:90]}"
        )
        return found

    def key_of(self, stack: Stack) -> str:
        """A run's key: the script, its launch and the stack (a planned stack's identity, else its versions)."""
        # A planned stack is its identity, whatever became of it (an install that failed is that stack's run, not
        # a run of every stack that fails the same way).
        what = stack.identity or stack.failure or sorted(stack.versions.items())
        return hashlib.sha256(
            json.dumps([CLASSIFIER_VERSION, self.script_sha, self.nproc, self.torchrun, what]).encode()
        ).hexdigest()[:16]

    def state_of(self, found: StackRun) -> str:
        """A run's state by the one rule (`flip_search.run_evidence`), in a script verdict's words: target, pass,
        other (no evidence: another failure, or a timeout where the target is not a hang) or unusable. A run that
        failed another way at a later point of the script than the failure asked about got past it: that failure is
        gone there, so for its search the run is a pass (`later` says so in the verdict). One that failed earlier,
        or where no point is known, stays no evidence."""
        found.later = False
        if found.run.outcome in ("install-failed", "skip"):
            return "unusable"
        if _cannot_run(found) or _needs_left_out(found):
            return "unusable"  # the stack cannot run on this machine at all: no evidence either way
        if found.run.outcome != "pass" and self.match is None and self.target is None:
            return ""  # no target chosen yet
        state = _SCRIPT_STATE[flip_search.run_evidence(found.run.outcome, self._is_target(found))]
        if state == "other" and found.run.outcome == "fail" and self._past_the_target(found):
            found.later = True
            return "pass"
        return state

    def _past_the_target(self, found: StackRun) -> bool:
        """Whether `found` ended at a later point of the script than every run that showed the failure asked about
        (the script's own frames, outermost first: a later module-level statement, or a later line inside the same
        one). Unknown points are never later."""
        points = [o.run.script_lines for o in self.observations if o.run.script_lines and self._is_target(o)]
        if not found.run.script_lines or not points:
            return False
        # The module-level statement only: inside one statement, which call of it comes first is not known here.
        return all(found.run.script_lines[0] > point[0] for point in points)

    def _is_target(self, found: StackRun) -> bool:
        if self.match is not None:
            return bool(self.match.search(f"{found.run.error or ''}\n{found.run.traceback}\n{found.run.stderr_tail}"))
        return found.run.signature == self.target

    def set_target(self, found: StackRun) -> None:
        self.target, self.target_error = found.run.signature, found.run.error
        for other in self.observations:
            other.state = self.state_of(other)

    def _count_stack(self, stack: Stack, phase: str) -> None:
        if stack.kind == "overlay":
            if stack.reused:
                self.cost.overlays_reused += 1
            elif stack.python is not None:
                self.cost.overlays_built += 1
        # The environments are the scanned stacks' (a move's is its older stack's, counted there), and a torch move's
        # own (`script_stacks.NATIVE_MOVES`).
        if (phase == "scan" or stack.kind == "moved") and stack.environment_reused is not None:
            if stack.environment_reused:
                self.cost.environments_reused += 1
            else:
                self.cost.environments_built += 1

    def timed(self, phase: str, started: float) -> None:
        self.cost.phase_seconds[phase] = round(self.cost.phase_seconds.get(phase, 0.0) + time.monotonic() - started, 1)

    # -- stacks ----------------------------------------------------------------------------------------------
    def stack_for(self, end: End) -> Stack:
        return self.source.scan(end)

    def moved(self, base: Stack, package: str, version: str, older: End, newer: End) -> Stack:
        """`base` with `package` moved to `version`; the label says what had to move with it."""
        stack = self.source.move(base, package, version, older, newer)
        dragged = sorted(
            f"{n}=={v}" for n, v in stack.overlaid.items() if n != package and not script_stacks.is_torch_runtime(n)
        )
        runtime = any(script_stacks.is_torch_runtime(n) for n in stack.overlaid)
        if len(dragged) > DRAGGED_SHOWN:  # the atlas packages by name, the rest counted (runs.jsonl has them all)
            named = [d for d in dragged if d.split("==")[0] in AXIS_PACKAGES + ERA_LIBRARIES]
            dragged = [*named, f"{len(dragged) - len(named)} other dependencies"]
        with_it = [*dragged, *(["its CUDA libraries"] if runtime else [])]
        return replace(stack, label=f"{stack.label} (with {', '.join(with_it)})") if with_it else stack


def run(bisect: ScriptBisect, ends: list[End], bad: End | None, *, all_moves: bool = False) -> dict[str, Any]:
    """The whole search over `ends` (atlas days in order, or the user's two pinned ends); returns the verdict
    (also written to `<out>/verdict.json`)."""
    say = bisect.say
    started = time.monotonic()
    say(f"bisect-script: {bisect.script.name}, {bisect.nproc} process(es), {len(ends)} stacks to scan")
    if isinstance(bisect.source, LocalStacks):  # environments built here (a GPU round's stacks are planned, not built)
        for line in _cost_lines(bisect.source, ends, bisect.options):
            say(line)
    stacks: dict[str, Stack] = {}
    scan: list[StackRun] = []
    for index, end in enumerate(ends, 1):
        stack = bisect.stack_for(end)
        stacks[end.label] = stack
        say(f"[{index}/{len(ends)}]")
        scan.append(bisect.observe("scan", stack))
    bisect.timed("scan", started)

    target_at = _choose_target(bisect, scan, bad)
    flips: list[Flip] = []
    answers: dict[str, list[Flip]] = {}
    if target_at is not None:
        bisect.set_target(target_at)
        by_label = {e.label: e for e in ends}
        neighbours = bool(ends[0].day) or len(ends) > 2  # days, or several stacks of the user's own, in order
        flips = _neighbour_flips(scan) if neighbours else _end_flips(scan)
        for flip in flips:
            _name_flip(bisect, flip, stacks[flip.older], by_label[flip.older], by_label[flip.newer], all_moves)
        if neighbours:
            answers = _answer_other_failures(bisect, scan, stacks, by_label, all_moves)
    verdict = _verdict(bisect, scan, flips, answers)
    (bisect.out_dir / "verdict.json").write_text(json.dumps(verdict, indent=1) + "\n")
    (bisect.out_dir / "script.py").write_bytes(bisect.script.read_bytes())
    for line in summary_lines(verdict):
        say(line)
    return verdict


def _cost_lines(source: LocalStacks, ends: list[End], options: InstallOptions) -> list[str]:
    """What the scan's environments will cost, said before the first is built (`disk.estimate`, as every command)."""
    need = disk.estimate(source.planned(ends), options.envs_dir, options.cap())
    return script_stacks.build_cost_lines(source.to_build(ends), len(ends), need)


def _answer_other_failures(
    bisect: ScriptBisect, scan: list[StackRun], stacks: dict[str, Stack], by_label: dict[str, End], all_moves: bool
) -> dict[str, list[Flip]]:
    """Every other failure the scan saw gets its own answer where the scan brackets it: the same search, the same
    evidence rule, with that failure in the place of the one asked about (its release where it ended, or started
    inside the scan; a stack showing yet another failure is no evidence either way). The failure asked about and its
    states are put back afterwards."""
    asked = (bisect.target, bisect.target_error, bisect.match)
    others: list[StackRun] = []
    for found in scan:
        if found.state == "other" and found.run.outcome in ("fail", "timeout"):
            if found.run.signature not in {o.run.signature for o in others}:
                others.append(found)
    answers: dict[str, list[Flip]] = {}
    try:
        for first in others:
            bisect.match = None
            bisect.set_target(first)
            flips = _neighbour_flips(scan)
            for flip in flips:
                older, newer = by_label[flip.older], by_label[flip.newer]
                _name_flip(bisect, flip, stacks[flip.older], older, newer, all_moves)
            answers[str(first.run.signature)] = flips
    finally:
        bisect.target, bisect.target_error, bisect.match = asked
        for found in bisect.observations:
            found.state = bisect.state_of(found)
    return answers


def _choose_target(bisect: ScriptBisect, scan: list[StackRun], bad: End | None) -> StackRun | None:
    """The failure asked about: the user's --match, else the bad end's failure, else the newest failing stack's. A
    stack that cannot run on this machine (a native library that cannot load here) is never where it is taken."""
    failing = [o for o in scan if o.run.outcome in ("fail", "timeout") and o.state != "unusable"]
    if bisect.match is not None:
        matched = [o for o in failing if o.state == "target"]
        return matched[-1] if matched else None
    if bad is not None:
        at = next((o for o in scan if o.label == bad.label), None)
        if at is not None and at.state == "unusable":
            bisect.say(f"the bad end {bad.label} cannot run on this machine ({at.run.error}): nothing to bisect")
            return None
        if at is None or at.run.outcome not in ("fail", "timeout"):
            outcome = at.run.outcome if at else "not run"
            bisect.say(f"the bad end {bad.label} does not fail ({outcome}): nothing to bisect")
            return None
        return at
    return failing[-1] if failing else None


def _neighbour_flips(scan: list[StackRun]) -> list[Flip]:
    known = [o for o in scan if o.state in KNOWN]
    return [
        Flip(a.label, b.label, a.state, b.state, _changed(a, b))
        for a, b in itertools.pairwise(known)
        if a.state != b.state
    ]


def _end_flips(scan: list[StackRun]) -> list[Flip]:
    good, bad = scan
    if good.state != "pass":
        why = f"the good end does not pass ({good.run.outcome}: {good.run.error}), so no release can be named"
        return [Flip(good.label, bad.label, good.state, bad.state, _changed(good, bad), note=why)]
    return [Flip(good.label, bad.label, good.state, bad.state, _changed(good, bad))]


def _changed(a: StackRun, b: StackRun) -> dict[str, list[str]]:
    va, vb = a.stack["versions"], b.stack["versions"]
    return {
        name: [va.get(name), vb.get(name)]
        for name in sorted(set(va) | set(vb))
        if name not in script_stacks.NOT_PACKAGES and va.get(name) != vb.get(name)
    }


def move_order(changed: dict[str, list[str]], failing: StackRun | None) -> list[str]:
    """Packages to move, most suspect first: those whose files the failing traceback passes through (innermost
    first), then those its error line names, then the atlas packages, then the rest. torch's CUDA libraries and
    triton are no move of their own: they move with torch."""
    movable = [p for p, (_, new) in changed.items() if new is not None and not script_stacks.is_torch_runtime(p)]
    text = f"{failing.run.traceback if failing else ''}"
    frames = re.findall(r'File "[^"]*/(?:site-packages|site)/([^/"]+)/', text)[::-1]
    error = (failing.run.error or "").lower() if failing else ""
    order: list[str] = []
    for module in frames:
        order += [p for p in movable if import_name(p) == module and p not in order]
    order += [p for p in movable if _named_in(import_name(p).lower(), error) and p not in order]
    order += [p for p in AXIS_PACKAGES if p in movable and p not in order]
    return order + [p for p in movable if p not in order]


def _named_in(module: str, error: str) -> bool:
    """Whether a word of the error starts like the module ('Accelerator.__init__()' names accelerate)."""
    stem = module[: min(len(module), 8)]
    return any(word.startswith(stem) for word in re.findall(r"[a-z_][a-z0-9_]*", error))


def _name_flip(bisect: ScriptBisect, flip: Flip, older_stack: Stack, older: End, newer: End, all_moves: bool) -> None:
    if flip.note:
        return
    say = bisect.say
    failing = next(o for o in bisect.observations if o.label in (flip.older, flip.newer) and o.state == "target")
    say(
        f"flip {flip.older} ({flip.older_state}) -> {flip.newer} ({flip.newer_state}): "
        f"{len(flip.changed)} packages differ"
    )
    started = time.monotonic()
    reproducing: list[str] = []
    order = move_order(flip.changed, failing)
    bound = len(order) if all_moves else MOVE_BOUND
    bisect.expected = [
        {"day": older.label, "package": p, "version": flip.changed[p][1], "newer": newer.label, "phase": "move"}
        | ({"old": flip.changed[p][0]} if flip.changed[p][0] else {})
        for p in order[:bound]
    ]
    for package in order[:bound]:
        version = flip.changed[package][1]
        found = bisect.observe("move", bisect.moved(older_stack, package, version, older, newer))
        flip.moves.append({"package": package, "version": version, **_brief(found)})
        if flip_search.reproduces(found.state, flip.newer_state):
            reproducing.append(package)
            if not all_moves:
                break
    bisect.timed("moves", started)
    if len(reproducing) != 1:
        tried = ", ".join(f"{m['package']} {m['version']}: {m['state']}" for m in flip.moves)
        flip.untried = order[len(flip.moves) :]
        flip.note = (
            f"each of {', '.join(reproducing)} alone reproduces it" if reproducing else f"no single package ({tried})"
        )
        if flip.untried:
            flip.note += (
                f"; {len(flip.untried)} changed packages not moved (bound {bound} moves; --all-moves moves them): "
                + ", ".join(flip.untried)
            )
        return
    package = flip.package = reproducing[0]
    old, new = flip.changed[package]
    started = time.monotonic()
    _bisect_releases(bisect, flip, older_stack, older, newer, package, old, new)
    bisect.timed("bisect", started)
    # Held: what every run of this package's moves kept at the older stack's release (what moved with it, as
    # torch's CUDA libraries or a requirement it excludes, is not).
    probes = [
        o
        for o in bisect.observations
        if o.phase in ("move", "bisect") and o.label.startswith(f"{older_stack.label} + {package}==")
    ]
    flip.held = {
        p: v
        for p, v in older_stack.packages().items()
        if p != package
        and p in (*AXIS_PACKAGES, *flip.changed)
        and all(o.stack["versions"].get(p) == v for o in probes if o.stack.get("versions"))
    }


def _bisect_releases(
    bisect: ScriptBisect, flip: Flip, base: Stack, older: End, newer: End, package: str, old: str | None,
    new: str,
) -> None:  # fmt: skip
    """Binary search over the releases after `old` up to `new`, both ends' states known already."""
    if old is None:
        flip.release, flip.note = new, f"{package} is absent from the older stack"
        return
    after = bisect.source.releases(package, old, new)
    if not after or after[-1] != str(Version(new)):
        after.append(new)  # the newer stack's own release, where the index no longer lists it (yanked)
    flip.candidates = after
    # Both ends are measured already: the older stack's release and the newer stack's (the move that reproduced).
    candidates = [str(Version(old)), *after]
    known = {candidates[0]: flip.older_state, after[-1]: flip.newer_state}
    if bisect.search == "sweep":
        _sweep_releases(bisect, flip, base, older, newer, package, candidates, known)
        _release_notes(bisect, flip, package)
        return
    step = flip_search.next_step(candidates, known, flip.older_state, flip.newer_state)
    while not step.done:
        bisect.expected = [
            {"day": older.label, "package": package, "version": v, "newer": newer.label, "phase": "bisect"}
            for v in search_order(candidates, known, flip.older_state, flip.newer_state)
        ]
        _probe_release(bisect, flip, base, older, newer, package, step.probes[0], known)
        step = flip_search.next_step(candidates, known, flip.older_state, flip.newer_state)
    flip.release, flip.last_release_before = step.first, step.last_before
    _release_notes(bisect, flip, package)


def _release_notes(bisect: ScriptBisect, flip: Flip, package: str) -> None:
    """What lies between the named release and the one before it that no run could judge: a yanked release, or
    releases that failed another way or could not run (the change may hide in them); and where the release's run got
    past the failure to fail further on, which failure takes over."""
    if not flip.release or not flip.last_release_before:
        return
    past = next(
        (
            o
            for o in bisect.observations
            if o.later and o.label.split(" (with ")[0].endswith(f"+ {package}=={flip.release}")
        ),
        None,
    )
    if past is not None:
        flip.note = f"where {past.run.error}, later in the script, takes over. "
    gone = [v for v in bisect.source.yanked(package) if _between(v, flip.last_release_before, flip.release)]
    if gone:
        flip.note += f"{', '.join(gone)} (yanked from the index) lies between and was not tried. "
    skipped = [s for s in flip.stepped_over if _between(s["version"], flip.last_release_before, flip.release)]
    if skipped:
        how = "fail differently" if any(s["state"] == "other" for s in skipped) else "could not run"
        flip.note += (
            f"{', '.join(s['version'] for s in skipped)} (between {flip.last_release_before} and "
            f"{flip.release}) {how}: the change may be in one of them, masked"
        )


def _probe_release(
    bisect: ScriptBisect, flip: Flip, base: Stack, older: End, newer: End, package: str, version: str,
    known: dict[str, str],
) -> None:  # fmt: skip
    """Run the script with `package` moved to `version`; what it showed goes into the flip's runs and `known`."""
    found = bisect.observe("bisect", bisect.moved(base, package, version, older, newer))
    entry = {"version": version, **_brief(found)}
    flip.bisect_runs.append(entry)
    if found.state not in (flip.older_state, flip.newer_state):
        flip.stepped_over.append(entry)  # failed another way or could not run: not the answer
    known[version] = found.state


#: The release searches: the sweep finds every change between the two ends, the bisect assumes one.
SEARCHES = ("sweep", "bisect")


def _sweep_releases(
    bisect: ScriptBisect, flip: Flip, base: Stack, older: End, newer: End, package: str, candidates: list[str],
    known: dict[str, str],
) -> None:  # fmt: skip
    """Every release that can change the outcome between the two ends (both known already): the sweep points at
    once, then each gap whose two ends differ; every change found goes into the flip, in order, and the flip's
    release is the last change (after which the newer end's state holds)."""
    step = flip_search.next_sweep(candidates, known)
    while not step.done:
        pending = [v for v in step.probes if v not in known]
        for index, version in enumerate(pending):
            # This probe and the rest of the step's (a GPU round carries them all: they are known before any run).
            bisect.expected = [
                {"day": older.label, "package": package, "version": v, "newer": newer.label, "phase": "bisect"}
                for v in pending[index:]
            ]
            _probe_release(bisect, flip, base, older, newer, package, version, known)
        step = flip_search.next_sweep(candidates, known)
    flip.changes = [{"package": package, **asdict(change), "direction": change.direction} for change in step.changes]
    flip.sweep = {
        "candidates": candidates,
        "points": flip_search.sweep_points(candidates),
        "bound": flip_search.sweep_bound(candidates),
        "stepped_over": step.stepped_over,
        "unmeasured": step.unmeasured,
    }
    last = next(
        (c for c in reversed(step.changes) if (c.direction == "started") == (flip.newer_state == "target")), None
    )
    if last is not None and last is step.changes[-1]:
        flip.release, flip.last_release_before = last.release, last.last_before


def search_order(candidates: list[str], known: dict[str, str], before: str, after: str, limit: int = 16) -> list[str]:
    """The releases the binary search may probe next, the likeliest first: its next probe, then the next probe
    of either outcome, level by level (what a GPU round carries so that the node can go on without coming back)."""
    order: list[str] = []
    level = [dict(known)]
    while level and len(order) < limit:
        following = []
        for states in level:
            step = flip_search.next_step(candidates, states, before, after)
            if step.done:
                continue
            probe = step.probes[0]
            if probe not in order:
                order.append(probe)
            following += [{**states, probe: before}, {**states, probe: after}]
        level = following
    return order[:limit]


def _cannot_run(found: StackRun) -> bool:
    """Whether what ended the run says its stack cannot run here at all (bitsandbytes with no library for the node's
    CUDA, deepspeed with no CPU accelerator): judged on the ending exception's whole traceback (such messages run
    long), or on the script's own exit line. A warning or a traceback a library printed and went past (bitsandbytes'
    caught GLIBCXX traceback on import) is not what ended it and never makes the run unusable; only a run whose ending
    no process could note (killed, or recorded before the runner) is judged on the whole stderr."""
    if found.run.ended == "exit":
        text = found.run.error_text or ""
    elif found.run.ended == "exception":
        text = f"{found.run.traceback}\n{found.run.error_text or ''}"
    else:
        text = f"{found.run.traceback}\n{found.run.stderr_tail}"
    return cannot_run_here(found.run.signature, found.run.error, text)


def _needs_left_out(found: StackRun) -> bool:
    """Whether the run failed importing a package its stack had to leave out (it cannot be imported there)."""
    left_out = (found.stack or {}).get("left_out") or {}
    text = f"{found.run.error or ''}\n{found.run.traceback}"
    return any(f"No module named '{import_name(name)}" in text for name in left_out)


def _between(version: str, low: str, high: str) -> bool:
    return Version(low) < Version(version) < Version(high)


def _brief(found: StackRun) -> dict[str, Any]:
    return {
        "state": found.state,
        "outcome": found.run.outcome,
        "signature": found.run.signature,
        "error": found.run.error,
        "mode": found.stack.get("mode"),
        "reused": found.reused,
        **({"setup": found.run.setup} if found.run.setup else {}),
        **({"script_lines": found.run.script_lines} if found.run.script_lines else {}),
        **({"later": True} if found.later else {}),
    }


def _verdict(
    bisect: ScriptBisect, scan: list[StackRun], flips: list[Flip], answers: dict[str, list[Flip]] | None = None
) -> dict[str, Any]:
    others = sorted(
        {(o.run.signature or "", o.run.error or "") for o in bisect.observations if o.state == "other"},
        key=lambda x: x[0],
    )
    answers = answers or {}
    verdict = {
        "script": bisect.script.name,
        "script_sha256": bisect.script_sha,
        "nproc": bisect.nproc,
        "torchrun": bisect.torchrun,
        "timeout_s": bisect.timeout_s,
        "match": bisect.match.pattern if bisect.match else None,
        "made_at": now_iso(),
        "target": {"signature": bisect.target, "error": bisect.target_error},
        "scan": [{"label": o.label, **_brief(o), "versions": _key_versions(o.stack["versions"])} for o in scan],
        "flips": [f.as_script_json() for f in flips],
        "different_failures": [
            {"signature": s, "error": e} | ({"flips": [f.as_script_json() for f in answers[s]]} if s in answers else {})
            for s, e in others
        ],
        "cost": asdict(bisect.cost)
        | {
            "runs_after_scan": sum(1 for o in bisect.observations if o.phase in ("move", "bisect")),
            "bound_after_scan": [
                math.ceil(math.log2(max(len(f.candidates), 1))) + len(f.moves) for f in flips if f.candidates
            ],
        },
        "runs": "runs.jsonl",
        # What this machine could not load, and tracebacks libraries printed and went past: said once, never a
        # failure of the script.
        "machine_limits": sorted({limit for o in bisect.observations for limit in o.run.machine_limits}),
        "printed_and_passed": sorted({shown_note(note) for o in bisect.observations for note in o.run.notes}),
    }
    verdict |= _device_facts(bisect)
    if bisect.device_calls:  # the node's calls made the runs (and timed them); this side only read them back
        seconds: dict[str, float] = {}
        for o in bisect.observations:
            phase = {"move": "moves"}.get(o.phase, o.phase)  # the phases' names as a run here times them
            seconds[phase] = round(seconds.get(phase, 0.0) + o.run.seconds, 1)
        verdict["cost"] |= {
            "runs": sum(c["runs"] for c in bisect.device_calls), "runs_reused": 0, "phase_seconds": seconds,
        }  # fmt: skip
    return verdict


def _device_facts(bisect: ScriptBisect) -> dict[str, Any]:
    """Where the runs ran: this machine, or a GPU node (its GPUs, and each device call's seconds and runs)."""
    devices = [o.stack.get("device") for o in bisect.observations if o.stack.get("device")]
    device = next((d for d in devices if d.get("kind") == "cuda"), devices[0] if devices else bisect.device)
    facts: dict[str, Any] = {"device": device}
    if bisect.device_calls:
        names = sorted({str(c["device"].get("name")) for c in bisect.device_calls if c["device"].get("name")})
        if len(names) > 1:  # calls may land on different cards: say so rather than name one for all
            facts["device"] = {**device, "name": " / ".join(names)}
        facts["device_calls"] = bisect.device_calls
        facts["device_seconds"] = round(sum(c["wall_s"] for c in bisect.device_calls), 1)
    return facts


def _key_versions(versions: dict[str, str]) -> dict[str, str]:
    return {p: versions[p] for p in ("python", *AXIS_PACKAGES) if p in versions}


def atlas_days(results_dir: Path, history: Profile) -> list[str]:
    """Every install day the committed history runs resolved (the environments the atlas ran in): a run that
    re-checks two days never narrows the atlas to them. Else the profile's date rule resolved against the index."""
    days: set[str] = set()
    for meta_path in [meta_file(r) for r in profile_runs(results_dir, history.name) if meta_file(r).is_file()]:
        days |= set(json.loads(meta_path.read_text()).get("resolved_axes", {}).get(DATE_AXIS) or [])
    if days:
        return sorted(days)
    resolved, _ = releases.resolve_axes(history)
    return sorted(resolved.axes[DATE_AXIS])


def day_torches(results_dir: Path, history: Profile) -> dict[str, str]:
    """The torch release each atlas day resolved, as the history runs' records show it (the newest run's where two
    differ): the scan's disk estimate counts the days that share one torch once."""
    from harness.recording.records import read_records

    found: dict[str, str] = {}
    for run_dir in profile_runs(results_dir, history.name):
        for record in read_records(records_file(run_dir), warn=False):
            day = (record.get("pins") or {}).get(DATE_AXIS)
            torch = (record.get("versions") or {}).get("torch")
            if day and torch:
                found[day] = str(torch).split("+")[0]
    return found


def checked_ends(args: Any) -> tuple[End | None, End | None]:
    """The command's input checked as a user gave it (one-line errors): the --good and --bad ends, if given."""
    if args.nproc < 1:
        raise UsageError("--nproc must be at least 1")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if args.offline and args.wheelhouse is None:
        raise UsageError("--offline needs --wheelhouse DIR")
    if bool(args.good) != bool(args.bad):
        raise UsageError("--good and --bad go together")
    good = parse_end("--good", args.good) if args.good else None
    bad = parse_end("--bad", args.bad) if args.bad else None
    if good and bad and bool(good.day) != bool(bad.day):
        raise UsageError("--good and --bad must both be days or both be pins")
    for option, value in (("--from", args.from_day), ("--to", args.to_day)):
        if value and not parse_end(option, value).day:
            raise UsageError(f"{option} {value!r}: give a day, YYYY-MM-DD")
    return good, bad


def command(args: Any) -> int:
    """`compat-matrix bisect-script` here: pick the stacks, run, write the issue body."""
    from harness.define.profile import load_profile
    from harness.environments.envs import default_envs_dir
    from harness.paths import MATRIX_DIR

    good, bad = checked_ends(args)
    out_dir = args.results_dir / SCRIPT_BISECT_FOLDER / (args.name or args.script.stem)
    history = load_profile("history", MATRIX_DIR)
    options = InstallOptions(
        envs_dir=default_envs_dir(),
        offline=args.offline,
        wheelhouse=args.wheelhouse.resolve() if args.wheelhouse else None,
        max_env_gb=getattr(args, "max_env_gb", None),
        torch_index=getattr(args, "torch_index", None),
    )
    if good and bad and not good.day:
        ends = [good, bad]
    else:
        first = args.from_day or (min(good.day, bad.day) if good and bad else None)  # type: ignore[type-var]
        last = args.to_day or (max(good.day, bad.day) if good and bad else None)  # type: ignore[type-var]
        if first and last and first > last:
            raise UsageError(f"--from {first} is after --to {last}")
        atlas = atlas_days(args.results_dir, history)
        # --from/--to clip the atlas's days (each of which has an environment already); the user's own --good and
        # --bad days are stacks of their own (a new dated environment where the atlas has none).
        own = {good.day, bad.day} if good and bad else set()
        days = sorted({d for d in atlas if (not first or d >= first) and (not last or d <= last)} | own)  # type: ignore[arg-type]
        if not days:
            raise UsageError(f"no atlas day between {first or 'the first'} and {last or 'the last'}")
        ends = [End(day=d) for d in days]
    # Made once the input is known good: a refused invocation leaves no folder behind.
    bisect = ScriptBisect(
        args.script, out_dir, history, options, nproc=args.nproc, torchrun=args.torchrun, timeout_s=args.timeout,
        match=args.match,
        fresh=args.fresh, search="bisect" if args.bisect else "sweep",
        day_torch=day_torches(args.results_dir, history) if ends[0].day else None,
    )  # fmt: skip
    verdict = run(bisect, ends, bad, all_moves=args.all_moves)
    return write_issue(verdict, bisect)


def write_issue(verdict: dict[str, Any], bisect: ScriptBisect) -> int:
    """The issue body of the first named flip (`issue.md`, from the runs that really ran), and where it all is."""
    from harness.publishing.upstream import script_issue_body

    out_dir = bisect.out_dir
    named = [f for f in (Flip.from_json(x) for x in verdict["flips"]) if f.package and f.release]
    if named:
        runs = [json.loads(line) for line in (out_dir / "runs.jsonl").read_text().splitlines() if line.strip()]
        body = script_issue_body(verdict, bisect.script.read_text(), named[0], runs, out_dir)
        (out_dir / "issue.md").write_text(body)
        bisect.say(f"  issue body for {named[0].package}: {out_dir / 'issue.md'}")
    bisect.say(f"  verdict: {out_dir / 'verdict.json'}; every run: {out_dir / 'runs.jsonl'}")
    return 0
