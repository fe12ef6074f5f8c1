"""Row types every layer shares: a block of pulled rows (``RowBlock``), the layout of a task's rows
in one key space (``TableSpec``, ``TablePart``) and read access to trained rows wherever they live
(``ParameterView``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from cadence.core.initial import hashed_normal, initial_rows


@dataclass
class RowBlock:
    """A copy of some rows of a store, in the order of the ids that were pulled."""

    values: Tensor  # [n, dim] float32
    state: Tensor  # [n, state_width] float32
    versions: Tensor | None = None  # [n] int64


class RowStore(Protocol):
    """What ``TableSpec.initialize`` fills: a store's rows, optimizer state and versions."""

    values: Tensor
    state: Tensor
    versions: Tensor

    def initialize(self, std: float, seed: int) -> None: ...


@dataclass(frozen=True)
class TablePart:
    """A named range of keys ``[start, start + count)``; ``zero``: its rows start at 0."""

    name: str
    start: int
    count: int
    zero: bool = False


@dataclass(frozen=True)
class TableSpec:
    """The embedding rows of a task.

    ``rows`` = N: keys are 0..N-1, initialised like ``EmbeddingStore.initialize`` (chunked, seeded
    normal draws), so every backend and every shard of a parameter server starts from the same rows.
    ``rows`` = None: a growing vocabulary of int64 keys, each initialised from a hash of
    (seed, key), so its value never depends on the order in which keys are first seen.
    """

    rows: int | None
    width: int
    init_std: float
    seed: int
    parts: tuple[TablePart, ...] = ()

    @property
    def fixed(self) -> bool:
        return self.rows is not None

    def initial_values(self, keys: Tensor) -> Tensor:
        """[n, width] initial values of ``keys`` (any order, no duplicates needed)."""
        if self.rows is None:
            return hashed_normal(keys, self.width, self.init_std, self.seed & 0xFFFFFFFF)
        values = initial_rows(keys, self.rows, self.width, self.init_std, self.seed)
        for part in self.parts:
            if part.zero:
                values[(keys >= part.start) & (keys < part.start + part.count)] = 0.0
        return values

    def initialize(self, store: RowStore, keys: Tensor | None = None) -> None:
        """Fill ``store`` with the initial rows of ``keys`` (row i holds keys[i]; default: row = key)."""
        if keys is None:
            store.initialize(self.init_std, self.seed)
            for part in self.parts:
                if part.zero:
                    store.values[part.start:part.start + part.count] = 0.0
            return
        for start in range(0, keys.shape[0], 1 << 16):
            chunk = keys[start:start + (1 << 16)]
            store.values[start:start + chunk.shape[0]] = self.initial_values(chunk)
        store.state.zero_()
        store.versions.fill_(-1)

    def part(self, name: str) -> TablePart:
        return next(p for p in self.parts if p.name == name)


class ParameterView(Protocol):
    """Read access to the trained rows, wherever they live (store, server shards, checkpoint)."""

    def values(self, keys: Tensor) -> Tensor:
        """[n, width] rows of ``keys``; keys never trained read their initial values."""
