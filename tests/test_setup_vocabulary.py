"""One setup vocabulary, declared once (`harness/define/setup.py`): every scenario's seed configs and every committed
record's config speak it (a scenario that names its engine under a key the vocabulary does not know fails here), a
config's own keys win over its scenario's SPEC `setup`, and a user's words mean one thing to every answer."""

from __future__ import annotations

import pytest

from harness.define import setup as vocabulary
from harness.define.registry import discover
from harness.errors import UsageError
from harness.knowledge.atlas import Atlas
from tests.conftest import REPO_ROOT


def test_every_scenario_and_every_committed_config_speaks_the_vocabulary() -> None:
    specs = {s.id: s.spec for s in discover()}
    problems = set()
    for scenario in discover():
        for config in scenario.examples():
            problems |= {(scenario.id, p) for p in vocabulary.config_problems(config, scenario.spec)}
    atlas = Atlas(REPO_ROOT / "results", specs)
    seen = 0
    for record in [*atlas.table, *atlas.probes]:
        spec = specs.get(record["scenario"])
        if spec is not None:
            problems |= {(record["scenario"], p) for p in vocabulary.config_problems(record.get("config") or {}, spec)}
            seen += 1
    assert problems == set()
    assert seen > 5000


def test_an_engine_under_a_key_the_vocabulary_lacks_is_refused() -> None:
    assert vocabulary.config_problems({"backend": "fsdp2"}) == [
        "config backend='fsdp2' names the engine under a key the vocabulary lacks"
    ]
    assert vocabulary.config_problems({"fsdp": "fsdp3"}) == [
        "config fsdp='fsdp3' is no engine value (single, ddp, fsdp1, fsdp2, zero2, zero3)"
    ]
    assert vocabulary.config_problems({}, {"setup": {"path": "trainer"}}) == [
        "SPEC setup path='trainer' is not in the vocabulary"
    ]


def test_a_config_s_own_keys_name_its_setup() -> None:
    s1 = {"setup": {"engine": "fsdp1", "adapter": "dora"}}
    assert vocabulary.setup_of({"fsdp": "fsdp2", "path": "manual"}, s1) == {
        "loop": "hand", "engine": "fsdp2", "adapter": "dora"
    }  # fmt: skip
    assert vocabulary.setup_of({"use_dora": False}, s1)["adapter"] == "lora"
    s2 = {"setup": {"adapter": "qlora"}}
    assert vocabulary.setup_of({"base": "frozen-base"}, s2)["adapter"] == "lora"  # a full-precision base: LoRA
    assert vocabulary.setup_of({"base": "manual-4bit"}, s2)["adapter"] == "qlora"
    assert vocabulary.setup_of({"quant": "4bit", "adapter": "dora"})["adapter"] == "qdora"
    assert vocabulary.setup_of({"context": "none", "engine": "zero3"}) == {"engine": "zero3"}
    assert vocabulary.words(vocabulary.setup_of({"path": "trainer", "engine": "fsdp2", "adapter": "lora"})) == (
        "the Trainer · FSDP2 · LoRA"
    )


def test_a_user_s_words_mean_one_thing() -> None:
    assert vocabulary.parse_words(["FSDP2,lora", "own"]) == {"loop": "hand", "engine": "fsdp2", "adapter": "lora"}
    assert vocabulary.parse_words(["manual zero-3 sharded ws2"]) == {
        "loop": "hand", "engine": "zero3", "state_dict": "sharded_state_dict"
    }  # fmt: skip
    with pytest.raises(UsageError, match="two engine values"):
        vocabulary.parse_words(["fsdp1,fsdp2"])
    with pytest.raises(UsageError, match="not a setup word this tool knows"):
        vocabulary.parse_words(["fsdp3"])
    # a setup that does not name a key is not excluded by it (S10 names no engine); precision never narrows
    assert vocabulary.agrees({"adapter": "lora"}, {"engine": "fsdp2", "adapter": "lora"})
    assert not vocabulary.agrees({"engine": "fsdp1"}, {"engine": "fsdp2"})
    assert vocabulary.agrees({"engine": "fsdp1", "precision": "bf16"}, {"precision": "fp32"})
