"""Errors that the CLI turns into one clear line and exit code 2, and the stop signals it turns into 130/143."""

from __future__ import annotations

import re
from collections.abc import Callable


class UsageError(Exception):
    """Bad input from the user (profile, CLI argument, results path). Nothing has run yet."""


class NothingToJudge(UsageError):
    """The user's files name none of the packages the atlas judges: bad input for a gate (exit 2), unless the caller
    says such files are expected (a pre-commit hook on a requirements-dev.txt)."""


class ProfileError(UsageError):
    """A profile file is malformed; the message names the file and the key."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}")
        self.path = path
        self.key = key


class OptionError(UsageError):
    """Bad input about one of the run's settings, raised below the CLI: the text names settings as `{dest}` (the
    option table's name for them, e.g. `{world_sizes}`), never as flags; the CLI words each as the flag that sets
    it (`worded`). Elsewhere it reads with the settings' own names."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(self.worded(lambda dest: dest))

    def worded(self, name_of: Callable[[str], str | None]) -> str:
        """The text with each `{dest}` replaced by `name_of(dest)` (kept as it is where that is None)."""
        return re.sub(r"\{(\w+)\}", lambda m: name_of(m.group(1)) or m.group(0), self.text)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: records kept, meta says interrupted, the partial table written."""

    signal_name = "SIGTERM"


def stopped_by(signal_name: str | None) -> KeyboardInterrupt:
    """The stop to raise again after an inner run caught it (a probe's matrix run): the command stops too."""
    return Terminated() if signal_name == "SIGTERM" else KeyboardInterrupt()
