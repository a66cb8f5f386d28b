"""The configs users train with, read as the projects that read them do: the YAML `accelerate config` writes, a
DeepSpeed JSON (with DeepSpeed's field names and their aliases: its config models populate a field by its name or
its alias, so `gather_16bit_weights_on_model_save` is `stage3_gather_16bit_weights_on_model_save`), and the Trainer's
arguments as a YAML or JSON config holds them: TrainingArguments' own names (TRL, alignment-handbook, LLaMA-Factory)
and axolotl's (`fsdp_version` beside `fsdp_config`, which turns FSDP on without `fsdp:`; unversioned is FSDP1 there).
A path a config names (`deepspeed: examples/deepspeed/ds_z3_config.json`, `deepspeed_config_file`) is opened as the
trainer opens it, from the working directory; where it is not there, from the config's folder or the nearest folder
above it that holds it, and said so. Each config read is one line in words (`UserSetup.configs`), as the page says it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from harness.define import setup as vocabulary
from harness.errors import UsageError
from harness.tools.user_files.user_text import MOST_CONFIG_BYTES, load_json, load_yaml, read_text, shown

#: What `accelerate config` may write as distributed_type.
DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
                     "MULTI_HPU", "FSDP", "DEEPSPEED", "XLA", "MEGATRON_LM", "TP")  # fmt: skip
STATE_DICT_TYPES = {"FULL_STATE_DICT": "full_state_dict", "SHARDED_STATE_DICT": "sharded_state_dict",
                    "LOCAL_STATE_DICT": None}  # fmt: skip
#: DeepSpeed's ZeRO field for gathering 16-bit weights on save: its name, its alias, and the deprecated name that
#: sets it (deepspeed/runtime/zero/config.py: DeepSpeedZeroConfig, populate_by_name=True, extra="forbid").
GATHER = ("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
          "stage3_gather_fp16_weights_on_model_save")  # fmt: skip
KIND_WORDS = {"accelerate": "an accelerate config", "deepspeed": "a DeepSpeed JSON",
              "trainer": "the Trainer's arguments", "axolotl": "an axolotl config"}  # fmt: skip


@dataclass
class UserSetup:
    """The setup a user's configs say, in the vocabulary's keys (settings such as use_reentrant included), how many
    GPUs (world size) where a config says it, and per config what was read (`configs`: file, kind, setup, gpus and
    notes, each said in one line by `line`)."""

    setup: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    configs: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: UserSetup, where: str) -> None:
        for key, value in other.setup.items():
            if key in self.setup and self.setup[key] != value:
                raise UsageError(f"{where}: {key} is {value!r} there and {self.setup[key]!r} in another file")
            self.setup[key] = value
        self.gpus = other.gpus if other.gpus is not None else self.gpus
        self.configs += other.configs

    @property
    def read(self) -> list[str]:
        return [line(c) for c in self.configs]


def line(config: dict[str, Any]) -> str:
    """What one config was read as, in one line: 'read x.yaml as an accelerate config: engine=fsdp2, 2 GPU(s)'."""
    said = [f"{k}={v}" for k, v in config["setup"].items()]
    if config.get("gpus") is not None:
        said.append(f"{config['gpus']} GPU(s)")
    notes = f" ({'; '.join(config['notes'])})" if config.get("notes") else ""
    settings = ", ".join(said) or "no setting the atlas judges"
    return f"read {config['file']} as {KIND_WORDS[config['kind']]}: {settings}{notes}"


def _config(path: Path, kind: str, found: UserSetup, notes: list[str] | None = None) -> None:
    found.configs.insert(0, {"file": str(path), "kind": kind, "setup": dict(found.setup), "gpus": found.gpus,
                             "notes": list(notes or [])})  # fmt: skip


# --- loading -------------------------------------------------------------------------------------------------------


def _load(path: Path, kinds: str) -> Any:
    """A YAML or JSON config's data (JSON by its suffix, else YAML, which JSON also is), with the limits of
    user_text; a syntax error is bad input naming the file."""
    text = read_text(path, MOST_CONFIG_BYTES)
    data = load_json(path, text, kinds) if path.suffix.lower() == ".json" else load_yaml(path, text, kinds)
    if data is None:
        raise UsageError(f"{path}: read as nothing: an empty file")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not {kinds}: its top level is a {type(data).__name__}, not a mapping")
    return data


def named_file(path: Path, said: str, key: str) -> tuple[Path, str | None]:
    """A file a config names, found as the trainer finds it: from the working directory; else from the config's folder
    or the nearest folder above it that holds it (a note says so); else bad input naming where it looked."""
    given = Path(said)
    if given.is_absolute() or (Path.cwd() / given).exists():
        return given, None
    for folder in (path.parent, *path.parent.resolve().parents):
        if (folder / given).exists():
            return folder / given, f"{key} {said}: not in the working directory; read from {folder}"
    raise UsageError(f"{path}: {key} {shown(said)}: no such file (looked in the working directory {Path.cwd()} and in "
                     f"{path.parent} and the folders above it)")  # fmt: skip


def _mapping(path: Path, data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{path}: {key} is {shown(value)}, not a mapping of settings")
    return value


def _boolean(path: Path, key: str, value: Any) -> str | None:
    """'true' / 'false' for a yes or a no ('auto' and null decide nothing); anything else names the key."""
    if value is None or value == "auto":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str | int | float):
        raise UsageError(f"{path}: {key} is {shown(value)}: expected true or false")
    said = str(value).strip().lower()
    if said in ("true", "yes", "1", "on"):
        return "true"
    if said in ("false", "no", "0", "off"):
        return "false"
    raise UsageError(f"{path}: {key} is {shown(value)}: expected true or false")


def _choice(path: Path, key: str, value: Any, allowed: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int) or value not in allowed:  # `fsdp_version: true`
        raise UsageError(f"{path}: {key} is {shown(value)}: expected one of {', '.join(map(str, allowed))}")
    return value


def _count(path: Path, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit() or int(value) < 1:
        raise UsageError(f"{path}: {key} is {shown(value)}: expected a whole number of at least 1")
    return int(value)


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def _stage(value: Any) -> Any:
    return int(value) if isinstance(value, str) and value.isdigit() else value


# --- accelerate ----------------------------------------------------------------------------------------------------


def read_accelerate(path: Path) -> UserSetup:
    """The YAML `accelerate config` writes: distributed_type, fsdp_config (fsdp_version, fsdp_state_dict_type), the
    DeepSpeed part (zero_stage, zero3_save_16bit_model, a deepspeed_config_file followed), num_processes as the world
    size, mixed_precision."""
    data = _load(path, "an accelerate config YAML")
    said = data.get("distributed_type", "")
    kind = str(_choice(path, "distributed_type", _upper(said if said is not None else ""), DISTRIBUTED_TYPES))
    found = UserSetup()
    notes = [f"distributed_type {kind}"]
    if data.get("num_processes") is not None and kind != "NO":
        found.gpus = _count(path, "num_processes", data["num_processes"])
    precision = data.get("mixed_precision")
    if precision not in (None, "no"):
        found.setup["precision"] = _choice(path, "mixed_precision", precision, ("bf16", "fp16", "fp8"))
    if kind == "FSDP":
        fsdp = _mapping(path, data, "fsdp_config")
        version = _choice(path, "fsdp_config.fsdp_version", _stage(fsdp.get("fsdp_version") or 1), (1, 2))
        found.setup["engine"] = f"fsdp{version}"
        _state_dict(path, "fsdp_config.fsdp_state_dict_type", fsdp.get("fsdp_state_dict_type"), found)
    elif kind == "DEEPSPEED":
        _accelerate_deepspeed(path, _mapping(path, data, "deepspeed_config"), found, notes)
    elif kind in ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU"):
        found.setup["engine"] = "ddp"
    elif kind == "NO":
        found.setup["engine"] = "single"
    _config(path, "accelerate", found, notes)
    return found


def _state_dict(path: Path, key: str, value: Any, found: UserSetup) -> None:
    if value is None:
        return
    said = _choice(path, key, _upper(value), STATE_DICT_TYPES)
    if STATE_DICT_TYPES[said]:
        found.setup["state_dict"] = STATE_DICT_TYPES[said]


def _accelerate_deepspeed(path: Path, deepspeed: dict[str, Any], found: UserSetup, notes: list[str]) -> None:
    file = deepspeed.get("deepspeed_config_file")
    if file:
        if not isinstance(file, str):
            raise UsageError(f"{path}: deepspeed_config.deepspeed_config_file is {shown(file)}: expected a path")
        target, note = named_file(path, file, "deepspeed_config.deepspeed_config_file")
        notes += [note] if note else []
        found.merge(read_deepspeed(target), str(path))
        return
    stage = deepspeed.get("zero_stage")
    if stage is not None:
        found.setup["engine"] = f"zero{_choice(path, 'deepspeed_config.zero_stage', _stage(stage), (0, 1, 2, 3))}"
    gather = _boolean(path, "deepspeed_config.zero3_save_16bit_model", deepspeed.get("zero3_save_16bit_model"))
    if gather:
        found.setup["zero3_gather_16bit"] = gather


# --- DeepSpeed -----------------------------------------------------------------------------------------------------


def read_deepspeed(path: Path) -> UserSetup:
    """A DeepSpeed JSON, as DeepSpeed's config models read it (`deepspeed_settings`)."""
    found = UserSetup()
    notes = deepspeed_settings(path, _load(path, "a DeepSpeed JSON config"), found)
    _config(path, "deepspeed", found, notes)
    return found


def deepspeed_settings(path: Path, data: dict[str, Any], found: UserSetup) -> list[str]:
    """DeepSpeed's settings (a JSON's, or the dict a Trainer config holds in its place) into `found`: the ZeRO stage
    (`"zero_optimization": true` is stage 1, DeepSpeed's old form) and whether ZeRO-3 gathers 16-bit weights on save,
    by the field's name, its alias or its deprecated name (two of them at once: DeepSpeed refuses the config, and so
    does this); the notes say which name was read."""
    zero = data.get("zero_optimization")
    if isinstance(zero, bool):  # DeepSpeed's read_zero_config_deprecated
        zero = {"stage": 1 if zero else 0}
    zero = _mapping(path, {"zero_optimization": zero}, "zero_optimization")
    stage = zero.get("stage")
    if stage is not None:
        found.setup["engine"] = f"zero{_choice(path, 'zero_optimization.stage', _stage(stage), (0, 1, 2, 3))}"
    given = [k for k in GATHER if k in zero and zero[k] != "auto"]  # DeepSpeed drops "auto" values
    if len(given) > 1:
        raise UsageError(f"{path}: zero_optimization sets both {given[0]} and {given[1]}: one field under two names, "
                         "which DeepSpeed refuses")  # fmt: skip
    if not given:
        return []
    gather = _boolean(path, f"zero_optimization.{given[0]}", zero[given[0]])
    if gather:
        found.setup["zero3_gather_16bit"] = gather
    if given[0] == GATHER[1]:
        return []
    return [f"{given[0]}: DeepSpeed's {'name' if given[0] == GATHER[0] else 'deprecated name'} of {GATHER[1]}"]


# --- the Trainer's arguments ---------------------------------------------------------------------------------------


def is_axolotl(data: dict[str, Any]) -> bool:
    """axolotl's config: `base_model` (axolotl's required key; TrainingArguments configs say model_name_or_path), or
    its own top-level `fsdp_version`."""
    return "base_model" in data or "fsdp_version" in data


def read_trainer(path: Path, pins: dict[str, str] | None = None) -> UserSetup:
    """The Trainer's arguments as a YAML or JSON config writes them (TrainingArguments' own names, and axolotl's,
    LLaMA-Factory's and TRL's for the adapter): the Trainer as the loop, FSDP (its version, from fsdp_config, else
    transformers' default for the release the user pins: FSDP2 from 5.0; axolotl's own fsdp_version, FSDP1 where
    none is given), DeepSpeed (a path followed, or inline), use_reentrant, average_tokens_across_devices, gradient
    accumulation, the adapter and a 4-bit base."""
    data = _load(path, "a Trainer config (YAML or JSON)")
    axolotl = is_axolotl(data)
    found = UserSetup(setup={"loop": "trainer"})
    notes: list[str] = []
    _trainer_deepspeed(path, data, found, notes)
    if axolotl:
        _axolotl_fsdp(path, data, found, notes)
    else:
        _trainer_fsdp(path, data, pins or {}, found, notes)
    kwargs = _mapping(path, data, "gradient_checkpointing_kwargs")
    reentrant = _boolean(path, "gradient_checkpointing_kwargs.use_reentrant", kwargs.get("use_reentrant"))
    if reentrant:
        found.setup["use_reentrant"] = reentrant
    average = _boolean(path, "average_tokens_across_devices", data.get("average_tokens_across_devices"))
    if average:
        found.setup["average_tokens"] = average
    steps = data.get("gradient_accumulation_steps")
    if steps is not None:
        found.setup["accumulation"] = "none" if _count(path, "gradient_accumulation_steps", steps) == 1 else "several"
    adapter = _trainer_adapter(path, data)
    if adapter:
        found.setup["adapter"] = adapter
    for flag, precision in (("bf16", "bf16"), ("fp16", "fp16")):
        if _boolean(path, flag, data.get(flag)) == "true":
            found.setup["precision"] = precision
    _config(path, "axolotl" if axolotl else "trainer", found, notes)
    return found


def _trainer_deepspeed(path: Path, data: dict[str, Any], found: UserSetup, notes: list[str]) -> None:
    deepspeed = data.get("deepspeed")
    fsdp = data.get("fsdp") or (is_axolotl(data) and data.get("fsdp_config"))
    if deepspeed and fsdp:
        raise UsageError(f"{path}: both deepspeed and fsdp are set: the Trainer runs one of them")
    if isinstance(deepspeed, dict):
        notes += deepspeed_settings(path, deepspeed, found)
    elif isinstance(deepspeed, str) and deepspeed:
        target, note = named_file(path, deepspeed, "deepspeed")
        notes += [note] if note else []
        found.merge(read_deepspeed(target), str(path))
    elif deepspeed not in (None, False, ""):
        raise UsageError(f"{path}: deepspeed is {shown(deepspeed)}: expected a DeepSpeed JSON's path or its settings")


def _fsdp_config(path: Path, data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    config = data.get("fsdp_config") or {}
    if isinstance(config, str):
        target, note = named_file(path, config, "fsdp_config")
        notes += [note] if note else []
        config = _load(target, "an FSDP config")
    if not isinstance(config, dict):
        raise UsageError(f"{path}: fsdp_config is {shown(config)}, not a mapping of settings")
    return config


def _trainer_fsdp(path: Path, data: dict[str, Any], pins: dict[str, str], found: UserSetup, notes: list[str]) -> None:
    """TrainingArguments: FSDP where `fsdp` is set; fsdp_config's keys with or without their `fsdp_` prefix."""
    fsdp = data.get("fsdp")
    if fsdp in (None, False, "", []):
        return
    if not isinstance(fsdp, str | list | bool):
        raise UsageError(f"{path}: fsdp is {shown(fsdp)}: expected the Trainer's fsdp options (a string or a list)")
    config = _fsdp_config(path, data, notes)
    version = config.get("version", config.get("fsdp_version"))
    if version is None:  # transformers' own default: FSDP2 from 5.0 (training_args.py), FSDP1 before
        transformers = pins.get("transformers")
        version = 2 if transformers and _major(transformers) >= 5 else 1
        notes.append(f"no FSDP version: transformers {transformers or '(not given)'}'s default")
    found.setup["engine"] = f"fsdp{_choice(path, 'fsdp_config.version', _stage(version), (1, 2))}"
    _state_dict(path, "fsdp_config.state_dict_type", config.get("state_dict_type", config.get("fsdp_state_dict_type")),
                found)  # fmt: skip


def _axolotl_fsdp(path: Path, data: dict[str, Any], found: UserSetup, notes: list[str]) -> None:
    """axolotl: FSDP where `fsdp` or `fsdp_config` is set; its version the top-level `fsdp_version`, else
    fsdp_config's `fsdp_version` or `version`, else 1 (axolotl's validation pins unversioned configs to FSDP1)."""
    if data.get("fsdp") in (None, False, "", []) and not data.get("fsdp_config"):
        if data.get("fsdp_version") is not None:
            notes.append("fsdp_version without fsdp or fsdp_config: no FSDP")
        return
    fsdp = data.get("fsdp")
    if fsdp not in (None, False, "", []) and not isinstance(fsdp, str | list | bool):
        raise UsageError(f"{path}: fsdp is {shown(fsdp)}: expected the Trainer's fsdp options (a string or a list)")
    config = _fsdp_config(path, data, notes)
    version = data.get("fsdp_version") or config.get("fsdp_version") or config.get("version")
    key = "fsdp_version" if data.get("fsdp_version") else "fsdp_config.fsdp_version"
    if not version:
        version = 1
        notes.append("no fsdp_version: axolotl's FSDP1")
    found.setup["engine"] = f"fsdp{_choice(path, key, _stage(version), (1, 2))}"
    _state_dict(path, "fsdp_config.state_dict_type", config.get("state_dict_type", config.get("fsdp_state_dict_type")),
                found)  # fmt: skip


def _major(version: str) -> int:
    try:
        return Version(version).major
    except ValueError:  # InvalidVersion, or a number of more digits than int() converts
        return 0


def _trainer_adapter(path: Path, data: dict[str, Any]) -> str | None:
    """LoRA, DoRA, QLoRA or a full fine-tune, as axolotl (`adapter`, `peft_use_dora`, `load_in_4bit`), LLaMA-Factory
    (`finetuning_type`, `use_dora`, `quantization_bit`) and TRL (`use_peft`, `load_in_4bit`) say it."""
    said = data.get("adapter") or data.get("finetuning_type")
    if said is None and data.get("use_peft") is not None:
        said = "lora" if _boolean(path, "use_peft", data.get("use_peft")) == "true" else "full"
    if said is None:
        return None
    if not isinstance(said, str) or said.lower() not in ("lora", "qlora", "full", "freeze"):
        raise UsageError(f"{path}: adapter {shown(said)}: expected lora, qlora or full")
    said = said.lower()
    if said in ("full", "freeze"):
        return "none"
    dora = any(_boolean(path, k, data.get(k)) == "true" for k in ("peft_use_dora", "use_dora"))
    four_bit = (
        said == "qlora"
        or _boolean(path, "load_in_4bit", data.get("load_in_4bit")) == "true"
        or str(data.get("quantization_bit") or "") == "4"
    )
    return {(False, False): "lora", (True, False): "dora", (False, True): "qlora", (True, True): "qdora"}[
        (dora, four_bit)
    ]


def read_setup(
    accelerate: Path | None,
    deepspeed: Path | None,
    words: list[str],
    trainer: Path | None = None,
    pins: dict[str, str] | None = None,
) -> UserSetup:
    """The user's setup from their configs, then `--setup` words over them (the words win)."""
    found = UserSetup()
    for path, reader in ((accelerate, read_accelerate), (deepspeed, read_deepspeed)):
        if path is not None:
            found.merge(reader(path), str(path))
    if trainer is not None:
        found.merge(read_trainer(trainer, pins), str(trainer))
    found.setup |= vocabulary.parse_words(words)
    return found
