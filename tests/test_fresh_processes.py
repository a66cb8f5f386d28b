"""What the table shows of a scenario that starts its own process group (S8) ran as a script runs: each job in
processes of its own. Read from the committed worker logs, not from the code that should have made it so.

S8's first hangs at 2 ranks all came at a worker's second to fifth job (results/probes/nccl-regroup-20261126/): a
shown record made by a reused process would be a claim about the harness, not about the stack.
"""

from __future__ import annotations

import json
import tarfile
from collections import defaultdict

from harness.define.registry import select
from harness.knowledge.selection import select_runs
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "results"


def _own_group_scenarios() -> list[str]:
    return [s.id for s in select(["S*"]) if s.spec.get("process_group") == "scenario"]


def _jobs_per_launch(run_id: str, scenario_id: str) -> list[int]:
    """How many jobs each launch of the scenario started on rank 0 (its events file in the run's worker logs)."""
    starts: dict[str, int] = defaultdict(int)
    with tarfile.open(RESULTS / "runs" / run_id / "worker-logs.tgz") as logs:
        for member in logs.getmembers():
            if f"/{scenario_id}/" in member.name and member.name.endswith("events.rank0.jsonl"):
                handle = logs.extractfile(member)
                assert handle is not None
                lines = handle.read().decode().splitlines()
                starts[member.name] = sum(1 for line in lines if line and json.loads(line)["event"] == "start")
    return list(starts.values())


def test_every_shown_record_of_a_scenario_that_starts_its_own_group_ran_in_fresh_processes() -> None:
    scenarios = _own_group_scenarios()
    assert scenarios, "no scenario starts its own process group: this test checks nothing"
    shown = defaultdict(set)
    for record in select_runs(RESULTS).records:
        if record["scenario"] in scenarios and record["outcome"] != "skip":
            shown[record["scenario"]].add(record["run_id"])
    assert shown, "the table shows no record of such a scenario"
    for scenario_id, run_ids in shown.items():
        for run_id in sorted(run_ids):
            per_launch = _jobs_per_launch(run_id, scenario_id)
            assert per_launch, f"{run_id}: no worker logs of {scenario_id}"
            assert max(per_launch) == 1, f"{run_id}: a launch of {scenario_id} ran {max(per_launch)} jobs"


def test_the_check_can_fail_on_a_run_that_reused_processes() -> None:
    """The superseded run fc9f reused processes: the same reading finds launches of several jobs there."""
    assert max(_jobs_per_launch("gpu-history-ws2-20261126T151133Z-fc9f", "S8-trainer-fsdp-launch")) > 1
