"""Run one scenario in one cell: the planned jobs, retries, shrinking of drawn failures, then their fixes.

The jobs of a single-process scenario can be packed over several warm workers (one per GPU) that run
concurrently; everything that decides the next job from the last result (retries, the shrinker, fixes)
runs in the first worker.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.define.cells import Cell
from harness.define.profile import Profile, RetryPolicy
from harness.define.registry import Scenario
from harness.execution.launcher import JobResult, WorkerSession
from harness.execution.options import MatrixOptions, MatrixSummary
from harness.execution.progress import Progress
from harness.execution.shrink import ShrinkResult, shrink
from harness.planning import draws
from harness.planning.plan import RunPlan
from harness.recording.record import Outcome, job_outcome, judge
from harness.recording.records import RecordWriter

Emit = Callable[[str, dict[str, Any], dict[str, Any]], None]


@dataclass
class RunContext:
    """What every cell of one run shares."""

    plan: RunPlan
    options: MatrixOptions
    machine: dict[str, Any]
    run_id: str
    run_dir: Path
    writer: RecordWriter
    progress: Progress
    summary: MatrixSummary
    #: scenario id -> how its configs were drawn (seed, max_examples, count): the shrinker replays the draw.
    draws: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Builds the next cell's environment while this one runs (harness/execution/executor.py: EnvPrefetch).
    prefetch: Any = None


def baseline_first(scenario: Scenario, planned: dict[str, Any], profile: Profile) -> bool:
    """Whether a config runs its baseline first and its other variants only where that fails: drawn configs
    do, and explicit examples too under `example_variants = "where-baseline-fails"`. A scenario that measures
    every variant (S3, S5) runs them all."""
    if scenario.spec.get("drawn_variants", "failing") != "failing":
        return False
    return draws.is_drawn(planned) or profile.example_variants == "where-baseline-fails"


def run_scenario(
    scenario: Scenario,
    variants: tuple[str, ...],
    pending: list[tuple[str, dict[str, Any]]],
    resumed_fixes: list[tuple[tuple[str, ...], dict[str, Any]]],
    sessions: list[WorkerSession],
    emit: Emit,
    ctx: RunContext,
    cell: Cell,
    versions: dict[str, str],
) -> None:
    """Three steps: the planned jobs (packed over `sessions` when there are several); shrinking each new
    drawn failure; then the fix variants of every drawn config whose baseline failed. Every outcome is judged
    by the applicability rules first (`versions`: the cell's), so a not-applicable job is never shrunk or fixed."""
    session = sessions[0]
    device = str(ctx.machine.get("device") or "cpu")

    def judged(result: JobResult, config: dict[str, Any]) -> Outcome:
        return judge(observed(result), config, device, versions)

    baseline = variants[0]
    confirmed: set[str] = set()  # signatures already confirmed by a retry in this cell x scenario
    profile = ctx.plan.profile
    retry = profile.retry
    failed_drawn: list[tuple[dict[str, Any], dict[str, Any]]] = []
    failed_examples: list[dict[str, Any]] = []
    for variant, planned, fields in _run_batch(sessions, pending, retry, confirmed, judged):
        if variant == baseline and draws.is_drawn(planned) and fields["outcome"] == "fail":
            failed_drawn.append((planned, fields))  # written once shrunk, so the record holds both configs
        else:
            emit(variant, planned, fields)
            if variant == baseline and fields["outcome"] == "fail" and baseline_first(scenario, planned, profile):
                failed_examples.append(planned)

    shrunk: dict[str, dict[str, Any]] = {}
    for planned, fields in failed_drawn:
        signature = fields["signature"]
        if signature not in shrunk and planned["source"] == "hypothesis" and not ctx.options.no_shrink:
            ctx.progress.start_cell(cell.cell_id, f"{scenario.id}: shrinking {signature}")
            shrunk[signature] = _shrink(scenario, baseline, planned, signature, session, ctx, judged).as_record()
            shrunk[signature]["shrunk_from"] = planned["config_id"]
            fields |= {k: v for k, v in shrunk[signature].items() if k != "shrunk_from"}
        elif signature in shrunk:
            # Same signature as a config already shrunk in this cell: point at that minimal config.
            fields |= {k: v for k, v in shrunk[signature].items() if k != "shrink"}
            fields["shrink"] = {"shared_from": shrunk[signature]["shrunk_from"]}
        emit(baseline, planned, fields)

    # Scenarios that measure every variant ran them already; the others run their fixes now.
    failing = [p for p, _ in failed_drawn if baseline_first(scenario, p, profile)] + failed_examples
    fixes = [(v, c) for c in failing for v in variants[1:]]
    fixes += [(v, c) for vs, c in resumed_fixes for v in vs[1:]]
    fixes = [(v, c) for v, c in fixes if (cell.cell_id, scenario.id, v, c["config_id"]) not in ctx.writer]
    ctx.progress.add_jobs(len(fixes))
    for variant, planned, fields in _run_batch(sessions, fixes, retry, confirmed, judged):
        emit(variant, planned, fields)


Judge = Callable[[JobResult, dict[str, Any]], Outcome]


def _run_batch(
    sessions: list[WorkerSession],
    items: list[tuple[str, dict[str, Any]]],
    retry: RetryPolicy,
    confirmed: set[str],
    judged: Judge,
) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Run (variant, planned) jobs and yield their record fields. Failures the retry policy wants confirmed
    are re-run after the batch (in the first worker) and come last: if the attempts disagree the outcome is
    `flaky`, never pass or fail."""
    session = sessions[0]
    held: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for variant, planned, result, slot in run_packed(sessions, items):
        fields = judged(result, planned["config"])
        if len(sessions) > 1:
            fields["slot"] = {"index": slot, "of": len(sessions), **sessions[slot].spec.slot}
        wanted = retry.times > 0 and fields["outcome"] in retry.outcomes
        if wanted and (retry.scope == "every-failure" or fields["signature"] not in confirmed):
            held.append((variant, planned, fields))
            if retry.scope == "first-per-signature":
                confirmed.add(fields["signature"])  # its later failures in this batch are not retried again
        else:
            yield variant, planned, fields
    attempts = [[_attempt(fields)] for _, _, fields in held]
    for round_ in range(retry.times if held else 0):
        # A timeout is confirmed once at most: a hung job never costs more than two job timeouts.
        due = [i for i, (_, _, fields) in enumerate(held) if round_ == 0 or fields["outcome"] != "timeout"]
        if not due:
            break
        again = session.run([(held[i][1]["config"], held[i][0]) for i in due])
        for i, result in zip(due, again, strict=True):
            attempts[i].append(_attempt(judged(result, held[i][1]["config"])))
    for (variant, planned, fields), seen in zip(held, attempts, strict=True):
        fields["attempts"] = seen
        if len({(a["outcome"], a["signature"]) for a in seen}) > 1:
            fields["outcome"] = "flaky"
            fields["message"] = f"attempts disagree: {_attempts_text(seen)}; first: {fields['message']}"
            confirmed.discard(fields["signature"])  # not confirmed after all: retry its next failure too
        else:
            confirmed.add(fields["signature"])
        yield variant, planned, fields


def run_packed(
    sessions: list[WorkerSession], items: list[tuple[str, dict[str, Any]]]
) -> Iterator[tuple[str, dict[str, Any], JobResult, int]]:
    """(variant, planned) jobs dealt round-robin over the sessions (one per GPU), run concurrently; results
    are yielded as they arrive, with the slot that ran them. One session: in order, no threads."""
    if len(sessions) == 1 or len(items) <= 1:
        for (variant, planned), result in zip(items, sessions[0].run(_jobs(items)), strict=True):
            yield variant, planned, result, 0
        return
    arrivals: queue.Queue = queue.Queue()
    done = object()

    def drive(slot: int, shard: list[tuple[str, dict[str, Any]]]) -> None:
        try:
            for (variant, planned), result in zip(shard, sessions[slot].run(_jobs(shard)), strict=True):
                arrivals.put((variant, planned, result, slot))
        except BaseException as exc:  # handed to the main thread, which raises it
            arrivals.put(exc)
        finally:
            arrivals.put(done)

    shards = [items[i :: len(sessions)] for i in range(len(sessions))]
    threads = [
        threading.Thread(target=drive, args=(slot, shard), name=f"slot-{slot}", daemon=True)
        for slot, shard in enumerate(shards)
        if shard
    ]
    for thread in threads:
        thread.start()
    finished = 0
    while finished < len(threads):
        item = arrivals.get()
        if item is done:
            finished += 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield item
    for thread in threads:
        thread.join()


def _jobs(items: list[tuple[str, dict[str, Any]]]) -> list[tuple[dict[str, Any], str]]:
    return [(planned["config"], variant) for variant, planned in items]


def _attempt(fields: dict[str, Any]) -> dict[str, Any]:
    return {"outcome": fields["outcome"], "signature": fields["signature"]}


def _attempts_text(attempts: list[dict[str, Any]]) -> str:
    return ", ".join(f"{a['outcome']}" + (f" {a['signature']}" if a["signature"] else "") for a in attempts)


def _shrink(
    scenario: Scenario,
    baseline: str,
    planned: dict[str, Any],
    signature: str,
    session: WorkerSession,
    ctx: RunContext,
    judged: Judge,
) -> ShrinkResult:
    how = ctx.draws[scenario.id]
    plan = draws.DrawPlan(int(how["seed"]), int(how["max_examples"]), int(how["count"]))
    database = (
        draws.ScenarioDatabase(ctx.options.example_db, scenario.id) if ctx.options.example_db is not None else None
    )

    def observe(config: dict[str, Any]) -> str | None:
        fields = judged(session.run_one(config, baseline), config)
        return fields["signature"] if fields["outcome"] == "fail" else None

    return shrink(
        scenario.strategy(),
        plan,
        planned["config"],
        signature,
        observe,
        max_seconds=ctx.plan.scenario_plan.hypothesis["shrink_seconds"],
        max_runs=int(ctx.plan.scenario_plan.hypothesis["shrink_calls"]),
        database=database,
    )


def observed(result: JobResult) -> Outcome:
    return job_outcome(result.status, result.detail, result.duration_s)
