"""Errors that the CLI turns into one clear line and exit code 2, and the stop signals it turns into 130/143."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user (profile, CLI argument, results path). Nothing has run yet."""


class ProfileError(UsageError):
    """A profile file is malformed; the message names the file and the key."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}")
        self.path = path
        self.key = key


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: records kept, meta says interrupted, the partial table written."""

    signal_name = "SIGTERM"


def stopped_by(signal_name: str | None) -> KeyboardInterrupt:
    """The stop to raise again after an inner run caught it (a probe's matrix run): the command stops too."""
    return Terminated() if signal_name == "SIGTERM" else KeyboardInterrupt()
