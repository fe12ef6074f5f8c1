"""Sparse per-key storage for an AdaPM node: entries made when a key arrives and freed when it leaves.

``Pool`` is a set of columns (tensors whose first dimension is the entry) with a free list: an
entry freed is reused by the next one made, so a node's memory follows the number of entries it
holds, not the size of the key space. The columns are reserved for ``capacity`` entries with
``torch.empty``: the kernel commits a page when it is first written, so a reserve costs address
space, not memory (a pool touches entries 0..used-1 only), and holding more entries than that
needs no copy of the columns while it lasts; beyond it they grow by half. ``Entries`` is
a pool indexed by int64 key (``store.hash_index.HashIndex``): a node's rows and their metadata, its
home records, its cache of where keys it does not hold live.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from cadence.store.hash_index import HashIndex


@dataclass(frozen=True)
class Column:
    """One column of a pool: its shape per entry, its dtype, and the value a new entry starts with
    (None: left as it was, e.g. a row about to be written)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    fill: float | int | None = 0


class Pool:
    """Columns of entries, with a free list; entry numbers are stable while the entry lives."""

    def __init__(self, columns: dict[str, Column], capacity: int = 64):
        self.spec = columns  # (``capacity``: entries reserved, see above)
        self.capacity = max(16, capacity)
        self.columns = {name: torch.empty((self.capacity, *column.shape), dtype=column.dtype)
                        for name, column in columns.items()}
        self.used = 0  # entries 0..used-1 have been handed out at least once
        self.free = torch.empty(0, dtype=torch.int64)

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self.__dict__["columns"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __len__(self) -> int:
        return self.used - self.free.shape[0]

    def allocate(self, count: int) -> Tensor:
        """``count`` new entries, every column at its fill value."""
        reused = self.free[:count]
        self.free = self.free[count:]
        fresh = count - reused.shape[0]
        if self.used + fresh > self.capacity:
            self._grow(self.used + fresh)
        entries = torch.cat([reused, torch.arange(self.used, self.used + fresh)])
        self.used += fresh
        for name, column in self.spec.items():
            if column.fill is not None:
                self.columns[name].index_fill_(0, entries, column.fill)
        return entries

    def release(self, entries: Tensor) -> None:
        if entries.numel():
            self.free = torch.cat([self.free, entries])

    def nbytes(self) -> int:
        """Bytes of the columns' entries handed out so far (the pages written; the rest of the reserve
        is address space only)."""
        return sum(column[:self.used].numel() * column.element_size() for column in self.columns.values())

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity += capacity // 2  # (by half, not double: the peak while copying is 2.5x, not 3x)
        for name, old in self.columns.items():
            new = torch.empty((capacity, *old.shape[1:]), dtype=old.dtype)
            new[:self.used] = old[:self.used]
            self.columns[name] = new
        self.capacity = capacity


class Entries(Pool):
    """A pool indexed by int64 key: ``find`` the entries of keys (-1: none), ``add`` entries for keys
    that have none, ``remove`` entries (their numbers are reused)."""

    def __init__(self, columns: dict[str, Column], capacity: int = 64, expected: int | None = None):
        super().__init__({"key": Column((), torch.int64, None), **columns}, capacity)
        self.index = HashIndex(capacity if expected is None else expected)  # (written whole: sized for the
        # entries expected, it grows if they are more)

    def find(self, keys: Tensor) -> Tensor:
        return self.index.lookup(keys) if keys.numel() else torch.empty(0, dtype=torch.int64)

    def add(self, keys: Tensor) -> Tensor:
        """Entries for ``keys`` (unique, none present)."""
        entries = self.allocate(keys.shape[0])
        self.columns["key"].index_copy_(0, entries, keys)
        self.index.insert(keys, entries)
        return entries

    def find_or_add(self, keys: Tensor) -> Tensor:
        entries = self.find(keys)
        missing = entries < 0
        if bool(missing.any()):
            self.add(torch.unique(keys[missing]))
            entries = self.find(keys)
        return entries

    def remove(self, entries: Tensor) -> None:
        """Free ``entries``; a freed entry's key reads -1 until it is handed out again."""
        if entries.numel():
            self.index.remove(self.columns["key"].index_select(0, entries))
            self.columns["key"].index_fill_(0, entries, -1)
            self.release(entries)

    def nbytes(self) -> int:
        return super().nbytes() + self.index.slot_keys.numel() * 16

    def clear(self) -> None:
        self.index = HashIndex(64)
        self.used, self.free = 0, torch.empty(0, dtype=torch.int64)

    def live(self) -> Tensor:
        """Every entry in use (in no particular order)."""
        return self.index.lookup(self.index.keys())
