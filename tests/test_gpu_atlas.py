"""The GPU atlas: flips named in rounds on an air-gapped node, the profiles that carry its probe days, and the
views that set a GPU history beside the CPU one.

These tests exist because each piece decides what a published row says, with no run in between to catch a
mistake: `node_flips.step` picks which probe days the next device call carries and which release it names as
the cause (a wrong bracket names the wrong release); the profile accepts probe days only in their one shape; a
cell id shared by the CPU and GPU history must stay two cells; a config whose day's bitsandbytes cannot load over
the node's torch is no evidence, so a flip on it is masked, not named; the bitsandbytes load failures must be
classified as a broken environment, not as the scenario's failure; and every CPU/GPU disagreement gets its
reason. All inputs are synthetic records and dataclasses: no network, no GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.define.profile import load_profile
from harness.errors import ProfileError
from harness.knowledge.flips import dated_verdicts, masking
from harness.knowledge.selection import qualify_shared_cells
from harness.publishing.atlas import held_torch
from harness.publishing.device_compare import disagreements, disagreements_markdown
from harness.recording.signatures import classify
from harness.recording.verdicts import verdict
from harness.tools.gpu_node.node_flips import PER_ROUND, step, window_step
from harness.tools.release_search.flip_naming import Flip
from harness.tools.release_search.flip_search import spread as _spread

S2 = "S2-qlora-grad-flags"
TARGET = "no-grad-element-0"
BNB = "bnb-no-library-for-this-cuda"
SPECS = {S2: {"target": [TARGET]}}
OLDER, NEWER = "2025-11-14", "2026-04-15"
RELEASES = ["4.57.1", "4.57.4", "4.57.5", "5.0.0", "5.2.0", "5.5.4"]


# --- node_flips.step / _spread ---------------------------------------------------------------------------------


def s2_flip() -> Flip:
    return Flip(
        scenario=S2,
        older=OLDER,
        newer=NEWER,
        older_state="target",
        newer_state="not-reproduced",
        signature=TARGET,
        changed={"transformers": ["4.57.1", "5.5.4"], "peft": ["0.18.0", "0.19.0"]},
    )


def day(package: str, version: str) -> str:
    return f"{OLDER}+{package}-{version}"


#: Transformers 5.5.4 alone ends the target (pass, like the newer day); peft 0.19.0 alone keeps it.
ALONE = {day("transformers", "5.5.4"): "pass", day("peft", "0.19.0"): "fail"}


def test_step_first_asks_for_each_changed_package_moved_alone() -> None:
    flip = s2_flip()
    assert step(flip, {}, []) == ["2025-11-14+transformers-5.5.4", "2025-11-14+peft-0.19.0"]
    assert flip.moves == [] and flip.reproducing == [] and flip.package is None and flip.release is None


def test_step_asks_only_for_the_moved_alone_probe_still_missing() -> None:
    flip = s2_flip()
    assert step(flip, {day("transformers", "5.5.4"): "pass"}, []) == ["2025-11-14+peft-0.19.0"]
    assert [p["probe_day"] for p in flip.moves] == ["2025-11-14+transformers-5.5.4"]


def test_step_names_the_package_whose_move_alone_reproduces_the_newer_outcome() -> None:
    flip = s2_flip()
    assert step(flip, dict(ALONE), []) == []
    assert flip.reproducing == ["transformers"]
    assert flip.package is None and flip.release is None  # not bisected yet: no release list
    assert {p["package"]: p["state"] for p in flip.moves} == {"transformers": "pass", "peft": "fail"}


def test_step_when_the_newer_day_fails_the_failing_probe_reproduces() -> None:
    flip = s2_flip()
    flip.older_state, flip.newer_state = "not-reproduced", "target"
    assert step(flip, dict(ALONE), []) == []
    assert flip.reproducing == ["peft"]


def test_step_with_both_moves_reproducing_names_no_package_and_no_release() -> None:
    flip = s2_flip()
    states = {day("transformers", "5.5.4"): "pass", day("peft", "0.19.0"): "pass"}
    assert step(flip, states, RELEASES) == []
    assert flip.reproducing == ["transformers", "peft"]
    assert flip.package is None and flip.release is None and flip.bisect is None


def test_step_an_unusable_moved_alone_probe_reproduces_nothing() -> None:
    flip = s2_flip()
    states = {day("transformers", "5.5.4"): "unusable", day("peft", "0.19.0"): "fail"}
    assert step(flip, states, RELEASES) == []
    assert flip.reproducing == []
    assert flip.package is None


def test_step_bisects_with_up_to_per_round_untested_releases_inside_the_bracket() -> None:
    flip = s2_flip()
    needed = step(flip, dict(ALONE), RELEASES)
    untested = ["4.57.4", "4.57.5", "5.0.0", "5.2.0"]
    assert PER_ROUND == 4
    assert needed == [day("transformers", v) for v in _spread(untested, PER_ROUND)]
    assert needed == [
        "2025-11-14+transformers-4.57.4",
        "2025-11-14+transformers-4.57.5",
        "2025-11-14+transformers-5.0.0",
        "2025-11-14+transformers-5.2.0",
    ]
    assert flip.package == "transformers" and flip.release is None


def test_step_with_more_untested_releases_than_a_round_spreads_them() -> None:
    flip = s2_flip()
    releases = ["4.57.1", *(f"4.57.{i}" for i in range(2, 12)), "5.5.4"]
    needed = step(flip, dict(ALONE), releases)
    assert needed == [day("transformers", v) for v in ("4.57.3", "4.57.5", "4.57.7", "4.57.9")]


def test_step_sweeps_every_point_in_one_round_and_names_every_change() -> None:
    """The node's sweep: every sweep point of the reproducing package in one round (no PER_ROUND cap: they are known
    before any run), then the changes in order, the flip's release the last one."""
    flip = s2_flip()
    needed = step(flip, dict(ALONE), RELEASES, search="sweep")
    between = [v for v in RELEASES if v not in ("4.57.1", "5.5.4")]
    assert needed == [day("transformers", v) for v in between]  # 7 releases or fewer: every one
    states = dict(ALONE) | {
        day("transformers", v): ("pass" if v in ("4.57.5", "5.2.0") else "fail") for v in between
    }  # a fix in 4.57.5, undone in 5.0.0, done again in 5.2.0
    assert step(flip, states, RELEASES, search="sweep") == []
    assert flip.changes_words() == (
        "ended with transformers 4.57.5 · started with transformers 5.0.0 · ended again with transformers 5.2.0"
    )
    assert (flip.release, flip.last_release_before) == ("5.2.0", "5.0.0")


def s2_window() -> Flip:
    """Two days after S2's end that agree (the target absent on both), transformers changed between them."""
    return Flip(
        scenario=S2,
        older=NEWER,
        newer="2026-07-29",
        older_state="not-reproduced",
        newer_state="not-reproduced",
        signature=TARGET,
        changed={"transformers": ["5.5.4", "5.14.1"]},
    )


def window_day(version: str) -> str:
    return f"{NEWER}+transformers-{version}"


WINDOW_RELEASES = ["5.5.4", "5.6.0", "5.7.0", "5.8.0", "5.9.0", "5.10.0", "5.12.0", "5.14.1"]


def test_a_window_sweeps_every_point_over_the_older_day_and_needs_no_probe_of_the_day_itself() -> None:
    """A day pair that agrees can hide a break and its fix: the node sweeps the named package's releases over the
    older day's stack, every sweep point in one round, and the older day's own release is that day's records, not a
    probe. Until the probes ran the window claims nothing (no sweep, no change)."""
    window = s2_window()
    needed = window_step(window, {}, {"transformers": WINDOW_RELEASES})
    assert needed == [window_day(v) for v in WINDOW_RELEASES[1:]]
    assert window.sweep is None and window.changes == []


def test_a_window_with_no_change_inside_says_it_was_swept() -> None:
    window = s2_window()
    states = {window_day(v): "pass" for v in WINDOW_RELEASES[1:]}
    assert window_step(window, states, {"transformers": WINDOW_RELEASES}) == []
    assert window.changes == [] and window.sweep["probes"] == {v: "pass" for v in WINDOW_RELEASES[1:]}
    assert not window.is_window  # no change inside: the table lists it among the quiet day pairs


def test_a_window_names_the_break_and_the_fix_inside_it() -> None:
    """5.8.0 brings the failure back and 5.12.0 ends it again: both changes, each with the release before it."""
    window = s2_window()
    states = {window_day(v): ("fail" if v in ("5.8.0", "5.9.0", "5.10.0") else "pass") for v in WINDOW_RELEASES[1:]}
    assert window_step(window, states, {"transformers": WINDOW_RELEASES}) == []
    assert window.changes_words() == "started with transformers 5.8.0 · ended with transformers 5.12.0"
    assert [c["last_before"] for c in window.changes] == ["5.7.0", "5.10.0"] and window.is_window


def test_a_window_steps_over_a_release_that_is_no_evidence() -> None:
    window = s2_window()
    states = {window_day(v): ("unusable" if v == "5.9.0" else "pass") for v in WINDOW_RELEASES[1:]}
    assert window_step(window, states, {"transformers": WINDOW_RELEASES}) == []
    assert window.changes == [] and window.sweep["stepped_over"] == ["5.9.0"]


def test_step_completes_with_the_first_release_past_the_flip() -> None:
    flip = s2_flip()
    states = dict(ALONE) | {
        day("transformers", "4.57.4"): "fail",
        day("transformers", "4.57.5"): "fail",
        day("transformers", "5.0.0"): "pass",
        day("transformers", "5.2.0"): "pass",
    }
    assert step(flip, states, RELEASES) == []
    assert flip.package == "transformers"
    assert flip.release == "5.0.0"
    assert flip.bisect == "4 release(s) of transformers probed between 4.57.1 and 5.5.4 on the node"
    bisected = {p["version"]: p["state"] for p in flip.moves if p["probe_day"] not in ALONE}
    assert bisected == {"4.57.4": "fail", "4.57.5": "fail", "5.0.0": "pass", "5.2.0": "pass"}


def test_step_narrows_the_bracket_to_the_releases_still_untested() -> None:
    flip = s2_flip()
    states = dict(ALONE) | {day("transformers", "4.57.4"): "fail", day("transformers", "5.2.0"): "pass"}
    assert step(flip, states, RELEASES) == [day("transformers", "4.57.5"), day("transformers", "5.0.0")]
    assert flip.release is None


def test_step_steps_over_an_unusable_release_inside_the_bracket() -> None:
    flip = s2_flip()
    states = dict(ALONE) | {
        day("transformers", "4.57.4"): "fail",
        day("transformers", "4.57.5"): "fail",
        day("transformers", "5.0.0"): "unusable",
        day("transformers", "5.2.0"): "pass",
    }
    assert step(flip, states, RELEASES) == []
    assert flip.release == "5.2.0"  # 5.0.0 could not run: not the release, and not asked for again
    assert {"package": "transformers", "version": "5.0.0", "probe_day": day("transformers", "5.0.0")} | {
        "state": "unusable"
    } in flip.moves


def test_step_bounds_the_bracket_with_the_days_own_releases_when_the_index_lacks_them() -> None:
    # The index list may miss the older or the newer release (yanked, or filtered by Requires-Python).
    flip = s2_flip()
    assert step(flip, ALONE, ["4.57.4", "4.57.5", "5.0.0", "5.5.4"]) == [
        day("transformers", v) for v in ("4.57.4", "4.57.5", "5.0.0")
    ]
    flip = s2_flip()
    needed = step(flip, ALONE | {day("transformers", "4.57.4"): "fail"}, ["4.57.1", "4.57.4", "5.0.0"])
    assert needed == [day("transformers", "5.0.0")]  # never names a release nobody probed
    assert flip.release is None


def test_spread_picks_evenly_spaced_items() -> None:
    items = [str(i) for i in range(10)]
    assert _spread(items, 4) == ["1", "3", "5", "7"]
    assert _spread(["a", "b", "c"], 4) == ["a", "b", "c"]
    assert _spread(["a", "b", "c", "d"], 4) == ["a", "b", "c", "d"]


# --- profile validation: probe days, era packages ----------------------------------------------------------------


def gpu_profile(
    tmp_path: Path, dates: str = '["2025-11-14", "2025-11-14+transformers-5.0.0"]', install: str = ""
) -> Path:
    install = install or (
        'mode = "system"\nnode_image = "cuda-image"\n'
        'era_packages = ["transformers", "peft", "accelerate", "bitsandbytes"]\n'
    )
    text = f"""
[profile]
description = "GPU history probes"
python = "3.12"
device = "cuda"
world_size = 1
scenarios = ["{S2}"]
examples_per_scenario = 0
hypothesis_seed = 20261121
hypothesis_profile = "ci"

[axes]
date = {dates}

[stacks.era]
torch = "system"
transformers = "latest"
peft = "latest"
accelerate = "latest"
bitsandbytes = "latest"

[install]
{install}
[timeouts]
install_s = 600
job_s = 300
worker_start_s = 300
"""
    path = tmp_path / "gpu-probes.toml"
    path.write_text(text)
    return path


def test_profile_accepts_probe_days(tmp_path: Path) -> None:
    profile = load_profile(str(gpu_profile(tmp_path)), tmp_path)
    assert profile.axes["date"] == ("2025-11-14", "2025-11-14+transformers-5.0.0")
    assert profile.era_packages == ("transformers", "peft", "accelerate", "bitsandbytes")
    assert profile.node_image == "cuda-image"
    assert profile.install_mode == "system"


@pytest.mark.parametrize(
    "bad", ["2025-11-14+Transformers", "yesterday", "2025-11-14+transformers", "2025-11-14+transformers-x1"]
)
def test_profile_rejects_what_is_neither_a_day_nor_a_probe_day(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ProfileError) as caught:
        load_profile(str(gpu_profile(tmp_path, dates=f'["2025-11-14", "{bad}"]')), tmp_path)
    assert caught.value.key == "axes.date"
    assert repr(bad) in str(caught.value)


def test_probe_days_need_an_era_locked_profile(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="era-locked profiles only") as caught:
        load_profile(str(gpu_profile(tmp_path, install='mode = "system"\n')), tmp_path)
    assert caught.value.key == "axes.date"


def test_era_packages_need_a_node_image(tmp_path: Path) -> None:
    install = 'mode = "system"\nera_packages = ["transformers"]\n'
    with pytest.raises(ProfileError, match=r"needs install\.node_image") as caught:
        load_profile(str(gpu_profile(tmp_path, install=install)), tmp_path)
    assert caught.value.key == "install.era_packages"


def test_era_packages_need_system_mode(tmp_path: Path) -> None:
    # A uv profile cannot pin torch 'system', so this one's stack names torch at a version.
    path = gpu_profile(tmp_path, install='mode = "uv"\nera_packages = ["transformers"]\n')
    path.write_text(path.read_text().replace('torch = "system"', 'torch = "2.11.0"'))
    with pytest.raises(ProfileError, match='mode = "system"') as caught:
        load_profile(str(path), tmp_path)
    assert caught.value.key == "install.era_packages"


def test_era_packages_need_a_date_axis(tmp_path: Path) -> None:
    path = gpu_profile(tmp_path)
    path.write_text(path.read_text().replace('date = ["2025-11-14", "2025-11-14+transformers-5.0.0"]', ""))
    with pytest.raises(ProfileError, match="needs a date axis") as caught:
        load_profile(str(path), tmp_path)
    assert caught.value.key == "install.era_packages"


# --- report.qualify_shared_cells ---------------------------------------------------------------------------------


def test_a_cell_shared_by_two_profiles_becomes_two_cells() -> None:
    shared = "era_date-2024-02-29"
    records = [
        {"cell": shared, "run_id": "run-cpu", "scenario": S2, "outcome": "pass"},
        {"cell": shared, "run_id": "run-gpu", "scenario": S2, "outcome": "fail"},
        {"cell": "era_date-2025-11-14", "run_id": "run-gpu", "scenario": S2, "outcome": "fail"},
    ]
    metas = {"run-cpu": {"profile": "history"}, "run-gpu": {"profile": "gpu-history"}}
    out = qualify_shared_cells(records, metas)
    assert [r["cell"] for r in out] == [
        "era_date-2024-02-29@history",
        "era_date-2024-02-29@gpu-history",
        "era_date-2025-11-14",
    ]
    assert [r.get("cell_at_run") for r in out] == [shared, shared, None]
    assert [r["outcome"] for r in out] == ["pass", "fail", "fail"]
    assert records[0]["cell"] == shared  # the caller's records are left as they were


def test_a_cell_of_two_runs_of_one_profile_is_unchanged() -> None:
    records = [
        {"cell": "era_date-2025-11-14", "run_id": "run-a", "scenario": S2, "outcome": "pass"},
        {"cell": "era_date-2025-11-14", "run_id": "run-b", "scenario": S2, "outcome": "fail"},
    ]
    metas = {"run-a": {"profile": "gpu-history"}, "run-b": {"profile": "gpu-history"}}
    assert qualify_shared_cells(records, metas) == records


# --- verdicts, masking, held_torch -------------------------------------------------------------------------------


def rec(
    config_id: str,
    outcome: str,
    signature: str | None,
    date: str = OLDER,
    device: str = "cuda",
    torch: str = "2.11.0",
    pin_torch: str = "system",
) -> dict[str, Any]:
    return {
        "cell": f"era_date-{date}",
        "run_id": f"run-{device}",
        "pins": {"date": date, "torch": pin_torch},
        "scenario": S2,
        "variant": "baseline",
        "config": {"seed": int(config_id[1:])},
        "config_id": config_id,
        "outcome": outcome,
        "signature": signature,
        "versions": {"torch": torch, "nvidia-cuda-runtime": "13.0.96", "transformers": "4.57.1", "peft": "0.18.0"},
        "hardware": {"device": device, "world_size": 1},
    }


def broken_day(date: str = OLDER) -> list[dict[str, Any]]:
    """Three 4-bit configs whose bitsandbytes cannot load over the node's torch; one config that passes."""
    return [rec(c, "env-broken", BNB, date) for c in ("c1", "c2", "c3")] + [rec("c0", "pass", None, date)]


def test_configs_that_could_not_run_are_no_candidates() -> None:
    found = verdict(broken_day(), {"target": [TARGET]})
    assert found.state == "not-reproduced"
    assert found.candidates == 1
    assert found.others == {BNB: 3}
    assert found.unusable_ids == {"c1": BNB, "c2": BNB, "c3": BNB}
    assert found.target_records == []


def test_every_config_env_broken_is_an_env_broken_entry() -> None:
    found = verdict([rec(c, "env-broken", BNB) for c in ("c1", "c2")], {"target": [TARGET]})
    assert found.state == "env-broken"
    assert found.first_signature == BNB


def onset(newer_configs: list[str]) -> tuple[Flip, dict[str, Any]]:
    records = broken_day(OLDER) + [rec(c, "fail", TARGET, NEWER) for c in newer_configs]
    records += [rec(c, "pass", None, NEWER) for c in ("c0", "c1", "c2", "c3") if c not in newer_configs]
    verdicts = dated_verdicts(records, SPECS)[2]
    flip = Flip(OLDER, NEWER, "not-reproduced", "target", scenario=S2)
    return flip, verdicts


def test_an_onset_on_configs_that_could_not_run_before_is_masked() -> None:
    flip, verdicts = onset(["c1", "c2", "c3"])
    assert verdicts[S2][OLDER].state == "not-reproduced" and verdicts[S2][NEWER].state == "target"
    assert masking(flip, verdicts) == [f"could not run: {BNB}"]


def test_an_onset_on_a_config_that_ran_on_both_days_is_not_masked() -> None:
    flip, verdicts = onset(["c0"])
    assert verdicts[S2][NEWER].state == "target"
    assert masking(flip, verdicts) == []


def test_held_torch_names_the_nodes_torch_build() -> None:
    records = broken_day()
    assert held_torch(records) == "2.11.0+cu130"
    assert held_torch([*records[:-1], rec("c0", "pass", None, pin_torch="2.11.0")]) is None
    assert held_torch([]) is None


# --- signatures.classify: bitsandbytes that cannot load is a broken environment -----------------------------------


@pytest.mark.parametrize(
    ("exc_type", "message", "traceback", "signature"),
    [
        (
            "builtins.RuntimeError",
            "CUDA Setup failed despite GPU being available. Please run the following command to get more information",
            "",
            BNB,
        ),
        ("builtins.ModuleNotFoundError", "No module named 'triton.ops'", "", "bnb-needs-triton-ops"),
        (
            "builtins.AttributeError",
            "/x/bitsandbytes/libbitsandbytes_cpu.so: undefined symbol: cquantize_blockwise_bf16_nf4",
            "",
            BNB,
        ),
        (
            "builtins.RuntimeError",
            "🚨 Forgot to compile the bitsandbytes library? 🚨",
            "Traceback (most recent call last):\n  ...\nOriginal error: Configured CUDA binary not found at "
            "/x/bitsandbytes/libbitsandbytes_cuda130.so\n",
            BNB,
        ),
    ],
)
def test_bitsandbytes_that_cannot_load_is_env_broken(
    exc_type: str, message: str, traceback: str, signature: str
) -> None:
    found = classify("exception", {"exc_type": exc_type, "message": message, "traceback": traceback})
    assert (found.outcome, found.signature) == ("env-broken", signature)


def test_an_unrelated_runtime_error_stays_a_failure() -> None:
    found = classify("exception", {"exc_type": "builtins.RuntimeError", "message": "shapes (2, 3) and (4,) differ"})
    assert found.outcome == "fail"
    assert found.signature is not None and found.signature.startswith("unclassified-RuntimeError-")


def test_an_env_broken_status_keeps_the_known_name() -> None:
    detail = {"exc_type": "builtins.ModuleNotFoundError", "message": "No module named 'triton.ops'"}
    found = classify("env-broken", detail)
    assert (found.outcome, found.signature) == ("env-broken", "bnb-needs-triton-ops")
    other = classify("env-broken", {"exc_type": "builtins.ImportError", "message": "libcudart.so.12: cannot open"})
    assert (other.outcome, other.signature) == ("env-broken", "env-broken-ImportError")


# --- device_compare: where the CPU and GPU atlases disagree, and why --------------------------------------------


def cpu(config_id: str, outcome: str, signature: str | None, date: str) -> dict[str, Any]:
    return rec(config_id, outcome, signature, date, device="cpu", torch="2.4.0", pin_torch="2.4.0")


def gpu(config_id: str, outcome: str, signature: str | None, date: str) -> dict[str, Any]:
    return rec(config_id, outcome, signature, date, device="cuda")


D1, D2, D3 = "2024-02-29", "2024-06-01", "2025-11-14"
CPU_RECORDS = [
    cpu("c0", "fail", TARGET, D1),  # target on CPU ...
    cpu("c0", "fail", TARGET, D2),
    cpu("c0", "pass", None, D3),
]
GPU_RECORDS = [
    gpu("c0", "env-broken", BNB, D1),  # ... the day's bitsandbytes cannot load on the GPU
    gpu("c0", "fail", TARGET, D2),  # both show the target
    gpu("c0", "fail", TARGET, D3),  # only the GPU shows it
]


def test_disagreements_name_a_reason_per_day() -> None:
    rows = disagreements(CPU_RECORDS, GPU_RECORDS, SPECS)
    assert [(r["scenario"], r["day"]) for r in rows] == [(S2, D1), (S2, D3)]
    first, last = rows
    assert (first["cpu"], first["gpu"]) == ("target 1/1", "env-broken")
    assert first["reason"].startswith("GPU: the day's packages cannot run")
    assert BNB in first["reason"]
    assert (last["cpu"], last["gpu"]) == ("not reproduced 0/1", "target 1/1")
    assert last["reason"].startswith("GPU-only failure")
    assert "torch 2.4.0 on CPU, 2.11.0 on GPU" in last["reason"]


def test_disagreements_markdown_needs_both_sides() -> None:
    assert disagreements_markdown([], GPU_RECORDS, SPECS) == ""
    assert disagreements_markdown(CPU_RECORDS, [], SPECS) == ""
    text = disagreements_markdown(CPU_RECORDS, GPU_RECORDS, SPECS)
    assert "## Where the CPU and GPU atlases disagree" in text
    assert "2.11.0+cu130" in text
    assert text.count(f"| {S2} |") == 2


def test_the_flips_command_prints_a_gpu_runs_flips_probed_or_masked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`compat-matrix flips` on a GPU history run prints each flip of the planning round: a flip its round
    probed names what its moves found; one with no move (masked) says why it was not probed."""
    import argparse

    from harness import cli_commands
    from harness.tools.gpu_node import node_flips

    probed, masked, planned = s2_flip(), s2_flip(), s2_flip()
    masked.note = "masked by zip-length-mismatch"
    probed.moves = [{"package": "transformers", "version": "5.5.4", "probe_day": day("transformers", "5.5.4"),
                     "state": "pass"}]  # fmt: skip
    monkeypatch.setattr(
        node_flips,
        "plan_round",
        lambda run_dirs, profile, out_root, only, search, windows=False: ([probed, masked, planned], {}),
    )
    args = argparse.Namespace(results_dir=tmp_path, windows=False, from_day=None, to_day=None, bisect=False)
    profile = argparse.Namespace(name="gpu-history")
    assert cli_commands._node_flips(args, profile, [tmp_path / "gpu-history-x"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "by not named: no single package (transformers 5.5.4: passes)" in lines[0]
    assert lines[1].endswith("(masked by zip-length-mismatch; not probed)")
    assert lines[2].endswith("(its first probes are planned below)")
    assert lines[3] == "every flip of gpu-history-x is as named as its probes allow"


def test_an_ending_is_masked_only_by_failures_on_its_own_configs() -> None:
    """A target that ends on its configs while another config fails otherwise did end (S7's ZeRO-3 save on 2 GPUs,
    2024-09-26 .. 2025-03-20): the other config's failure masks nothing. A failure on the flip's own config does."""
    other = "dora-reads-sharded-lora-weight"
    records = [rec("c0", "fail", TARGET, OLDER), rec("c1", "pass", None, OLDER)]
    records += [rec("c0", "pass", None, NEWER), rec("c1", "fail", other, NEWER)]
    verdicts = dated_verdicts(records, SPECS)[2]
    ended = Flip(OLDER, NEWER, "target", "not-reproduced", scenario=S2)
    ended.config_ids = ["c0"]
    assert masking(ended, verdicts) == []
    hidden = [rec("c0", "fail", other, NEWER) if r["config_id"] == "c0" and r["pins"]["date"] == NEWER else r
              for r in records]  # fmt: skip
    assert masking(ended, dated_verdicts(hidden, SPECS)[2]) == [other]
    stored_without_configs = Flip(OLDER, NEWER, "target", "not-reproduced", scenario=S2)
    assert masking(stored_without_configs, verdicts) == [other]


def test_a_round_over_several_runs_reads_them_together_and_keeps_other_scenarios_flips(tmp_path: Path) -> None:
    """Days measured in two device calls are two runs: read together they show the flip neither shows alone, the
    newer record of a key wins (as in the table), and a round over one scenario leaves the flips another round
    filed for another scenario in flips.json."""
    import json

    from harness.tools.gpu_node.node_flips import plan_round

    def write_run(name: str, records: list[dict[str, Any]]) -> Path:
        run_dir = tmp_path / "runs" / name
        run_dir.mkdir(parents=True)
        (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run_dir / "meta.json").write_text(json.dumps({"started_at": max(r["started_at"] for r in records)}))
        return run_dir

    older = [rec("c0", "fail", TARGET, OLDER) | {"started_at": "2026-11-26T10:00:00"}]
    newer = [rec("c0", "pass", None, NEWER) | {"started_at": "2026-11-26T11:00:00"}]
    newer[0]["versions"] = newer[0]["versions"] | {"transformers": "5.5.4"}
    # An earlier record of the newer day, replaced by the newer run's: the newest record per key counts.
    stale = [rec("c0", "fail", TARGET, NEWER) | {"started_at": "2026-11-26T09:00:00"}]
    first, second = write_run("gpu-ws2-a", older + stale), write_run("gpu-ws2-b", newer)
    out_root = tmp_path / "flips"
    (out_root / "gpu-ws2-a").mkdir(parents=True)
    kept = {"older": "x", "newer": "y", "older_state": "target", "newer_state": "not-reproduced", "scenario": "S7"}
    (out_root / "gpu-ws2-a" / "flips.json").write_text(json.dumps([kept]))
    profile = load_profile("gpu-history-ws2", Path(__file__).resolve().parents[1] / "matrix")
    alone, _ = plan_round([first], profile, out_root, [S2])
    assert alone == []  # the first run alone: its newer day still fails
    flips, needed = plan_round([first, second], profile, out_root, [S2])
    assert [(f.older, f.newer, f.newer_state) for f in flips] == [(OLDER, NEWER, "not-reproduced")]
    assert needed == {S2: [f"{OLDER}+transformers-5.5.4"]}  # its first probe: the changed package moved alone
    saved = json.loads((out_root / "gpu-ws2-a" / "flips.json").read_text())
    assert [e["scenario"] for e in saved] == ["S7", S2]


def test_a_probe_resolves_against_the_first_day_that_holds_its_release() -> None:
    """A flip spanning days the profile did not run (2024-09-26 .. 2025-03-20) moves peft 0.15.0: the day after the
    older one (2024-12-07, peft 0.14.0) cannot install it; the first day holding it or later can."""
    from harness.tools.gpu_node.node_flips import release_day

    days = {
        d: {"resolved": {"peft": v}}
        for d, v in [
            ("2024-09-26", "0.13.0"),
            ("2024-12-07", "0.14.0"),
            ("2025-03-20", "0.15.0"),
            ("2025-07-04", "0.16.0"),
        ]
    }
    assert release_day(days, "2024-09-26", "peft", "0.15.0") == "2025-03-20"
    assert release_day(days, "2024-09-26", "peft", "0.14.0") == "2024-12-07"
    assert release_day(days, "2024-09-26", "peft", "0.15.1") == "2025-07-04"  # a release between two days
    # No lock day holds it (a release newer than the newest day, as the release watch moves): the day after its first
    # upload to the index (peft 0.17.0: 2025-08-01), never the newest day, whose index cannot install it.
    assert release_day(days, "2025-07-04", "peft", "0.17.0") == "2025-08-02"


def test_a_probe_profile_config_reads_back_as_itself_or_is_refused() -> None:
    """The probe profile carries the profile's own configs as TOML: each must read back with the same config id
    (else its probes would never find the flip's config); a value TOML cannot hold is refused before anything is
    written."""
    import tomllib

    from harness.planning.draws import config_id
    from harness.tools.gpu_node.node_flips import toml_inline

    config = {"engine": "fsdp2", "lora.r": 8, "targets": ["q", "v"], "wrap": {"min": 1.5}, "ok": True, "name": "é😀"}
    assert config_id(tomllib.loads(f"c = {toml_inline(config)}")["c"]) == config_id(config)
    for bad in ({"task_type": None}, {"lr": float("inf")}):
        with pytest.raises(ValueError):
            toml_inline(bad)


def test_an_ending_whose_configs_did_not_run_on_the_newer_day_is_no_evidence() -> None:
    """The newer day was measured with other configs: the flip's own config has no record there, so the target
    did not end there as far as the records show."""
    records = [rec("c0", "fail", TARGET, OLDER), rec("c1", "pass", None, NEWER)]
    ended = Flip(OLDER, NEWER, "target", "not-reproduced", scenario=S2)
    ended.config_ids = ["c0"]
    assert masking(ended, dated_verdicts(records, SPECS)[2]) == ["did not run: c0"]


def test_flips_of_several_runs_are_filed_once(tmp_path: Path) -> None:
    """A second filing of the same runs' flips under another run would show each flip twice in the table: refused,
    naming the run they are filed under, for a GPU profile's runs as for CPU runs read together."""
    import argparse

    from harness import cli_commands
    from harness.errors import UsageError

    for name in ("gpu-history-ws2-a", "gpu-history-ws2-b"):
        run_dir = tmp_path / "runs" / name
        run_dir.mkdir(parents=True)
        (run_dir / "records.jsonl").write_text(json.dumps(rec("c0", "pass", None)) + "\n")
    (tmp_path / "flips" / "gpu-history-ws2-b").mkdir(parents=True)
    (tmp_path / "flips" / "gpu-history-ws2-b" / "flips.json").write_text("[]")
    args = argparse.Namespace(
        results_dir=tmp_path, runs=["gpu-history-ws2-a", "gpu-history-ws2-b"], profile="gpu-history-ws2",
        scenario=None, again=False,
    )  # fmt: skip
    with pytest.raises(UsageError, match="filed under gpu-history-ws2-b"):
        cli_commands.flips(args)
    with pytest.raises(UsageError, match="filed under gpu-history-ws2-b"):
        cli_commands.flips(argparse.Namespace(**{**vars(args), "profile": "history"}))
