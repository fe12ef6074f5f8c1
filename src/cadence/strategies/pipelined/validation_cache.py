"""OAC's validation cache (SPEC section 1): recent row versions, kept on the compute device.

Entries are (row id, value, optimizer state, timestamp) in slots of preallocated tensors; a dense
``slot_of`` map (one int64 per store row, -1 when uncached) finds a whole batch's slots with one
``index_select``, so lookups, inserts and evictions are vectorised and cost O(batch) copies plus an
O(capacity) comparison, never a rewrite of the cache. Invariants:

- at most one entry per row: inserting a cached row overwrites its slot in place;
- ``repair`` replaces a batch's row only by a strictly newer timestamp than the one it read;
- ``evict_upto(ste)`` frees the slots of entries with timestamp <= ste, which no future batch can need.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cadence.core.rows import RowBlock

INITIAL_CAPACITY = 1024


class ValidationCache:
    def __init__(self, num_rows: int, dim: int, state_width: int, device: torch.device):
        self.device = device
        self.slot_of = torch.full((num_rows,), -1, dtype=torch.int64, device=device)
        self.ids = torch.full((INITIAL_CAPACITY,), -1, dtype=torch.int64, device=device)  # -1: free
        self.values = torch.empty(INITIAL_CAPACITY, dim, device=device)
        self.state = torch.empty(INITIAL_CAPACITY, state_width, device=device)
        self.stamps = torch.full((INITIAL_CAPACITY,), -1, dtype=torch.int64, device=device)
        self.free = torch.arange(INITIAL_CAPACITY - 1, -1, -1, device=device)  # a stack of free slots
        self.size = 0
        self.peak_rows = 0
        self.evicted_rows = 0

    def __len__(self) -> int:
        return self.size

    def cached_ids(self) -> Tensor:
        return self.ids[self.ids >= 0]

    def evict_upto(self, safe_to_evict: int) -> None:
        drop = (self.ids >= 0) & (self.stamps <= safe_to_evict)
        slots = drop.nonzero().squeeze(1)
        if slots.numel():
            self.slot_of.index_fill_(0, self.ids.index_select(0, slots), -1)
            self.ids.index_fill_(0, slots, -1)
            self.free = torch.cat([self.free, slots])
            self.size -= slots.numel()
            self.evicted_rows += slots.numel()

    def repair(self, ids: Tensor, rows: RowBlock) -> int:
        """Replace rows the batch read stale by their newer cached versions; return how many."""
        if not self.size:
            return 0
        slots = self.slot_of.index_select(0, ids)
        cached = slots >= 0
        newer = cached & (self.stamps.index_select(0, slots.clamp(min=0)) > rows.versions)
        count = int(newer.sum())
        if count:
            where = newer.nonzero().squeeze(1)
            source = slots.index_select(0, where)
            rows.values.index_copy_(0, where, self.values.index_select(0, source))
            rows.state.index_copy_(0, where, self.state.index_select(0, source))
            rows.versions.index_copy_(0, where, self.stamps.index_select(0, source))
        return count

    def insert(self, ids: Tensor, rows: RowBlock) -> None:
        """Add a computed batch's rows (unique ids), overwriting their older entries."""
        slots = self.slot_of.index_select(0, ids)
        missing = (slots < 0).nonzero().squeeze(1)
        if missing.numel():
            if missing.numel() > self.free.numel():
                self._grow(missing.numel())
            fresh = self.free[-missing.numel():]
            self.free = self.free[:-missing.numel()]
            new_ids = ids.index_select(0, missing)
            slots.index_copy_(0, missing, fresh)
            self.slot_of.index_copy_(0, new_ids, fresh)
            self.ids.index_copy_(0, fresh, new_ids)
            self.size += missing.numel()
            self.peak_rows = max(self.peak_rows, self.size)
        self.values.index_copy_(0, slots, rows.values.detach())
        self.state.index_copy_(0, slots, rows.state)
        self.stamps.index_copy_(0, slots, rows.versions)

    def _grow(self, needed: int) -> None:
        old = self.ids.shape[0]
        new = max(2 * old, old + needed)
        extra = new - old
        self.ids = torch.cat([self.ids, self.ids.new_full((extra,), -1)])
        self.values = torch.cat([self.values, self.values.new_empty(extra, self.values.shape[1])])
        self.state = torch.cat([self.state, self.state.new_empty(extra, self.state.shape[1])])
        self.stamps = torch.cat([self.stamps, self.stamps.new_full((extra,), -1)])
        self.free = torch.cat([torch.arange(new - 1, old - 1, -1, device=self.device), self.free])
