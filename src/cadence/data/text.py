"""Reading users' text files strictly (every reader reports a problem as ``path:line: what``), and
writing names and numbers as TSV fields that read back whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from cadence.errors import DataError

UTF8_BOM = b"\xef\xbb\xbf"
TSV_DIGITS = "%.9g"  # 9 significant digits: every float32 reads back to itself
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def numbered_lines(path: str | Path, missing: str = "file not found") -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end-of-line) of a UTF-8 file, a byte-order mark at
    its start dropped (editors on Windows write one; it would glue itself to the first name);
    ``DataError`` for a missing file (with the ``missing`` hint), a directory, or a line that is
    not UTF-8."""
    path = Path(path)
    if path.is_dir():
        raise DataError("is a directory, where a file was expected", path)
    if not path.is_file():
        raise DataError(missing, path)
    try:
        handle = open(path, "rb")
    except OSError as err:
        raise DataError(f"cannot read it: {err.strerror}", path) from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise DataError(f"not UTF-8 text (byte {err.start} of the line)", path, number) from None


def tsv_name(name: Any) -> str:
    """A name as one TSV field: a backslash, tab, newline or carriage return in it written as ``\\\\``,
    ``\\t``, ``\\n``, ``\\r`` (the escapes of PostgreSQL's text format)."""
    return str(name).translate(_TSV_ESCAPES)
