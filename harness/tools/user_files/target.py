"""The machine a user's files are read for: its operating system, CPU and Python, as PEP 508's environment markers
see them. A requirements line `torch==2.4.1; sys_platform == "linux"`, a forked `uv.lock` and a PEP 751 lock name
different releases for different machines; pip installs the one whose markers hold where it runs, so `audit` reads
them for one target (`--platform`, `--python-version`; default: this machine) and says which.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass

from packaging.markers import default_environment

from harness.errors import UsageError

#: --platform's systems: name -> (sys_platform, platform_system, os_name, the usual machine).
SYSTEMS = {
    "linux": ("linux", "Linux", "posix", "x86_64"),
    "windows": ("win32", "Windows", "nt", "AMD64"),
    "macos": ("darwin", "Darwin", "posix", "arm64"),
}
ALIASES = {"win32": "windows", "win": "windows", "darwin": "macos", "osx": "macos", "mac": "macos"}


@dataclass(frozen=True)
class Target:
    """One machine: `system` (linux, windows, macos), `machine` (platform.machine(): x86_64, aarch64, AMD64, arm64),
    `python` (a release: 3.11 or 3.11.7)."""

    system: str
    machine: str
    python: str

    def environment(self) -> dict[str, str]:
        """PEP 508's marker variables for this machine (packaging's names)."""
        found = dict(default_environment())
        sys_platform, system, os_name, _ = SYSTEMS[self.system]
        full = self.python if self.python.count(".") >= 2 else f"{self.python}.0"
        if self.system != here().system:
            found |= {"platform_release": "", "platform_version": ""}
        if full != found["python_full_version"]:
            found["implementation_version"] = full
        return found | {
            "sys_platform": sys_platform,
            "platform_system": system,
            "os_name": os_name,
            "platform_machine": self.machine,
            "python_version": ".".join(full.split(".")[:2]),
            "python_full_version": full,
        }

    def words(self) -> str:
        return f"{self.system} {self.machine}, Python {self.python}"

    def as_json(self) -> dict[str, str]:
        return {"platform": self.system, "machine": self.machine, "python": self.python}


def here() -> Target:
    """This machine."""
    system = {"win32": "windows", "darwin": "macos"}.get(sys.platform, "linux")
    return Target(system, platform.machine() or SYSTEMS[system][3], ".".join(map(str, sys.version_info[:2])))


def target_of(platform_said: str | None, python: str | None) -> Target:
    """The target `--platform SYSTEM[-MACHINE]` and `--python-version X.Y[.Z]` name; what they leave out is this
    machine's (a system other than this one's gets its usual machine)."""
    found = here()
    system, machine = found.system, found.machine
    if platform_said:
        name, _, said_machine = platform_said.strip().lower().partition("-")
        name = ALIASES.get(name, name)
        if name not in SYSTEMS:
            raise UsageError(f"--platform {platform_said}: expected linux, windows or macos (optionally -MACHINE: "
                             "linux-aarch64, macos-x86_64, windows-amd64)")  # fmt: skip
        if name != system:
            machine = SYSTEMS[name][3]
        system = name
        if said_machine:
            machine = {"amd64": "AMD64" if name == "windows" else "x86_64", "arm64": "arm64" if name == "macos"
                       else "aarch64"}.get(said_machine, said_machine)  # fmt: skip
    version = found.python
    if python:
        parts = python.strip().split(".")
        if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts) or parts[0] != "3":
            raise UsageError(f"--python-version {python}: expected a Python 3 release such as 3.11 or 3.12.4")
        version = ".".join(str(int(p)) for p in parts)
    return Target(system, machine, version)
