"""`bisect-script --device cuda` end to end on this machine: the connected side plans rounds over an era-locked
profile (real uv resolutions, real wheels in a real pack), a "node" (this python, nothing from an index) runs each
round with `bisect-script-node`, and the runs come back with `--node-runs` until the verdict.

The script fails from packaging 22.0 (parse() of a non-PEP 440 string), the lock's days hold packaging 21.3 and 23.0.
What the GPU flow adds is checked as a user sees it: the release named, the rounds it took, a round cut short by its
time limit and finished by the next, runs never repeated, the device calls in the verdict's cost.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_script_bisect import BREAKS_AT_22

PROFILE = """
[profile]
description = "a stand-in GPU atlas: two days of packaging over this machine's python"
python = "{python}"
device = "cpu"
world_size = 1
scenarios = ["S3-*"]
examples_per_scenario = 0
hypothesis_seed = 1
hypothesis_profile = "ci"

[axes]
date = ["2022-06-01", "2023-02-01"]

[stacks.era]
peft = "latest"

[install]
mode = "system"
node_image = "here"
era_packages = ["packaging"]
"""


@pytest.fixture(autouse=True)
def _own_stack_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test plans with a cache of resolved stacks of its own (the user's stays untouched)."""
    monkeypatch.setenv("COMPAT_MATRIX_PLAN_CACHE", str(tmp_path / "stack-cache"))


def test_a_stack_is_resolved_once_and_then_taken_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning resolves each stack with uv (about 20 s each); the same request in a later round or another folder
    is read back from the cache, and a failed resolution is not kept (it may be the index's of the moment)."""
    from harness.define.profile import load_profile
    from harness.tools.gpu_node import node_script
    from harness.versions import lock as era_lock

    atlas = node_script.NodeAtlas.of(load_profile("standin", _atlas(tmp_path).parent))
    calls = []

    def resolve_probe(uv, pins, day, newer, package, version, python, held, extra):
        calls.append((package, version))
        if version == "0.0":
            raise era_lock.ResolutionFailed("no such release")
        return {"packaging": version}, "older-dependencies"

    monkeypatch.setattr(era_lock, "resolve_probe", resolve_probe)
    monkeypatch.setattr(era_lock, "index_requires", lambda url: lambda name, version: [])
    resolve = node_script._probe_resolver(atlas, ())
    request = {"day": "2022-06-01", "newer": "2023-02-01", "package": "packaging", "version": "22.0"}
    first = resolve(request)
    assert resolve(dict(request)) == first and calls == [("packaging", "22.0")]
    assert node_script._probe_resolver(atlas, ())(request) == first and len(calls) == 1  # a new plan: still cached
    failed = request | {"version": "0.0"}
    assert "error" in resolve(failed) and "error" in resolve(failed) and len(calls) == 3


def _node_torch() -> str:
    """This python's torch, as the stand-in node's (a node refuses a plan resolved over another torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "2.4.1"


def _atlas(tmp_path: Path) -> Path:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    matrix = tmp_path / "matrix"
    (matrix / "locks").mkdir(parents=True)
    (matrix / "nodes").mkdir()
    (matrix / "standin.toml").write_text(PROFILE.format(python=python))
    image = {"python": f"{python}.0", "torch": _node_torch(), "cuda": "", "packages": {}}
    (matrix / "nodes" / "here.json").write_text(json.dumps(image))
    day = {
        "2022-06-01": {"packaging": "21.3", "pyparsing": "3.0.9"},
        "2023-02-01": {"packaging": "23.0"},
    }
    lock = {
        "lock_version": 1,
        "requirements": ["packaging"],
        "era_packages": ["packaging"],
        "held": {"torch": image["torch"]},
        "node": {"python": image["python"], "torch": image["torch"], "cuda": ""},
        "days": {d: {"resolved": r, "overlay": r} for d, r in day.items()},
    }
    (matrix / "locks" / "standin.json").write_text(json.dumps(lock))
    return matrix / "standin.toml"


def _harness(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.matrix
def test_a_gpu_bisect_runs_in_planned_rounds_and_names_the_release(tmp_path: Path) -> None:
    profile = _atlas(tmp_path)
    script = tmp_path / "parse_legacy.py"
    script.write_text(BREAKS_AT_22)
    results = tmp_path / "results"
    folder = results / "script-bisect" / "legacy"
    plan_args = ["bisect-script", str(script), "--device", "cuda", "--profile", str(profile), "--name", "legacy",
                 "--results-dir", str(results)]  # fmt: skip
    rounds = []
    out = None
    for number in range(1, 6):
        pack = tmp_path / f"round{number}.tar.xz"
        said = _harness(*plan_args, "--pack", str(pack), *(["--node-runs", str(out)] if out else [])).stdout
        if (folder / "verdict.json").is_file():
            break
        plan = json.loads((folder / "node-plan.json").read_text())
        rounds.append(plan["pack"]["stacks"])
        if number == 1:  # asked again before the node ran: the same round and pack, not a new one
            again = _harness(*plan_args, "--pack", str(pack)).stdout
            assert "round 1:" in again and json.loads((folder / "node-plan.json").read_text())["round"] == 1
        assert "scripts/gpu-script-bisect.sh" in said and "--node-runs" in said
        out = tmp_path / f"out{number}"
        limit = ["--time-limit", "0"] if number == 1 else []  # the first call's time is spent before it starts
        node = _harness("bisect-script-node", str(folder), "--wheels", str(pack), "--out", str(out), *limit)
        out = out / "legacy"
        call = json.loads((out / "call.json").read_text())
        if number == 1:
            assert call["runs"] == 0 and "time is spent" in node.stdout
    verdict = json.loads((folder / "verdict.json").read_text())
    flip = verdict["flips"][0]
    assert (flip["package"], flip["first_release"], flip["last_release_before"]) == ("packaging", "22.0", "21.3")
    # The first round carries the scan and what the search needs if the two days differ (the move, then its sweep
    # points): the cut-short round is planned again as it was, and the next call ends the verdict.
    assert rounds[0] == rounds[1] == ["2022-06-01", "2023-02-01", "2022-06-01 + packaging==23.0",
                                      "2022-06-01 + packaging==22.0"], rounds  # fmt: skip
    assert len(rounds) == 2, rounds
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]
    assert len({r["key"] for r in runs}) == len(runs) == 4  # 2 days, 1 move, 1 sweep point: nothing twice
    n = len(flip["candidates"])
    assert verdict["cost"]["runs_after_scan"] <= math.ceil(math.log2(n)) + 3
    assert len(verdict["device_calls"]) == 2 and verdict["device_seconds"] > 0
    assert verdict["device"]["kind"] in ("cpu", "unknown", "cuda")
    assert "since packaging 22.0 (last good: 21.3)" in (folder / "issue.md").read_text()


def test_committed_gpu_verdicts_ran_on_a_node_and_name_a_release() -> None:
    """The GPU verdicts under results/script-bisect/: their runs ran on CUDA, each names a package and release
    within the bound of its search after the scan (a binary search's ceil(log2 n) + 3, a sweep's own bound plus the
    moves), and the device calls' time is in the verdict."""
    root = Path(__file__).resolve().parent.parent / "results" / "script-bisect"
    named = []
    for path in sorted(root.glob("*/verdict.json")):
        verdict = json.loads(path.read_text())
        if (verdict.get("device") or {}).get("kind") != "cuda":
            continue
        runs = [json.loads(line) for line in (path.parent / "runs.jsonl").read_text().splitlines()]
        assert all(r["stack"]["device"]["kind"] == "cuda" for r in runs if r["outcome"] != "install-failed")
        calls = verdict["device_calls"]
        assert verdict["device_seconds"] == round(sum(c["wall_s"] for c in calls), 1) > 0
        assert sum(c["runs"] for c in calls) == verdict["cost"]["runs"] == len(runs)
        for flip in verdict["flips"]:
            if flip["package"]:
                assert flip["first_release"]
                n = len(flip["candidates"])
                bound = flip["sweep"]["bound"] - 2 if flip.get("sweep") else math.ceil(math.log2(n))
                assert verdict["cost"]["runs_after_scan"] <= bound + len(flip["moves"]) + 1
                named.append(path.parent.name)
    assert len(named) >= 2, named


@pytest.mark.matrix
def test_a_scripts_own_dependencies_are_resolved_into_every_planned_stack(tmp_path: Path) -> None:
    """A PEP 723 dependency no GPU day holds (six) is resolved with each day's and each probe's stack, as the
    index had it then, and installed on the node beside them."""
    profile = _atlas(tmp_path)
    script = tmp_path / "with_six.py"
    script.write_text(
        BREAKS_AT_22.replace('["packaging"]', '["packaging", "six"]').replace(
            "from packaging", "import six  # noqa\nfrom packaging"
        )
    )
    results = tmp_path / "results"
    folder = results / "script-bisect" / "six"
    out = None
    for number in range(1, 5):
        plan_args = ["bisect-script", str(script), "--device", "cuda", "--profile", str(profile), "--name", "six",
                     "--results-dir", str(results), "--pack", str(tmp_path / f"r{number}.tar.xz")]  # fmt: skip
        _harness(*plan_args, *(["--node-runs", str(out)] if out else []))
        if (folder / "verdict.json").is_file():
            break
        _harness("bisect-script-node", str(folder), "--wheels", str(tmp_path / f"r{number}.tar.xz"), "--out",
                 str(tmp_path / f"o{number}"))  # fmt: skip
        out = tmp_path / f"o{number}" / "six"
    plan = json.loads((folder / "node-plan.json").read_text())
    assert plan["extra"] == ["six"]
    assert all("six" in entry["overlay"] for entry in plan["stacks"].values() if not entry.get("error"))
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]
    assert all("six" in r["stack"]["versions"] for r in runs)
    flip = json.loads((folder / "verdict.json").read_text())["flips"][0]
    assert (flip["package"], flip["first_release"]) == ("packaging", "22.0")


def test_a_bitsandbytes_without_a_library_for_this_cuda_is_unusable_not_a_different_failure(tmp_path: Path) -> None:
    """bitsandbytes >= 0.46 raises with a banner whose first line names no cause: a run is named on its whole text,
    and a run recorded before that is judged on its whole text again (unusable, never a different failure)."""
    from harness.execution.script_launch import run_script
    from harness.recording.signatures import cannot_run_here

    script = tmp_path / "bnb_banner.py"
    script.write_text(
        'raise RuntimeError("\\n🚨 Forgot to compile the bitsandbytes library? 🚨\\n"\n'
        '                   "Original error: Configured CUDA binary not found at /x/libbitsandbytes_cuda130.so")\n'
    )
    run = run_script(Path(sys.executable), script, timeout_s=60)
    assert (run.outcome, run.signature) == ("fail", "bnb-no-library-for-this-cuda"), (run.signature, run.error)
    error = "RuntimeError: 🚨 Forgot to compile the bitsandbytes library? 🚨"
    assert cannot_run_here("unclassified-RuntimeError-eb206b44", error, run.stderr_tail)
    assert not cannot_run_here(None, "RuntimeError: element 0 of tensors does not require grad", "Traceback ...")


@pytest.mark.matrix
def test_one_pack_carries_the_rounds_of_two_folders_for_one_call(tmp_path: Path) -> None:
    """bisect-script-pack: two scripts' planned rounds in one pack; the node runs each folder from it."""
    profile = _atlas(tmp_path)
    results = tmp_path / "results"
    folders = []
    for name, text in (("legacy", BREAKS_AT_22), ("passes", "print('fine')\n")):
        script = tmp_path / f"{name}.py"
        script.write_text(text)
        _harness("bisect-script", str(script), "--device", "cuda", "--profile", str(profile), "--name", name,
                 "--results-dir", str(results), "--pack", str(tmp_path / f"{name}.tar.xz"))  # fmt: skip
        folders.append(results / "script-bisect" / name)
    pack = tmp_path / "both.tar.xz"
    said = _harness("bisect-script-pack", str(pack), *map(str, folders)).stdout
    assert said.count("scripts/gpu-script-bisect.sh") == 2
    for folder in folders:
        _harness("bisect-script-node", str(folder), "--wheels", str(pack), "--out", str(tmp_path / "out"))
        runs = (tmp_path / "out" / folder.name / "runs.jsonl").read_text().splitlines()
        # the scan, and where its two days differ (the legacy script) the move and sweep point the round carried
        further = {"2022-06-01 + packaging==23.0", "2022-06-01 + packaging==22.0"} if folder.name == "legacy" else set()
        assert {json.loads(r)["label"] for r in runs} == {"2022-06-01", "2023-02-01", *further}
        assert all(json.loads(r)["outcome"] != "install-failed" for r in runs)
    missing = _harness_fails("bisect-script-pack", str(pack), str(tmp_path / "nowhere"))
    assert "no node-plan.json" in missing


def _harness_fails(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    return proc.stderr


@pytest.mark.matrix
def test_a_failed_install_on_the_node_is_that_stacks_run_and_a_changed_launch_plans_anew(tmp_path: Path) -> None:
    """A stack whose install fails on the node is recorded under its own identity: the planner takes it as run
    (unusable) instead of asking for it again; a changed --match plans anew, and the old plan's node folder is
    then refused."""
    from harness.environments.wheel_pack import unpack

    profile = _atlas(tmp_path)
    script = tmp_path / "legacy.py"
    script.write_text(BREAKS_AT_22)
    results = tmp_path / "results"
    folder = results / "script-bisect" / "legacy"
    plan_args = ["bisect-script", str(script), "--device", "cuda", "--profile", str(profile), "--name", "legacy",
                 "--results-dir", str(results)]  # fmt: skip
    _harness(*plan_args, "--pack", str(tmp_path / "r1.tar.xz"))
    wheels = tmp_path / "wheels"
    unpack(tmp_path / "r1.tar.xz", wheels)
    for wheel in wheels.glob("packaging-23.0-*.whl"):
        wheel.unlink()  # the newer day cannot install on the node
    _harness("bisect-script-node", str(folder), "--wheels", str(wheels), "--out", str(tmp_path / "o1"))
    said = _harness(*plan_args, "--node-runs", str(tmp_path / "o1" / "legacy")).stdout
    verdict = json.loads((folder / "verdict.json").read_text())
    assert [s["state"] for s in verdict["scan"]] == ["pass", "unusable"], said
    assert verdict["flips"] == [] and "round 2" not in said
    first_plan = json.loads((folder / "node-plan.json").read_text())["plan_id"]
    said = _harness(*plan_args, "--match", "InvalidVersion", "--pack", str(tmp_path / "r2.tar.xz")).stdout
    assert "the launch changed" in said and "match None -> InvalidVersion" in said
    assert json.loads((folder / "node-plan.json").read_text())["plan_id"] != first_plan
    refused = _harness_fails(*plan_args, "--match", "InvalidVersion", "--node-runs", str(tmp_path / "o1" / "legacy"))
    assert "another plan" in refused


def test_a_round_pins_only_the_era_packages_the_script_can_reach() -> None:
    """A GPU round resolves and packs what the script can reach (issue 53): a Trainer + LoRA script pins
    transformers, peft and accelerate, never DeepSpeed's or bitsandbytes' wheels; a BitsAndBytesConfig or a
    `deepspeed=` brings them in; a package the table does not know (packaging) is always planned."""
    from dataclasses import replace

    from harness.tools.gpu_node.node_script import NodeAtlas, script_needs

    trainer = "from transformers import Trainer, TrainingArguments\nfrom peft import LoraConfig\n"
    assert script_needs(trainer) == {"transformers", "peft", "accelerate"}
    qlora = trainer + "cfg = BitsAndBytesConfig(load_in_4bit=True)\n"
    assert "bitsandbytes" in script_needs(qlora) and "deepspeed" not in script_needs(qlora)
    assert "deepspeed" in script_needs(trainer + "args = TrainingArguments(deepspeed='ds.json')\n")
    atlas = NodeAtlas(None, {"requirements": ["transformers", "peft", "accelerate", "deepspeed", "bitsandbytes"]}, {})  # type: ignore[arg-type]
    profile = type(
        "P", (), {"era_packages": ("transformers", "peft", "accelerate", "bitsandbytes", "deepspeed", "packaging")}
    )()
    atlas = replace(atlas, profile=profile, lock={"requirements": [*atlas.lock["requirements"], "packaging"]})
    assert replace(atlas, needed=script_needs(trainer)).axis == ["transformers", "peft", "accelerate", "packaging"]
    assert atlas.axis == ["transformers", "peft", "accelerate", "bitsandbytes", "deepspeed", "packaging"]


def test_a_scan_day_overlays_only_what_the_script_can_reach_at_the_days_own_versions() -> None:
    """The scan's days are the era lock's own resolutions, but the node gets only the reachable packages and what
    they require (issue 53: a Trainer + LoRA script's first round built and packed three DeepSpeed wheels)."""
    from dataclasses import replace

    from harness.tools.gpu_node.node_script import NodeAtlas, day_entry, script_needs

    resolved = {"transformers": "4.57.1", "peft": "0.18.0", "accelerate": "1.11.0", "deepspeed": "0.18.2"}
    resolved |= {"hjson": "3.1.0", "safetensors": "0.6.2"}
    needs = {"transformers": ["safetensors>=0.4.3"], "deepspeed": ["hjson", "torch"]}
    profile = type("P", (), {"era_packages": ("transformers", "peft", "accelerate", "deepspeed", "bitsandbytes")})()
    lock = {"requirements": list(profile.era_packages), "days": {"2025-11-14": {"resolved": resolved, "overlay": {}}}}
    lock["days"]["2025-11-14"]["overlay"] = {n: v for n, v in resolved.items()}
    atlas = NodeAtlas(profile, lock, {"packages": {"torch": "2.11.0"}, "python": "3.12.3"})  # type: ignore[arg-type]
    trainer = replace(atlas, needed=script_needs("from transformers import Trainer\nfrom peft import LoraConfig\n"))
    entry = day_entry(trainer, "2025-11-14", lambda name, version: needs.get(name, []))
    reached = {"accelerate": "1.11.0", "peft": "0.18.0", "safetensors": "0.6.2", "transformers": "4.57.1"}
    assert entry["overlay"] == reached and entry["resolved"] == resolved
    assert day_entry(atlas, "2025-11-14", lambda name, version: [])["overlay"] == resolved  # every package: the lock's
