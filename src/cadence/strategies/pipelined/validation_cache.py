"""OAC's validation cache (SPEC section 1): recent row versions, kept on the compute device.

An entry is (row id, timestamp, position): the row's version computed by the batch of that
timestamp, found at that position of the batch's own rows, which the cache keeps a reference to
(``blocks``: timestamp -> the batch's ``RowBlock``) rather than a copy. Those rows are in memory
until the batch is written anyway; a copy would hold every row in flight twice, and out of core
that second copy is page cache the table loses (issue 46: under a 900 MiB cap a copy of ~85k rows
of dim 256 made OAC fault its table in twice as often as async). A dense ``slot_of`` map (one int32
per store row, -1 when uncached) finds a whole batch's entries with one ``index_select``, so
lookups, inserts and evictions are vectorised: O(batch) work plus an O(capacity) comparison, and a
repair gathers from each batch it takes rows of (at most the batches in flight). Invariants:

- at most one entry per row: inserting a cached row overwrites its entry in place;
- ``repair`` replaces a batch's row only by a strictly newer timestamp than the one it read;
- ``evict_upto(ste)`` frees the entries with timestamp <= ste, which no future batch can need, and
  drops the blocks of those batches;
- ``compact(stamp, needed)``, once a batch's write has landed (only the batches already read can
  still need its rows, and only the rows they read): its entries for other rows are freed and the
  rest copied into a block of their own, so the batch's whole block is not held until eviction;
- a block is never written after it is inserted (a computed batch's rows are only read: by its
  writer and by repairs).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cadence.core.rows import RowBlock

INITIAL_CAPACITY = 1024


class ValidationCache:
    def __init__(self, num_rows: int, device: torch.device):
        self.device = device
        self.slot_of = torch.full((num_rows,), -1, dtype=torch.int32, device=device)
        self.ids = torch.full((INITIAL_CAPACITY,), -1, dtype=torch.int64, device=device)  # -1: free
        self.stamps = torch.full((INITIAL_CAPACITY,), -1, dtype=torch.int64, device=device)
        self.positions = torch.zeros(INITIAL_CAPACITY, dtype=torch.int64, device=device)
        self.free = torch.arange(INITIAL_CAPACITY - 1, -1, -1, device=device)  # a stack of free slots
        self.blocks: dict[int, RowBlock] = {}  # timestamp -> the rows of the batch it stamped
        self.block_ids: dict[int, Tensor] = {}  # timestamp -> that block's row ids, in its order
        self.compacted: set[int] = set()  # the timestamps whose blocks ``compact`` has cut down
        self.size = 0
        self.peak_rows = 0
        self.evicted_rows = 0

    def __len__(self) -> int:
        return self.size

    def cached_ids(self) -> Tensor:
        return self.ids[self.ids >= 0]

    def evict_upto(self, safe_to_evict: int) -> None:
        self._free(((self.ids >= 0) & (self.stamps <= safe_to_evict)).nonzero().squeeze(1))
        for stamp in [stamp for stamp in self.blocks if stamp <= safe_to_evict]:
            del self.blocks[stamp], self.block_ids[stamp]
            self.compacted.discard(stamp)

    def landed(self, upto: int) -> list[int]:
        """The timestamps <= ``upto`` whose blocks are whole (not compacted yet), oldest first."""
        return sorted(stamp for stamp in self.blocks if stamp <= upto and stamp not in self.compacted)

    def compact(self, stamp: int, needed: Tensor) -> None:
        """Of batch ``stamp``'s live entries keep those whose row is ``needed`` ([rows of its block]
        bool), their rows copied into a block of their own; free the others, and the batch's block."""
        block = self.blocks[stamp]
        mine = ((self.ids >= 0) & (self.stamps == stamp)).nonzero().squeeze(1)
        at = self.positions.index_select(0, mine)
        keep = needed.to(at.device).index_select(0, at)
        self._free(mine[~keep])
        kept, kept_at = mine[keep], at[keep]
        self.blocks[stamp] = RowBlock(block.values.index_select(0, kept_at), block.state.index_select(0, kept_at))
        self.block_ids[stamp] = self.block_ids[stamp].index_select(0, kept_at.to(self.block_ids[stamp].device))
        self.positions.index_copy_(0, kept, torch.arange(kept.shape[0], device=kept.device))
        self.compacted.add(stamp)

    def _free(self, slots: Tensor) -> None:
        if slots.numel():
            self.slot_of.index_fill_(0, self.ids.index_select(0, slots), -1)
            self.ids.index_fill_(0, slots, -1)
            self.free = torch.cat([self.free, slots])
            self.size -= slots.numel()
            self.evicted_rows += slots.numel()

    def repair(self, ids: Tensor, rows: RowBlock) -> int:
        """Replace rows the batch read stale by their newer cached versions; return how many.

        Two reads of device values by the host whatever the number of batches the rows come from
        (the stale positions, then each owner's count): on a GPU each such read waits for the
        device, and a read per owning batch stalled OAC's compute thread once per batch in flight
        (683 launches a batch against async's 72 on the 10M-entity table,
        benchmarks/results/gpu_profile_kge-10m_oac_async.json)."""
        if not self.size:
            return 0
        slots = self.slot_of.index_select(0, ids).long()
        stamps = self.stamps.index_select(0, slots.clamp(min=0))
        where = ((slots >= 0) & (stamps > rows.versions)).nonzero().squeeze(1)  # (the first read)
        count = where.shape[0]
        if count:
            owners, order = stamps.index_select(0, where).sort(stable=True)
            where = where.index_select(0, order)
            at = self.positions.index_select(0, slots.index_select(0, where))
            stamped, counts = torch.stack(torch.unique_consecutive(owners, return_counts=True)).tolist()  # (the second)
            taken = zip(stamped, torch.split(at, counts))
            values, state = zip(*((self.blocks[owner].values.index_select(0, source),
                                   self.blocks[owner].state.index_select(0, source)) for owner, source in taken))
            rows.values.index_copy_(0, where, torch.cat(values))
            rows.state.index_copy_(0, where, torch.cat(state))
            rows.versions.index_copy_(0, where, owners.to(rows.versions.dtype))
        return count

    def insert(self, ids: Tensor, rows: RowBlock) -> None:
        """Add a computed batch's rows (unique ids, all of one timestamp), overwriting their older
        entries; the cache keeps ``rows`` itself, which nobody may write afterwards."""
        assert rows.versions is not None and rows.versions.numel() == ids.numel()
        if not ids.numel():
            return
        stamp = int(rows.versions[0])
        slots = self.slot_of.index_select(0, ids).long()
        missing = (slots < 0).nonzero().squeeze(1)
        if missing.numel():
            if missing.numel() > self.free.numel():
                self._grow(missing.numel())
            fresh = self.free[-missing.numel():]
            self.free = self.free[:-missing.numel()]
            new_ids = ids.index_select(0, missing)
            slots.index_copy_(0, missing, fresh)
            self.slot_of.index_copy_(0, new_ids, fresh.int())
            self.ids.index_copy_(0, fresh, new_ids)
            self.size += missing.numel()
            self.peak_rows = max(self.peak_rows, self.size)
        self.stamps.index_fill_(0, slots, stamp)
        self.positions.index_copy_(0, slots, torch.arange(ids.shape[0], device=slots.device))
        self.blocks[stamp] = rows
        self.block_ids[stamp] = ids

    def _grow(self, needed: int) -> None:
        old = self.ids.shape[0]
        new = max(2 * old, old + needed)
        extra = new - old
        self.ids = torch.cat([self.ids, self.ids.new_full((extra,), -1)])
        self.stamps = torch.cat([self.stamps, self.stamps.new_full((extra,), -1)])
        self.positions = torch.cat([self.positions, self.positions.new_zeros(extra)])
        self.free = torch.cat([torch.arange(new - 1, old - 1, -1, device=self.device), self.free])
