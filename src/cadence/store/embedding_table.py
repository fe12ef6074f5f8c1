"""An embedding table keyed by feature key, growing as unseen keys arrive (a dynamic vocabulary).

Keys are int64 and need not be dense. A ``HashIndex`` maps keys to rows of an ``EmbeddingStore``
(grown by doubling): a batch is looked up in a few vectorised probes, and adding keys is amortised
O(1) (``benchmarks/key_index.py``). A new key's row is initialised from a hash of (seed, key): the
table's contents never depend on the order in which workers first see keys, which keeps runs
reproducible across engines and worker counts.

Hogwild access (``DynamicEmbeddingTable`` under ``hogwild``, ``shadow-*``, ``fr-*``): reading and
writing rows of known keys takes no lock; adding keys takes the table's ``adding`` lock (one writer
of the index at a time; readers never wait for it: ``HashIndex``). What a reader may see: a row
half-written by another thread (some columns new, some old), and an update lost when two threads
update one row at once (each reads, steps and writes the row back), or when an update lands in the
old store while the table grows (the store doubles, copied under the lock; a write to the old copy
during the copy is lost). A growth happens log2(rows) times in a run.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from cadence.store.hash_index import HashIndex
from cadence.core.rows import RowBlock
from cadence.store.embedding_store import create_store
from cadence.core.initial import hashed_normal


class DynamicEmbeddingTable:
    def __init__(self, width: int, state_width: int, init_std: float, seed: int, capacity: int = 1024):
        self.width = width
        self.init_std = init_std
        self.seed = seed
        self.index = HashIndex(capacity)
        self.keys_of_rows = torch.empty(capacity, dtype=torch.int64)  # row -> its key
        self.store = create_store(capacity, width, state_width)
        self.size = 0
        self.added = 0  # keys added since creation (the vocabulary growth a run reports)
        self.adding = threading.Lock()  # held while keys are added (never by a read or write of known keys)

    def __len__(self) -> int:
        return self.size

    def clear(self) -> None:
        """Forget every key (before a checkpoint's rows replace the table)."""
        self.index = HashIndex(self.store.num_rows)
        self.size = 0

    def rows(self, keys: Tensor, create: bool = True) -> Tensor:
        """Row indices of ``keys`` (unique), creating rows for unseen keys (under ``adding``: another
        thread may have added some of them since this one looked)."""
        rows = self.index.lookup(keys)
        missing = rows < 0
        if not bool(missing.any()):
            return rows
        if not create:
            raise KeyError("unknown keys")
        absent = keys[missing]
        with self.adding:
            found = self.index.lookup(absent)
            new = found < 0
            if bool(new.any()):
                found[new] = self._add(absent[new])
        rows[missing] = found
        return rows

    def peek(self, keys: Tensor) -> Tensor:
        """Values of ``keys`` without adding unseen ones (they get their would-be initial rows)."""
        rows = self.index.lookup(keys)
        known = (rows >= 0).nonzero().squeeze(1)
        if known.shape[0] == keys.shape[0]:
            return self.store.values.index_select(0, rows)
        values = hashed_normal(keys, self.width, self.init_std, self.seed)
        values[known] = self.store.values.index_select(0, rows[known])
        return values

    def pull(self, keys: Tensor) -> RowBlock:
        rows = self.rows(keys)  # first: it may grow (replace) the store
        return self.store.pull(rows)

    def set(self, keys: Tensor, block: RowBlock) -> None:
        rows = self.rows(keys)
        self.store.set(rows, block)

    def _add(self, new_keys: Tensor) -> Tensor:
        count = new_keys.shape[0]
        if self.size + count > self.store.num_rows:
            self._grow(self.size + count)
        rows = torch.arange(self.size, self.size + count)
        self.store.values[rows] = hashed_normal(new_keys, self.width, self.init_std, self.seed)
        self.store.state[rows] = 0.0
        self.keys_of_rows[rows] = new_keys
        self.index.insert(new_keys, rows)
        self.size += count
        self.added += count
        return rows

    def _grow(self, needed: int) -> None:
        """A store of twice the rows (or ``needed``), filled, then published (readers never see an
        empty one)."""
        capacity = max(needed, 2 * self.store.num_rows)
        old = self.store
        store = create_store(capacity, old.dim, old.state_width)
        store.values[: self.size] = old.values[: self.size]
        store.state[: self.size] = old.state[: self.size]
        keys = torch.empty(capacity, dtype=torch.int64)
        keys[: self.size] = self.keys_of_rows[: self.size]
        self.store, self.keys_of_rows = store, keys

    def export_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        """(keys sorted, their values, their optimizer state): the table independent of its layout."""
        keys, rows = torch.sort(self.keys_of_rows[: self.size])
        return keys, self.store.values[rows], self.store.state[rows]

    def import_rows(self, keys: Tensor, values: Tensor, state: Tensor) -> None:
        """Add or overwrite the rows of ``keys`` (a checkpoint, or another run's parameters)."""
        if not keys.numel():
            return
        rows = self.rows(keys)
        self.store.values[rows] = values
        self.store.state[rows] = state


class FixedTable:
    """The rows of a fixed key space 0..N-1 that one shard of ``shards`` owns (key % shards == shard),
    with the verbs of ``DynamicEmbeddingTable``. Local row = key // shards; every row starts with the
    value ``spec.initial_values`` gives its key, so any sharding starts from the same model."""

    def __init__(self, spec, state_width: int, shard: int = 0, shards: int = 1):
        self.spec = spec
        self.width = spec.width
        self.shard, self.shards = shard, shards
        # the keys it owns (none when the shard's index is past the last key: more shards than rows)
        self.owned = owned = torch.arange(shard, max(shard, spec.rows), shards)
        self.store = create_store(owned.shape[0], spec.width, state_width)
        for start in range(0, owned.shape[0], 1 << 16):
            chunk = owned[start:start + (1 << 16)]
            self.store.values[start:start + chunk.shape[0]] = spec.initial_values(chunk)
        self.added = 0  # a fixed key space never grows

    def __len__(self) -> int:
        return self.store.num_rows

    def clear(self) -> None:
        """Nothing to forget: a checkpoint's part overwrites every row of a fixed key space."""

    def _local(self, keys: Tensor) -> Tensor:
        return keys.div(self.shards, rounding_mode="floor")

    def pull(self, keys: Tensor) -> RowBlock:
        return self.store.pull(self._local(keys))

    def set(self, keys: Tensor, block: RowBlock) -> None:
        self.store.set(self._local(keys), block)

    def peek(self, keys: Tensor) -> Tensor:
        return self.store.values.index_select(0, self._local(keys))

    def export_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.owned.clone(), self.store.values.clone(), self.store.state.clone()

    def import_rows(self, keys: Tensor, values: Tensor, state: Tensor) -> None:
        """Overwrite the rows of ``keys`` (keys this shard owns: the runtime routes them)."""
        local = self._local(keys)
        self.store.values[local] = values
        self.store.state[local] = state
