"""User-facing errors.

Anything a user can cause (a bad config key, a malformed data line, a corrupt checkpoint) raises a
``CadenceError``. The CLI prints its message, without a traceback, and exits non-zero; library
callers catch it like any exception. Bugs stay ordinary exceptions so they keep their traceback.
"""

from __future__ import annotations

from pathlib import Path


class CadenceError(Exception):
    """An error caused by the user's input, reported without a traceback."""

    exit_code = 2


class ConfigError(CadenceError):
    """A configuration key is unknown, mistyped or out of range."""


class DataError(CadenceError):
    """A data file is missing, empty, malformed or inconsistent.

    ``path`` and ``line`` (1-based) locate the problem, as compilers do: ``path:line: message``.
    """

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None):
        self.path = None if path is None else str(path)
        self.line = line
        self.reason = message
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(where + message)


class CheckpointError(CadenceError):
    """A checkpoint is missing, corrupt or does not match the run it is loaded into."""


class FetchError(CadenceError):
    """A dataset could not be downloaded or failed its checksum."""
