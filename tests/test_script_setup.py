"""A user's script run records what really ran, measured inside its own ranks, never what the script declares.

These tests exist because a verdict once called a script "FSDP1" that named no FSDP version: on transformers 5.x
the Trainer then runs FSDP2. The probe (runtime/script_probe/sitecustomize.py) watches each rank: device, GPUs,
the process group's world size and backend, and what accelerate's `prepare` resolved and really wrapped. The real
run here trains through accelerate at 2 ranks with gloo (marked `matrix`: it builds a torch environment).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from harness.execution.script_launch import measured_setup, run_script
from harness.publishing.upstream import setup_words


def test_a_script_that_imports_no_torch_runs_unchanged_and_measures_no_device(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import sys\nprint('hello')\nsys.exit(3)\n")
    found = run_script(Path(sys.executable), script, timeout_s=60)
    assert (found.outcome, found.exit_code) == ("fail", 3)  # the probe changes nothing the script does
    assert found.setup == {"ranks_reporting": 1}
    assert setup_words(found.setup) == "no torch imported, no process group seen"


def test_the_whole_failure_text_is_kept_beside_its_first_line(tmp_path: Path) -> None:
    script = tmp_path / "long.py"
    script.write_text("raise RuntimeError('first line\\nsecond line\\nthird line')\n")
    found = run_script(Path(sys.executable), script, timeout_s=60)
    assert found.error == "RuntimeError: first line"
    assert found.error_text == "RuntimeError: first line\nsecond line\nthird line"


def test_what_prepare_returns_as_a_list_is_looked_at_too(tmp_path: Path) -> None:
    """accelerate's FSDP2 path returns `prepare(model, optimizer)` as a list, not a tuple: the probe once looked at
    the list itself and saw no wrapper, so the Trainer's FSDP2 runs read 'not wrapped'. A stand-in `accelerate`
    (accelerate's FSDP2 path needs GPUs) returns a list holding an engine the probe knows by its class name."""
    package = tmp_path / "site" / "accelerate"
    package.mkdir(parents=True)
    package.joinpath("__init__.py").write_text("from .accelerator import Accelerator\n")
    package.joinpath("accelerator.py").write_text(
        "class DeepSpeedEngine:\n    pass\n\n\n"
        "class Accelerator:\n    def prepare(self, *args):\n        return [DeepSpeedEngine(), object()]\n"
    )
    script = tmp_path / "prepare_list.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(package.parent)!r})\nimport accelerate\n"
                      "accelerate.Accelerator().prepare('model', 'optimizer')\n")  # fmt: skip
    found = run_script(Path(sys.executable), script, timeout_s=60)
    assert found.outcome == "pass", found.stderr_tail
    assert found.setup.get("wrapped_by") == "deepspeed", found.setup


def test_ranks_that_disagree_are_all_listed_and_what_nobody_measured_is_absent(tmp_path: Path) -> None:
    prepare = {"distributed_type": "FSDP", "fsdp_plugin_version": 2, "state_dict_type": "FULL_STATE_DICT"}
    for rank, wrapped in (("0", "fsdp2"), ("1", "fsdp1")):
        device = {"kind": "cuda", "gpu_count": 2, "gpu_names": ["NVIDIA H200"], "world_size": 2, "backend": "nccl"}
        saves = [{"state_dict_type": "FULL_STATE_DICT"}]
        facts = {
            "device": device,
            "accelerate": {"prepare": [prepare | {"wrapped_by": [wrapped]}], "get_state_dict": saves},
        }
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(facts))
    setup = measured_setup(tmp_path)
    assert setup["wrapped_by"] == ["fsdp1", "fsdp2"] and setup["world_size"] == 2
    assert setup["state_dict_type_at_save"] == "FULL_STATE_DICT" and "zero_stage" not in setup
    assert setup_words(setup) == (
        "cuda, 2 x NVIDIA H200 visible, world size 2 (nccl); accelerate FSDP: wrapped by fsdp1 / fsdp2, "
        "FSDP plugin version 2, state dict FULL_STATE_DICT, at save FULL_STATE_DICT"
    )
    assert measured_setup(tmp_path / "none") == {}
    assert setup_words({}) == "setup not measured (the run predates measuring it)"


ACCELERATE_AT_TWO_RANKS = textwrap.dedent(
    """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=CPU)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = model(torch.ones(2, 4)).sum()
    accelerator.backward(loss)
    optimizer.step()
    accelerator.get_state_dict(model)
    accelerator.wait_for_everyone()
    """
)


@pytest.mark.matrix
def test_a_real_accelerate_run_at_two_ranks_measures_what_ran(tmp_path: Path) -> None:
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.paths import MATRIX_DIR
    from harness.tools.script_verdicts.script_stacks import pinned_stack

    ci = load_profile("ci", MATRIX_DIR)
    pins = {"torch": ci.axes["torch"][0], "accelerate": "1.15.0"}
    stack = pinned_stack(ci, "accelerate", pins, [], InstallOptions(envs_dir=default_envs_dir()))
    assert stack.python is not None, stack.failure
    measured = {}
    for cpu in (False, True):
        script = tmp_path / f"two_ranks_{cpu}.py"
        script.write_text(f"CPU = {cpu}\n" + ACCELERATE_AT_TWO_RANKS)
        found = run_script(stack.python, script, nproc=2, timeout_s=300)
        assert found.outcome == "pass", found.stderr_tail
        measured[cpu] = found.setup
    # What the script asked for is not what ran: at 2 ranks on CPU, accelerate 1.15 forms the group (made without
    # a backend: 'cpu:gloo') but distributes nothing unless told `cpu=True`; then DDP over gloo wraps the model.
    plain, cpu = measured[False], measured[True]
    assert plain["ranks_reporting"] == 2 and plain["device"] == "cpu" and plain["world_size"] == 2
    assert (plain["backend"], plain["distributed_type"], "wrapped_by" in plain) == ("cpu:gloo", "NO", False)
    assert (cpu["backend"], cpu["distributed_type"], cpu["wrapped_by"], cpu["world_size"]) == (
        "gloo",
        "MULTI_CPU",
        "ddp",
        2,
    )
    assert "gpu_count" not in cpu and "fsdp_plugin_version" not in cpu


#: GPU verdicts whose runs predate measuring setup and could not be made again here: each needs the machine named.
NOT_YET_MEASURED: dict[str, str] = {}


def test_every_committed_script_verdict_states_what_its_runs_measured() -> None:
    """Every run of a committed verdict carries the setup its ranks measured; the GPU verdicts not yet made again
    are named here with the machine they need, and say 'not measured' wherever their runs are shown."""
    from harness.paths import RESULTS_DIR

    for path in sorted((RESULTS_DIR / "script-bisect").glob("*/verdict.json")):
        verdict = json.loads(path.read_text())
        runs = [*verdict["scan"], *(m for f in verdict["flips"] for m in [*f["moves"], *f["bisect_runs"]])]
        ran = [r for r in runs if r.get("outcome") not in ("install-failed", "skip")]
        name = path.parent.name
        if name in NOT_YET_MEASURED:
            assert not any(r.get("setup") for r in ran), f"{name} is measured now: drop it from NOT_YET_MEASURED"
            continue
        assert ran and all(r.get("setup", {}).get("ranks_reporting") for r in ran), name
        # Where accelerate prepared an FSDP plugin, what really wrapped the model was seen (FSDP2's too).
        assert all(r["setup"].get("wrapped_by") for r in ran if r["setup"].get("fsdp_plugin_version")), name
        if verdict["nproc"] > 1:
            assert all(r["setup"].get("world_size") == verdict["nproc"] for r in ran if r["outcome"] == "pass"), name
