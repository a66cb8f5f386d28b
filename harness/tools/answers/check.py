"""`check`: the answer for the user's own environment, without building any.

Run inside the training environment (`python -m harness check` from a checkout): it runs each scenario's seed
config with every variant in *this* interpreter (its torch, its GPUs), through the same warm workers as the
matrix, and prints which target failures this stack has, which fixes work here, and the nearest rows of the
published table. Exit 1 when a target failure reproduces (so it can gate a CI job), 0 otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from harness.define import setup as vocabulary
from harness.define.packages import AXIS_PACKAGES, public_version
from harness.define.registry import Scenario, discover, select
from harness.errors import UsageError
from harness.execution import hardware
from harness.execution.launcher import LaunchSpec, WorkerSession, stack_env
from harness.execution.scenario_run import observed
from harness.knowledge import pitfalls as knowledge
from harness.knowledge.atlas import Atlas
from harness.knowledge.evidence import device_class
from harness.knowledge.judge import Query
from harness.recording.record import Record, judge, make_record
from harness.recording.verdicts import Verdict, headline, verdict
from scenarios.fix_words import fix_words

JOB_TIMEOUT_S = 600.0


def installed_versions() -> dict[str, str]:
    """This environment's stack, as the matrix records it."""
    found = {"python": ".".join(str(p) for p in sys.version_info[:3])}
    for name in AXIS_PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def skip_reason(scenario: Scenario, versions: dict[str, str], device: str, gpus: int) -> str | None:
    missing = [p for p in scenario.requires if p.lower() not in versions]
    if missing:
        return f"needs {', '.join(missing)}, which this environment does not have"
    wanted = scenario.spec.get("device", "any")
    if wanted not in ("any", device):
        return f"needs device {wanted}, this machine runs {device}"
    if scenario.distributed and device == "cuda" and gpus < 2:
        return "needs 2 GPUs for its ranks, this machine has 1"
    return None


def run_check(patterns: list[str] | None, results_dir: Path, stream: TextIO = sys.stdout) -> int:
    versions = installed_versions()
    gpus = len(hardware.visible_gpus())
    device = "cuda" if gpus else "cpu"
    scenarios = select(patterns, where="--scenario") if patterns else discover()
    print("this environment: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f"; {device}", file=stream)
    atlas = published_atlas(results_dir)
    live: dict[str, list[dict[str, Any]]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="compat-check-") as workdir:
        runnable: list[Scenario] = []
        for scenario in scenarios:
            reason = skip_reason(scenario, versions, device, gpus)
            if reason:
                print(f"\n{scenario.id}: SKIP ({reason})", file=stream)
            else:
                runnable.append(scenario)
        # Each scenario's worker starts while the one before it runs (it imports the stack meanwhile).
        sessions = [WorkerSession(_launch_spec(s, device, Path(workdir), gpus)) for s in runnable]
        try:
            for position, scenario in enumerate(runnable):
                for session in sessions[position : position + 2]:
                    session.start_early()
                scenario_started = time.monotonic()
                records = _run_seed(scenario, sessions[position], versions, gpus)
                sessions[position].close()
                live[scenario.id] = records
                print(f"\n{scenario.id}: {scenario.spec.get('title', '')}", file=stream)
                for line in live_lines(records, scenario.spec, atlas):
                    print(f"  {line}", file=stream)
                print(f"  took: {time.monotonic() - scenario_started:.0f} s ({len(records)} runs)", file=stream)
        finally:
            for session in sessions:
                session.close()
    reproduced = reproduced_here(live, atlas, {s.id: s.spec for s in scenarios})
    for line in judged_lines(atlas, live, versions, device, gpus):
        print(line, file=stream)
    print(f"\nchecked {len(live)} scenario(s) in {time.monotonic() - started:.0f} s", file=stream)
    if reproduced:
        print(f"target failures in this environment: {'; '.join(reproduced)}", file=stream)
        return 1
    print("no target failure reproduced in this environment", file=stream)
    return 0


def published_atlas(results_dir: Path) -> Atlas | None:
    """The published atlas (its pitfalls, its known failures), or None where there is no table to read."""
    try:
        atlas = Atlas(results_dir, {s.id: s.spec for s in discover()})
        return atlas if atlas.selection.run_ids else None
    except UsageError:
        return None


def live_lines(records: list[Record], spec: dict[str, Any], atlas: Atlas | None) -> list[str]:
    """What this check's own runs of a scenario showed (the table's lines), its pitfall configs apart: they fail on
    every release measured, so they are never counted, nor in the exit code."""
    left_out = atlas.counted(records)[1] if atlas else set()
    found = live_verdict(records, spec, atlas)
    lines = list(headline(found, spec)) if found else []
    for config_id in sorted(left_out):
        mine = [r for r in records if r["config_id"] == config_id and r["variant"] == "baseline"]
        if not mine or atlas is None:
            continue
        pitfall = atlas.pitfalls[knowledge.pitfall_key(mine[0]["scenario"], device_class(mine[0]), config_id)]
        here = "shows here too" if mine[0]["outcome"] != "pass" else "PASSES here (the first release measured to)"
        way = ", ".join(fix_words(v) for v in pitfall.fixes) or "no measured change removes it"
        lines.append(
            f"pitfall, not counted ({vocabulary.config_words(pitfall.config, spec)}): {pitfall.words(spec)}; {here}; "
            f"fails on every release measured ({pitfall.stacks} stacks, {pitfall.first_day} to {pitfall.last_day}); "
            f"way out: {way}"
        )
    return lines


def live_verdict(records: list[Record], spec: dict[str, Any] | None, atlas: Atlas | None) -> Verdict | None:
    """The verdict of this check's own runs by the atlas's one pitfall rule (`Atlas.verdict_of`); without a published
    table there is no pitfall known, and every record counts."""
    if atlas is not None and records:
        return atlas.verdict_of(records, records[0]["scenario"])
    return verdict(records, spec) if records else None


def reproduced_here(
    live: dict[str, list[dict[str, Any]]], atlas: Atlas | None, specs: dict[str, dict[str, Any]]
) -> list[str]:
    """The scenarios whose target this check's own runs showed (pitfall configs left out): the exit code's reason."""
    found = []
    for scenario, records in live.items():
        shown = live_verdict(records, specs.get(scenario), atlas)
        hits = shown.target_records if shown else []
        if hits:
            found.append(f"{scenario} ({', '.join(sorted({str(r['signature']) for r in hits}))})")
    return found


def judged_lines(
    atlas: Atlas | None, live: dict[str, list[dict[str, Any]]], versions: dict[str, str], device: str, gpus: int
) -> list[str]:
    """The judge's answer for this environment, this check's runs added to the atlas as records at exactly these
    releases: per known failure of the scenarios checked, whether it applies here and how sure, and the way out over
    every known failure (the same answer `lookup` and `audit` give for these releases)."""
    if atlas is None:
        return ["", "(no published atlas to judge this environment against)"]
    from harness.tools.answers.audit import Report
    from harness.tools.answers.lookup import SHOWN, answer_lines

    here = atlas.with_records([r for records in live.values() for r in records])
    stack = {p: str(public_version(v)) for p, v in versions.items() if p in AXIS_PACKAGES}
    query = Query(stack, {}, device, gpus or None)
    answers = here.judge(query)
    report = Report(answers, here.tables, query, answers, fix=True)
    lines = ["", "what the atlas says of these releases (your runs above included):"]
    for answer in (a for a in answers if a["state"] in SHOWN and a["scenario"] in live):
        lines += answer_lines(report, answer)
    if len(lines) == 2:
        lines.append("  no known failure of the scenarios checked applies to these releases")
    from harness.tools.answers.audit import way_out_lines

    return lines + [f"  {line}" for line in way_out_lines(report)]


def _jit_cache_dir() -> Path:
    """DeepSpeed's JIT builds for this environment: one folder per interpreter prefix, since torch writes the
    environment's include paths into each op's build.ninja (a shared folder rebuilds the op every time the
    user checks another environment)."""
    prefix = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "compat-matrix" / "torch_extensions" / f"check-{prefix}"


def ranks_for(scenario: Scenario, device: str, gpus: int) -> int:
    """A distributed scenario's ranks here: one per GPU on a node of two or more, two on CPU; one otherwise."""
    if not scenario.distributed:
        return 1
    return max(2, gpus) if device == "cuda" else 2


def _launch_spec(scenario: Scenario, device: str, workdir: Path, gpus: int) -> LaunchSpec:
    """A worker in this interpreter and this environment (the user's PYTHONPATH included: a package installed
    with `pip --target` is seen by the workers as by the check itself), one rank per GPU for a distributed scenario."""
    env = stack_env(device, _jit_cache_dir())
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return LaunchSpec(
        python=Path(sys.executable),
        module=scenario.module_name,
        preload=scenario.preload,
        device=device,
        world_size=ranks_for(scenario, device, gpus),
        env=env,
        workdir=workdir / scenario.id,
        job_timeout_s=JOB_TIMEOUT_S,
        start_timeout_s=JOB_TIMEOUT_S,
        stop_after_failure=bool(scenario.spec.get("restart_after_failure", True)),
        in_step_failures=tuple(scenario.spec.get("in_step_failures", ())),
    )


def _run_seed(scenario: Scenario, session: WorkerSession, versions: dict[str, str], gpus: int) -> list[Record]:
    """The scenario's seed configs (its explicit examples): the baseline of each, then every variant on the
    configs where the baseline showed the target, in this interpreter and one warm worker."""
    from harness.planning.draws import config_id
    from harness.recording.verdicts import matches

    device, world = session.spec.device, session.spec.world_size
    hardware_seen = {"device": device, "world_size": world, "gpu_name": None, "gpu_count": gpus}
    records: list[Record] = []

    def run(items: list[tuple[dict[str, Any], str]]) -> list[Record]:
        done = []
        for (config, variant), result in zip(items, session.run(items), strict=True):
            planned = {"config": config, "config_id": config_id(config), "source": "example"}
            record = make_record(
                run_id="check",
                cell_id="this-environment",
                pins={},
                scenario_id=scenario.id,
                variant=variant,
                planned=planned,
                versions=versions,
                hardware=hardware_seen,
                install={"mode": "check"},
                scenario_digest=None,
                outcome=judge(observed(result), config, device, versions),
            )
            done.append(dict(record))
        return done

    records += run([(config, "baseline") for config in scenario.examples()])
    target = list(scenario.spec.get("target") or [])
    failing = [r["config"] for r in records if r["outcome"] != "pass" and matches(r["signature"], target)]
    records += run([(config, variant) for config in failing for variant in scenario.variants[1:]])
    return records
