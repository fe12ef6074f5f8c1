"""User-facing errors.

Anything a user can cause (a bad config key, a malformed data line, a corrupt checkpoint) raises a
``CadenceError``. The CLI prints its message, without a traceback, and exits non-zero; library
callers catch it like any exception. Bugs stay ordinary exceptions so they keep their traceback.
"""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path
from typing import Iterator


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


class QueryError(CadenceError):
    """A question to a trained model names something it does not know (an entity, a word, a user) or
    asks what its task does not answer (``cadence predict``, ``cadence.load``)."""


class SystemResourceError(CadenceError):
    """The operating system refused: a file cannot be read or written (permissions, a full disk, a
    read-only file system). Exit status 1, apart from a mistake in what the user typed (2)."""

    exit_code = 1


class ProcessLost(CadenceError):
    """A process of the run (a Ray actor: a trainer, a server, a node) died from outside, where the
    strategy cannot recover from it: the run stops; its newest checkpoint is whole."""

    exit_code = 1


# the errors that say a process of the run died (matched by module and name: this module imports
# neither): Ray's for a process of the cluster, torch's for a collective (ShadowSync's MA and BMUF
# rounds over gloo) that cannot form or go on because a peer's process is gone
LOST_PROCESS_ERRORS = {
    "ray.": ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError", "NodeDiedError",
             "OwnerDiedError", "LocalRayletDiedError"),
    "torch.": ("DistStoreError", "DistNetworkError"),
}


def lost_process(err: BaseException) -> bool:
    """Whether ``err`` says a process of the run died (and not that code in one raised)."""
    return any(kind.__module__.startswith(module) and kind.__name__ in names
               for kind in type(err).__mro__ for module, names in LOST_PROCESS_ERRORS.items())


def describe_os_error(err: OSError, path: str | Path | None = None, doing: str | None = None) -> str:
    """``path: cannot <doing>: <reason>`` of an ``OSError`` (its own file names when ``path`` is None)."""
    names = [str(name) for name in (err.filename, err.filename2) if name is not None]
    where = str(path) if path is not None else " -> ".join(names)
    reason = err.strerror or str(err)
    if err.errno == errno.ENOSPC:
        reason += " (the disk is full: free space, then resume the run)"
    text = f"cannot {doing}: {reason}" if doing else reason
    return f"{where}: {text}" if where else text


@contextlib.contextmanager
def os_errors(path: str | Path, doing: str) -> Iterator[None]:
    """Report an ``OSError`` (or a safetensors I/O error) inside as a ``SystemResourceError`` naming
    ``path`` and what was being done."""
    try:
        yield
    except OSError as err:
        raise SystemResourceError(describe_os_error(err, path, doing)) from None
    except Exception as err:
        if type(err).__name__ != "SafetensorError":
            raise
        reason = str(err).split("I/O error: ")[-1]
        raise SystemResourceError(f"{path}: cannot {doing}: {reason}") from None
