"""The atlas keeps up, with time made to pass: a package index served here (the simple API's JSON form, with upload
times) that has a peft minor and a transformers release dated after the newest atlas day, a results folder holding the
atlas as the table reads it, and `COMPAT_MATRIX_TODAY` set. The growth adds exactly the new days, for every scenario
(a past "today" stays, a day only one scenario has is completed), and nothing the day after it ran; the watch moves
exactly the new release alone onto the newest day's stack."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.environments.envs import era_flags
from harness.paths import MATRIX_DIR, REPO_ROOT, RESULTS_DIR
from harness.recording.records import read_records
from harness.tools.growth import atlas_growth

#: (package, version, first upload): the index the test serves. peft 0.9.0 and 0.10.0 give the atlas's old days;
#: peft 0.22.0 (2026-11-30) is a new minor; transformers 5.25.0 (2026-12-01) is the new release the watch must move.
RELEASES = [
    ("peft", "0.9.0", "2024-02-28T10:00:00Z"),
    ("peft", "0.10.0", "2024-03-21T10:00:00Z"),
    ("peft", "0.22.0", "2026-11-30T09:00:00Z"),
    ("transformers", "5.24.0", "2026-11-20T09:00:00Z"),
    ("transformers", "5.25.0", "2026-12-01T09:00:00Z"),
    ("transformers", "5.26.0rc1", "2026-12-01T12:00:00Z"),
]
OLD_DAYS = ["2024-02-29", "2024-03-22"]
PAST_TODAY = "2026-11-24"


class Index(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        name = self.path.strip("/").split("/")[-1]
        files = [
            {"filename": f"{p.replace('-', '_')}-{v}-py3-none-any.whl", "url": f"/{p}/{v}.whl", "hashes": {},
             "upload-time": t}
            for p, v, t in RELEASES
            if p == name
        ]  # fmt: skip
        body = json.dumps({"meta": {"api-version": "1.1"}, "name": name, "files": files}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    monkeypatch.setenv("PIP_INDEX_URL", url)
    yield url
    server.shutdown()


def write_atlas_run(
    results: Path, run_id: str, days: list[str], scenarios: list[str], versions: dict, profile: str = "history"
) -> None:
    """A run of a dated profile as the table reads it: meta.json and one baseline record per day and scenario."""
    run = results / "runs" / run_id
    run.mkdir(parents=True)
    meta = {"run_id": run_id, "profile": profile, "started_at": run_id, "status": "complete", "attempts": []}
    (run / "meta.json").write_text(json.dumps(meta))
    records = [
        {"run_id": run_id, "cell": f"era_date-{day}", "scenario": s, "variant": "baseline", "config_id": "c1",
         "config": {}, "outcome": "pass", "signature": None, "pins": {"date": day}, "versions": versions,
         "hardware": {"device": "cpu", "world_size": 2}, "metrics": {}, "started_at": run_id}
        for day in days
        for s in scenarios
    ]  # fmt: skip
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_growth_adds_exactly_the_new_days_for_every_scenario(
    tmp_path: Path, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = load_profile("history", MATRIX_DIR)
    scenarios = atlas_growth.runnable_scenarios(history)
    assert "S8-trainer-fsdp-launch" not in scenarios  # GPUs only: a CPU atlas never waits for it
    stack = {"torch": "2.15.0", "transformers": "5.24.0", "peft": "0.21.2"}
    write_atlas_run(tmp_path, "history-20261124T000000Z-aaaa", [*OLD_DAYS, PAST_TODAY], scenarios, stack)
    # A later re-check of one scenario that ran on its own new day (what S9's first run did on 2026-11-27).
    write_atlas_run(tmp_path, "history-20261127T000000Z-bbbb", ["2026-11-27"], scenarios[-1:], stack)
    monkeypatch.setenv(atlas_growth.TODAY_VAR, "2026-12-02")
    days = atlas_growth.rule_days(history, atlas_growth.today())
    # The rule's days now: a day after each peft minor, today; a release candidate or a future upload gives none.
    assert days == ["2024-02-29", "2024-03-22", "2026-12-01", "2026-12-02"]
    evidence = atlas_growth.atlas_evidence(tmp_path, "history")
    plan = atlas_growth.growth_plan(evidence, days, scenarios)
    grown = {(day, s) for step in plan for day in step.days for s in step.scenarios}
    everything = set(scenarios)
    expected = {("2026-11-27", s) for s in everything - set(scenarios[-1:])}
    expected |= {(day, s) for day in ("2026-12-01", "2026-12-02") for s in everything}
    assert grown == expected  # the past "today" 2026-11-24 and the old days stay as they are; nothing else runs
    assert {(day, s) for day in (*OLD_DAYS, PAST_TODAY) for s in everything}.isdisjoint(grown)
    # The growth ran (its records are in the table): the same day, a second growth finds nothing to run.
    write_atlas_run(tmp_path, "history-20261202T000000Z-cccc", ["2026-12-01", "2026-12-02"], scenarios, stack)
    write_atlas_run(tmp_path, "history-20261202T000001Z-dddd", ["2026-11-27"], scenarios[:-1], stack)
    again = atlas_growth.growth_plan(atlas_growth.atlas_evidence(tmp_path, "history"), days, scenarios)
    assert again == []
    # ... and the command says so and runs nothing (the workflow's own command line).
    done = subprocess.run(
        [sys.executable, "-m", "harness", "matrix", "--profile", "history", "--no-example-db", "--grow",
         "--results-dir", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Nothing to grow on 2026-12-02" in done.stdout
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "history-20261124T000000Z-aaaa", "history-20261127T000000Z-bbbb", "history-20261202T000000Z-cccc",
        "history-20261202T000001Z-dddd",
    ]  # fmt: skip
    assert (tmp_path / "growth-summary.md").read_text().startswith("Nothing to grow")


def test_the_watch_moves_exactly_the_new_release_alone(
    tmp_path: Path, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = load_profile("history", MATRIX_DIR)
    monkeypatch.setenv(atlas_growth.TODAY_VAR, "2026-12-02")
    found = atlas_growth.new_releases(["transformers", "peft", "torch"], "2026-11-27", atlas_growth.today())
    # Published after the newest day and by today, final releases only: the new minor and the new transformers.
    assert found == [("peft", "0.22.0", "2026-11-30"), ("transformers", "5.25.0", "2026-12-01")]
    day = {"torch": "2.15.0", "transformers": "5.24.0", "peft": "0.21.2", "accelerate": "1.15.0",
           "deepspeed": "0.19.8", "bitsandbytes": "0.50.2"}  # fmt: skip
    probe = atlas_growth.moved_alone(history, day, "2026-11-27", "transformers", "5.25.0")
    (cell,) = expand(probe)
    assert cell.pins == {**day, "transformers": "5.25.0", "date": "2026-11-27"}
    # Everything resolves as of the newest day; only the moved package may come from after it.
    assert era_flags(cell, probe) == [
        "--exclude-newer", "2026-11-27T00:00:00Z", "--exclude-newer-package", "transformers=2026-12-02T23:59:59Z",
    ]  # fmt: skip


def test_a_watched_release_reads_as_its_effect() -> None:
    from harness.recording.verdicts import Verdict

    def shows(k: int, n: int) -> Verdict:
        return Verdict("target" if k else "not-reproduced", target_records=[{}] * k, candidates=n)

    assert atlas_growth.effect("S7", shows(0, 5), shows(3, 5)) == "breaks S7 (target now shows on 3/5)"
    assert atlas_growth.effect("S1", shows(5, 7), shows(0, 7)) == "fixes S1 (0/7 was 5/7)"
    assert atlas_growth.effect("S1", shows(5, 7), shows(1, 7)) == "changes S1 (target on 1/7, was 5/7)"
    assert atlas_growth.effect("S2", shows(0, 4), shows(0, 4)) == "no change"
    assert atlas_growth.effect("S2", shows(0, 4), Verdict("install-failed")) == "cannot install"


def test_a_watched_release_that_changes_a_target_is_a_named_flip() -> None:
    watched = [
        atlas_growth.Watched(
            "transformers",
            "5.25.0",
            "2026-12-01",
            "2026-11-27",
            "history-x",
            {
                "S7-saved-adapter": "breaks S7-saved-adapter (target now shows on 3/5)",
                "S1-dora-fsdp-checkpoint": "no change",
            },
        ),
        atlas_growth.Watched(
            "peft", "0.22.0", "2026-11-30", "2026-11-27", "history-y", {"S1-dora-fsdp-checkpoint": "no change"}
        ),
    ]
    (flip,) = atlas_growth.watch_flips(watched, {"transformers": "5.24.0", "peft": "0.21.2"})
    assert (flip.scenario, flip.older, flip.newer) == (
        "S7-saved-adapter",
        "2026-11-27",
        "2026-11-27+transformers-5.25.0",
    )
    assert (flip.older_state, flip.newer_state, flip.package, flip.release) == (
        "not-reproduced",
        "target",
        "transformers",
        "5.25.0",
    )
    assert flip.last_release_before == "5.24.0" and flip.changed == {"transformers": ["5.24.0", "5.25.0"]}


def test_a_gpu_watch_plans_each_release_alone_for_the_node_and_judges_what_it_ran(
    tmp_path: Path, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU profile the watch plans each new release as a probe day of its own (the newest GPU day with that one
    package moved; the node's torch never moves), does nothing more the same day until the node's records are
    imported, then reads each release's effect from them: a release whose records break S7 is a named flip."""
    from harness.tools.gpu_node import node_flips, node_watch

    gpu = load_profile("gpu-history-ws2", MATRIX_DIR)
    results = tmp_path / "results"
    day = {"torch": "2.11.0", "transformers": "5.24.0", "peft": "0.21.2", "accelerate": "1.15.0",
           "deepspeed": "0.19.8", "bitsandbytes": "0.50.2"}  # fmt: skip
    write_atlas_run(results, "gpu-history-ws2-20261125T000000Z-aaaa", ["2026-11-25"], ["S7-saved-adapter"], day,
                    profile="gpu-history-ws2")  # fmt: skip
    planned: list[list[str]] = []
    monkeypatch.setattr(node_flips, "write_probe_profile", lambda profile, needed, *_: planned.append(list(needed)))
    monkeypatch.setenv(atlas_growth.TODAY_VAR, "2026-12-02")
    said: list[str] = []
    assert node_watch.watch(gpu, results, said.append)[0] == []  # planned, nothing run yet
    assert planned == [["2026-11-25+peft-0.22.0", "2026-11-25+transformers-5.25.0"]]  # one package moved each
    plan = json.loads((results / "watch" / "2026-12-02" / "gpu-history-ws2" / "plan.json").read_text())
    assert [(r["package"], r["version"]) for r in plan["releases"]] == [("peft", "0.22.0"), ("transformers", "5.25.0")]
    assert any("scripts/gpu-node-run.sh gpu-history-ws2-probes" in line for line in said)
    assert node_watch.watch(gpu, results, said.append)[0] == [] and len(planned) == 1  # the same day: nothing new
    # The node's records, imported: transformers 5.25.0 makes S7's save fail (a real S7 failure record of the GPU
    # atlas, moved onto the probe day), peft 0.22.0 keeps it passing.
    failing = next(
        r for d in sorted((RESULTS_DIR / "runs").glob("gpu-history-ws2-*"))
        for r in read_records(d / "records.jsonl", warn=False)
        if r["scenario"] == "S7-saved-adapter" and r["outcome"] == "fail" and r["variant"] == "baseline"
    )  # fmt: skip
    probes = []
    for probe, outcome in (("2026-11-25+peft-0.22.0", "pass"), ("2026-11-25+transformers-5.25.0", "fail")):
        base = failing if outcome == "fail" else {k: v for k, v in failing.items() if k != "signature"}
        probes.append(base | {"cell": f"era_date-{probe}", "pins": {"date": probe}, "config_id": "c1",
                              "outcome": outcome, "variant": "baseline"})  # fmt: skip
    run = results / "watch" / "2026-12-02" / "gpu-history-ws2" / "runs" / "gpu-history-ws2-probes-x"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"run_id": run.name, "profile": "gpu-history-ws2-probes"}))
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in probes))
    watched, text = node_watch.watch(gpu, results, said.append)
    assert {w.package: w.summary for w in watched} == {
        "peft": "no change",
        "transformers": "breaks S7-saved-adapter (target now shows on 1/1)",
    }, text
    (flip,) = json.loads((run.parents[1] / "flips.json").read_text())
    assert (flip["package"], flip["release"], flip["newer"]) == (
        "transformers",
        "5.25.0",
        "2026-11-25+transformers-5.25.0",
    )
    assert len(planned) == 1  # judged, not planned again
