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

from harness.tools.user_files.user_configs import read_setup
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
    # axolotl's FSDP2: fsdp_version at the top (no fsdp: key) or in fsdp_config; its DeepSpeed JSONs write DeepSpeed's
    # field name gather_16bit_weights_on_model_save, which is stage3_gather_16bit_weights_on_model_save
    "axolotl/examples/deepseek-v4/v4-flash-nvfp4-lora.yaml": (
        {
            "loop": "trainer",
            "engine": "fsdp2",
            "state_dict": "sharded_state_dict",
            "use_reentrant": "false",
            "adapter": "lora",
        },
        None,
    ),
    "axolotl/examples/glm47-flash/qlora_fsdp.yaml": (
        {"loop": "trainer", "engine": "fsdp2", "state_dict": "full_state_dict", "adapter": "qlora"},
        None,
    ),
    "axolotl/examples/llama-3/lora-1b-ray.yml": (
        {"loop": "trainer", "engine": "zero3", "zero3_gather_16bit": "true", "adapter": "lora"},
        None,
    ),
    "axolotl/deepspeed_configs/zero3.json": ({"engine": "zero3", "zero3_gather_16bit": "true"}, None),
    "axolotl/deepspeed_configs/zero3_bf16.json": ({"engine": "zero3", "zero3_gather_16bit": "true"}, None),
    # LLaMA-Factory's deepspeed path is relative to its root, where training starts
    "llama-factory/examples/train_lora/qwen3_lora_sft_ds3.yaml": (
        {"loop": "trainer", "engine": "zero3", "zero3_gather_16bit": "true", "adapter": "lora"},
        None,
    ),
    "llama-factory/examples/deepspeed/ds_z3_config.json": ({"engine": "zero3", "zero3_gather_16bit": "true"}, None),
    # TRL's own flags for a QLoRA: use_peft with load_in_4bit
    "alignment-handbook/recipes/zephyr-7b-beta/sft/config_qlora.yaml": (
        {"loop": "trainer", "use_reentrant": "false", "adapter": "qlora"},
        None,
    ),
    "trl/examples/accelerate_configs/fsdp2.yaml": ({"engine": "fsdp2", "state_dict": "full_state_dict"}, 8),
    "accelerate/examples/config_yaml_templates/fsdp.yaml": ({"engine": "fsdp1", "state_dict": "sharded_state_dict"}, 2),
    "accelerate/examples/config_yaml_templates/deepspeed.yaml": ({"engine": "zero1"}, 2),
    "accelerate/examples/deepspeed_config_templates/zero_stage1_config.json": ({"engine": "zero1"}, None),
}
#: What the command line must say it read from each, in its one line per config.
SAYS = {
    "axolotl/examples/deepseek-v4/v4-flash-nvfp4-lora.yaml": "as an axolotl config: loop=trainer, engine=fsdp2",
    "axolotl/deepspeed_configs/zero3_bf16.json": "DeepSpeed's name of stage3_gather_16bit_weights_on_model_save",
    "llama-factory/examples/train_lora/qwen3_lora_sft_ds3.yaml": "read examples/deepspeed/ds_z3_config.json as a "
    "DeepSpeed JSON: engine=zero3, zero3_gather_16bit=true",
}


def _audit(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", "audit", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)  # fmt: skip


def _where(source: dict[str, str]) -> tuple[Path, Path]:
    """(where training starts, the config's path from there): a project's root for a config that names another file
    relative to it, else this checkout's root."""
    cwd = CONFIGS / source["cwd"] if source.get("cwd") else REPO_ROOT
    return cwd, (CONFIGS / source["file"]).relative_to(cwd)


def test_the_configs_come_from_five_public_projects_with_their_commits() -> None:
    assert len({s["repository"] for s in SOURCES}) >= 6
    projects = {"axolotl-ai-cloud/axolotl", "hiyouga/LLaMA-Factory", "huggingface/trl",
                "huggingface/alignment-handbook", "huggingface/accelerate"}  # fmt: skip
    assert projects <= {s["repository"] for s in SOURCES}
    for source in SOURCES:
        assert (CONFIGS / source["file"]).is_file(), source
        assert len(source["commit"]) == 40 and source["read"] and source["url"].endswith(source["path"]), source
    assert {s["file"] for s in SOURCES} == set(READ)


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s["file"])
def test_each_config_is_read_for_what_it_says(source: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    cwd, path = _where(source)
    monkeypatch.chdir(cwd)
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
    cwd, path = _where(source)
    done = _audit(str(PINS), OPTION[source["kind"]], str(path), "--setup", "lora", cwd=cwd)
    assert done.returncode in (0, 1), done.stderr  # read: a gate answer, never "bad input"
    assert "Traceback" not in done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("read ")]
    assert said[1].startswith(f"read {path} as "), said  # one line a config, the pins' file first
    if source.get("follows"):  # the file it names, read from where training starts, said in a line of its own
        assert any(line.startswith(f"read {source['follows']} as a DeepSpeed JSON") for line in said), said
    assert SAYS.get(source["file"], "") in "\n".join(said), said
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
