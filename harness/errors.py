"""Errors that the CLI turns into one clear line and exit code 2."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user (profile, CLI argument, results path). Nothing has run yet."""


class ProfileError(UsageError):
    """A profile file is malformed; the message names the file and the key."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}")
        self.path = path
        self.key = key
