"""The page reads a pasted config as `audit` reads the file: the same setup and GPU count, or both refuse it. Over the
real configs of five projects, the bad-input corpus and configs Hypothesis writes (PyYAML's block style, the values
users put there: yes/no, auto, numbers as text, nulls, lists), site_config.js under node against user_configs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import UsageError
from harness.tools.user_files.user_configs import read_accelerate, read_deepspeed, read_trainer
from harness.tools.user_files.user_text import read_text
from tests.conftest import REPO_ROOT, run_node

SITE_CONFIG = REPO_ROOT / "harness" / "publishing" / "site_config.js"
CORPUS = REPO_ROOT / "tests" / "audit_inputs"
EXAMPLES = REPO_ROOT / "examples" / "audit" / "configs"
PINS = {"transformers": "5.14.1"}
READERS = {"accelerate": read_accelerate, "deepspeed": read_deepspeed, "trainer": lambda p: read_trainer(p, PINS)}


def python_read(path: Path, kind: str) -> dict[str, Any]:
    try:
        found = READERS[kind](path)
    except UsageError:
        return {"refused": True}
    return {"setup": found.setup, "gpus": found.gpus}


def node_read(tmp_path: Path, cases: list[tuple[str, str]]) -> list[dict[str, Any]]:
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    script = (
        "const c = require(process.argv[1]); const cases = require(process.argv[2]);"
        f"const pins = {json.dumps(PINS)};"
        "process.stdout.write(JSON.stringify(cases.map(([text, kind]) => {"
        " try { const r = c.readConfig(text, kind, pins); return { setup: r.setup, gpus: r.gpus }; }"
        " catch (e) { if (e instanceof c.NotRead) return { refused: true }; throw e; } })));"
    )
    return run_node(script, str(SITE_CONFIG), str(tmp_path / "cases.json"), timeout=300)


def node_parse(tmp_path: Path, text: str) -> Any:
    (tmp_path / "doc.json").write_text(json.dumps(text))
    script = (
        "const c = require(process.argv[1]);"
        "process.stdout.write(JSON.stringify(c.parseYaml(require(process.argv[2]))));"
    )
    return run_node(script, str(SITE_CONFIG), str(tmp_path / "doc.json"), timeout=120)


def _files() -> list[tuple[Path, str]]:
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    found = [(CORPUS / name, entry["as"]) for name, entry in sorted(manifest.items())
             if entry["as"] in READERS and "file" not in name and "ds-file" not in name]  # fmt: skip
    sources = json.loads((EXAMPLES / "SOURCES.json").read_text())
    return found + [(EXAMPLES / s["file"], s["kind"]) for s in sources if not s.get("follows")]  # it opens no file


def test_the_page_reads_every_real_and_odd_config_as_audit_does(tmp_path: Path) -> None:
    names, cases, expected = [], [], []
    for path, kind in _files():
        try:
            text = read_text(path)
        except UsageError:
            continue  # not text: the page never gets it as a paste
        names.append(path.name)
        cases.append((text, kind))
        expected.append(python_read(path, kind))
    found = node_read(tmp_path, cases)
    assert len(cases) >= 20 and sum("refused" in e for e in expected) >= 8, len(cases)
    for name, mine, theirs in zip(names, expected, found, strict=True):
        assert theirs == mine, name
    for name in ("axolotl-qlora-fsdp-70b.yaml", "llama-factory-fsdp_qlora-llama3_lora_sft.yaml"):  # the whole file
        text = (EXAMPLES / name).read_text()
        assert node_parse(tmp_path, text) == json.loads(json.dumps(yaml.safe_load(text))), name
    assert node_read(tmp_path, [((EXAMPLES / "trl-deepspeed_zero3.yaml").read_text(), "auto")])[0] == {
        "setup": {"precision": "fp16", "engine": "zero3", "zero3_gather_16bit": "true"}, "gpus": 8,
    }  # the kind told from the text  # fmt: skip


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-1, 9), st.sampled_from(["yes", "no", "auto", "on", "3", "2", "true", "x"]),
    st.sampled_from(["FULL_STATE_DICT", "sharded_state_dict", "LOCAL_STATE_DICT", "bf16", "fp16", "no", "fp8"]),
)  # fmt: skip
FSDP_KEYS = ["fsdp_version", "fsdp_state_dict_type", "fsdp_offload_params"]
DEEPSPEED_KEYS = ["zero_stage", "zero3_save_16bit_model", "zero3_init_flag"]
ACCELERATE = st.fixed_dictionaries(
    {"distributed_type": st.sampled_from(["FSDP", "DEEPSPEED", "MULTI_GPU", "NO", "fsdp", "TPU"])},
    optional={
        "num_processes": VALUES,
        "mixed_precision": VALUES,
        "fsdp_config": st.dictionaries(st.sampled_from(FSDP_KEYS), VALUES, max_size=3),
        "deepspeed_config": st.dictionaries(st.sampled_from(DEEPSPEED_KEYS), VALUES, max_size=3),
        "tpu_env": st.just([]),
    },
)
TRAINER_FSDP_KEYS = ["version", "fsdp_version", "state_dict_type", "fsdp_state_dict_type"]
ZERO = st.dictionaries(st.sampled_from(["stage", "stage3_gather_16bit_weights_on_model_save"]), VALUES, max_size=2)
TRAINER = st.fixed_dictionaries(
    {},
    optional={
        "adapter": st.sampled_from(["lora", "qlora", "full", "ia3", None]),
        "finetuning_type": st.sampled_from(["lora", "freeze"]),
        "use_peft": VALUES,
        "load_in_4bit": VALUES,
        "quantization_bit": st.sampled_from([4, 8, "4", None]),
        "peft_use_dora": VALUES,
        "fsdp": st.sampled_from([["full_shard", "auto_wrap"], "full_shard", [], None]),
        "fsdp_config": st.dictionaries(st.sampled_from(TRAINER_FSDP_KEYS), VALUES, max_size=2),
        "deepspeed": st.one_of(st.none(), st.dictionaries(st.just("zero_optimization"), ZERO, max_size=1)),
        "gradient_checkpointing_kwargs": st.dictionaries(st.just("use_reentrant"), VALUES, max_size=1),
        "average_tokens_across_devices": VALUES,
        "gradient_accumulation_steps": VALUES,
        "bf16": VALUES,
        "fp16": VALUES,
        "datasets": st.just([{"path": "tatsu-lab/alpaca", "type": "alpaca"}]),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_configs_hypothesis_writes_are_read_alike(tmp_path: Path, data: st.DataObject) -> None:
    configs = []
    for _ in range(20):  # a batch per example: node starts once
        kind = data.draw(st.sampled_from(["accelerate", "trainer"]))
        config = data.draw(ACCELERATE if kind == "accelerate" else TRAINER)
        configs.append((yaml.safe_dump(config, default_flow_style=False, sort_keys=False), kind))
    expected = []
    for n, (text, kind) in enumerate(configs):
        path = tmp_path / f"c{n}.yaml"
        path.write_text(text)
        expected.append(python_read(path, kind))
    found = node_read(tmp_path, configs)
    for (text, _), mine, theirs in zip(configs, expected, found, strict=True):
        assert theirs == mine, text
