"""OAC's validation cache (SPEC section 1): recent row versions, kept on the compute device.

Entries are (row id, value, optimizer state, timestamp), held as four tensors sorted by id so that a
whole batch is looked up with one ``searchsorted`` (no per-row Python). Invariants:

- at most one entry per row: inserting a row replaces its older entry;
- ``repair`` replaces a batch's row only by a strictly newer timestamp than the one it read;
- ``evict_upto(ste)`` drops entries with timestamp <= ste, which no future batch can need.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cadence.store.embedding_store import RowBlock


class ValidationCache:
    def __init__(self, dim: int, state_width: int, device: torch.device):
        self.ids = torch.empty(0, dtype=torch.int64, device=device)
        self.values = torch.empty(0, dim, device=device)
        self.state = torch.empty(0, state_width, device=device)
        self.stamps = torch.empty(0, dtype=torch.int64, device=device)
        self.peak_rows = 0
        self.evicted_rows = 0

    def __len__(self) -> int:
        return self.ids.shape[0]

    def evict_upto(self, safe_to_evict: int) -> None:
        keep = self.stamps > safe_to_evict
        dropped = len(self) - int(keep.sum())
        if dropped:
            self.ids, self.values, self.state, self.stamps = (
                self.ids[keep], self.values[keep], self.state[keep], self.stamps[keep])
            self.evicted_rows += dropped

    def repair(self, ids: Tensor, rows: RowBlock) -> int:
        """Replace rows the batch read stale by their newer cached versions; return how many."""
        if not len(self):
            return 0
        position = torch.searchsorted(self.ids, ids).clamp_(max=len(self) - 1)
        newer = (self.ids[position] == ids) & (self.stamps[position] > rows.versions)
        count = int(newer.sum())
        if count:
            source = position[newer]
            rows.values[newer] = self.values[source]
            rows.state[newer] = self.state[source]
            rows.versions[newer] = self.stamps[source]
        return count

    def insert(self, ids: Tensor, rows: RowBlock) -> None:
        """Add a computed batch's rows (ids sorted and unique), replacing older entries."""
        keep = ~torch.isin(self.ids, ids)
        merged_ids = torch.cat([self.ids[keep], ids])
        order = torch.argsort(merged_ids)
        self.ids = merged_ids[order]
        self.values = torch.cat([self.values[keep], rows.values.detach()])[order]
        self.state = torch.cat([self.state[keep], rows.state])[order]
        self.stamps = torch.cat([self.stamps[keep], rows.versions])[order]
        self.peak_rows = max(self.peak_rows, len(self))
