"""Reading users' text files strictly: every reader reports a problem as ``path:line: what``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from cadence.errors import DataError


def numbered_lines(path: str | Path, missing: str = "file not found") -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end-of-line) of a UTF-8 file; ``DataError`` for a
    missing file (with the ``missing`` hint) or a line that is not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise DataError(missing, path)
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise DataError(f"not UTF-8 text (byte {err.start} of the line)", path, number) from None
