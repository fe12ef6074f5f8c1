"""Click-through-rate (CTR) examples, their feature keys, their splits, and the registry of CTR datasets
(the readers, ``criteo``, ``movielens`` and ``synthetic_ctr``, register themselves; ``ctr`` loads).

An example is a row of categorical features, optional multi-valued ("bag") features, optional
numeric features and a 0/1 label. Categorical values become **global feature keys**, one int64
per (field, value), so every field can share one embedding table in the parameter server::

    key = (field_index << 40) | value_index        bits 62..40: field, bits 39..0: value

Single-valued fields take field indices ``0 .. F-1`` and bag fields ``F .. F+B-1``, so keys of
different fields never collide. ``value_index`` is < 2**40; readers choose it (MovieLens numbers a
field's distinct raw values in order of first appearance, Criteo parses the hex value). Keys are
sparse: the store grows its table as unseen keys arrive.

Splits: ``random_split`` shuffles with a generator seeded from ``derive_seed(seed, "ctr-split")``
(each part keeps source order); ``periods`` cuts the time-ordered examples into consecutive
"days" of equal count for continual training (train on day d, evaluate on day d+1; GBA, SPEC 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cadence.data import fetch as fetching
from cadence.errors import ConfigError
from cadence.registry import Registry
from cadence.seeding import derive_seed

VALUE_BITS = 40
MAX_VALUE_INDEX = (1 << VALUE_BITS) - 1
MAX_FIELD_INDEX = (1 << (63 - VALUE_BITS)) - 1
PAD = -1  # fills unused slots of a bag


def feature_key(field_index: int, value_index: int) -> int:
    """The global key of value ``value_index`` of field ``field_index``."""
    if not 0 <= field_index <= MAX_FIELD_INDEX or not 0 <= value_index <= MAX_VALUE_INDEX:
        raise ValueError(f"feature ({field_index}, {value_index}) is out of the key range")
    return (field_index << VALUE_BITS) | value_index


def feature_keys(field_index: int, value_indices: Tensor) -> Tensor:
    """``feature_key`` over an int64 tensor of value indices."""
    return value_indices.to(torch.int64) | (field_index << VALUE_BITS)


def field_of(keys: Tensor) -> Tensor:
    """The field index of each key (the inverse of ``feature_key`` on its high bits)."""
    return keys >> VALUE_BITS


@dataclass
class CtrExamples:
    keys: Tensor        # [n, F] int64 keys of the single-valued categorical fields
    bags: Tensor        # [n, B, L] int64 keys of multi-valued fields, PAD-filled; B may be 0
    dense: Tensor       # [n, D] float32 numeric features (D may be 0)
    labels: Tensor      # [n] float32 in {0., 1.}
    timestamps: Tensor  # [n] int64 (0 where the source has none)

    def __post_init__(self) -> None:
        n = self.labels.shape[0]
        for item in fields(self):
            if getattr(self, item.name).shape[0] != n:
                raise ValueError(f"CtrExamples.{item.name} has {getattr(self, item.name).shape[0]} rows, not {n}")

    def __len__(self) -> int:
        return self.labels.shape[0]

    def subset(self, index: Tensor) -> CtrExamples:
        """The examples at ``index`` (int64 positions or a bool mask), in that order. (Positions go
        through ``index_select``: the same rows as ``[index]`` at 2.5x its speed on a batch of 1024,
        which every training batch pays.)"""
        if index.dtype == torch.bool:
            return CtrExamples(**{item.name: getattr(self, item.name)[index] for item in fields(self)})
        return CtrExamples(**{item.name: getattr(self, item.name).index_select(0, index) for item in fields(self)})


@dataclass
class CtrRows:
    """Examples read to be predicted (``cadence predict RUN clicks FILE``): their labels NaN where the
    file has none (``labelled``), and the file line of each."""

    examples: CtrExamples
    lines: list[int]
    labelled: bool


@dataclass
class CtrDataset:
    name: str
    field_names: list[str]  # column f of keys has field index f
    bag_names: list[str]    # bag b has field index len(field_names) + b
    dense_names: list[str]
    examples: CtrExamples   # everything, in source order

    def random_split(
        self, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    ) -> tuple[CtrExamples, CtrExamples, CtrExamples]:
        """Train, valid and test parts, shuffled by ``seed``; each part keeps source order."""
        if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
            raise ConfigError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
        n = len(self.examples)
        generator = torch.Generator().manual_seed(derive_seed(seed, "ctr-split"))
        order = torch.randperm(n, generator=generator)
        first, second = round(fractions[0] * n), round((fractions[0] + fractions[1]) * n)
        parts = (order[:first], order[first:second], order[second:])
        train, valid, test = (self.examples.subset(part.sort().values) for part in parts)
        return train, valid, test

    def periods(self, count: int) -> list[CtrExamples]:
        """``count`` consecutive periods of the time-ordered examples; sizes differ by at most one.

        Equal timestamps keep source order (a stable sort), so a source without timestamps is cut
        in file order, which is time order for day-ordered logs such as Criteo's.
        """
        n = len(self.examples)
        if not 1 <= count <= n:
            raise ConfigError(f"cannot cut {n} examples into {count} periods")
        order = torch.sort(self.examples.timestamps, stable=True).indices
        return [self.examples.subset(chunk) for chunk in torch.tensor_split(order, count)]


@dataclass(frozen=True)
class CtrDatasetEntry:
    name: str
    description: str
    load: Callable[[int], CtrDataset]  # seed -> dataset, with default settings
    source: fetching.WheelSource | None = None  # where a fetched dataset comes from
    generate: Callable[[Any, int], CtrDataset] | None = None  # (config, seed), for a generated dataset
    # rows to predict from a file in the data set's own format, read as its files are (None: no format)
    read_rows: Callable[[Path], CtrRows] | None = None

    def fetch(self) -> Path | None:
        return None if self.source is None else fetching.fetch(self.name, self.source)

    def is_fetched(self) -> bool:
        return self.source is None or fetching.is_fetched(self.name, self.source)


CTR_DATASETS: Registry[CtrDatasetEntry] = Registry("ctr dataset")
