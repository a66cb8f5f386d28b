"""One rule for evidence in every search: a probe says something about a failure only where the configs that
showed it ran and either passed or showed it again. A timeout, an unnamed failure, another known failure, a
config that did not run or a stack that could not install is no evidence: the search steps over it and no flip is
named from it.

These tests exist because the rule decides every published flip: the S7 flip of 2025-11-14 .. 2026-04-15 once
read "each of torch, transformers, accelerate alone" from a torch probe that timed out and an accelerate probe that
failed with an unnamed gloo error. They cover the rule itself, each bisector that uses it (the packaging bisect,
the atlas flips on CPU and on the node, bisect-script), and every committed probe, re-judged from its own records.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.define.profile import load_profile
from harness.environments.envs import InstallOptions
from harness.execution.options import MatrixOptions
from harness.recording.flip import Flip
from harness.tools.gpu_node.node_flips import step
from harness.tools.release_search import bisection, flip_search
from harness.tools.release_search import flip_naming as flips
from harness.tools.release_search.bisection import probe_state
from tests.conftest import REPO_ROOT

TARGET = "check-saved_adapter_empty"
S7 = "S7-saved-adapter"


def rec(config_id: str, outcome: str, signature: str | None = None) -> dict[str, Any]:
    return {"config_id": config_id, "outcome": outcome, "signature": signature}


# --- the rule for one run ---------------------------------------------------------------------------------------


def test_only_the_target_or_a_pass_is_evidence_for_one_run() -> None:
    assert flip_search.run_evidence("fail", True) == flip_search.SHOWS
    assert flip_search.run_evidence("flaky", True) == flip_search.SHOWS
    assert flip_search.run_evidence("timeout", True) == flip_search.SHOWS  # a hang that is itself the target
    assert flip_search.run_evidence("pass", False) == flip_search.ABSENT
    for outcome in ("timeout", "crash", "error", "fail", "flaky", "skip"):
        assert flip_search.run_evidence(outcome, False) == flip_search.NO_EVIDENCE, outcome
    for outcome in ("install-failed", "env-broken"):
        assert flip_search.run_evidence(outcome, False) == flip_search.UNUSABLE


# --- a probe over the configs that showed the failure ---------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (rec("c1", "timeout", "timeout"), "timeout"),
        (
            rec("c1", "fail", "unclassified-RuntimeError-0bf99232"),
            "another failure: unclassified-RuntimeError-0bf99232",
        ),
        (rec("c1", "fail", "check-saved_adapter_untrained"), "another failure: check-saved_adapter_untrained"),
        (rec("c1", "crash", "crash-SIGSEGV"), "crash: crash-SIGSEGV"),
        (rec("c1", "error", "harness-error"), "error: harness-error"),
    ],
)
def test_a_timeout_an_unnamed_or_another_known_failure_is_no_evidence(record: dict, reason: str) -> None:
    assert probe_state([record], TARGET, ["c1"]) == ("no-evidence", [reason])
    # ... even where the other configs of the probe pass: every config that showed the failure must run and pass.
    assert probe_state([rec("c0", "pass"), record], TARGET, ["c0", "c1"])[0] == "no-evidence"


def test_the_target_on_any_config_shows_it_and_a_pass_needs_every_config() -> None:
    assert probe_state([rec("c0", "pass"), rec("c1", "fail", TARGET)], TARGET, ["c0", "c1"]) == ("fail", [TARGET])
    assert probe_state([rec("c0", "timeout", "timeout"), rec("c1", "fail", TARGET)], TARGET, ["c0", "c1"])[0] == "fail"
    assert probe_state([rec("c0", "pass"), rec("c1", "pass")], TARGET, ["c0", "c1"]) == ("pass", [])
    # A config that showed the failure and did not run in the probe: no evidence.
    assert probe_state([rec("c0", "pass")], TARGET, ["c0", "c1"]) == ("no-evidence", ["did not run: c1"])
    assert probe_state([rec("c1", "skip", "not-applicable")], TARGET, ["c1"])[0] == "no-evidence"
    # Configs outside the ones asked about say nothing either way.
    assert probe_state([rec("c0", "fail", TARGET), rec("c1", "pass")], TARGET, ["c1"]) == ("pass", [])
    assert probe_state([rec("c1", "install-failed", "install-failed")], TARGET, ["c1"])[0] == "unusable"
    assert probe_state([], TARGET, ["c1"])[0] == "no-evidence"


def test_without_named_configs_a_skip_is_no_candidate_and_the_rest_must_pass() -> None:
    assert probe_state([rec("c0", "pass"), rec("c1", "skip", "not-applicable")], None) == ("pass", [])
    assert probe_state([rec("c0", "pass"), rec("c1", "timeout", "timeout")], None)[0] == "no-evidence"
    assert probe_state([rec("c0", "fail", "anything")], None) == ("fail", ["anything"])
    assert probe_state([rec("c1", "skip", "not-applicable")], None)[0] == "no-evidence"


# --- the atlas flips on CPU ---------------------------------------------------------------------------------------


def _s7_flip() -> Flip:
    flip = Flip("2025-11-14", "2026-04-15", "target", "not-reproduced", scenario=S7, signature=TARGET)
    flip.changed = {
        "torch": ["2.9.1", "2.11.0"],
        "transformers": ["4.57.1", "5.5.4"],
        "accelerate": ["1.11.0", "1.13.0"],
    }
    flip.config_ids = ["c1"]
    return flip


def _name(tmp_path: Path, states: dict[str, tuple[str, list[str]]], bisected: list[str]) -> Flip:
    def probe(profile, base, package, version, scenario, variant, options, out_dir, signature, **_):
        assert options.config_ids == ("c1",)  # the probes run the configs that showed the failure
        state, reasons = states[package]
        return bisection.Probe(version, state, reasons, f"run-{package}", 1)

    def bisector(profile, package, scenario, variant, options, *, old, new, signature, out_root, older_state, **_):
        bisected.append(package)
        return Flip(old, new, "fail", "pass", {package: [old, new]}, package=package, release="5.0.0",
                    last_release_before="4.57.6")  # fmt: skip

    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    profile = load_profile("history", REPO_ROOT / "matrix")
    older = {"torch": "2.9.1", "transformers": "4.57.1", "accelerate": "1.11.0"}
    return flips.name_flip(_s7_flip(), profile, older, options, tmp_path / "f", probe=probe, bisector=bisector)


def test_a_timeout_and_another_failure_never_make_a_flip(tmp_path: Path) -> None:
    """The committed S7 case: torch's move timed out, accelerate's failed with an unnamed gloo error, only
    transformers' move passed. Only transformers reproduces the newer side: it is named and bisected."""
    bisected: list[str] = []
    named = _name(
        tmp_path,
        {
            "torch": ("no-evidence", ["timeout"]),
            "transformers": ("pass", []),
            "accelerate": ("no-evidence", ["another failure: unclassified-RuntimeError-0bf99232"]),
        },
        bisected,
    )
    assert named.reproducing == ["transformers"] and bisected == ["transformers"]
    assert (named.package, named.release, named.last_release_before) == ("transformers", "5.0.0", "4.57.6")


def test_a_flip_no_probe_reproduces_is_not_named_with_the_reasons(tmp_path: Path) -> None:
    bisected: list[str] = []
    named = _name(
        tmp_path,
        {
            "torch": ("no-evidence", ["timeout"]),
            "transformers": ("fail", [TARGET]),
            "accelerate": ("no-evidence", ["another failure: unclassified-RuntimeError-0bf99232"]),
        },
        bisected,
    )
    assert named.package is None and bisected == []
    why = named.why_not_named()
    assert "torch 2.11.0: no evidence (timeout)" in why
    assert "accelerate 1.13.0: no evidence (another failure: unclassified-RuntimeError-0bf99232)" in why
    assert "transformers 5.5.4: the failure shows" in why
    assert "not named: no single package" in flips.describe(named)


# --- the packaging bisect -------------------------------------------------------------------------------------


VERSIONS = ["0.11.0", "0.11.1", "0.12.0", "0.13.0"]


def _bisect(monkeypatch, tmp_path: Path, states: dict[str, str], older_state: str | None = None) -> Flip:
    monkeypatch.setattr(bisection.releases, "releases", lambda *a, **k: [Version(v) for v in VERSIONS])

    def fake_probe(profile, base, package, version, scenario_id, variant, options, out_dir, signature, **_):
        reasons = ["another failure: fsdp-flatten-mixed-dtype"] if states[version] == "no-evidence" else []
        return bisection.Probe(version, states[version], reasons, f"run-{version}", 1)

    monkeypatch.setattr(bisection, "probe_cell", fake_probe)
    options = MatrixOptions(results_dir=tmp_path, install=InstallOptions(envs_dir=tmp_path / "envs"))
    profile = load_profile("cpu", REPO_ROOT / "matrix")
    return bisection.bisect(profile, "peft", "S1", "baseline", options, out_root=tmp_path, older_state=older_state)


def test_a_release_that_is_no_evidence_is_stepped_over_in_the_bisect(monkeypatch, tmp_path: Path) -> None:
    verdict = _bisect(monkeypatch, tmp_path, {"0.11.0": "fail", "0.11.1": "no-evidence", "0.12.0": "pass",
                                              "0.13.0": "pass"})  # fmt: skip
    assert verdict.release == "0.12.0" and verdict.stepped_over == ["0.11.1"]
    assert verdict.last_release_before == "0.11.0"


def test_an_onset_after_releases_that_were_no_evidence_says_so(monkeypatch, tmp_path: Path) -> None:
    """DoRA under FSDP failed another way before peft 0.12: the failure first shows there, and the verdict says
    the release before it was no evidence rather than calling it a pass."""
    verdict = _bisect(monkeypatch, tmp_path, {"0.11.0": "no-evidence", "0.11.1": "no-evidence", "0.12.0": "fail",
                                              "0.13.0": "fail"})  # fmt: skip
    assert (verdict.release, verdict.older_state) == ("0.12.0", "no-evidence")
    assert verdict.note == "first shows; before it, 0.11.1: another failure: fsdp-flatten-mixed-dtype"
    flip = Flip("d0", "d1", "not-reproduced", "target", package="peft")
    flips.name_release(flip, verdict)
    assert flip.release_words() == "0.12.0 (first shows; before it, 0.11.1: another failure: fsdp-flatten-mixed-dtype)"


def test_a_failure_that_ends_needs_an_old_end_that_shows_it(monkeypatch, tmp_path: Path) -> None:
    verdict = _bisect(monkeypatch, tmp_path, {v: "no-evidence" for v in VERSIONS}, older_state="fail")
    assert len(verdict.bisect_runs) == 1 and verdict.release is None  # one probe, and nothing named
    flip = Flip("d0", "d1", "target", "not-reproduced", package="peft")
    flips.name_release(flip, verdict)
    assert flip.release is None and "did not show the failure in the bisect" in flip.note


# --- the node's rounds and bisect-script ------------------------------------------------------------------------


def test_a_node_probe_that_is_no_evidence_reproduces_nothing() -> None:
    flip = Flip("2025-11-14", "2026-04-15", "target", "not-reproduced", scenario="S2-qlora-grad-flags",
                signature="no-grad-element-0", changed={"transformers": ["4.57.1", "5.5.4"]})  # fmt: skip
    assert step(flip, {"2025-11-14+transformers-5.5.4": "no-evidence"}, []) == []
    assert flip.reproducing == [] and flip.package is None


def test_a_script_run_is_judged_by_the_same_rule() -> None:
    from harness.tools.script_verdicts.script_bisect import _SCRIPT_STATE

    assert _SCRIPT_STATE == {"shows": "target", "absent": "pass", "unusable": "unusable", "no-evidence": "other"}
    assert not any(flip_search.reproduces("other", side) for side in ("target", "pass"))


# --- every committed probe, judged again from its own records --------------------------------------------------


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "records.jsonl.xz"
    text = lzma.open(path, "rt").read() if path.is_file() else (run_dir / "records.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_every_committed_cpu_probe_state_is_what_its_records_show() -> None:
    """Each move of every committed CPU flip, and each probe of its bisect, carries the state today's rule gives
    its own records (over the configs that showed the failure): no committed flip stands on a probe that timed
    out or failed another way. A bisect an earlier rule wrote and a later one superseded leaves no verdict."""
    results = REPO_ROOT / "results" / "flips"
    checked, verdicts = 0, set()
    for path in sorted(results.glob("*/flips.json")):
        for entry in json.loads(path.read_text()):
            signature, configs = entry["signature"], entry.get("config_ids") or ()
            for move in entry["probes"]:
                if not move.get("run_id"):
                    continue  # a node's move: its state is computed from the probe days at every planning round
                [run_dir] = list(path.parent.glob(f"**/runs/{move['run_id']}"))
                state, _ = probe_state(_records(run_dir), signature, configs)
                assert move["state"] == state, (path.parent.name, entry["scenario"], move["package"], move["run_id"])
                checked += 1
            for probe in (entry.get("sweep") or {}).get("runs", []):
                [run_dir] = list(path.parent.glob(f"**/runs/{probe['run_id']}"))
                state, _ = probe_state(_records(run_dir), signature, configs)
                assert probe["state"] == state, (entry["scenario"], entry.get("family"), probe["version"])
                checked += 1
            folder = REPO_ROOT / (entry.get("bisect") or "-")
            if not (folder / "verdict.json").is_file():
                continue
            verdicts.add(folder / "verdict.json")
            for probe in json.loads((folder / "verdict.json").read_text())["probes"]:
                [run_dir] = list(path.parent.glob(f"**/runs/{probe['run_id']}"))
                state, _ = probe_state(_records(run_dir), signature, configs)
                assert probe["state"] == state, (folder, probe["version"])
                checked += 1
    assert checked >= 60
    assert set(results.glob("*/*/bisect/*/verdict.json")) == verdicts
