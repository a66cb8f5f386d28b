"""From the release to the function: which of the changed functions a failure runs is its cause, by putting them back.

The candidates are the functions and methods both runs of a finding executed whose source differs between the two
releases (`changed_code.py`). In the newer release's environment, a set of them is reverted to the older release's
source (`runtime/revert/sitecustomize.py`) and the reproducer runs again: where the revert brings back the older
release's outcome, the set holds the cause. Delta debugging (Zeller's ddmin) shrinks the set to a smallest one that
does. This one direction serves a break (the revert passes) and a fix (the revert fails again). A revert that cannot
run (it names something the newer release lacks: the run raises instead of giving either outcome) is no evidence
either way; such a function is tried again with its whole module reverted, and the verdict says so.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.paths import REPO_ROOT

#: The folder whose sitecustomize puts functions back (first on PYTHONPATH of a blame run).
REVERT_DIR = REPO_ROOT / "runtime" / "revert"
#: The outcomes a run can give: the older release's, the newer release's, or neither (it could not run).
OLDER, NEWER, NEITHER = "older", "newer", "neither"
#: How many reproducer runs one blame may make (each takes the reproducer's seconds).
MOST_RUNS = 40


@dataclass(frozen=True)
class Candidate:
    """A changed function: the file inside the package ('peft/utils/save_and_load.py') and its qualified name."""

    file: str
    qualname: str

    @property
    def module(self) -> str:
        parts = self.file.removesuffix(".py").split("/")
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    @property
    def revertible(self) -> str:
        """The def that can be put back alone: a nested function's outermost enclosing one ('f.<locals>.g' -> 'f')."""
        return self.qualname.split(".<locals>.", 1)[0]

    def __str__(self) -> str:
        return f"{self.file}::{self.qualname}"


#: A call refused before its body ran (no trace of it in the failing run): the callee's name, as Python words it.
_REFUSED = re.compile(
    r"([\w.]+)\(\) (?:got an unexpected keyword argument|got multiple values for|missing \d+ required|takes \d+)"
)


def refused_calls(changed: Any, error_text: str, older_sources: dict[str, str]) -> list[Candidate]:
    """Functions one run executed and the failing run's call never entered, that its error names as refusing the
    call's arguments ('Accelerator.__init__() got an unexpected keyword argument'): a changed signature is a
    changed function neither trace shows in both runs. Only those whose older source is at hand can be put back."""
    named = set(_REFUSED.findall(error_text or ""))
    found = []
    for name in [*changed.only_older, *changed.only_newer]:
        file, qualname = name.split("::", 1)
        if qualname in named and file in older_sources:
            found.append(Candidate(file, qualname))
    return found


def source_with_decorators(text: str, qualname: str) -> str | None:
    """The source of a def by its qualified name ('Class.method'), its decorators included, or None."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    lines = text.splitlines(keepends=True)
    nodes: list[Any] = [tree]
    for part in qualname.split("."):
        found = None
        for node in nodes:
            for child in ast.iter_child_nodes(node):
                named = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                if named and child.name == part:
                    found = child
        if found is None:
            return None
        nodes = [found]
    node = nodes[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    return "".join(lines[start - 1 : node.end_lineno])


def revert_plan(chosen: Sequence[Candidate], older_sources: dict[str, str], whole: Sequence[str] = ()) -> dict:
    """The plan `runtime/revert` applies: each chosen function's older source (nested ones as their enclosing def),
    and the modules (`whole`, files) reverted entirely."""
    functions, seen = [], set()
    for candidate in chosen:
        if candidate.file in whole or (candidate.file, candidate.revertible) in seen:
            continue
        seen.add((candidate.file, candidate.revertible))
        source = source_with_decorators(older_sources.get(candidate.file, ""), candidate.revertible)
        if source is not None:
            functions.append({"module": candidate.module, "qualname": candidate.revertible, "source": source})
    modules = [
        {"module": Candidate(f, "").module, "source": older_sources[f]}
        for f in sorted(set(whole))
        if f in older_sources
    ]
    return {"functions": functions, "modules": modules}


def ddmin(items: Sequence[Any], test: Callable[[list[Any]], str]) -> list[Any]:
    """A smallest subset of `items` for which `test` gives OLDER (given that all of them do), by Zeller's ddmin: try
    each of n parts and each complement, keep the first that still gives OLDER, else split finer. A test that gives
    NEITHER (the revert could not run) counts as not OLDER."""
    current, parts = list(items), 2
    while len(current) >= 2:
        size = -(-len(current) // parts)
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        reduced = False
        for chunk in chunks:
            if test(chunk) == OLDER:
                current, parts, reduced = chunk, 2, True
                break
        if not reduced:
            for index in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != index for x in c]
                if len(chunks) > 2 and test(rest) == OLDER:
                    current, parts, reduced = rest, max(parts - 1, 2), True
                    break
        if not reduced:
            if parts >= len(current):
                break
            parts = min(len(current), parts * 2)
    return current


@dataclass
class Blame:
    """What putting code back showed: the smallest set whose revert gives the older outcome (empty where none
    does), every run made (the set, what it gave, the run's last line, its seconds), and what could not run."""

    package: str
    older: str
    newer: str
    candidates: list[str]
    blamed: list[str] = field(default_factory=list)
    #: Files whose functions could not be put back alone, reverted whole instead.
    widened: list[str] = field(default_factory=list)
    #: Functions whose revert raised (they name what the newer release lacks), left out where the rest sufficed.
    unrunnable: list[str] = field(default_factory=list)
    #: The other way: the blamed functions as the newer release wrote them, put into the older release's run.
    converse: dict[str, Any] = field(default_factory=dict)
    #: The machine the runs were made on (`hardware.describe`): a cause may show on some CPUs only.
    machine: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def seconds(self) -> float:
        return round(sum(r.get("seconds") or 0.0 for r in self.runs), 1)


def blame(
    package: str,
    older: str,
    newer: str,
    candidates: Sequence[Candidate],
    older_sources: dict[str, str],
    run: Callable[[dict], dict[str, Any]],
) -> Blame:
    """Shrink the candidates to the smallest set whose revert gives the older release's outcome. `run(plan)` runs the
    reproducer in the newer release's environment with the plan reverted and returns {"outcome": OLDER | NEWER |
    NEITHER, "line", "seconds", "failed": reverts that could not be applied, "raised": the reverted functions the
    run's traceback names}. A function whose revert raised (it names what the newer release lacks) is left out where
    the rest gives the older outcome, else widened to its whole module; the search goes on over what is left."""
    result = Blame(package, older, newer, [str(c) for c in candidates])
    memo: dict[tuple[str, ...], tuple[str, list[str]]] = {}

    def test(units: list[Any]) -> str:
        return _run_units(units, older_sources, run, memo, result)[0]

    units: list[Any] = list(candidates)
    outcome, raised = _run_units(units, older_sources, run, memo, result)
    for _ in range(len(candidates)):
        stuck = [u for u in units if isinstance(u, Candidate) and f"{u.module}.{u.revertible}" in raised]
        if outcome != NEITHER or not stuck:
            break
        # A revert that raised names what the newer release lacks: first leave it out; where the rest does not give
        # the older outcome, put its whole module back instead.
        rest = [u for u in units if u not in stuck]
        outcome, raised = _run_units(rest, older_sources, run, memo, result)
        if outcome == OLDER:
            result.unrunnable += [str(u) for u in stuck]
            units = rest
            break
        files = sorted({u.file for u in stuck})
        result.widened += [f for f in files if f not in result.widened]
        units = [u for u in units if not (isinstance(u, Candidate) and u.file in files)] + files
        outcome, raised = _run_units(units, older_sources, run, memo, result)
    if outcome != OLDER:
        result.verdict = (
            "reverting every changed function the runs executed does not bring back the older outcome "
            f"({outcome}): the cause is elsewhere (native code, module-level code such as an import, a function "
            "neither run executed, another package)"
        )
        return result
    chosen = ddmin(units, test)
    result.blamed = [str(u) if isinstance(u, Candidate) else f"{u} (whole module)" for u in chosen]
    # A module put back whole during the search is said only where the smallest set still needs it whole.
    whole = [u for u in chosen if isinstance(u, str)]
    notes = [f"{len(whole)} module(s) reverted whole: their functions alone cannot run"] if whole else []
    notes += [f"not runnable alone, no evidence: {', '.join(result.unrunnable)}"] if result.unrunnable else []
    result.verdict = f"reverting {', '.join(result.blamed)} at {package} {newer} gives the {older} outcome" + "".join(
        f"; {n}" for n in notes
    )
    return result


def _run_units(
    units: list[Any], older_sources: dict[str, str], run: Callable[[dict], dict[str, Any]],
    memo: dict[tuple[str, ...], tuple[str, list[str]]], result: Blame,
) -> tuple[str, list[str]]:  # fmt: skip
    """(outcome, the reverted functions the traceback names) of one run with these functions and whole modules put
    back; each set is run once."""
    key = tuple(sorted(str(u) for u in units))
    if key in memo:
        return memo[key]
    if len(result.runs) >= MOST_RUNS:
        return NEITHER, []
    functions = [u for u in units if isinstance(u, Candidate)]
    whole = [u for u in units if isinstance(u, str)]
    found = run(revert_plan(functions, older_sources, whole))
    outcome = NEITHER if found.get("failed") else found["outcome"]
    result.runs.append({"reverted": list(key), "outcome": outcome, "line": found.get("line"),
                        "seconds": found.get("seconds"), "failed": found.get("failed") or [],
                        "error": found.get("error")})  # fmt: skip
    memo[key] = (outcome, list(found.get("raised") or []))
    return memo[key]


def converse(result: Blame, newer_sources: dict[str, str], run_older: Callable[[dict], dict[str, Any]]) -> None:
    """Apply the blamed functions the other way (the newer release's source into the older release's run): a cause
    should bring the newer outcome there too. Only where every blamed item is a function."""
    chosen = [Candidate(*name.split("::", 1)) for name in result.blamed if "::" in name]
    if not chosen or len(chosen) != len(result.blamed):
        return
    found = run_older(revert_plan(chosen, newer_sources))
    outcome = NEITHER if found.get("failed") else found["outcome"]
    result.converse = {"applied": [str(c) for c in chosen], "outcome": outcome, "line": found.get("line"),
                       "seconds": found.get("seconds"), "error": found.get("error")}  # fmt: skip
    result.verdict += "; " + converse_words(result)


def converse_words(result: Blame) -> str:
    """What the run the other way shows, in words: a run that could not run is no evidence either way, and one that
    kept the older outcome says the blamed code alone does not bring the failure there."""
    other = result.converse or {}
    where = f"the other way (the {result.newer} source at {result.package} {result.older})"
    if other.get("outcome") == NEWER:
        return f"{where} gives the {result.newer} outcome: the blamed code brings it alone"
    if other.get("outcome") == OLDER:
        return (
            f"{where} keeps the {result.older} outcome: the blamed code is needed but not enough alone there "
            "(what it works with changed too)"
        )
    error = other.get("error") or other.get("line") or "no outcome line"
    return f"{where} could not run ({error}): no evidence either way"


def outcome_of(exit_code: int | None, line: str | None, older: dict[str, Any], newer: dict[str, Any]) -> str:
    """Which release's outcome a run gave: its exit code and the first word of its last line ('ok:', 'FAIL:') as
    one side's run gave them; anything else (a traceback, a timeout) is neither."""

    def said(code: int | None, text: str | None) -> tuple[int | None, str]:
        return code, (text or "").split(":", 1)[0].strip()

    mine = said(exit_code, line)
    if mine == said(older.get("exit_code"), older.get("line")):
        return OLDER
    if mine == said(newer.get("exit_code"), newer.get("line")):
        return NEWER
    return NEITHER


def raised_reverts(stderr: str) -> list[str]:
    """The reverted function a run's last traceback raised in: its deepest reverted frame ('File "<reverted
    toypkg.core.Scaler.__init__>"'); the reverted callers above it ran as far as their callee let them."""
    last = stderr.rsplit("Traceback (most recent call last):", 1)[-1]
    frames = re.findall(r'File "<reverted ([^>]+)>"', last)
    return frames[-1:]


@contextmanager
def reverting(plan: dict) -> Iterator[tuple[dict[str, str], Callable[[], list[dict[str, str]]]]]:
    """The variables a run needs for `runtime/revert` to put `plan` back (its plan file and report folder, alive for
    the block), and a reader of the reverts the run's processes could not apply (no evidence either way)."""
    with tempfile.TemporaryDirectory(prefix="blame-") as scratch:
        plan_file, report = Path(scratch) / "plan.json", Path(scratch) / "report"
        plan_file.write_text(json.dumps(plan))
        report.mkdir()

        def failed() -> list[dict[str, str]]:
            return [f for path in sorted(report.glob("revert-*.json")) for f in json.loads(path.read_text())["failed"]]

        yield {"COMPAT_MATRIX_REVERT": str(plan_file), "COMPAT_MATRIX_REVERT_REPORT": str(report)}, failed


def run_reverted(
    command: list[str], env: dict[str, str], plan: dict, sides: tuple[dict[str, Any], dict[str, Any]],
    cwd: Path | None = None, timeout_s: float = 1800.0,
) -> dict[str, Any]:  # fmt: skip
    """One run of the reproducer's command with the plan put back (`runtime/revert` first on PYTHONPATH), judged
    against the two sides' runs (older, newer): what `blame` asks of `run`."""
    with reverting(plan) as (revert_env, read_failed):
        paths = [str(REVERT_DIR), *filter(None, [env.get("PYTHONPATH")])]
        env = env | revert_env | {"PYTHONPATH": os.pathsep.join(paths)}
        started = time.monotonic()
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = None, str(exc.stdout or ""), str(exc.stderr or "")
        failed = read_failed()
    lines = [line for line in out.splitlines() if line.strip()]
    line = lines[-1] if lines else None
    outcome = outcome_of(code, line, *sides)
    errors = [e for e in err.strip().splitlines() if e.strip()]
    return {"outcome": outcome, "line": line, "seconds": round(time.monotonic() - started, 1), "failed": failed,
            "raised": raised_reverts(err), "error": errors[-1] if errors and outcome == NEITHER else None}  # fmt: skip


def write(blame_result: Blame, folder: Path) -> Path:
    path = folder / "blame.json"
    path.write_text(json.dumps(blame_result.as_json() | {"seconds": blame_result.seconds}, indent=1) + "\n")
    return path
