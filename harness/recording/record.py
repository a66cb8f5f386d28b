"""The one constructor of a record, and its typed shape (`record.schema.json` is the same contract for tools).

A record is built from two halves: where it ran (run, cell, scenario, variant, config, versions, hardware,
install) and what happened (`job_outcome` for a job that ran, `not_run` for one that could not).
"""

from __future__ import annotations

from typing import Any, TypedDict

from harness.paths import REPO_ROOT
from harness.recording import runs
from harness.recording.signatures import RULES_DIGEST, classify, judged

MESSAGE_LIMIT = 600
RECORD_VERSION = 1
#: Detail fields a job's outcome keeps when the worker or launcher reported them.
OPTIONAL_DETAIL = (
    "warnings",
    "stderr_tail",
    "traceback",
    "cause",
    "ranks_failed",
    "check",
    "rank_stacks",
    "waiting_in",
    "ranks_without_stack",
    "ranks_deaf_to_sigusr1",
    "ranks_without_result",
    "setup",
)


class Outcome(TypedDict, total=False):
    """What happened to one job."""

    outcome: str
    signature: str | None
    signature_rules: str
    known_issue: list[str]
    classified: bool
    message: str
    metrics: dict[str, Any]
    duration_s: float
    path: str | None
    exc_type: str | None
    warnings: list[str]
    stderr_tail: str
    traceback: str
    #: The first exception of a chained one (what the last one was raised while handling), where it differs.
    cause: str
    ranks_failed: list[int]
    check: str
    rank_stacks: dict[str, str]
    waiting_in: str
    #: Timeouts: ranks that wrote no Python stack when asked (no longer running Python).
    ranks_without_stack: list[int]
    #: Timeouts: ranks that wrote nothing on SIGUSR1 (their stack, if any, came with SIGABRT).
    ranks_deaf_to_sigusr1: list[int]
    #: Distributed jobs: ranks that gave no result while another rank failed (they hung, or died).
    ranks_without_result: list[int]
    attempts: list[dict[str, Any]]
    shrink: dict[str, Any]
    minimal_config: dict[str, Any]
    slot: dict[str, Any]
    #: What really ran, measured while the job ran (scenarios/kit/measured.py): quantized weights, the FSDP that
    #: wrapped the model, world size, dtypes, ZeRO stage, autocast, the Trainer's distributed settings.
    setup: dict[str, Any]
    #: Why the record is not evidence about the stack (scenarios/applicability.py), with what the job reported.
    not_applicable: str
    reported_outcome: str
    reported_signature: str | None


class Record(Outcome, total=False):
    """One line of records.jsonl: one scenario x variant x config in one cell."""

    record_version: int
    run_id: str
    cell: str
    pins: dict[str, str]
    scenario: str
    variant: str
    config: dict[str, Any]
    config_id: str
    config_source: str
    config_also_from: list[str]
    versions: dict[str, str]
    hardware: dict[str, Any]
    started_at: str
    install: dict[str, Any]
    scenario_digest: str | None


def make_record(
    *,
    run_id: str,
    cell_id: str,
    pins: dict[str, str],
    scenario_id: str,
    variant: str,
    planned: dict[str, Any],
    versions: dict[str, str],
    hardware: dict[str, Any],
    install: dict[str, Any],
    scenario_digest: str | None,
    outcome: Outcome,
) -> Record:
    """Where it ran, then what happened (the outcome's fields win: a slot or an attempt list is part of it)."""
    record: dict[str, Any] = {
        "run_id": run_id,
        "cell": cell_id,
        "pins": pins,
        "record_version": RECORD_VERSION,
        "scenario": scenario_id,
        "variant": variant,
        "config": planned["config"],
        "config_id": planned["config_id"],
        "config_source": planned["source"],
        "versions": versions,
        "hardware": hardware,
        "started_at": runs.now_iso(),
        "install": dict(install),
        "scenario_digest": scenario_digest,
    }
    if planned.get("also_from"):
        record["config_also_from"] = planned["also_from"]
    return Record(**(record | dict(outcome)))  # type: ignore[typeddict-item]


def not_run(outcome: str, signature: str, message: str) -> Outcome:
    """A job the harness did not start: excluded, pruned, not installable, not applicable here."""
    return Outcome(
        outcome=outcome,
        signature=signature,
        known_issue=[],
        message=message[: MESSAGE_LIMIT * 3],
        metrics={},
        duration_s=0.0,
        classified=True,
    )


def judge(fields: Outcome, config: dict[str, Any], device: str, versions: dict[str, str]) -> Outcome:
    """A job's outcome judged by the applicability rules with what it ran on: the machine's device and the cell's
    versions, and the config it declared (not-applicable when the machine could not run it, or another setup
    ran). Applied before shrinking and fixes are decided, so nothing is spent on a record that is no evidence."""
    context = {"config": config, "hardware": {"device": device}, "versions": versions}
    verdict = judged(dict(fields) | context)
    return (
        fields
        if verdict.get("outcome") == fields.get("outcome")
        else Outcome(
            **{k: v for k, v in verdict.items() if k not in context}  # type: ignore[typeddict-item]
        )
    )


def job_outcome(status: str, detail: dict[str, Any], duration_s: float) -> Outcome:
    """A job that ran: its worker's (or launcher's) report, classified into an outcome and a signature."""
    verdict = classify(status, detail, repo_root=str(REPO_ROOT))
    message = (detail.get("message") or "").strip()
    fields = Outcome(
        outcome=verdict.outcome,
        signature=verdict.signature,
        signature_rules=RULES_DIGEST,
        known_issue=verdict.known_issue,
        classified=verdict.classified,
        message=message[:MESSAGE_LIMIT],
        metrics=detail.get("metrics") or {},
        duration_s=round(duration_s, 4),
        path=detail.get("path"),
        exc_type=detail.get("exc_type"),
    )
    for optional in OPTIONAL_DETAIL:
        if detail.get(optional):
            fields[optional] = detail[optional]  # type: ignore[literal-required]
    return fields
