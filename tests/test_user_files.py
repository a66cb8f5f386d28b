"""The gate as users meet it: every file users have, read as the tools that write it read it
(`harness/tools/user_files.py`). A corpus of odd and bad files (`tests/audit_inputs/`, each with the exit and the
words `audit` must give) and Hypothesis fuzzing of each format (real files mutated, random bytes, other encodings):
never a traceback, one line and exit 2 for anything that cannot be read, never an exit 0 or 1 from it; a UTF-16
`pip freeze` is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.errors import UsageError
from harness.tools import user_configs, user_files
from tests.conftest import REPO_ROOT

CORPUS = REPO_ROOT / "tests" / "audit_inputs"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
STACK = "torch==2.11.0\ntransformers==5.14.1\npeft==0.20.0\naccelerate==1.14.0\n"
OPTION = {"accelerate": "--accelerate-config", "deepspeed": "--deepspeed-config", "trainer": "--trainer-config"}


def audit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["audit", *argv, "--results-dir", str(REPO_ROOT / "results")])
    out, err = capsys.readouterr()
    return code, out, err


def argv_for(name: str, kind: str, tmp_path: Path) -> list[str]:
    if kind in OPTION:
        stack = tmp_path / "requirements.txt"
        stack.write_text(STACK)
        return [str(stack), OPTION[kind], str(CORPUS / name), "--gpus", "2"]
    return [str(CORPUS / name)]


def test_the_corpus_is_large_and_every_format_is_in_it() -> None:
    assert len(MANIFEST) >= 40
    assert {e["as"] for e in MANIFEST.values()} == {"requirements", "lock", "accelerate", "deepspeed", "trainer"}
    assert sum(1 for e in MANIFEST.values() if e["exit"] == [2]) >= 30


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_every_odd_or_bad_file_gets_its_answer(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = MANIFEST[name]
    code, out, err = audit(capsys, *argv_for(name, entry["as"], tmp_path))
    assert code in entry["exit"], (name, code, out[-500:], err)
    if code == 2:
        assert out == "" and len(err.strip().splitlines()) == 1, (name, err)
        assert entry["says"] in err, (name, err)
    else:
        assert err == "" and entry["says"] in out, (name, out[-800:])
    if entry.get("reads"):
        found = user_files.read_pins(CORPUS / name)
        assert found.pins.items() >= entry["reads"].items(), (name, found)


def test_a_config_s_fix_clears_what_it_fixes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """stage3_gather_16bit_weights_on_model_save: true in the user's DeepSpeed JSON clears the ZeRO-3 Trainer save
    failure it fixes (measured passing wherever that failure showed); false leaves it applying."""
    stack = tmp_path / "requirements.txt"
    stack.write_text("torch==2.9.1\ntransformers==4.57.1\npeft==0.18.0\naccelerate==1.11.0\ndeepspeed==0.18.2\n")
    states = {}
    for gather in ("true", "false"):
        config = tmp_path / f"ds-{gather}.json"
        config.write_text(json.dumps({"zero_optimization": {"stage": 3,
                                      "stage3_gather_16bit_weights_on_model_save": gather == "true"}}))  # fmt: skip
        _, out, _ = audit(capsys, str(stack), "--deepspeed-config", str(config), "--setup", "trainer,lora",
                             "--gpus", "0", "--format", "json")  # fmt: skip
        found = json.loads(out)["answers"]
        states[gather] = {a["state"] for a in found if a["scenario"] == "S7-saved-adapter" and "ZeRO-3" in a["when"]}
    assert "cleared" in states["true"] and "applies" not in states["true"], states
    assert "applies" in states["false"], states


def test_num_processes_is_the_gpu_count_and_a_trainer_config_names_the_setup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accelerate = user_configs.read_accelerate(CORPUS / "acc-fsdp2-sharded.yaml")
    assert accelerate.gpus == 2 and accelerate.setup == {
        "precision": "bf16", "engine": "fsdp2", "state_dict": "sharded_state_dict"
    }  # fmt: skip
    followed = user_configs.read_accelerate(CORPUS / "acc-deepspeed-file.yaml")
    assert followed.setup == {"engine": "zero3", "zero3_gather_16bit": "true"} and followed.gpus == 2
    trainer = user_configs.read_trainer(CORPUS / "trainer-axolotl.yaml")
    assert trainer.setup == {"loop": "trainer", "engine": "fsdp2", "use_reentrant": "false", "adapter": "qlora"}
    # No FSDP version given: transformers' own default for the pinned release (FSDP2 from 5.0).
    bare = tmp_path / "trainer.yaml"
    bare.write_text("fsdp: full_shard auto_wrap\nper_device_train_batch_size: 1\n")
    assert user_configs.read_trainer(bare, {"transformers": "5.14.1"}).setup["engine"] == "fsdp2"
    assert user_configs.read_trainer(bare, {"transformers": "4.57.1"}).setup["engine"] == "fsdp1"


def test_an_environment_without_the_packages_is_no_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--python` of an interpreter that has none of torch, transformers, peft, ... (a fresh venv): exit 2 with one
    line, not a clean gate."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    code, out, err = audit(capsys, "--python", str(tmp_path / "venv" / "bin" / "python"))
    assert code == 2 and out == "" and "nothing to judge" in err and len(err.strip().splitlines()) == 1, err


#: Real files of each format, as the tools write them: what the fuzzing mutates.
SEEDS = {
    "requirements.txt": STACK.encode(),
    "uv.lock": b'version = 1\n\n[[package]]\nname = "torch"\nversion = "2.11.0"\n\n[[package]]\nname = "peft"\n'
    b'version = "0.20.0"\nsource = { registry = "https://pypi.org/simple" }\n',
    "accelerate.yaml": (CORPUS / "acc-fsdp2-sharded.yaml").read_bytes(),
    "deepspeed.json": (CORPUS / "ds-good.json").read_bytes(),
    "trainer.yaml": (CORPUS / "trainer-axolotl.yaml").read_bytes(),
}
READERS = {
    "requirements.txt": user_files.read_pins,
    "uv.lock": user_files.read_pins,
    "accelerate.yaml": user_configs.read_accelerate,
    "deepspeed.json": user_configs.read_deepspeed,
    "trainer.yaml": user_configs.read_trainer,
}


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    """A format's real file with bytes flipped, cut, inserted or re-encoded, or random bytes."""
    name = draw(st.sampled_from(sorted(SEEDS)))
    data = bytearray(SEEDS[name])
    how = draw(st.sampled_from(["flip", "cut", "insert", "utf16", "bom", "random"]))
    if how == "random":
        return name, draw(st.binary(max_size=300))
    if how == "utf16":
        return name, b"\xff\xfe" + bytes(data).decode().encode("utf-16-le")
    if how == "bom":
        return name, b"\xef\xbb\xbf" + bytes(data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if how == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif how == "cut":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return name, bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutated())
def test_no_file_breaks_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: tuple[str, bytes]) -> None:
    """Whatever the bytes: no traceback; exit 2 with one line exactly where the reader refuses the file, else the
    judge's 0 or 1."""
    name, data = case
    path = tmp_path / name
    path.write_bytes(data)
    try:
        READERS[name](path)
        readable = True
    except UsageError:
        readable = False
    kind = {"requirements.txt": "requirements", "uv.lock": "lock", "accelerate.yaml": "accelerate",
            "deepspeed.json": "deepspeed", "trainer.yaml": "trainer"}[name]  # fmt: skip
    argv = [str(path)] if kind in ("requirements", "lock") else argv_for(path.name, kind, tmp_path)
    if kind not in ("requirements", "lock"):
        argv[2] = str(path)
    code, out, err = audit(capsys, *argv)
    if readable:
        assert code in (0, 1), (name, data[:80], err)
    else:
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (name, data[:80], err)
