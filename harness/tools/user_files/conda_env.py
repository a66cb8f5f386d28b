"""A conda `environment.yml` (what `conda env export` writes, or a hand-written one): the conda pins of the packages
the atlas judges (conda's names: `pytorch` is torch) and its `pip:` section, read with pip's grammar. conda's own
match specs are read as conda reads them: `name==1.2.3` is that release, `name=1.2.3` is `1.2.3.*` (read as 1.2.3
where it names a full release of three numbers or more, as pins do), `name 1.2.3` that release, a range a range, a
build string ignored; anything else of conda's (an OR of versions, a wildcard in a build) is said and not judged. An
explicit spec (`@EXPLICIT`, `conda list --explicit`) and conda-lock files are not read, and said so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from harness.define.packages import AXIS_PACKAGES
from harness.errors import UsageError
from harness.tools.user_files.user_text import load_yaml, shown

#: conda's names of the packages the atlas judges.
CONDA_NAMES = {"pytorch": "torch", "pytorch-gpu": "torch", "pytorch-cpu": "torch", **{p: p for p in AXIS_PACKAGES}}
_SPEC = re.compile(r"^(?:(?P<channel>[^:\s]+)::)?(?P<name>[A-Za-z0-9_.\-]+)\s*(?P<rest>.*)$")


@dataclass
class CondaRead:
    """What the file says: exact conda pins, conda ranges (as PEP 440 specifiers), the pip lines, what was not read."""

    pins: dict[str, str] = field(default_factory=dict)
    loose: list[str] = field(default_factory=list)
    pip_lines: list[tuple[str, str]] = field(default_factory=list)  # (where, line)
    not_read: list[str] = field(default_factory=list)


def looks_like_conda(path: Path, text: str) -> bool:
    """An environment.yml by its name or its top-level keys; a conda explicit spec by its marker line."""
    if path.name.lower() in ("environment.yml", "environment.yaml", "env.yml", "env.yaml"):
        return True
    if re.search(r"^@EXPLICIT\s*$", text, re.M):
        return True
    return path.suffix.lower() in (".yml", ".yaml") or bool(re.search(r"^(dependencies|channels)\s*:", text, re.M))


def read_conda(path: Path, text: str) -> CondaRead:
    if re.search(r"^@EXPLICIT\s*$", text, re.M):
        raise UsageError(f"{path}: a conda explicit spec (conda list --explicit): not read; give the environment.yml "
                         "`conda env export` writes, or `pip freeze` of that environment")  # fmt: skip
    data = load_yaml(path, text, "a conda environment.yml")
    if isinstance(data, dict) and "package" in data and "metadata" in data:
        raise UsageError(f"{path}: a conda-lock file: not read; give the environment.yml it was made from, or "
                         "`pip freeze` of that environment")  # fmt: skip
    if not isinstance(data, dict) or not isinstance(data.get("dependencies"), list):
        raise UsageError(f"{path}: not read: neither a requirements file nor a conda environment.yml "
                         "(no list of dependencies in it)")  # fmt: skip
    found = CondaRead()
    for number, item in enumerate(data["dependencies"], 1):
        where = f"{path.name}: dependencies[{number}]"
        if isinstance(item, dict) and set(item) == {"pip"}:
            lines = item["pip"] or []
            if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
                raise UsageError(f"{where}: pip is {shown(lines)}: expected a list of requirement lines")
            found.pip_lines += [(f"{where}.pip[{n}]", line) for n, line in enumerate(lines, 1)]
        elif isinstance(item, str):
            _conda_spec(where, item, found)
        else:
            raise UsageError(f"{where}: {shown(item)}: expected a conda package or a `pip:` list")
    return found


def _conda_spec(where: str, said: str, found: CondaRead) -> None:
    spec = _SPEC.match(said.strip())
    if not spec:
        raise UsageError(f"{where}: {shown(said)} is not a conda package")
    package = CONDA_NAMES.get(spec.group("name").lower())
    if package is None:
        return  # a package the atlas does not judge
    rest = spec.group("rest").strip()
    if not rest:
        found.loose.append(package)
        return
    if rest.startswith("=") and not rest.startswith("=="):  # name=1.2.3[=build]: conda's 1.2.3.*
        version = rest[1:].split("=", 1)[0].strip()
        if "*" not in version and _release_parts(version) >= 3:
            found.pins[package] = version
        else:
            _range(where, said, package, "==" + version.rstrip(".*") + ".*", found)
        return
    if " " in rest and not re.match(r"^[<>=!~]", rest):  # name 1.2.3 build
        rest = rest.split()[0]
    if re.fullmatch(r"[0-9][^\s,|<>=!*]*", rest):
        rest = "==" + rest
    if rest.startswith("==") and "*" not in rest and "," not in rest and "|" not in rest:
        found.pins[package] = rest[2:].split("=", 1)[0].strip()
        return
    _range(where, said, package, rest.split("=", 2)[0] if rest.count("=") > 2 else rest, found)


def _range(where: str, said: str, package: str, spec: str, found: CondaRead) -> None:
    if "|" in spec:
        found.not_read.append(f"{where}: {said} (conda's OR of versions)")
        return
    try:
        found.loose.append(package + str(SpecifierSet(spec)))
    except InvalidSpecifier:
        found.not_read.append(f"{where}: {said} (a conda version spec this tool does not read)")


def _release_parts(version: str) -> int:
    try:
        return len(Version(version).release)
    except ValueError:  # InvalidVersion, or a number of more digits than int() converts
        return 0


def describe(found: CondaRead) -> dict[str, Any]:
    return {"pins": found.pins, "loose": found.loose, "pip": [line for _, line in found.pip_lines]}
