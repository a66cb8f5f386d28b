"""The configs users really run, audited: accelerate, DeepSpeed and Trainer configs from five public projects (each
with its repository, commit and the day it was read in examples/audit/configs/SOURCES.json), audited with a real
project's pins. Each is read for what it says (engine, state dict, GPUs, the Trainer's own settings), and a fix it
holds clears the failure it fixes, and only that: the same file with the fix turned off leaves it applying."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.tools.user_configs import read_setup
from tests.conftest import REPO_ROOT

CONFIGS = REPO_ROOT / "examples" / "audit" / "configs"
SOURCES = json.loads((CONFIGS / "SOURCES.json").read_text())
PINS = REPO_ROOT / "examples" / "audit" / "axolotl.requirements.txt"
OPTION = {"accelerate": "--accelerate-config", "deepspeed": "--deepspeed-config", "trainer": "--trainer-config"}
#: What each file says, in the setup vocabulary (with transformers 4.47.1, axolotl's pin, for the FSDP default).
READ = {
    "peft-fsdp_config_qlora.yaml": ({"engine": "fsdp1", "state_dict": "sharded_state_dict"}, 2),
    "peft-deepspeed_config_z3_qlora.yaml": ({"engine": "zero3", "zero3_gather_16bit": "true"}, 2),
    "axolotl-qlora-fsdp-70b.yaml": (
        {
            "loop": "trainer",
            "engine": "fsdp1",
            "state_dict": "full_state_dict",
            "use_reentrant": "true",
            "adapter": "qlora",
        },
        None,
    ),
    "llama-factory-fsdp_qlora-llama3_lora_sft.yaml": ({"loop": "trainer", "adapter": "qlora"}, None),
    "llama-factory-ds_z3_config.json": ({"engine": "zero3", "zero3_gather_16bit": "true"}, None),
    "trl-deepspeed_zero3.yaml": ({"engine": "zero3", "zero3_gather_16bit": "true"}, 8),
    "alignment-handbook-fsdp.yaml": ({"engine": "fsdp1", "state_dict": "sharded_state_dict"}, 8),
    "alignment-handbook-deepspeed_zero3.yaml": ({"engine": "zero3", "zero3_gather_16bit": "true"}, 1),
}


def _audit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", "audit", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=300)  # fmt: skip


def test_the_configs_come_from_five_public_projects_with_their_commits() -> None:
    assert len({s["repository"] for s in SOURCES}) >= 5
    for source in SOURCES:
        assert (CONFIGS / source["file"]).is_file(), source
        assert len(source["commit"]) == 40 and source["read"] and source["url"].endswith(source["path"]), source
    assert {s["file"] for s in SOURCES} == set(READ)


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s["file"])
def test_each_config_is_read_for_what_it_says(source: dict[str, str]) -> None:
    path = CONFIGS / source["file"]
    kind = source["kind"]
    user = read_setup(
        path if kind == "accelerate" else None, path if kind == "deepspeed" else None, [],
        path if kind == "trainer" else None, {"transformers": "4.47.1"},
    )  # fmt: skip
    setup, gpus = READ[source["file"]]
    assert {k: user.setup.get(k) for k in setup} == setup, user
    assert user.gpus == gpus, user


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s["file"])
def test_each_config_is_audited_with_a_real_projects_pins(source: dict[str, str]) -> None:
    done = _audit(str(PINS), OPTION[source["kind"]], str(CONFIGS / source["file"]), "--setup", "lora")
    assert done.returncode in (0, 1), done.stderr  # read: a gate answer, never "bad input"
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stdout.rstrip().splitlines()[-1].startswith(("no known failure", *"0123456789")), done.stdout


@pytest.mark.parametrize("name", ["trl-deepspeed_zero3.yaml", "peft-deepspeed_config_z3_qlora.yaml"])
def test_the_fix_a_deepspeed_config_holds_clears_what_it_fixes(tmp_path: Path, name: str) -> None:
    """zero3_save_16bit_model: true is S7's measured fix of the Trainer's ZeRO-3 FULL_STATE_DICT save: with it the
    failure is CLEARED; the same file with false leaves it APPLIES (judged as a CPU run, where it was measured)."""
    text = (CONFIGS / name).read_text()
    off = tmp_path / name
    off.write_text(text.replace("zero3_save_16bit_model: true", "zero3_save_16bit_model: false"))
    common = ["--setup", "trainer,lora", "--gpus", "0", "--format", "json"]
    on_answers = json.loads(_audit(str(PINS), "--accelerate-config", str(CONFIGS / name), *common).stdout)["answers"]
    off_answers = json.loads(_audit(str(PINS), "--accelerate-config", str(off), *common).stdout)["answers"]
    on = {a["id"]: a["state"] for a in on_answers if a["scenario"] == "S7-saved-adapter"}
    off_states = {a["id"]: a["state"] for a in off_answers if a["scenario"] == "S7-saved-adapter"}
    cleared = [i for i, s in on.items() if s == "cleared"]
    assert cleared, on
    assert any(off_states.get(i) == "applies" for i in cleared), (on, off_states)
    assert "applies" not in on.values(), on
