"""What a user has, read the way the tools that write it read it: requirements files and `pip freeze` output (pip),
`uv.lock`, `pylock.toml` and `poetry.lock` (TOML), the YAML `accelerate config` writes, a DeepSpeed JSON, and the
Trainer's own arguments as axolotl, LLaMA-Factory and TRL configs write them (YAML or JSON). `audit` reads through
here; the page's `site_read.js` reads requirements and locks the same way.

Every file is decoded as pip decodes a requirements file: UTF-8, UTF-8 with a byte-order mark (Notepad), UTF-16 with
one (what `pip freeze > req.txt` writes in Windows PowerShell). Anything that is not text, not the format, or holds a
value this tool does not know (`fsdp_version: 3`, `"stage": "three"`) is one line naming the file and the key, and
exit 2: never a traceback, never an exit 0 or 1 from a file that could not be read. An input read as nothing (an empty
requirements file, an environment with none of the packages) is exit 2 too.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.define import setup as vocabulary
from harness.define.packages import AXIS_PACKAGES
from harness.errors import UsageError

#: How deep `-r other.txt` includes are followed (a loop of includes is bad input).
MOST_INCLUDES = 8
#: What `accelerate config` may write as distributed_type.
DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
                     "MULTI_HPU", "FSDP", "DEEPSPEED", "XLA", "MEGATRON_LM", "TP")  # fmt: skip
STATE_DICT_TYPES = {"FULL_STATE_DICT": "full_state_dict", "SHARDED_STATE_DICT": "sharded_state_dict",
                    "LOCAL_STATE_DICT": None}  # fmt: skip


@dataclass
class Pins:
    """Exact releases, the requirements that pin none, and whether the input need not name every package installed (a
    requirements file: torch is often installed apart)."""

    pins: dict[str, str] = field(default_factory=dict)
    loose: list[str] = field(default_factory=list)
    partial: bool = False
    #: The requirements files read (a way out is printed as a diff of them).
    requirements: list[Path] = field(default_factory=list)


@dataclass
class UserSetup:
    """The setup a user's configs say, in the vocabulary's keys (settings such as use_reentrant included), how many
    GPUs (world size) where a config says it, and what was read, in words."""

    setup: dict[str, str] = field(default_factory=dict)
    gpus: int | None = None
    read: list[str] = field(default_factory=list)

    def merge(self, other: UserSetup, where: str) -> None:
        for key, value in other.setup.items():
            if key in self.setup and self.setup[key] != value:
                raise UsageError(f"{where}: {key} is {value!r} there and {self.setup[key]!r} in another file")
            self.setup[key] = value
        self.gpus = other.gpus if other.gpus is not None else self.gpus
        self.read += other.read


# --- text ----------------------------------------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """The file's text: UTF-8, or UTF-8 / UTF-16 with a byte-order mark; anything else is bad input."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    try:
        if data.startswith(b"\xef\xbb\xbf"):
            text = data.decode("utf-8-sig")
        elif data.startswith((b"\xff\xfe", b"\xfe\xff")):
            text = data.decode("utf-16")
        else:
            text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (neither UTF-8 nor UTF-16 with a byte-order mark)") from None
    if "\x00" in text:
        raise UsageError(f"{path}: not a text file (it holds NUL bytes)")
    return text


# --- releases ------------------------------------------------------------------------------------------------------


def read_pins(path: Path) -> Pins:
    """Exact releases from a lockfile or a requirements file / pip freeze; read as nothing is bad input."""
    text = read_text(path)
    if path.suffix in (".lock", ".toml") or re.search(r"^\s*\[\[(package|packages)\]\]\s*$", text, re.M):
        found = Pins(_toml_pins(path, text), [], partial=False)
    else:
        found = _requirement_pins(path, text, depth=0)
        found.partial = True
        found.requirements = [path]
    if not found.pins and not found.loose:
        raise UsageError(f"{path}: read as nothing: no requirement and no locked package in it")
    return found


def _toml_pins(path: Path, text: str) -> dict[str, str]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not a lockfile: {exc}") from None
    entries = data.get("package") or data.get("packages")  # uv.lock, poetry.lock: [[package]]; PEP 751: [[packages]]
    if not isinstance(entries, list):
        raise UsageError(f"{path}: no [[package]] or [[packages]] table: not a uv, poetry or PEP 751 lock")
    pins = {}
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise UsageError(f"{path}: package entry {number} has no name")
        version = entry.get("version")
        if version is None:
            continue  # a workspace member or a path dependency: no release
        if not isinstance(version, str) or not _is_version(version):
            raise UsageError(f"{path}: package entry {number} ({entry['name']}): version {version!r} is not a version")
        pins[str(canonicalize_name(entry["name"]))] = version
    return pins


#: A requirement that names no release to look up: a URL or a path (pip's direct references).
_DIRECT = re.compile(r"^(git\+|hg\+|svn\+|bzr\+|https?://|file:|\.{1,2}/|/|[A-Za-z]:[\\/])")


def _requirement_pins(path: Path, text: str, depth: int) -> Pins:
    found = Pins(partial=True)
    for number, raw in enumerate(text.splitlines(), 1):
        line = _without_comment(raw)
        if not line or line.startswith("#"):
            continue
        include = re.match(r"^(-r|--requirement|-c|--constraint)\s*=?\s*(\S+)$", line)
        if include:
            _include(path, include.group(2), depth, found)
            continue
        if line.startswith("-"):
            continue  # options: -e, --index-url, --hash continuations, --extra-index-url
        if " @ " in line or _DIRECT.match(line):
            found.loose.append(line)  # a direct reference: no release to look up
            continue
        try:
            requirement = Requirement(line.rstrip("\\").strip())
        except InvalidRequirement as exc:
            why = str(exc).splitlines()[0]
            raise UsageError(f"{path}:{number}: {raw.strip()!r} is not a requirement ({why})") from None
        exact = [s for s in requirement.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if exact:
            found.pins[str(canonicalize_name(requirement.name))] = exact[0].version
        else:
            found.loose.append(str(requirement))
    return found


def _without_comment(raw: str) -> str:
    return re.split(r"\s+#", raw, maxsplit=1)[0].strip()


def requirement_name(raw: str) -> str | None:
    """The package a requirements line names (canonical), or None for a comment, an option, an include or a direct
    reference: the lines a way out's diff rewrites."""
    line = _without_comment(raw).rstrip("\\").strip()
    if not line or line.startswith(("#", "-")) or " @ " in line or _DIRECT.match(line):
        return None
    try:
        return str(canonicalize_name(Requirement(line).name))
    except InvalidRequirement:
        return None


def _include(path: Path, name: str, depth: int, found: Pins) -> None:
    """`-r other.txt`: read it too, relative to the including file, as pip does."""
    if depth >= MOST_INCLUDES:
        raise UsageError(f"{path}: -r {name}: includes nested deeper than {MOST_INCLUDES} (a loop?)")
    included = (path.parent / name).resolve()
    if not included.is_file():
        raise UsageError(f"{path}: -r {name}: no such file ({included})")
    more = _requirement_pins(included, read_text(included), depth + 1)
    found.pins |= more.pins
    found.loose += more.loose


def _is_version(value: str) -> bool:
    try:
        Version(value)
    except InvalidVersion:
        return False
    return True


def loose_ranges(loose: list[str]) -> dict[str, Any]:
    """package -> the SpecifierSet a requirement that pins no release allows ('transformers>=4.41,<=4.45.2')."""
    found = {}
    for line in loose:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        found[str(canonicalize_name(requirement.name))] = requirement.specifier
    return found


def environment_pins(python: str | None = None) -> dict[str, str]:
    """What an environment has installed: this interpreter's (`--env`), or another's (`--python`); one that holds none
    of the packages the atlas measures is bad input."""
    if python:
        from harness.environments.envs import installed_versions

        found = installed_versions(Path(python))
        pins = {str(canonicalize_name(k)): str(v) for k, v in found.items() if k != "python"}
    else:
        from importlib import metadata

        pins = {
            str(canonicalize_name(d.metadata["Name"])): d.version
            for d in metadata.distributions()
            if d.metadata["Name"]
        }
    if not any(p in pins for p in AXIS_PACKAGES):
        where = python or "this environment"
        raise UsageError(f"{where}: none of {', '.join(AXIS_PACKAGES)} is installed there: nothing to judge")
    return pins


# --- configs -------------------------------------------------------------------------------------------------------


def _load(path: Path, kinds: str) -> Any:
    """A YAML or JSON file's data (JSON is YAML too); a syntax error is bad input naming the file."""
    import yaml

    text = read_text(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"{path}: not {kinds}: {first}") from None
    if data is None:
        raise UsageError(f"{path}: read as nothing: an empty file")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not {kinds}: its top level is a {type(data).__name__}, not a mapping")
    return data


def _mapping(path: Path, data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{path}: {key} is {value!r}, not a mapping of settings")
    return value


def _boolean(path: Path, key: str, value: Any) -> str | None:
    """'true' / 'false' for a yes or a no ('auto' and null decide nothing); anything else names the key."""
    if value is None or value == "auto":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    said = str(value).strip().lower()
    if said in ("true", "yes", "1", "on"):
        return "true"
    if said in ("false", "no", "0", "off"):
        return "false"
    raise UsageError(f"{path}: {key} is {value!r}: expected true or false")


def _choice(path: Path, key: str, value: Any, allowed: Any) -> Any:
    if isinstance(value, bool) or value not in allowed:  # `fsdp_version: true` is not 1
        raise UsageError(f"{path}: {key} is {value!r}: expected one of {', '.join(map(str, allowed))}")
    return value


def _count(path: Path, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit() or int(value) < 1:
        raise UsageError(f"{path}: {key} is {value!r}: expected a whole number of at least 1")
    return int(value)


def read_accelerate(path: Path) -> UserSetup:
    """The YAML `accelerate config` writes: distributed_type, fsdp_config (fsdp_version, fsdp_state_dict_type), the
    DeepSpeed part (zero_stage, zero3_save_16bit_model, a deepspeed_config_file followed), num_processes as the world
    size, mixed_precision."""
    data = _load(path, "an accelerate config YAML")
    kind = str(_choice(path, "distributed_type", str(data.get("distributed_type", "")).upper(), DISTRIBUTED_TYPES))
    found = UserSetup(read=[f"{path.name}: distributed_type {kind}"])
    if data.get("num_processes") is not None and kind != "NO":
        found.gpus = _count(path, "num_processes", data["num_processes"])
    precision = data.get("mixed_precision")
    if precision not in (None, "no"):
        found.setup["precision"] = _choice(path, "mixed_precision", precision, ("bf16", "fp16", "fp8"))
    if kind == "FSDP":
        fsdp = _mapping(path, data, "fsdp_config")
        version = _choice(path, "fsdp_config.fsdp_version", _stage(fsdp.get("fsdp_version") or 1), (1, 2))
        found.setup["engine"] = f"fsdp{version}"
        state_dict = fsdp.get("fsdp_state_dict_type")
        if state_dict is not None:
            said = _choice(path, "fsdp_config.fsdp_state_dict_type", str(state_dict).upper(), STATE_DICT_TYPES)
            if STATE_DICT_TYPES[said]:
                found.setup["state_dict"] = STATE_DICT_TYPES[said]
    elif kind == "DEEPSPEED":
        _accelerate_deepspeed(path, _mapping(path, data, "deepspeed_config"), found)
    elif kind in ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU"):
        found.setup["engine"] = "ddp"
    elif kind == "NO":
        found.setup["engine"] = "single"
    return found


def _accelerate_deepspeed(path: Path, deepspeed: dict[str, Any], found: UserSetup) -> None:
    file = deepspeed.get("deepspeed_config_file")
    if file:
        target = (path.parent / str(file)).resolve()
        if not target.is_file():
            raise UsageError(f"{path}: deepspeed_config.deepspeed_config_file {file}: no such file ({target})")
        found.merge(read_deepspeed(target), str(path))
        return
    stage = deepspeed.get("zero_stage")
    if stage is not None:
        found.setup["engine"] = f"zero{_choice(path, 'deepspeed_config.zero_stage', _stage(stage), (0, 1, 2, 3))}"
    gather = _boolean(path, "deepspeed_config.zero3_save_16bit_model", deepspeed.get("zero3_save_16bit_model"))
    if gather:
        found.setup["zero3_gather_16bit"] = gather


def _stage(value: Any) -> Any:
    return int(value) if isinstance(value, str) and value.isdigit() else value


def read_deepspeed(path: Path, data: dict[str, Any] | None = None) -> UserSetup:
    """A DeepSpeed JSON (or the dict a Trainer config holds in its place): the ZeRO stage and whether ZeRO-3 gathers
    16-bit weights on save."""
    data = _load(path, "a DeepSpeed JSON config") if data is None else data
    zero = _mapping(path, data, "zero_optimization")
    found = UserSetup(read=[f"{path.name}: DeepSpeed"])
    stage = zero.get("stage")
    if stage is not None:
        found.setup["engine"] = f"zero{_choice(path, 'zero_optimization.stage', _stage(stage), (0, 1, 2, 3))}"
    gather = _boolean(path, "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                      zero.get("stage3_gather_16bit_weights_on_model_save"))  # fmt: skip
    if gather:
        found.setup["zero3_gather_16bit"] = gather
    return found


def read_trainer(path: Path, pins: dict[str, str] | None = None) -> UserSetup:
    """The Trainer's arguments as a YAML or JSON config writes them (TrainingArguments' own names, and axolotl's,
    LLaMA-Factory's and TRL's for the adapter): the Trainer as the loop, FSDP (its version, from fsdp_config, else
    transformers' default for the release the user pins: FSDP2 from 5.0), DeepSpeed (a path followed, or inline),
    use_reentrant, average_tokens_across_devices, gradient accumulation, the adapter and a 4-bit base."""
    data = _load(path, "a Trainer config (YAML or JSON)")
    found = UserSetup(setup={"loop": "trainer"}, read=[f"{path.name}: the Trainer's arguments"])
    _trainer_engine(path, data, pins or {}, found)
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
    return found


def _trainer_engine(path: Path, data: dict[str, Any], pins: dict[str, str], found: UserSetup) -> None:
    deepspeed = data.get("deepspeed")
    fsdp = data.get("fsdp")
    if deepspeed and fsdp:
        raise UsageError(f"{path}: both deepspeed and fsdp are set: the Trainer runs one of them")
    if isinstance(deepspeed, dict):
        found.merge(read_deepspeed(path, deepspeed), str(path))
    elif isinstance(deepspeed, str) and deepspeed:
        target = (path.parent / deepspeed).resolve()
        if not target.is_file():
            raise UsageError(f"{path}: deepspeed {deepspeed}: no such file ({target})")
        found.merge(read_deepspeed(target), str(path))
    elif deepspeed not in (None, False, ""):
        raise UsageError(f"{path}: deepspeed is {deepspeed!r}: expected a DeepSpeed JSON's path or its settings")
    if fsdp in (None, False, "", []):
        return
    if not isinstance(fsdp, str | list | bool):
        raise UsageError(f"{path}: fsdp is {fsdp!r}: expected the Trainer's fsdp options (a string or a list)")
    config = data.get("fsdp_config") or {}
    if isinstance(config, str):
        target = (path.parent / config).resolve()
        config = _load(target, "an FSDP config") if target.is_file() else {}
    if not isinstance(config, dict):
        raise UsageError(f"{path}: fsdp_config is {config!r}, not a mapping of settings")
    version = config.get("version", config.get("fsdp_version"))
    if version is None:  # transformers' own default: FSDP2 from 5.0 (training_args.py), FSDP1 before
        transformers = pins.get("transformers")
        version = 2 if transformers and _is_version(transformers) and Version(transformers).major >= 5 else 1
        found.read.append(f"{path.name}: no FSDP version: transformers {transformers or '(not given)'}'s default")
    found.setup["engine"] = f"fsdp{_choice(path, 'fsdp_config.version', _stage(version), (1, 2))}"
    state_dict = config.get("state_dict_type", config.get("fsdp_state_dict_type"))
    if state_dict is not None:
        said = _choice(path, "fsdp_config.state_dict_type", str(state_dict).upper(), STATE_DICT_TYPES)
        if STATE_DICT_TYPES[said]:
            found.setup["state_dict"] = STATE_DICT_TYPES[said]


def _trainer_adapter(path: Path, data: dict[str, Any]) -> str | None:
    """LoRA, DoRA, QLoRA or a full fine-tune, as axolotl (`adapter`, `peft_use_dora`, `load_in_4bit`), LLaMA-Factory
    (`finetuning_type`, `use_dora`, `quantization_bit`) and TRL (`use_peft`, `load_in_4bit`) say it."""
    said = data.get("adapter") or data.get("finetuning_type")
    if said is None and data.get("use_peft") is not None:
        said = "lora" if _boolean(path, "use_peft", data.get("use_peft")) == "true" else "full"
    if said is None:
        return None
    said = str(said).lower()
    if said not in ("lora", "qlora", "full", "freeze"):
        raise UsageError(f"{path}: adapter {said!r}: expected lora, qlora or full")
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
