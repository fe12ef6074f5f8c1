"""A reader for the Criteo display-advertising TSV format (Kaggle / Terabyte click logs).

Each line has 40 tab-separated columns: the label (0 or 1), 13 integer features I1-I13 and 26
categorical features C1-C26 (hashed values written as 8 hex digits); any feature may be empty.

- numeric: ``dense = log(1 + max(x, 0))``, an empty value counts as 0. Negative counts (a few in
  I2) are clipped to 0, as the DLRM reference preprocessing does: the log needs x > -1, and the
  negative values are rare sentinels, not magnitudes.
- categorical: exactly 8 hex digits -> ``value_index = int(value, 16)`` (< 2**32); any other
  non-empty string -> a stable 39-bit blake2b hash placed above 2**32, so it never meets a hex
  value; empty -> ``MISSING``, one "missing" value per field. Keys: ``feature_key(c, value_index)``
  for column Cc+1 (field index c).
- no timestamps in the format: they are 0, and ``CtrDataset.periods`` then cuts in file order,
  which is time order in the released day files.

Strict: a line without 40 columns, a label other than 0/1, a non-integer numeric feature or
non-UTF-8 bytes raise ``DataError`` with file and line. Blank lines are skipped; a UTF-8 byte-order
mark is dropped; a first line of column names (a header, which the format does not have) is
skipped with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import string
from array import array
from pathlib import Path

import numpy as np
import torch

from cadence.data.ctr_examples import MAX_VALUE_INDEX, VALUE_BITS, CtrDataset, CtrExamples, CtrRows
from cadence.data.text import numbered_lines
from cadence.errors import DataError

log = logging.getLogger("cadence")

NUM_DENSE = 13
NUM_CATEGORICAL = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_CATEGORICAL
DENSE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)]
FIELD_NAMES = [f"C{i}" for i in range(1, NUM_CATEGORICAL + 1)]
MISSING = MAX_VALUE_INDEX
HASHED_BASE = 1 << 32
_HEX = frozenset(string.hexdigits)
_INTEGER = re.compile(r"-?[0-9]+")  # stricter than int(), which also takes "+1", " 1" and "1_0"


def category_value(text: str) -> int:
    """The value index of one categorical column value."""
    if not text:
        return MISSING
    if len(text) == 8 and _HEX.issuperset(text):
        return int(text, 16)
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return HASHED_BASE + digest % (MISSING - HASHED_BASE)


def dense_value(count: int) -> float:
    return math.log1p(max(count, 0))


def is_header(line: str) -> bool:
    """A first line of column names (``label  I1 ... C26``) rather than an example: its label column
    is a word."""
    label = line.split("\t", 1)[0].strip()
    return label[:1].isalpha()


def parse_line(line: str, path: Path, number: int, labelled: bool = True) -> tuple[float, list[float], list[int]]:
    """(label, 13 dense values, 26 categorical value indices) of one line; ``labelled=False``: a line
    without the label column (I1-I13, C1-C26: rows to predict), its label NaN."""
    columns = line.split("\t")
    if len(columns) != NUM_COLUMNS - (not labelled):
        raise DataError(f"expected {NUM_COLUMNS - (not labelled)} tab-separated columns "
                        f"({'label, ' if labelled else ''}I1-I13, C1-C26), found {len(columns)}", path, number)
    if not labelled:
        columns = ["nan", *columns]
    elif columns[0] not in ("0", "1"):
        raise DataError(f"label {columns[0]!r} is not 0 or 1", path, number)
    dense = []
    for name, text in zip(DENSE_NAMES, columns[1:1 + NUM_DENSE], strict=True):
        if text and not _INTEGER.fullmatch(text):
            raise DataError(f"{name} value {text!r} is not an integer", path, number)
        try:
            dense.append(dense_value(int(text)) if text else 0.0)
        except OverflowError:
            raise DataError(f"{name} value {text[:20]}... is too large for a count", path, number) from None
    return float(columns[0]), dense, [category_value(text) for text in columns[1 + NUM_DENSE:]]


def read_criteo(path: str | Path, max_rows: int | None = None) -> CtrDataset:
    """The first ``max_rows`` examples (all when None) of a Criteo-format file."""
    path = Path(path)
    examples, _, _ = _read_examples(path, max_rows, label_optional=False)
    return CtrDataset(path.stem, list(FIELD_NAMES), [], list(DENSE_NAMES), examples)


def read_criteo_rows(path: str | Path) -> CtrRows:
    """Rows to predict, from a Criteo-format file, read and hashed as ``read_criteo`` reads a training
    file. Its lines have the label column (40 columns) or all lack it (39: I1-I13, C1-C26); the first
    example decides, and a line of the other layout is an error naming it."""
    return CtrRows(*_read_examples(Path(path), None, label_optional=True))


def _read_examples(path: Path, max_rows: int | None, label_optional: bool) -> tuple[CtrExamples, list[int], bool]:
    """(the examples, each one's line number, whether they have labels); blank lines skipped, and a
    first line of column names. ``label_optional``: the first example says whether lines have the
    label column (else they must)."""
    labels, dense, values, lines = array("f"), array("f"), array("q"), []  # flat and compact: 4-8 bytes a value
    labelled = None if label_optional else True
    for number, line in numbered_lines(path):
        if max_rows is not None and len(labels) >= max_rows:
            break
        if not line.strip():
            continue
        if number == 1 and is_header(line):
            log.warning("%s:1: skipped a header line (%s...): the Criteo format has none", path, line[:40])
            continue
        if labelled is None:
            labelled = line.count("\t") + 1 == NUM_COLUMNS
        label, row_dense, row_values = parse_line(line, path, number, labelled)
        labels.append(label)
        dense.extend(row_dense)
        values.extend(row_values)
        lines.append(number)
    if not labels:
        raise DataError("file holds no examples", path)
    n = len(labels)
    fields = torch.arange(NUM_CATEGORICAL, dtype=torch.int64) << VALUE_BITS
    examples = CtrExamples(
        keys=torch.from_numpy(np.frombuffer(values, dtype=np.int64).reshape(n, NUM_CATEGORICAL)) | fields,
        bags=torch.empty(n, 0, 0, dtype=torch.int64),
        dense=torch.from_numpy(np.frombuffer(dense, dtype=np.float32).reshape(n, NUM_DENSE)),
        labels=torch.from_numpy(np.frombuffer(labels, dtype=np.float32)),
        timestamps=torch.zeros(n, dtype=torch.int64),
    )
    return examples, lines, bool(labelled)
