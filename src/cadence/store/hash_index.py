"""A hash index from int64 feature keys to table rows, vectorised over a batch of keys.

Open addressing with linear probing in two flat tensors (slot -> key, slot -> row), kept at most
half full, so a lookup probes about 1.5 slots on average and adding keys is amortised O(1)
(doubling rehashes every key once per doubling). A removed key leaves a tombstone that lookups
probe past and insertions reuse; tombstones count towards the load, so a table that churns (keys
come and go: an AdaPM node's relocations) is rebuilt at its live size. Every operation works on a whole batch at once:
each round looks up all the keys still probing, so a round costs a few tensor ops whatever the
batch size, and the number of rounds is the longest probe sequence of the batch (small at load
0.5). This replaces a sorted key array, whose insertions re-sorted every key (O(K log K) per batch
that brings a new key). The rounds run in numpy on views of the tensors: a few thousand keys take
a few rounds of tiny operations, where numpy's ~1 us per call beats torch's ~5 us (a lookup of
1k keys: 70 us instead of 300; large batches cost the same in both).

Readers need no lock while one writer inserts (a Hogwild table: ``DynamicEmbeddingTable`` takes a
lock only to add keys). A slot's row is written before its key, so a reader that finds a key finds
its row; a rehash builds new slot arrays aside and publishes them as one pair (``slots``), so a
reader works on the old pair or the new one, never a mix. A reader may miss a key being inserted
(it reads -1, and the caller adds the key under its lock, where it finds it). Removing keys is for
a single thread (AdaPM's node, under its own lock).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from cadence import compiled

EMPTY = torch.iinfo(torch.int64).min  # a key no caller uses (feature keys are non-negative)
REMOVED = EMPTY + 1  # a tombstone: a key was here (lookups go on past it)
_MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64 (Fibonacci hashing)


class HashIndex:
    def __init__(self, capacity: int = 1024):
        compiled.warm_up("hash_slots")  # (loaded now, not inside the first timed batch that looks a key up)
        capacity = 1 << max(4, (max(capacity, 1) * 2 - 1).bit_length())  # a power of two, >= 2x
        # (slot -> key, slot -> row): one attribute, replaced whole by a rehash (readers take it once)
        self.slots = (torch.full((capacity,), EMPTY, dtype=torch.int64), torch.empty(capacity, dtype=torch.int64))
        self.size = 0
        self.tombstones = 0

    def __len__(self) -> int:
        return self.size

    @property
    def slot_keys(self) -> Tensor:
        return self.slots[0]

    @property
    def slot_rows(self) -> Tensor:
        return self.slots[1]

    @property
    def capacity(self) -> int:
        return self.slot_keys.shape[0]

    @staticmethod
    def _home(keys: np.ndarray, capacity: int) -> np.ndarray:
        mixed = keys * np.int64(_MIX)  # wraps modulo 2^64
        return (mixed ^ (mixed >> 29)) & (capacity - 1)

    def lookup(self, keys: Tensor) -> Tensor:
        """The row of each key, -1 where the key is absent (safe beside one writer: module docstring)."""
        slot_keys, slot_rows = self.slots  # one pair, whatever a writer publishes meanwhile
        found = self._find(_int64(keys), slot_keys.numpy())
        return torch.from_numpy(np.where(found >= 0, slot_rows.numpy()[found], -1))

    def _find(self, wanted: np.ndarray, slot_keys: np.ndarray | None = None) -> np.ndarray:
        """The slot of each key in ``slot_keys`` (this index's own by default), -1 where absent:
        compiled (``compiled.hash_slots``, key by key) where numba is, else ``_find_rounds``."""
        if slot_keys is None:
            slot_keys = self.slot_keys.numpy()
        if compiled.AVAILABLE:
            return compiled.hash_slots(wanted, slot_keys, _MIX, EMPTY)
        return self._find_rounds(wanted, slot_keys)

    def _find_rounds(self, wanted: np.ndarray, slot_keys: np.ndarray) -> np.ndarray:
        """``_find`` in numpy rounds: every key still probing takes one step a round (the reference)."""
        capacity = slot_keys.shape[0]
        slots = self._home(wanted, capacity)
        probed = slot_keys[slots]  # the first probe, for every key at once (most end here)
        hit = probed == wanted
        result = np.where(hit, slots, -1)
        pending = np.flatnonzero(~(hit | (probed == EMPTY)))
        mask = capacity - 1
        slots[pending] = (slots[pending] + 1) & mask
        while pending.size:
            probing = slots[pending]
            probed = slot_keys[probing]
            hit = probed == wanted[pending]
            result[pending[hit]] = probing[hit]
            going_on = ~(hit | (probed == EMPTY))
            pending = pending[going_on]
            slots[pending] = (probing[going_on] + 1) & mask
        return result

    def insert(self, keys: Tensor, rows: Tensor) -> None:
        """Add ``keys`` (unique, none present) with their ``rows``."""
        if not keys.numel():
            return
        if 2 * (self.size + self.tombstones + keys.shape[0]) > self.capacity:
            self._grow(self.size + keys.shape[0])
        self.tombstones -= self._place(keys, rows)
        self.size += keys.shape[0]

    def remove(self, keys: Tensor) -> None:
        """Remove ``keys`` (unique, all present)."""
        if not keys.numel():
            return
        found = self._find(_int64(keys))
        if bool((found < 0).any()):
            raise KeyError("remove: a key that is not in the index")
        self.slot_keys.numpy()[found] = REMOVED
        self.size -= found.shape[0]
        self.tombstones += found.shape[0]

    def copy(self) -> "HashIndex":
        """An independent index with the same keys and rows."""
        twin = HashIndex.__new__(HashIndex)
        twin.slots = (self.slot_keys.clone(), self.slot_rows.clone())
        twin.size, twin.tombstones = self.size, self.tombstones
        return twin

    def keys(self) -> Tensor:
        """Every key held (in no particular order)."""
        return self.slot_keys[self.slot_keys > REMOVED]

    def _place(self, keys: Tensor, rows: Tensor, slots_pair: tuple[Tensor, Tensor] | None = None) -> int:
        """Put ``keys`` and their ``rows`` into free slots of ``slots_pair`` (this index's own by
        default); each slot's row is written before its key (a reader that sees the key sees its
        row). Returns how many tombstones were reused."""
        keys, rows = _int64(keys), _int64(rows)
        slot_keys, slot_rows = (slots_pair or self.slots)[0].numpy(), (slots_pair or self.slots)[1].numpy()
        if compiled.AVAILABLE:  # (key by key, compiled; the rounds below where numba is not)
            return compiled.hash_place(keys, rows, slot_keys, slot_rows, _MIX, EMPTY, REMOVED)
        return self._place_rounds(keys, rows, slot_keys, slot_rows)

    def _place_rounds(self, keys: np.ndarray, rows: np.ndarray, slot_keys: np.ndarray, slot_rows: np.ndarray) -> int:
        """``_place`` in numpy rounds: every key still looking takes one probe a round; of several
        claimants of a free slot the first wins."""
        capacity = slot_keys.shape[0]
        slots = self._home(keys, capacity)
        pending = np.arange(keys.shape[0])
        mask = capacity - 1
        reused_total = 0
        while pending.size:
            wanted = slots[pending]
            found = slot_keys[wanted]
            free = np.flatnonzero((found == EMPTY) | (found == REMOVED))
            # of several claimants of one slot in this round, the first wins; the rest probe on
            _, first = np.unique(wanted[free], return_index=True)
            winners = free[first]
            claimed = wanted[winners]
            slot_rows[claimed] = rows[pending[winners]]  # the row first, then the key that reveals it
            slot_keys[claimed] = keys[pending[winners]]
            reused_total += int((found[winners] == REMOVED).sum())
            settled = np.zeros(pending.shape[0], dtype=bool)
            settled[winners] = True
            pending = pending[~settled]
            slots[pending] = (slots[pending] + 1) & mask
        return reused_total

    def _grow(self, needed: int) -> None:
        """Rehash into a table at most half full with ``needed`` keys (no tombstones), built aside
        and published as one pair."""
        occupied = self.slot_keys > REMOVED
        keys, rows = self.slot_keys[occupied], self.slot_rows[occupied]
        capacity = self.capacity
        while 2 * needed > capacity:
            capacity *= 2
        fresh = (torch.full((capacity,), EMPTY, dtype=torch.int64), torch.empty(capacity, dtype=torch.int64))
        self._place(keys, rows, fresh)
        self.slots = fresh
        self.tombstones = 0


def _int64(values: Tensor) -> np.ndarray:
    """A tensor's values as an int64 numpy array (a view where it already is one)."""
    return values.detach().to(torch.int64).contiguous().numpy()
