"""What an AdaPM node holds (seed 001, SPEC section 2): an entry per key it owns or replicates, or
has intent for, in one table (``entries.Entries``, a hash index from key to entry).

Every key homed here (``key % nodes``) starts here from the task's seeded initial rows (``KeySpace``);
a key gets an entry when it arrives (relocation, replica) or when a worker here acts on an intent
for it, and the entry is freed when the key leaves and no intent is left (its last known owner goes
to the routing's cache). So a node's memory follows its home share and the keys it holds, not the
model. An entry: ``kind`` (``messages``: the main copy, a replica, or nothing), the value (the row
and its entity optimizer's state side by side, ``[width + state]``) and the protocol's metadata; a
replica's value at its last sync lives in a pool of its own (``syncs``). Every method works on arrays
of keys or entries; the caller holds the node's lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import Tensor

from cadence.pm.entries import Column, Entries, Pool
from cadence.pm.messages import ABSENT, OWNER, REPLICA, kinds
from cadence.pm.routing import Routing


@dataclass(frozen=True)
class KeySpace:
    """The task's keys as a node sees them without holding them: ``size`` keys, enumerated a chunk at
    a time (``chunks``: a node keeps its home share of each), each key's initial value (``initial``:
    [n, ``width``], the row and its zero optimizer state, a pure function of the key), and ``fixed``:
    the keys are 0..size-1 (a key outside is refused at once)."""

    size: int
    width: int
    fixed: bool
    chunks: Callable[[], Iterable[Tensor]]
    initial: Callable[[Tensor], Tensor]

    @staticmethod
    def table(keys: Tensor, values: Tensor) -> "KeySpace":
        """A small key space given whole: sorted ``keys`` and their initial ``values`` (tests, benchmarks)."""
        fixed = bool(keys.shape[0]) and torch.equal(keys, torch.arange(keys.shape[0]))
        return KeySpace(keys.shape[0], values.shape[1], fixed, lambda: iter([keys]),
                        lambda wanted: values.index_select(0, torch.searchsorted(keys, wanted)))


class Holdings:
    """A node's entries (``store``), its replicas' sync rows (``syncs``), its routing of the keys it
    does not hold (``routing``), the entries a round looks at (``live``) and its workers' clocks."""

    def __init__(self, index: int, nodes: int, space: KeySpace, workers: int, full: bool):
        """``full``: every key here from the start, a replica unless homed here (full replication)."""
        self.index, self.nodes, self.space = index, nodes, space
        share = space.size if full else -(-space.size // nodes)
        self.store = Entries({
            "kind": Column((), torch.int8, ABSENT),
            "stamp": Column((), torch.int64, 0),  # the tick of the last local change (a write, a merge, an install)
            "version": Column((), torch.int64, 0),  # owner: the main copy's; replica: the one held
            "refreshed": Column((), torch.float64, 0.0),  # replica: last refresh (staleness)
            "moves": Column((), torch.int64, 0),  # owner: relocations of the main copy so far
            "interested": Column((), torch.int64, 0),  # owner: bitmask of nodes with active intent
            "holders": Column((), torch.int64, 0),  # owner: bitmask of replica holders
            "signalled": Column((), torch.bool, False),  # this node told the owner of its intent
            "hint": Column((), torch.int16, None),  # the last known owner
            "active_end": Column((workers,), torch.int64, 0),  # acted intents: end clock per worker
            "sync": Column((), torch.int64, -1),  # replica: its row in ``syncs``
            "tracked": Column((), torch.bool, False),  # a round looks at it (``live``)
            "data": Column((space.width,), torch.float32, None),
        }, capacity=2 * share + 1024, expected=share + share // 8)  # (a reserve: see entries.Pool)
        self.syncs = Pool({"row": Column((space.width,), torch.float32, None)})  # replicas' values at the last sync
        self.routing = Routing(index, nodes, self.store, max(1 << 16, share))
        self.tick = 0
        self._pulled = threading.local()  # each worker's last pull: (keys, entries), for its commit
        self.clocks = [0] * workers
        self._start(full)
        self.peak_entries = len(self.store)

    def _start(self, full: bool) -> None:
        now = time.perf_counter()
        store, index = self.store, self.index
        for chunk in self.space.chunks():
            keys = chunk if full else chunk[self.routing.home(chunk) == index]
            if not keys.numel():
                continue
            entries = store.add(keys)
            store.data.index_copy_(0, entries, self.space.initial(keys))
            home = self.routing.home(keys)
            store.hint.index_copy_(0, entries, home.to(torch.int16))
            mine = home == index
            store.kind.index_copy_(0, entries, torch.where(mine, OWNER, REPLICA).to(torch.int8))
            replicas = entries[~mine]
            if replicas.numel():
                rows = self.syncs.allocate(replicas.shape[0])
                self.syncs.row.index_copy_(0, rows, store.data.index_select(0, replicas))
                store.sync.index_copy_(0, replicas, rows)
                store.refreshed.index_fill_(0, replicas, now)

    # ---- entries ---------------------------------------------------------------------------------
    @property
    def live(self) -> Tensor:
        """The entries a round has to look at (ascending): acted intents, signalled ones, replicas; a
        round visits these, not the key space (one pass over the ``tracked`` flags of the entries
        handed out), and drops those with nothing left to manage (``untrack``)."""
        return self.store.tracked[:self.store.used].nonzero().squeeze(1)

    def anything_live(self) -> bool:
        return bool(self.store.tracked[:self.store.used].any())

    def check(self, keys: Tensor) -> None:
        if self.space.fixed and keys.numel() and (int(keys.min()) < 0 or int(keys.max()) >= self.space.size):
            raise KeyError("a key outside the task's key space")

    def kind(self, entries: Tensor) -> Tensor:
        """The kind of each entry (ABSENT for -1: no entry)."""
        return kinds(self.store, entries)

    def pulled(self, keys: Tensor, entries: Tensor) -> None:
        """A worker's pull looked ``keys`` up (this thread): its commit may reuse the lookup."""
        self._pulled.batch = (keys, entries)

    def entries_of(self, keys: Tensor) -> Tensor:
        """The entries of a batch's keys: the worker's pull looked them up (this thread, the same
        tensor); reused if every one still holds its key (a freed entry holds none), else looked up."""
        pulled = getattr(self._pulled, "batch", None)
        if pulled is not None and pulled[0] is keys:
            entries = pulled[1]
            if bool((entries >= 0).all()) and torch.equal(self.store.key.index_select(0, entries), keys):
                return entries
        return self.store.find(keys)

    def entries(self, keys: Tensor) -> Tensor:
        """The entries of ``keys``, made where missing (ABSENT, knowing what the cache knew)."""
        entries = self.store.find(keys)
        missing = (entries < 0).nonzero().squeeze(1)
        if missing.numel():
            new, inverse = torch.unique(keys.index_select(0, missing), return_inverse=True)
            hints = self.routing.take_cached(new)  # (what the cache knows moves into the entry)
            made = self.store.add(new)
            self.store.hint.index_copy_(0, made, hints.to(torch.int16))
            self.peak_entries = max(self.peak_entries, len(self.store))
            entries[missing] = made[inverse]
        return entries

    def active(self, entries: Tensor) -> Tensor:
        clocks = torch.tensor(self.clocks, dtype=torch.int64)
        return (self.store.active_end.index_select(0, entries) > clocks).any(1)

    def free(self, entries: Tensor) -> None:
        """Free entries holding nothing (ABSENT): their sync rows go back, their hints to the cache."""
        if not entries.numel():
            return
        store = self.store
        rows = store.sync.index_select(0, entries)
        self.syncs.release(rows[rows >= 0])
        keys, hints = store.key.index_select(0, entries), store.hint.index_select(0, entries).long()
        store.tracked.index_fill_(0, entries, False)  # (a freed entry is never live: its number may be handed out again)
        store.remove(entries)
        self.routing.remember(keys, hints, distinct=True)

    def release_dead(self, entries: Tensor) -> None:
        """Free those of ``entries`` that hold nothing and have no intent left to manage."""
        if entries.numel():
            store = self.store
            dead = ((store.kind.index_select(0, entries) == ABSENT) & ~store.signalled.index_select(0, entries)
                    & ~self.active(entries))
            self.free(entries[dead])

    def track(self, entries: Tensor) -> None:
        """Rounds look at ``entries`` from now on (until nothing is left to manage for them)."""
        self.store.tracked.index_fill_(0, entries, True)

    def untrack(self, entries: Tensor) -> None:
        """Rounds no longer look at ``entries`` (nothing left to manage; they stay held)."""
        self.store.tracked.index_fill_(0, entries, False)

    def touch(self, entries: Tensor) -> None:
        """A local change: a fresh stamp (a worker's commit of a pull before it adds, not overwrites)."""
        self.tick += 1
        self.store.stamp.index_fill_(0, entries, self.tick)

    def write(self, entries: Tensor, block: Tensor, add: bool) -> None:
        """Add ``block`` to the entries' values, or overwrite them: a local change (a main copy's new
        version)."""
        store = self.store
        if add:
            store.data.index_add_(0, entries, block)
        else:
            store.data.index_copy_(0, entries, block)
        self.touch(entries)
        owned = entries[store.kind.index_select(0, entries) == OWNER]
        store.version.index_add_(0, owned, torch.ones_like(owned))

    # ---- what it holds (tests, counters, checkpoints) ----------------------------------------------
    def value_of(self, keys: Tensor) -> Tensor:
        """The values held here of ``keys`` (each held: main copy or replica)."""
        entries = self.store.find(keys)
        if not bool((self.kind(entries) != ABSENT).all()):
            raise KeyError("value_of: a key not held here")
        return self.store.data.index_select(0, entries).clone()

    def held(self, kind: int | None = None) -> Tensor:
        """The keys held here (sorted): main copies and replicas, or only ``kind``'s."""
        entries = self.store.live()
        found = self.store.kind.index_select(0, entries)
        chosen = found != ABSENT if kind is None else found == kind
        return self.store.key.index_select(0, entries[chosen]).sort().values

    def load(self, keys: Tensor, values: Tensor) -> None:
        """Every copy here (main copy or replica) of a key in ``keys`` takes its value."""
        entries = self.store.find(keys)
        here = (self.kind(entries) != ABSENT).nonzero().squeeze(1)
        entries, values = entries.index_select(0, here), values.index_select(0, here)
        self.store.data.index_copy_(0, entries, values)
        self.touch(entries)
        rows = self.store.sync.index_select(0, entries)
        replica = rows >= 0
        self.syncs.row.index_copy_(0, rows[replica], values[replica])

    def memory(self) -> dict[str, int]:
        """Bytes of this node's store: entries (rows and metadata), replica sync rows, home records,
        the location cache."""
        return {"entries": len(self.store), "peak_entries": self.peak_entries,
                "store_bytes": self.store.nbytes(), "sync_bytes": self.syncs.nbytes(),
                "record_bytes": self.routing.nbytes()}
