"""Loading a CTR dataset by name (the registry's readers: Criteo TSV, MovieLens, synthetic) or path.
The types, feature keys and splits are ``ctr_examples``'s; they are re-exported here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from cadence.data import criteo, movielens, synthetic_ctr  # noqa: F401  (the readers register themselves)
from cadence.data.ctr_examples import (CTR_DATASETS, MAX_FIELD_INDEX, MAX_VALUE_INDEX, PAD, VALUE_BITS,  # noqa: F401
                                       CtrDataset, CtrDatasetEntry, CtrExamples, CtrRows, feature_key, feature_keys,
                                       field_of)
from cadence.errors import DataError, QueryError


def load_ctr_dataset(name_or_path: str, seed: int, synthetic_config: Any = None) -> CtrDataset:
    """A registered CTR dataset, or a Criteo-format TSV file given by path.

    ``synthetic_config`` (with the keyword arguments of ``synthetic_ctr`` as attributes) sizes a
    generated dataset; registered datasets that are not generated ignore it.
    """
    if name_or_path in CTR_DATASETS:
        entry = CTR_DATASETS.get(name_or_path)
        if synthetic_config is not None and entry.generate is not None:
            return entry.generate(synthetic_config, seed)
        return entry.load(seed)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return criteo.read_criteo(path)
    if path.is_dir():
        raise DataError("is a directory, where a Criteo-format TSV file was expected", path)
    if "/" in name_or_path or name_or_path.startswith(".") or path.suffix:
        raise DataError("file not found (a CTR dataset path must be a Criteo-format TSV file)", path)
    CTR_DATASETS.get(name_or_path)  # raises with the list of names and a close match
    raise AssertionError("unreachable")


def rows_reader(name_or_path: str) -> Callable[[Path], CtrRows]:
    """How rows to predict are read for a run on ``name_or_path``: a file in the format of the data
    set's own files, read and hashed by the reader that read them for training (a Criteo-format file:
    ``criteo.read_criteo_rows``; a registered data set: its entry's ``read_rows``). A generated data
    set has no file format: a ``QueryError``."""
    if name_or_path not in CTR_DATASETS:
        return criteo.read_criteo_rows
    entry = CTR_DATASETS.get(name_or_path)
    if entry.read_rows is None:
        raise QueryError(f"the {name_or_path} data set {'is generated: it has' if entry.generate else 'has'} no file "
                         "format to read rows to predict from (a run on a Criteo-format file reads that format)")
    return entry.read_rows
