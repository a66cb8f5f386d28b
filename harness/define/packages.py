"""The one package table: every package the matrix knows, with its short id, import name and install quirks.

Everything else derives from it: which packages a profile may put on an axis, the order of cell ids and table
columns, the versions a record keeps, what a reproducer pins, how an environment installs a package that
needs torch at build time. Adding an axis (say `trl`) is one row here plus the profiles that use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class Package:
    """One distribution. `axis` packages may vary across cells; the others are support pins only."""

    name: str
    #: Its part of a cell id: 'ds-0.19.2'.
    short: str
    import_name: str
    axis: bool
    #: Built against the environment's torch (it imports torch at build time), so installed in a second step.
    no_build_isolation: bool = False
    #: What that second step needs besides torch.
    build_requires: tuple[str, ...] = ()
    #: Environment variables for its build.
    build_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: The packages it imports whenever it is imported (its install requirements), so that code which imports it
    #: depends on their releases too: peft imports transformers and accelerate.
    imports: tuple[str, ...] = ()


DEEPSPEED_BUILD = ("setuptools", "wheel", "ninja", "packaging", "psutil", "py-cpuinfo")

#: In the order cell ids and tables show them.
PACKAGES: tuple[Package, ...] = (
    Package("torch", "torch", "torch", axis=True),
    Package("transformers", "tf", "transformers", axis=True, imports=("huggingface-hub", "safetensors", "tokenizers")),
    Package(
        "peft",
        "peft",
        "peft",
        axis=True,
        imports=("torch", "transformers", "accelerate", "safetensors", "huggingface-hub"),
    ),
    Package("accelerate", "acc", "accelerate", axis=True, imports=("torch", "safetensors", "huggingface-hub")),
    # An sdist only: with DS_BUILD_OPS=0 it builds a pure-Python wheel, but it imports torch to do so.
    Package(
        "deepspeed",
        "ds",
        "deepspeed",
        axis=True,
        no_build_isolation=True,
        build_requires=DEEPSPEED_BUILD,
        build_env=MappingProxyType({"DS_BUILD_OPS": "0"}),
        imports=("torch",),
    ),
    Package("bitsandbytes", "bnb", "bitsandbytes", axis=True, imports=("torch",)),
    Package("tokenizers", "tokenizers", "tokenizers", axis=False),
    Package("huggingface-hub", "hub", "huggingface_hub", axis=False),
    Package("safetensors", "safetensors", "safetensors", axis=False),
    Package("trl", "trl", "trl", axis=False),
    Package("numpy", "numpy", "numpy", axis=False),
    Package("hypothesis", "hypothesis", "hypothesis", axis=False),
)

BY_NAME: Mapping[str, Package] = MappingProxyType({p.name: p for p in PACKAGES})


def imported_with(names: Iterable[str]) -> set[str]:
    """The packages importing `names` imports, them included (peft -> torch, transformers, accelerate, ...)."""
    found: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += list(BY_NAME[name].imports) if name in BY_NAME else []
    return found


#: Packages a profile may put on an axis or in a stack, in table order.
AXIS_PACKAGES: tuple[str, ...] = tuple(p.name for p in PACKAGES if p.axis)
#: Packages a profile may also pin through `implied` rules or `[install] extra`.
SUPPORT_PACKAGES: tuple[str, ...] = tuple(p.name for p in PACKAGES if not p.axis)
#: What a record's versions and a reproducer's pins name: the axes, then the support packages.
PINNED_PACKAGES: tuple[str, ...] = AXIS_PACKAGES + SUPPORT_PACKAGES


def short_name(name: str) -> str:
    """The package's part of a cell id; an unknown name stands for itself."""
    package = BY_NAME.get(name)
    return package.short if package else name


def import_name(name: str) -> str:
    """'huggingface-hub' -> 'huggingface_hub'."""
    package = BY_NAME.get(name)
    return package.import_name if package else name.replace("-", "_")


def public_version(version: str | None) -> str | None:
    """Without a local label (2.13.0+cpu -> 2.13.0): the index decides the build, `==` still matches it."""
    return version.split("+", 1)[0] if version else version


def late_installed(names: list[str]) -> list[str]:
    """Those of `names` that must be built against the environment's torch, in a second install step."""
    return [n for n in names if n in BY_NAME and BY_NAME[n].no_build_isolation]


def build_requirements(names: list[str]) -> list[str]:
    """What the late step needs besides torch, for these packages."""
    out: list[str] = []
    for name in late_installed(names):
        out += [r for r in BY_NAME[name].build_requires if r not in out]
    return out


def build_env(names: list[str]) -> dict[str, str]:
    """Build environment variables for these packages."""
    env: dict[str, str] = {}
    for name in late_installed(names):
        env.update(BY_NAME[name].build_env)
    return env


#: Classes whose methods a package's API is called through, by the package that owns them: an error that names one
#: ("Accelerator.unwrap_model() got an unexpected keyword argument") is about that package's API.
API_OWNERS: Mapping[str, str] = MappingProxyType(
    {
        "Accelerator": "accelerate", "AcceleratorState": "accelerate", "PartialState": "accelerate",
        "FullyShardedDataParallelPlugin": "accelerate", "DeepSpeedPlugin": "accelerate",
        "Trainer": "transformers", "TrainingArguments": "transformers", "PreTrainedModel": "transformers",
        "PeftModel": "peft", "LoraConfig": "peft", "PeftConfig": "peft",
        "DeepSpeedEngine": "deepspeed", "Linear4bit": "bitsandbytes", "Params4bit": "bitsandbytes",
    }
)  # fmt: skip
