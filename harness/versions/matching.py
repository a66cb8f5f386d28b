"""A user's version against a release: `2.4` names every 2.4.x release, `2.4.1` only itself (prefix on release
components; a local part such as `+cu130` is left out). `lookup` and `lookup --measure` share these."""

from __future__ import annotations

from packaging.version import Version

from harness.define.packages import public_version


def matches(have: str | None, wanted: str) -> bool:
    """'2.4' matches 2.4.0 and 2.4.1; '2.4.1' only 2.4.1."""
    if not have:
        return False
    have_parts, wanted_parts = Version(public_version(have) or have).release, Version(wanted).release
    return have_parts[: len(wanted_parts)] == wanted_parts


def release_key(version: str) -> tuple[int, ...]:
    return Version(public_version(version) or version).release


def at_most(have: str | None, wanted: str) -> bool:
    """`have` is the asked release or an older one."""
    return bool(have) and (matches(have, wanted) or release_key(have) < release_key(wanted))  # type: ignore[arg-type]


def at_least(have: str | None, wanted: str) -> bool:
    """`have` is the asked release or a newer one."""
    return bool(have) and (matches(have, wanted) or release_key(have) > release_key(wanted))  # type: ignore[arg-type]
