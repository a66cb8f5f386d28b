"""The setup vocabulary, declared once: how training runs (engine and FSDP version, state-dict type, adapter, the
Trainer or a loop by hand, the order of wrappers, how it was launched, precision), in the words a user says and the
keys a scenario's configs use.

Every answer reads a config's setup through `setup_of`, and every user word through `parse_words`, so "FSDP2" means
one thing to the glance, `lookup`, `check`, `audit`, the advisories and the page. A scenario names a setup in its
configs under one of the config keys of `CONFIG_KEYS` (S1 and S2 name their engine `fsdp`, S7 and S9 `engine`), or in
its SPEC `setup` where every config shares it; a test holds every scenario's configs to this table, so a scenario
that names its engine under a key the table does not know fails it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from harness.errors import UsageError


@dataclass(frozen=True)
class SetupKey:
    """One dimension of a setup: its values in words, the words a user may say for each, and whether answers are
    narrowed by it (a key that is only said, never filtered on, is `narrows=False`)."""

    name: str
    values: Mapping[str, str]
    #: A user's word -> the value it names (each value also names itself).
    synonyms: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    narrows: bool = True
    #: Packages a value brings into the stack a failure can depend on (ZeRO-3: deepspeed; the Trainer: accelerate).
    brings: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))


def _words(**values: str) -> Mapping[str, str]:
    return MappingProxyType(values)


#: The words a yes or a no is said in, in a config or on the command line.
_BOOLEAN = MappingProxyType({"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"})


#: The keys in the order a user says them ('the Trainer · FSDP2 · SHARDED_STATE_DICT · LoRA').
KEYS: tuple[SetupKey, ...] = (
    SetupKey(
        "loop",
        _words(trainer="the Trainer", hand="a loop by hand", accelerate="accelerate's loop by hand"),
        MappingProxyType({"own": "hand", "manual": "hand", "loop": "hand", "custom": "hand"}),
        brings=MappingProxyType({"trainer": ("accelerate",), "accelerate": ("accelerate",)}),
    ),
    SetupKey(
        "order",
        _words(
            compile_then_peft="torch.compile, then the adapter",
            peft_then_compile="the adapter, then torch.compile",
            ckpt_then_peft="checkpointing, then the adapter",
            peft_then_ckpt="the adapter, then checkpointing",
        ),
    ),
    SetupKey(
        "engine",
        _words(single="one process", ddp="DDP", fsdp1="FSDP1", fsdp2="FSDP2", zero2="ZeRO-2", zero3="ZeRO-3"),
        MappingProxyType({"none": "single", "no": "single", "zero-3": "zero3", "zero-2": "zero2", "fsdp": "fsdp1"}),
        brings=MappingProxyType({"zero2": ("deepspeed",), "zero3": ("deepspeed",)}),
    ),
    SetupKey(
        "launch",
        _words(
            script_nccl="a script that starts its own NCCL group",
            script_gloo_nccl="a script that starts a gloo and NCCL group",
            script_device="a script that starts its group with a device",
            trainer="the Trainer starts the group",
            accelerate_launch="accelerate launch",
            deepspeed_init="deepspeed.init_distributed",
        ),
        narrows=False,
    ),
    SetupKey(
        "state_dict",
        _words(full_state_dict="FULL_STATE_DICT", sharded_state_dict="SHARDED_STATE_DICT"),
        MappingProxyType({"full": "full_state_dict", "sharded": "sharded_state_dict"}),
    ),
    SetupKey(
        "adapter",
        _words(lora="LoRA", dora="DoRA", qlora="QLoRA", qdora="DoRA on a 4-bit base", none="full fine-tune"),
        MappingProxyType({"full": "none", "full_finetune": "none"}),
        brings=MappingProxyType({"qlora": ("bitsandbytes",), "qdora": ("bitsandbytes",)}),
    ),
    # Said, never filtered on: a failure's configs are drawn over dtypes, so a config's dtype is one draw, not the
    # precision a failure needs (S1 fails loaded in float32 as in bfloat16).
    SetupKey("precision", _words(bf16="bfloat16", fp16="float16", fp32="float32"), narrows=False),
    # Settings a user's config can already hold that a scenario measured as a fix (SPEC `variant_setup`): they never
    # narrow which failures are the user's; a failure whose fix the user has, measured passing wherever it failed, is
    # cleared.
    SetupKey("use_reentrant", _words(true="use_reentrant=True", false="use_reentrant=False"), _BOOLEAN, narrows=False),
    SetupKey(
        "zero3_gather_16bit",
        _words(
            true="stage3_gather_16bit_weights_on_model_save=true",
            false="stage3_gather_16bit_weights_on_model_save=false",
        ),
        _BOOLEAN,
        narrows=False,
    ),
    SetupKey(
        "average_tokens",
        _words(true="average_tokens_across_devices=True", false="average_tokens_across_devices=False"),
        _BOOLEAN,
        narrows=False,
    ),
    SetupKey("accumulation", _words(none="no gradient accumulation", several="gradient accumulation"), narrows=False),
)
BY_KEY: Mapping[str, SetupKey] = MappingProxyType({k.name: k for k in KEYS})
KEY_ORDER: tuple[str, ...] = tuple(k.name for k in KEYS)

#: A scenario's config key -> (the setup key it names, its values -> the setup's; a value mapped to None names none).
CONFIG_KEYS: Mapping[str, tuple[str, Mapping[str, str | None]]] = MappingProxyType(
    {
        "engine": ("engine", MappingProxyType({})),
        "fsdp": ("engine", MappingProxyType({})),  # S1, S2: the FSDP version their FSDP runs
        "path": ("loop", MappingProxyType({"manual": "hand", "loop": "hand"})),
        "context": ("state_dict", MappingProxyType({"none": None})),
        "adapter": ("adapter", MappingProxyType({})),
        "use_dora": ("adapter", MappingProxyType({"True": "dora", "False": "lora"})),
        "order": ("order", MappingProxyType({"model_first": None, "args_first": None})),
        "launch": ("launch", MappingProxyType({})),
        "dtype": ("precision", MappingProxyType({"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"})),
        "load_dtype": ("precision", MappingProxyType({"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"})),
    }
)
#: Config keys that say the base is quantized (a LoRA on it is QLoRA), and the values that mean 4-bit.
QUANT_KEYS: Mapping[str, frozenset[str]] = MappingProxyType(
    {"quant": frozenset({"4bit"}), "base": frozenset({"4bit", "manual-4bit"})}
)
_ON_4BIT = {"lora": "qlora", "dora": "qdora"}
_OFF_4BIT = {v: k for k, v in _ON_4BIT.items()}


def setup_of(config: Mapping[str, Any] | None, spec: Mapping[str, Any] | None = None) -> dict[str, str]:
    """A config's setup in the vocabulary's keys ({'loop': 'trainer', 'engine': 'fsdp2', 'adapter': 'lora'}): its own
    config keys over what every config of its scenario is (SPEC `setup`), a 4-bit base making LoRA QLoRA."""
    config = config or {}
    found = {k: str(v) for k, v in ((spec or {}).get("setup") or {}).items()}
    for name, value in config.items():
        if name not in CONFIG_KEYS or value is None or value == "":
            continue
        key, mapped = CONFIG_KEYS[name]
        said = mapped.get(str(value), str(value))
        if said is None:
            found.pop(key, None)  # the config says it has none ('context: none': no state-dict type)
        else:
            found[key] = said
    quantized = [str(config[k]) in values for k, values in QUANT_KEYS.items() if k in config]
    if quantized and "adapter" in found:
        plain = _OFF_4BIT.get(found["adapter"], found["adapter"])
        found["adapter"] = _ON_4BIT.get(plain, plain) if any(quantized) else plain
    return {k: found[k] for k in KEY_ORDER if k in found}


def is_setup_key(config_key: str) -> bool:
    """Whether a config key names the setup (its value is said by `setup_of`, not a detail of the config)."""
    return config_key in CONFIG_KEYS or config_key in QUANT_KEYS


def narrowing(setup: Mapping[str, str]) -> dict[str, str]:
    """The keys of a setup that answers are narrowed by (precision and the launch are said, not filtered on)."""
    return {k: v for k, v in setup.items() if k in BY_KEY and BY_KEY[k].narrows}


def words(setup: Mapping[str, str], keys: Iterable[str] | None = None) -> str:
    """'the Trainer · FSDP2 · LoRA' (the narrowing keys, or `keys`); 'any setup' where it names none."""
    shown = [k for k in (keys if keys is not None else KEY_ORDER) if k in setup and (keys or BY_KEY[k].narrows)]
    return " · ".join(BY_KEY[k].values.get(setup[k], setup[k]) for k in shown) or "any setup"


def config_words(config: Mapping[str, Any] | None, spec: Mapping[str, Any] | None = None) -> str:
    """A config's setup in words ('a loop by hand · FSDP1 · DoRA')."""
    return words(setup_of(config, spec))


def agrees(have: Mapping[str, str], want: Mapping[str, str]) -> bool:
    """Whether a setup the records ran (`have`) is the user's (`want`): every narrowing key both name agrees (a setup
    that does not name a key, S10 names no engine, is not excluded by it)."""
    return all(have[k] == v for k, v in narrowing(want).items() if k in have)


def value_of(word: str) -> tuple[str, str] | None:
    """(key, value) a user's word names ('FSDP2' -> ('engine', 'fsdp2'), 'own' -> ('loop', 'hand')), or None."""
    for said in dict.fromkeys((word.strip().lower(), word.strip().lower().replace("-", "_"))):
        for key in KEYS:
            if said in key.values:
                return key.name, said
            if said in key.synonyms:
                return key.name, key.synonyms[said]
    return None


def setting_of(word: str) -> tuple[str, str] | None:
    """'use_reentrant=true' -> ('use_reentrant', 'true'); None where the key or the value is not the vocabulary's."""
    name, _, value = word.partition("=")
    key = BY_KEY.get(name.strip().lower())
    said = value.strip().lower()
    if key is None:
        return None
    said = key.synonyms.get(said, said)
    return (key.name, said) if said in key.values else None


#: Words a user may give beside the setup that say where it runs: not setup values (the GPU count is `--gpus`).
_WHERE = re.compile(r"ws\d+|cpu|gpu|cuda")


def parse_words(items: Iterable[str], where: str = "--setup") -> dict[str, str]:
    """'fsdp2,lora trainer' -> {'loop': 'trainer', 'engine': 'fsdp2', 'adapter': 'lora'}; an unknown word, or two
    values of one key, is a usage error naming it and the words this tool knows."""
    found: dict[str, str] = {}
    for item in items:
        for word in (w for w in re.split(r"[,\s]+", item) if w):
            named = setting_of(word) if "=" in word else value_of(word)
            if named is None:
                if _WHERE.fullmatch(word.lower()):
                    continue
                raise UsageError(f"{where} {word!r}: not a setup word this tool knows ({known_words()})")
            key, value = named
            if key in found and found[key] != value:
                raise UsageError(f"{where}: {found[key]!r} and {value!r} are two {key} values; give one")
            found[key] = value
    return {k: found[k] for k in KEY_ORDER if k in found}


def known_words() -> str:
    """Every key and its values, for an error message and --help."""
    return "; ".join(f"{k.name}: {', '.join(k.values)}" for k in KEYS)


def brought_packages(setup: Mapping[str, str]) -> set[str]:
    """The packages a setup brings into what a failure can depend on (ZeRO-3: deepspeed; QLoRA: bitsandbytes)."""
    return {p for k, v in setup.items() if k in BY_KEY for p in BY_KEY[k].brings.get(v, ())}


def config_problems(config: Mapping[str, Any], spec: Mapping[str, Any] | None = None) -> list[str]:
    """Why a scenario's config does not speak this vocabulary ('' list where it does): a config key of the table whose
    value is no value of its setup key, a SPEC `setup` key or value the table lacks, or a setup value (say 'fsdp2')
    under a config key the table does not know (a scenario naming its engine under another key)."""
    problems = []
    for key, value in ((spec or {}).get("setup") or {}).items():
        if key not in BY_KEY or str(value) not in BY_KEY[key].values:
            problems.append(f"SPEC setup {key}={value!r} is not in the vocabulary")
    for variant, setting in ((spec or {}).get("variant_setup") or {}).items():
        for key, value in setting.items():
            if key not in BY_KEY or str(value) not in BY_KEY[key].values:
                problems.append(f"SPEC variant_setup {variant}: {key}={value!r} is not in the vocabulary")
    distinctive = {v: k.name for k in KEYS if k.narrows for v in k.values if v not in ("none", "single", "trainer")}
    for name, value in config.items():
        if name in CONFIG_KEYS:
            key, mapped = CONFIG_KEYS[name]
            said = mapped.get(str(value), str(value))
            if said is not None and value is not None and said not in BY_KEY[key].values:
                problems.append(f"config {name}={value!r} is no {key} value ({', '.join(BY_KEY[key].values)})")
        elif name not in QUANT_KEYS and isinstance(value, str) and value in distinctive:
            problems.append(f"config {name}={value!r} names the {distinctive[value]} under a key the vocabulary lacks")
    return problems
