"""Fingerprints of a task's data, recorded in every checkpoint.

A checkpoint's rows are meaningful only with the id maps they were trained on (row 17 is entity
``C0017``, not whatever the 18th name of an edited file is). Each task names the parts of its data
(``Task.data_parts``: id maps, splits, examples) and every checkpoint records one digest per part;
``--resume``, ``eval`` and ``export`` recompute them from the data as it is now and refuse, naming
the parts that differ, when they do not match. The digests cover the data *as loaded* (names,
tensors), so a registered dataset, a user's files and a generated one are treated alike, and a
change that leaves the loaded data equal (a comment, a reordered blank line) is not a change.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from torch import Tensor

from cadence.errors import DataError

KEY = "data"  # the key of a checkpoint's state that holds the fingerprint
DIGITS = 16   # hex digits kept of each sha256 (64 bits: a collision is not a practical concern)

Part = Tensor | str | int | float | Iterable[str] | None


def digest(*items: Part) -> str:
    """sha256 (first ``DIGITS`` hex digits) of ``items``: tensors by dtype, shape and bytes; a
    list of strings by its entries (length-prefixed, so ``["ab"]`` differs from ``["a", "b"]``)."""
    hasher = hashlib.sha256()
    for item in items:
        if isinstance(item, Tensor):
            array = np.ascontiguousarray(item.detach().cpu().numpy())
            hasher.update(f"tensor:{array.dtype.str}:{array.shape};".encode())
            hasher.update(array.tobytes())
        elif item is None or isinstance(item, (str, int, float)):
            hasher.update(f"{type(item).__name__}:{item!r};".encode())
        else:
            entries = [str(entry).encode() for entry in item]
            hasher.update(f"list:{len(entries)};".encode())
            for entry in entries:
                hasher.update(len(entry).to_bytes(8, "little") + entry)
    return hasher.hexdigest()[:DIGITS]


def fingerprint(parts: Mapping[str, tuple[Part, ...]]) -> dict[str, str]:
    """{part: digest} of a task's ``data_parts``."""
    return {name: digest(*items) for name, items in parts.items()}


def check(recorded: Any, current: dict[str, str], where: str | Path, dataset: str) -> None:
    """Raise ``DataError`` when ``recorded`` (a checkpoint's fingerprint) differs from ``current``
    (the user's data changed), ``ValueError`` when it has other parts (a checkpoint of another
    task: it does not fit, like one of other shapes); a checkpoint written before fingerprints
    existed (``recorded`` is None) is accepted."""
    if recorded is None:
        return
    if not isinstance(recorded, dict):
        raise DataError("its data fingerprint is malformed", where)
    if set(recorded) != set(current):  # other parts: a checkpoint of another task, not this run's
        raise ValueError(f"a checkpoint of other data ({', '.join(sorted(recorded))})")
    changed = sorted(name for name in current if recorded[name] != current[name])
    if changed:
        raise DataError(f"the data ({dataset}) changed since this run's checkpoint was written ({', '.join(changed)} differ); the "
                        "trained rows would attach to the wrong ids. Use the data the run was trained on, or "
                        "train a new run", where)
