"""An AdaPM node (seed 001, SPEC section 2): a node-local store of every key the node owns or
replicates, the verbs its workers call, and the management protocol between nodes.

A node holds what it owns or replicates and nothing else (``entries.Entries``, a hash index from
key to entry): every key homed here (``key % nodes``) starts here from the task's seeded initial rows
(``KeySpace``), a key gets an entry here when it arrives (relocation, replica) or when a worker here
acts on an intent for it, and the entry is freed when the key leaves and no intent is left. So a
node's memory follows its home share and the keys it holds, not the model. ``kind`` says what it
holds: the **main copy** (it is the key's *owner*), a **replica**, or nothing. A value is the row
and its entity optimizer's state side by side (``[width + state]``), so a worker's optimizer step is
a local computation and its result an additive delta, as in the reference implementation.

Verbs (``pull``, ``push`` additive, ``set``, ``intent``, ``advance_clock``, ``current_clock``) work on
any key at any time: a key held here is read or written in place; any other key is a synchronous
remote access to its owner (counted in ``remote_accesses``).

Management, decided on the owner from the nodes with active intent (``intent`` bitmask per key):

- exactly one node, and no other holds a replica: **relocate** the main copy there (it stays until
  someone else needs it);
- more than one: a **replica** on every node with active intent but the owner; a node drops its
  replica when its intent expires, sending its last delta with the drop.

Replicas are synchronised through the owner: a per-key ``version`` (incremented on every change of
the main copy); each round a replica sends ``delta = value - sync_state`` with the version it holds;
the owner adds the delta and answers with its full value only if the replica is behind (someone
else changed the main copy meanwhile), and the replica keeps its local updates made since it sent
(``value = owner_value + value - sync_state``).

Each round a node sends every other node one grouped message (``Request``): intents that became
active or expired, replica deltas, location updates for keys homed there; the answer (``Response``)
carries relocations, new replicas, refreshed values and routing hints; messages name keys. The home
node of a key always knows its owner (a record for each home key that left); every node caches
the last known owner of keys it does not hold (``hint``), and a message that reaches a former owner
is answered with a hint and retried. A round visits the keys with something to manage (``live``:
acted or signalled intents, replicas), never the key space.

The dense parameters are one more managed value: the main copy on node 0 (its first worker's
module), a replica on every other worker, synchronised by the same delta/version rule each round.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import Tensor, nn

from cadence.strategies.adapm.entries import Column, Entries, Pool


ABSENT, OWNER, REPLICA = 0, 1, 2
TECHNIQUES = ("adaptive", "replication", "relocation", "static", "full")


def nbytes(*tensors: Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _empty(width: int = 0) -> Tensor:
    return torch.empty((0, width) if width else (0,), dtype=torch.float32 if width else torch.int64)


@dataclass
class Request:
    """One grouped message from node ``source`` to one destination in a round."""

    source: int
    intent: Tensor = field(default_factory=_empty)  # keys: the source's intent became active
    expire: Tensor = field(default_factory=_empty)  # keys: its intent expired (no replica held)
    drop: Tensor = field(default_factory=_empty)  # keys of replicas dropped (intent expired) ...
    drop_delta: Tensor | None = None  # ... with their last deltas
    sync: Tensor = field(default_factory=_empty)  # keys of replicas held ...
    sync_version: Tensor = field(default_factory=_empty)  # ... the versions they hold ...
    sync_changed: Tensor = field(default_factory=_empty)  # ... which changed since the last round (bool) ...
    sync_delta: Tensor | None = None  # ... and the deltas of those only (an unchanged replica sends none)
    home: Tensor = field(default_factory=_empty)  # keys homed at the destination that moved ...
    home_owner: Tensor = field(default_factory=_empty)  # ... their new owners ...
    home_moves: Tensor = field(default_factory=_empty)  # ... as of this many relocations (the latest wins)
    dense_delta: Tensor | None = None  # the source's dense replicas' deltas (to node 0)
    dense_version: Tensor | None = None

    def nbytes(self) -> int:
        return nbytes(self.intent, self.expire, self.drop, self.drop_delta, self.sync, self.sync_delta,
                      self.sync_version, self.sync_changed, self.home, self.home_owner, self.home_moves, self.dense_delta, self.dense_version)


@dataclass
class Response:
    relocate: Tensor = field(default_factory=_empty)  # keys whose main copy moves to the requester ...
    relocate_value: Tensor | None = None
    relocate_version: Tensor = field(default_factory=_empty)
    relocate_intent: Tensor = field(default_factory=_empty)  # ... with the nodes with intent
    relocate_holders: Tensor = field(default_factory=_empty)  # ... and replica holders
    relocate_moves: Tensor = field(default_factory=_empty)
    replica: Tensor = field(default_factory=_empty)  # new replicas for the requester
    replica_value: Tensor | None = None
    replica_version: Tensor = field(default_factory=_empty)
    replica_owner: Tensor = field(default_factory=_empty)  # (an answer may come through a forwarder)
    refresh: Tensor = field(default_factory=_empty)  # replicas that were behind: full values
    refresh_value: Tensor | None = None
    refresh_version: Tensor = field(default_factory=_empty)
    current: Tensor = field(default_factory=_empty)  # replicas that were not behind: versions only
    current_version: Tensor = field(default_factory=_empty)
    not_mine: Tensor = field(default_factory=_empty)  # intents sent to a non-owner ...
    hint: Tensor = field(default_factory=_empty)  # ... and where to send them
    # per dense copy of the requester: the main dense parameters if that copy was behind, else None
    dense_value: list[Tensor | None] | None = None
    dense_version: int | None = None

    def absorb(self, other: "Response") -> None:
        """Add another node's answer (to a forwarded part of the request) to this one."""
        for group in (("relocate", "relocate_value", "relocate_version", "relocate_intent", "relocate_holders",
                       "relocate_moves"), ("replica", "replica_value", "replica_version", "replica_owner")):
            if not getattr(other, group[0]).numel():
                continue
            for name in group:
                mine, theirs = getattr(self, name), getattr(other, name)
                setattr(self, name, theirs if mine is None or not mine.numel() else torch.cat([mine, theirs]))

    def nbytes(self) -> int:
        return nbytes(self.relocate, self.relocate_value, self.relocate_version, self.relocate_intent,
                      self.relocate_holders, self.relocate_moves, self.replica, self.replica_value, self.replica_version, self.replica_owner,
                      self.refresh, self.refresh_value, self.refresh_version, self.current,
                      self.current_version, self.not_mine, self.hint, *(self.dense_value or ()))


class ProtocolError(RuntimeError):
    """A message broke an invariant of the protocol (a bug, never a user's mistake)."""


def _bit(node: int) -> int:
    return 1 << node


def _members(mask: int) -> list[int]:
    return [node for node in range(64) if mask >> node & 1]


class DenseCopy:
    """A worker's dense module as a managed value: the main copy (node 0's first worker) or a
    replica; the flat parameter vector is what is synchronised."""

    def __init__(self, module: nn.Module, optimizer, main: bool):
        self.module, self.optimizer, self.main = module, optimizer, main
        self.params = [p for p in module.parameters()]
        self.lock = threading.Lock()  # a step of the dense optimizer vs a merge or refresh
        self.version = 0
        self.sync = self.vector() if self.params else None  # replica: the value at the last sync

    def vector(self) -> Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params]) if self.params else torch.empty(0)

    def add(self, delta: Tensor) -> None:
        offset = 0
        for p in self.params:  # through .data: a forward in flight keeps its graph (Hogwild)
            p.data.add_(delta[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def assign(self, value: Tensor) -> None:
        offset = 0
        for p in self.params:
            p.data.copy_(value[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


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


class Node:
    """One node: its store, its workers' verbs, and its side of the management protocol.

    The store holds an entry per key this node owns or replicates, or has intent for (a key it
    neither holds nor intends to access has none): the value, and the metadata of the protocol
    (``kind``, ``stamp``, ``version``, ``refreshed``, ``moves``, ``interested``, ``holders``,
    ``signalled``, ``hint``, ``active_end`` per worker); a replica's sync state lives in a pool of
    its own. Home records (``records``) exist only for home keys that have left this node, and the
    location cache for keys without an entry (``away``) only for keys not at their home, at most
    ``away_limit`` of them (a cache: cleared when full, the home records answer meanwhile)."""

    def __init__(self, index: int, nodes: int, space: KeySpace, width: int, technique: str = "adaptive",
                 workers: int = 1):
        if technique not in TECHNIQUES:
            raise ValueError(f"technique {technique!r} (choose one of {', '.join(TECHNIQUES)})")
        if nodes > 63:
            raise ValueError("at most 63 nodes (intent sets are 64-bit masks)")
        self.index, self.nodes, self.technique = index, nodes, technique
        self.space = space
        self.width = width  # of a row; values hold the row and its optimizer state
        full = technique == "full"
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
            "data": Column((space.width,), torch.float32, None),
        }, capacity=2 * share + 1024, expected=share + share // 8)  # (a reserve: see entries.Pool)
        self.syncs = Pool({"row": Column((space.width,), torch.float32, None)})  # replicas' values at the last sync
        self.records = Entries({"owner": Column((), torch.int16, index), "moves": Column((), torch.int64, 0)})
        self.away = Entries({"owner": Column((), torch.int16, None)})
        self.away_limit = max(1 << 16, share)
        self.tick = 0
        self._pulled = threading.local()  # each worker's last pull: (keys, entries), for its commit
        # the entries a round has to look at (sorted): acted intents, signalled ones, replicas; a round
        # visits these, not the key space, and drops those with nothing left to manage
        self.live = torch.empty(0, dtype=torch.int64)
        self.clocks = [0] * workers
        self.pending: list[deque[tuple[int, int, Tensor]]] = [deque() for _ in range(workers)]  # (start, end, keys)
        self.outbox: list[set[int]] = [set() for _ in range(nodes)]  # keys to decide for node m
        self.home_updates: list[dict[int, tuple[int, int]]] = [{} for _ in range(nodes)]  # key -> (owner, moves)
        self.lock = threading.RLock()
        self.round_done = threading.Condition()  # notified after each completed round (wait_sync)
        self.rounds_started = 0
        self.rounds_completed = 0
        self.dense: list[DenseCopy] = []  # this node's workers' dense copies
        self.main_dense: DenseCopy | None = None  # node 0: the main copy
        # counters
        self.accesses = 0
        self.remote_accesses = 0
        self.remote_reads = 0  # (of which reads: a key not here when its batch was pulled)
        self.bytes_sent = 0
        self.relocations_in = 0
        self.replicas_created = 0
        self.staleness_total = 0.0
        self.staleness_count = 0
        self.rounds = 0
        self.dense_bytes = 0  # (of bytes_sent: the dense replicas' deltas and the main copy's values)
        self.peak_entries = 0
        # every key homed here starts here, from the task's seeded initial rows (with ``full``: every
        # key, a replica unless homed here)
        now = time.perf_counter()
        for chunk in space.chunks():
            keys = chunk if full else chunk[self._home(chunk) == index]
            if not keys.numel():
                continue
            entries = self.store.add(keys)
            store = self.store
            store.data.index_copy_(0, entries, space.initial(keys))
            home = self._home(keys)
            store.hint.index_copy_(0, entries, home.to(torch.int16))
            mine = home == index
            store.kind.index_copy_(0, entries, torch.where(mine, OWNER, REPLICA).to(torch.int8))
            replicas = entries[~mine]
            if replicas.numel():
                rows = self.syncs.allocate(replicas.shape[0])
                self.syncs.row.index_copy_(0, rows, store.data.index_select(0, replicas))
                store.sync.index_copy_(0, replicas, rows)
                store.refreshed.index_fill_(0, replicas, now)
        self.peak_entries = len(self.store)

    # ---- keys and entries ------------------------------------------------------------------------
    def _home(self, keys: Tensor) -> Tensor:
        return keys.remainder(self.nodes)

    def _check(self, keys: Tensor) -> None:
        if self.space.fixed and keys.numel() and (int(keys.min()) < 0 or int(keys.max()) >= self.space.size):
            raise KeyError("a key outside the task's key space")

    def _kind(self, entries: Tensor) -> Tensor:
        """The kind of each entry (ABSENT for -1: no entry)."""
        found = entries >= 0
        if bool(found.all()):
            return self.store.kind.index_select(0, entries)
        kind = self.store.kind.index_select(0, entries.clamp(min=0))
        return torch.where(found, kind, torch.tensor(ABSENT, dtype=torch.int8))

    def _entries_of(self, keys: Tensor) -> Tensor:
        """The entries of a batch's keys: the worker's pull looked them up (this thread, the same
        tensor); reused if every one still holds its key (a freed entry holds none), else looked up."""
        pulled = getattr(self._pulled, "batch", None)
        if pulled is not None and pulled[0] is keys:
            entries = pulled[1]
            if bool((entries >= 0).all()) and torch.equal(self.store.key.index_select(0, entries), keys):
                return entries
        return self.store.find(keys)

    def _entries(self, keys: Tensor) -> Tensor:
        """The entries of ``keys``, made where missing (ABSENT, knowing what the cache knew)."""
        entries = self.store.find(keys)
        missing = (entries < 0).nonzero().squeeze(1)
        if missing.numel():
            new, inverse = torch.unique(keys.index_select(0, missing), return_inverse=True)
            hints = self._home(new)  # (what the cache knows moves into the entry)
            if len(self.away):
                away = self.away.find(new)
                known = (away >= 0).nonzero().squeeze(1)
                hints[known] = self.away.owner.index_select(0, away[known]).long()
                self.away.remove(away[known])
            made = self.store.add(new)
            self.store.hint.index_copy_(0, made, hints.to(torch.int16))
            self.peak_entries = max(self.peak_entries, len(self.store))
            entries[missing] = made[inverse]
        return entries

    def _active(self, entries: Tensor) -> Tensor:
        clocks = torch.tensor(self.clocks, dtype=torch.int64)
        return (self.store.active_end.index_select(0, entries) > clocks).any(1)

    def _free(self, entries: Tensor) -> None:
        """Free entries holding nothing (ABSENT): their sync rows go back, their hints to the cache."""
        if not entries.numel():
            return
        store = self.store
        rows = store.sync.index_select(0, entries)
        self.syncs.release(rows[rows >= 0])
        keys, hints = store.key.index_select(0, entries), store.hint.index_select(0, entries).long()
        store.remove(entries)
        if self.live.numel():  # (a freed entry is never live: its number may be handed out again)
            self.live = self.live[~torch.isin(self.live, entries)]
        self._remember(keys, hints)

    def _release_dead(self, entries: Tensor) -> None:
        """Free those of ``entries`` that hold nothing and have no intent left to manage."""
        if entries.numel():
            store = self.store
            dead = ((store.kind.index_select(0, entries) == ABSENT) & ~store.signalled.index_select(0, entries)
                    & ~self._active(entries))
            self._free(entries[dead])

    def _touch(self, entries: Tensor) -> None:
        """A local change: a fresh stamp (a worker's commit of a pull before it adds, not overwrites)."""
        self.tick += 1
        self.store.stamp.index_fill_(0, entries, self.tick)

    def _cached(self, keys: Tensor, entries: Tensor | None = None) -> Tensor:
        """The last known owner of each key: its entry's, the cache's, or its home (``entries``: the
        keys' entries, where the caller looked them up already)."""
        hints = self._home(keys)
        entries = self.store.find(keys) if entries is None else entries
        has = (entries >= 0).nonzero().squeeze(1)
        if has.numel():
            hints[has] = self.store.hint.index_select(0, entries.index_select(0, has)).long()
        rest = (entries < 0).nonzero().squeeze(1)
        if rest.numel() and len(self.away):
            away = self.away.find(keys.index_select(0, rest))
            known = away >= 0
            hints[rest[known]] = self.away.owner.index_select(0, away[known]).long()
        return hints

    def _remember(self, keys: Tensor, owners: Tensor) -> None:
        """Cache the owners of keys without an entry here (a key at its home needs no record)."""
        if not keys.numel():
            return
        keys, first = _unique_first(keys)
        owners = owners.index_select(0, first)
        at_home = owners == self._home(keys)
        found = self.away.find(keys)
        self.away.remove(found[at_home & (found >= 0)])
        keep = ~at_home
        if bool(keep.any()):
            if len(self.away) + int(keep.sum()) > self.away_limit:
                self.away.clear()
            entries = self.away.find_or_add(keys[keep])
            self.away.owner.index_copy_(0, entries, owners[keep].to(torch.int16))

    # ---- what a node holds (tests, counters) -------------------------------------------------------
    def kind_of(self, keys: Tensor) -> Tensor:
        with self.lock:
            return self._kind(self.store.find(keys))

    def kind_of_entries(self, entries: Tensor) -> Tensor:
        """The kind of each entry (ABSENT for -1)."""
        return self._kind(entries)

    def value_of(self, keys: Tensor) -> Tensor:
        """The values held here of ``keys`` (each held: main copy or replica)."""
        with self.lock:
            entries = self.store.find(keys)
            if not bool((self._kind(entries) != ABSENT).all()):
                raise KeyError("value_of: a key not held here")
            return self.store.data.index_select(0, entries).clone()

    def held(self, kind: int | None = None) -> Tensor:
        """The keys held here (sorted): main copies and replicas, or only ``kind``'s."""
        with self.lock:
            entries = self.store.live()
            kinds = self.store.kind.index_select(0, entries)
            chosen = kinds != ABSENT if kind is None else kinds == kind
            return self.store.key.index_select(0, entries[chosen]).sort().values

    def entries(self) -> int:
        """Entries in use (keys held, and keys with intent not yet held)."""
        return len(self.store)

    def live_keys(self) -> Tensor:
        """The keys a round looks at (sorted)."""
        with self.lock:
            return self.store.key.index_select(0, self.live).sort().values

    def hint_of(self, keys: Tensor) -> Tensor:
        with self.lock:
            return self._cached(keys)

    def learn(self, keys: Tensor, owners: Tensor) -> None:
        """Cache where keys not held here are (tests: a stale cache)."""
        with self.lock:
            self._learn(keys, owners)

    def home_record(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """(owner, relocations) of keys homed here, by the home record."""
        with self.lock:
            found = self.records.find(keys)
            known = found >= 0
            owners = torch.full(keys.shape, self.index, dtype=torch.int64)
            moves = torch.zeros(keys.shape, dtype=torch.int64)
            owners[known] = self.records.owner.index_select(0, found[known]).long()
            moves[known] = self.records.moves.index_select(0, found[known])
            return owners, moves

    def load(self, keys: Tensor, values: Tensor) -> None:
        """Every copy here (main copy or replica) of a key in ``keys`` takes its value."""
        with self.lock:
            entries = self.store.find(keys)
            held = (self._kind(entries) != ABSENT).nonzero().squeeze(1)
            entries, values = entries.index_select(0, held), values.index_select(0, held)
            self.store.data.index_copy_(0, entries, values)
            self._touch(entries)
            rows = self.store.sync.index_select(0, entries)
            replica = rows >= 0
            self.syncs.row.index_copy_(0, rows[replica], values[replica])

    def memory(self) -> dict[str, int]:
        """Bytes of this node's store: entries (rows and metadata), replica sync rows, home records,
        the location cache."""
        return {"entries": len(self.store), "peak_entries": self.peak_entries,
                "store_bytes": self.store.nbytes(), "sync_bytes": self.syncs.nbytes(),
                "record_bytes": self.records.nbytes() + self.away.nbytes()}

    # ---- worker verbs ----------------------------------------------------------------------------
    def intent(self, worker: int, keys: Tensor, start: int, end: int | None = None) -> None:
        """Worker ``worker`` will access ``keys`` while its clock c satisfies start <= c < end."""
        end = start + 1 if end is None else end
        if end <= start:
            raise ValueError(f"intent: end {end} must be after start {start}")
        self._check(keys)
        if self.technique in ("static", "full") or self.nodes == 1 or not keys.numel():
            return  # (nothing acts on them)
        with self.lock:
            self.pending[worker].append((start, end, keys))

    def advance_clock(self, worker: int) -> int:
        self.clocks[worker] += 1  # (one writer: the worker; readers tolerate a stale value)
        return self.clocks[worker]

    def current_clock(self, worker: int) -> int:
        return self.clocks[worker]

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Block until a communication round that starts after this call has completed (its
        actions installed); False on timeout."""
        with self.round_done:
            target = self.rounds_started + 1
            return self.round_done.wait_for(lambda: self.rounds_completed >= target, timeout)

    def holds(self, keys: Tensor) -> bool:
        """Whether every key is held here (main copy or replica)."""
        with self.lock:
            return bool((self._kind(self.store.find(keys)) != ABSENT).all())

    def round_started(self) -> None:
        with self.round_done:
            self.rounds_started += 1

    def round_completed(self) -> None:
        with self.round_done:
            self.rounds_completed = self.rounds_started
            self.round_done.notify_all()

    def pull(self, keys: Tensor, remote) -> tuple[Tensor, Tensor, Tensor]:
        """(values, local mask, stamps) of ``keys``: local ones read here, the others from their
        owners (``remote(node, keys) -> (values, not_mine, hints)``, synchronously)."""
        self._check(keys)
        with self.lock:
            store = self.store
            entries = store.find(keys)
            self._pulled.batch = (keys, entries)
            kind = self._kind(entries)
            local = kind != ABSENT
            if bool(local.all()):  # (the common case: one gather, no scatter)
                values, stamps = store.data.index_select(0, entries), store.stamp.index_select(0, entries)
                held = entries
            else:
                values = torch.empty(keys.shape[0], self.space.width)
                stamps = torch.zeros(keys.shape[0], dtype=torch.int64)
                here = local.nonzero().squeeze(1)
                held = entries.index_select(0, here)
                values[here] = store.data.index_select(0, held)
                stamps[here] = store.stamp.index_select(0, held)
                kind = kind.index_select(0, here)
            replica = held[kind == REPLICA]
            if replica.numel():
                now = time.perf_counter()
                self.staleness_total += float((now - store.refreshed.index_select(0, replica)).sum())
                self.staleness_count += replica.numel()
            self.accesses += keys.shape[0]
        missing = (~local).nonzero().squeeze(1)
        if missing.numel():
            values[missing] = self._remote(keys[missing], remote)
        return values, local, stamps

    def commit(self, keys: Tensor, before: Tensor, after: Tensor, local: Tensor, stamps: Tensor, remote) -> None:
        """A worker's update of ``keys`` from ``before`` (pulled) to ``after``: a key held here and
        untouched since the pull is overwritten (so one node equals ``sync`` bit for bit), a key held
        here and changed meanwhile (a merge, another worker, a relocation) takes the delta, any other
        key's delta is pushed to its owner."""
        with self.lock:
            entries = self._entries_of(keys)
            here = self._kind(entries) != ABSENT
            clean = here & local & (self.store.stamp.index_select(0, entries.clamp(min=0)) == stamps)
            self.accesses += keys.shape[0]
            if bool(clean.all()):  # (the common case: one write)
                self._write(entries, after, add=False)
                return
            dirty = here & ~clean
            if bool(clean.any()):
                chosen = clean.nonzero().squeeze(1)
                self._write(entries[chosen], after[chosen], add=False)
            if bool(dirty.any()):
                chosen = dirty.nonzero().squeeze(1)
                self._write(entries[chosen], after[chosen] - before[chosen], add=True)
        away = (~here).nonzero().squeeze(1)
        if away.numel():
            self._remote(keys[away], remote, delta=after[away] - before[away])

    def push(self, keys: Tensor, delta: Tensor, remote) -> None:
        """The verb ``push``: add ``delta`` to the values of ``keys`` (wherever they are)."""
        self._apply(keys, delta, True, remote)

    def set(self, keys: Tensor, values: Tensor, remote) -> None:
        """The verb ``set``: overwrite the values of ``keys`` (on a replica: the change travels to the
        owner as a delta, like any local update)."""
        self._apply(keys, values, False, remote)

    def _apply(self, keys: Tensor, block: Tensor, add: bool, remote) -> None:
        self._check(keys)
        with self.lock:
            entries = self.store.find(keys)
            here = self._kind(entries) != ABSENT
            self.accesses += keys.shape[0]
            chosen = here.nonzero().squeeze(1)
            if chosen.numel():
                self._write(entries[chosen], block[chosen], add=add)
        away = (~here).nonzero().squeeze(1)
        if away.numel():
            self._remote(keys[away], remote, **{"delta" if add else "value": block[away]})

    def _write(self, entries: Tensor, block: Tensor, add: bool) -> None:
        store = self.store
        if add:
            store.data.index_add_(0, entries, block)
        else:
            store.data.index_copy_(0, entries, block)
        self._touch(entries)
        owned = entries[store.kind.index_select(0, entries) == OWNER]
        store.version.index_add_(0, owned, torch.ones_like(owned))

    def _remote(self, keys: Tensor, remote, delta: Tensor | None = None, value: Tensor | None = None):
        """Synchronous remote accesses: read (neither ``delta`` nor ``value``), add or overwrite
        ``keys`` on their owners, following hints until every key is served."""
        out = torch.empty(keys.shape[0], self.space.width) if delta is None and value is None else None
        todo = torch.arange(keys.shape[0])
        with self.lock:
            self.remote_accesses += keys.shape[0]
            if out is not None:
                self.remote_reads += keys.shape[0]
        for attempt in range(10_000):
            with self.lock:  # it may have arrived meanwhile (a relocation or replica in flight)
                entries = self.store.find(keys[todo])
                kind = self._kind(entries)
                here = (kind != ABSENT).nonzero().squeeze(1)
                if here.numel():
                    chosen, held, todo = todo[here], entries[here], todo[kind == ABSENT]
                    if out is not None:
                        out[chosen] = self.store.data.index_select(0, held)
                    else:
                        self._write(held, (delta if delta is not None else value)[chosen], add=delta is not None)
                hints = self._route(keys[todo])
            if not todo.numel():
                return out
            unresolved = []
            for node in hints.unique().tolist():
                mine = todo[hints == node]
                if node == self.index:  # arriving here: wait for the sync thread to install it
                    unresolved.append(mine)
                    continue
                values, not_mine, hint = remote(node, keys[mine],
                                                None if delta is None else delta[mine],
                                                None if value is None else value[mine])
                served = torch.ones(mine.shape[0], dtype=torch.bool)
                if not_mine.numel():
                    served[not_mine] = False
                    with self.lock:  # (a replica may have arrived meanwhile: its owner is known)
                        self._learn(keys[mine[not_mine]], hint)
                    unresolved.append(mine[not_mine])
                if out is not None:
                    out[mine[served]] = values
            todo = torch.cat(unresolved) if unresolved else torch.empty(0, dtype=torch.int64)
            if not todo.numel():
                return out
            time.sleep(0.0002 * min(attempt + 1, 50))
        raise ProtocolError(f"node {self.index}: {todo.numel()} keys found no owner after 10000 attempts")

    def serve(self, source: int, keys: Tensor, delta: Tensor | None, value: Tensor | None):
        """Another node's synchronous access to ``keys``: (values read, positions not owned here,
        hints for them). Replicas do not serve: only the main copy."""
        with self.lock:
            entries = self.store.find(keys)
            owned = self._kind(entries) == OWNER
            mine = owned.nonzero().squeeze(1)
            not_mine = (~owned).nonzero().squeeze(1)
            values = None
            if delta is None and value is None:
                values = self.store.data.index_select(0, entries[mine])
            elif mine.numel():
                self._write(entries[mine], (delta if delta is not None else value)[mine], add=delta is not None)
            hint = self._answer_hint(keys[not_mine])
            self.bytes_sent += nbytes(values, hint)
            return values, not_mine, hint

    def _learn(self, keys: Tensor, hints: Tensor) -> None:
        """Cache where keys not held here are (a key held here keeps its own record)."""
        entries = self.store.find(keys)
        kind = self._kind(entries)
        absent = (entries >= 0) & (kind == ABSENT)
        self.store.hint[entries[absent]] = hints[absent].to(torch.int16)
        none = entries < 0
        self._remember(keys[none], hints[none])

    def _route(self, keys: Tensor, entries: Tensor | None = None) -> Tensor:
        """Where to send a message about keys not held here: the cached owner, unless the cache
        names this node (a stale answer): then the home node's record, or the home node."""
        hints = self._cached(keys, entries)
        stale = hints == self.index
        if bool(stale.any()):
            hints[stale] = self._answer_hint(keys[stale])
        return hints

    def _record_home(self, keys: Tensor, owners: Tensor, moves: Tensor) -> None:
        """The home node's record of where its keys are, as of ``moves`` relocations (the newest wins)."""
        if not keys.numel():
            return
        records = self.records.find_or_add(keys)
        newer = moves > self.records.moves.index_select(0, records)
        self.records.owner[records[newer]] = owners[newer].to(torch.int16)
        self.records.moves[records[newer]] = moves[newer]

    def _answer_hint(self, keys: Tensor) -> Tensor:
        """Where to look for keys not owned here: the home node's record if this is the home; else
        this node's cache (a former owner knows where it sent the key: fresher than a home record
        whose update is still on its way), unless the cache names this node: then the home node.
        A key homed here that never left has a record or is held here: any other is no key."""
        home = self._home(keys)
        cached = self._cached(keys)
        hints = torch.where(cached == self.index, home, cached)
        mine = (home == self.index).nonzero().squeeze(1)
        if mine.numel():
            records = self.records.find(keys.index_select(0, mine))
            if bool((records < 0).any()):
                raise KeyError(f"node {self.index}: a key outside the task's key space "
                               f"({int(keys.index_select(0, mine)[records < 0][0])})")
            hints[mine] = self.records.owner.index_select(0, records).long()
        return hints

    # ---- a communication round: this node's side ----------------------------------------------------
    def act_on_intents(self, horizons: list[float]) -> None:
        """Move each worker's pending intents that start before its horizon to the acted set."""
        with self.lock:
            for worker, horizon in enumerate(horizons):
                queue = self.pending[worker]
                while queue and queue[0][0] < horizon:
                    _, end, keys = queue.popleft()
                    entries = self._entries(keys)
                    ends = self.store.active_end
                    ends[entries, worker] = torch.clamp(ends[entries, worker], min=end)
                    self._track(entries)

    def _track(self, entries: Tensor) -> None:
        """Rounds look at ``entries`` from now on (until nothing is left to manage for them)."""
        if entries.numel():
            self.live = torch.unique(torch.cat([self.live, entries]))

    def requests(self) -> list[Request | None]:
        """This round's message to every other node (None for this node itself)."""
        with self.lock:
            store = self.store
            entries = self.live  # (every signalled key and every replica is live: no scan of the key space)
            live = store.key.index_select(0, entries)
            active = self._active(entries)
            signalled = store.signalled.index_select(0, entries)
            kind = store.kind.index_select(0, entries)
            keep = active | signalled | (kind == REPLICA)
            self._free(entries[~keep & (kind == ABSENT)])  # (nothing left to manage, nothing held)
            live, entries, active, signalled, kind = live[keep], entries[keep], active[keep], signalled[keep], kind[keep]
            new, gone = active & ~signalled, signalled & ~active
            me = _bit(self.index)
            # intents on keys owned here change the owner's record directly
            for chosen, on in ((new, True), (gone, False)):
                owned = chosen & (kind == OWNER)
                if bool(owned.any()):
                    mine = entries[owned]
                    current = store.interested.index_select(0, mine)
                    store.interested.index_copy_(0, mine, current | me if on else current & ~me)
                    store.signalled[mine] = on
                    self._changed(live[owned], mine)
            sending, expiring = new & (kind == ABSENT), gone & (kind == ABSENT)
            send_new, expire = live[sending], live[expiring]
            store.signalled[entries[new & (kind == REPLICA)]] = True
            target_new, target_expire = self._route(send_new, entries[sending]), self._route(expire, entries[expiring])
            store.signalled[entries[sending]] = True  # (undone if the destination is not the owner)
            store.signalled[entries[expiring]] = False  # (redone if the destination is not the owner)
            dropping = gone & (kind == REPLICA)
            drop = live[dropping]
            if drop.numel():  # the replica goes with its last delta; its entry is freed
                gone_entries = entries[dropping]
                drop_delta = (store.data.index_select(0, gone_entries)
                              - self.syncs.row.index_select(0, store.sync.index_select(0, gone_entries)))
                target_drop = store.hint.index_select(0, gone_entries)
                store.kind[gone_entries] = ABSENT
                store.signalled[gone_entries] = False
                self._free(gone_entries)
                live, entries, kind = live[~dropping], entries[~dropping], kind[~dropping]
            self.live = entries
            if self.technique == "full":  # (every key not owned here: a replica from the start)
                every = store.live()
                held = every[store.kind.index_select(0, every) == REPLICA]
                replicas = store.key.index_select(0, held)
            else:
                held, replicas = entries[kind == REPLICA], live[kind == REPLICA]
            if replicas.numel():
                rows = store.sync.index_select(0, held)
                now = store.data.index_select(0, held)
                sync_delta = now - self.syncs.row.index_select(0, rows)
                self.syncs.row.index_copy_(0, rows, now)
                changed = sync_delta.ne(0).any(dim=1)  # (a zero delta would change nothing on the owner)
                target_sync = store.hint.index_select(0, held)
                versions = store.version.index_select(0, held)
            requests: list[Request | None] = []
            for node in range(self.nodes):
                if node == self.index:
                    requests.append(None)
                    continue
                request = Request(self.index, intent=send_new[target_new == node], expire=expire[target_expire == node])
                if drop.numel():
                    chosen = (target_drop == node).nonzero().squeeze(1)
                    request.drop, request.drop_delta = drop[chosen], drop_delta[chosen]
                if replicas.numel():
                    chosen = (target_sync == node).nonzero().squeeze(1)
                    request.sync, request.sync_changed = replicas[chosen], changed[chosen]
                    request.sync_delta = sync_delta[chosen[request.sync_changed]]
                    request.sync_version = versions[chosen]
                updates = self.home_updates[node]
                if updates:
                    request.home = torch.tensor(list(updates.keys()), dtype=torch.int64)
                    request.home_owner = torch.tensor([owner for owner, _ in updates.values()], dtype=torch.int64)
                    request.home_moves = torch.tensor([moves for _, moves in updates.values()], dtype=torch.int64)
                    updates.clear()
                if node == 0 and self.dense and self.dense[0].params:
                    deltas, versions_dense = [], []
                    for copy in self.dense:
                        with copy.lock:
                            current = copy.vector()
                            deltas.append(current - copy.sync)
                            copy.sync = current
                            versions_dense.append(copy.version)
                    request.dense_delta = torch.stack(deltas)
                    request.dense_version = torch.tensor(versions_dense, dtype=torch.int64)
                    self.dense_bytes += nbytes(request.dense_delta, request.dense_version)
                self.bytes_sent += request.nbytes()
                requests.append(request)
            self.rounds += 1
            return requests

    def install(self, source: int, response: Response, request: Request) -> None:
        """Apply the answer of node ``source`` to this round's request."""
        now = time.perf_counter()
        with self.lock:
            store = self.store
            if response.not_mine.numel():  # intents and expiries that reached a non-owner: retry there
                keys = response.not_mine
                self._learn(keys, response.hint)
                intended = torch.isin(keys, request.intent)
                entries = store.find(keys)
                exists = entries >= 0
                store.signalled[entries[intended & exists]] = False
                store.signalled[entries[~intended & exists]] = True
                self._track(entries[~intended & exists])
            if response.relocate.numel():
                keys = response.relocate
                entries = self._entries(keys)
                value = response.relocate_value.clone()
                was_replica = (store.kind.index_select(0, entries) == REPLICA).nonzero().squeeze(1)
                if was_replica.numel():  # keep the replica's updates not yet sent
                    chosen = entries.index_select(0, was_replica)
                    rows = store.sync.index_select(0, chosen)
                    value[was_replica] += store.data.index_select(0, chosen) - self.syncs.row.index_select(0, rows)
                    self.syncs.release(rows)
                    store.sync.index_fill_(0, chosen, -1)
                store.data.index_copy_(0, entries, value)
                self._touch(entries)
                store.kind[entries] = OWNER
                store.version.index_copy_(0, entries, response.relocate_version)
                store.interested.index_copy_(0, entries, response.relocate_intent)
                store.holders.index_copy_(0, entries, response.relocate_holders & ~_bit(self.index))
                store.hint[entries] = self.index
                moves = response.relocate_moves + 1
                store.moves.index_copy_(0, entries, moves)
                here = self._home(keys) == self.index
                self._record_home(keys[here], torch.full_like(keys[here], self.index), moves[here])
                self.relocations_in += keys.shape[0]
                self._changed(keys, entries)
            if response.replica.numel():
                entries = self._entries(response.replica)
                absent = store.kind.index_select(0, entries) == ABSENT
                keys, entries, value = response.replica[absent], entries[absent], response.replica_value[absent]
                rows = self.syncs.allocate(keys.shape[0])
                self.syncs.row.index_copy_(0, rows, value)
                store.sync.index_copy_(0, entries, rows)
                store.data.index_copy_(0, entries, value)
                self._touch(entries)
                store.version.index_copy_(0, entries, response.replica_version[absent])
                store.kind[entries] = REPLICA
                self._track(entries)
                store.hint[entries] = response.replica_owner[absent].to(torch.int16)
                store.refreshed[entries] = now
                self.replicas_created += keys.shape[0]
            if response.refresh.numel():
                entries = store.find(response.refresh)
                held = self._kind(entries) == REPLICA
                entries, value = entries[held], response.refresh_value[held]
                rows = store.sync.index_select(0, entries)
                local = store.data.index_select(0, entries) - self.syncs.row.index_select(0, rows)
                store.data.index_copy_(0, entries, value + local)
                self.syncs.row.index_copy_(0, rows, value)
                self._touch(entries)
                store.version.index_copy_(0, entries, response.refresh_version[held])
                store.refreshed[entries] = now
            if response.current.numel():
                entries = store.find(response.current)
                held = self._kind(entries) == REPLICA
                store.version.index_copy_(0, entries[held], response.current_version[held])
                store.refreshed[entries[held]] = now
        if response.dense_version is not None:
            for copy, value in zip(self.dense, response.dense_value):
                with copy.lock:
                    if value is not None:  # keep the updates made since the delta was sent
                        copy.assign(value + (copy.vector() - copy.sync))
                        copy.sync = value.clone()
                    copy.version = response.dense_version

    # ---- a communication round: the owner's side ---------------------------------------------------
    def handle(self, request: Request, forward=None, forwarded: bool = False) -> Response:
        """Answer node ``request.source``'s message of this round. Intents and expiries for keys
        not owned here are forwarded once (``forward(node, request) -> Response``) to where the
        home record or this node's cache says the owner is, within the same round. A ``forwarded``
        message gets decisions on its own intents only: the requester's direct message to this node
        in the same round may carry deltas of replicas that a decision would relocate."""
        source, me = request.source, _bit(request.source)
        response = Response()
        with self.lock:
            store = self.store
            if request.home.numel():  # (a relocation reported late must not undo a later one: _record_home)
                self._record_home(request.home, request.home_owner, request.home_moves)
            not_mine = []
            for keys, on in ((request.intent, True), (request.expire, False)):
                if not keys.numel():
                    continue
                entries = store.find(keys)
                owned = self._kind(entries) == OWNER
                mine = entries[owned]
                current = store.interested.index_select(0, mine)
                store.interested.index_copy_(0, mine, current | me if on else current & ~me)
                self._changed(keys[owned], mine)
                not_mine.append(keys[~owned])
            if request.drop.numel():
                entries = self._merge(request.drop, request.drop_delta, source, "drop")
                current = store.holders.index_select(0, entries)
                store.holders.index_copy_(0, entries, current & ~me)
                current = store.interested.index_select(0, entries)
                store.interested.index_copy_(0, entries, current & ~me)
                self._changed(request.drop, entries)
            if request.sync.numel():
                keys, changed = request.sync, request.sync_changed
                entries = store.find(keys)
                if not bool((self._kind(entries) == OWNER).all()):
                    raise ProtocolError(f"node {self.index}: a sync from node {source} for keys it does not own")
                before = store.version.index_select(0, entries)  # (the versions before this message's deltas)
                if bool(changed.any()):
                    self._merge(keys[changed], request.sync_delta, source, "sync")
                behind = request.sync_version < before  # someone else changed the main copy
                response.refresh = keys[behind]
                response.refresh_value = store.data.index_select(0, entries[behind])
                response.refresh_version = store.version.index_select(0, entries[behind])
                response.current = keys[~behind]
                response.current_version = store.version.index_select(0, entries[~behind])
            if not_mine:
                response.not_mine = torch.cat(not_mine)
                response.hint = self._answer_hint(response.not_mine)
            self._deliver(source, response, request.intent if forwarded else None)
        if request.dense_delta is not None:
            main = self.main_dense
            if main is None:
                raise ProtocolError(f"node {self.index} holds no main dense copy")
            with main.lock:
                before = main.version
                for delta in request.dense_delta:
                    if bool(delta.ne(0).any()):
                        main.add(delta)
                        main.version += 1
                value = main.vector()
                response.dense_version = main.version
            # behind: the main copy changed by more than the replica's own delta (with several copies
            # in one message, each misses the others' deltas)
            several = request.dense_delta.shape[0] > 1
            response.dense_value = [value if several or held < before else None
                                    for held in request.dense_version.tolist()]
            self.dense_bytes += nbytes(*response.dense_value)
        self.bytes_sent += response.nbytes()
        if forward is not None and response.not_mine.numel():
            self._forward(request, response, forward)
        return response

    def _forward(self, request: Request, response: Response, forward) -> None:
        """One hop (never from a forwarded message): the owner's answer joins this response (the
        owner's bytes are counted there, the forwarded message's here)."""
        keys, hints = response.not_mine, response.hint
        intended = torch.isin(keys, request.intent)
        left, left_hint = [], []
        for node in hints.unique().tolist():
            chosen = hints == node
            if node in (self.index, request.source):
                left.append(keys[chosen])
                left_hint.append(hints[chosen])
                continue
            sub = Request(request.source, intent=keys[chosen & intended], expire=keys[chosen & ~intended])
            self.bytes_sent += sub.nbytes()
            answer = forward(node, sub)
            response.absorb(answer)
            left.append(answer.not_mine)
            left_hint.append(answer.hint)
        response.not_mine, response.hint = torch.cat(left), torch.cat(left_hint)

    def _merge(self, keys: Tensor, delta: Tensor, source: int, what: str) -> Tensor:
        """Add replica deltas to the main copies; their entries."""
        entries = self.store.find(keys)
        if not bool((self._kind(entries) == OWNER).all()):
            raise ProtocolError(f"node {self.index}: a {what} from node {source} for keys it does not own")
        changed = delta.ne(0).any(dim=1)
        self.store.data.index_add_(0, entries, delta)
        self.store.version.index_add_(0, entries, changed.long())
        if bool(changed.any()):
            self._touch(entries[changed])
        return entries

    def _changed(self, keys: Tensor, entries: Tensor) -> None:
        """The intent set of owned ``keys`` changed: decide for every other node with intent when it
        next asks (``_deliver``)."""
        if self.technique in ("static", "full") or not keys.numel():
            return
        intent = self.store.interested.index_select(0, entries)
        for node in range(self.nodes):
            if node == self.index:
                continue
            chosen = keys[(intent >> node & 1).bool()]
            if chosen.numel():
                self.outbox[node].update(chosen.tolist())

    def _deliver(self, node: int, response: Response, only: Tensor | None = None) -> None:
        """The decisions for ``node`` on the keys it has (or had) intent for (``only``: of these
        keys): relocate, replicate, or nothing, by the technique (under the lock)."""
        box = self.outbox[node]
        chosen = box if only is None else box.intersection(only.tolist())
        if not chosen:
            return
        keys = torch.tensor(sorted(chosen), dtype=torch.int64)
        box.difference_update(chosen)
        store = self.store
        entries = store.find(keys)
        owned = self._kind(entries) == OWNER
        keys, entries = keys[owned], entries[owned]
        intent, holders = store.interested.index_select(0, entries), store.holders.index_select(0, entries)
        wants = (intent >> node & 1).bool()
        keys, entries, intent, holders = keys[wants], entries[wants], intent[wants], holders[wants]
        me, them = _bit(self.index), _bit(node)
        if self.technique == "adaptive":
            relocate = (intent == them) & ((holders & ~them) == 0)
            replicate = ~relocate & ((holders & them) == 0)
        elif self.technique == "replication":
            relocate = torch.zeros(keys.shape[0], dtype=torch.bool)
            replicate = (holders & them) == 0
        else:  # relocation only: move it to a node with intent whenever the owner has none
            relocate = (intent & me) == 0
            replicate = torch.zeros_like(relocate)
        moving, leaving = keys[relocate], entries[relocate]
        if moving.numel():
            response.relocate = moving
            response.relocate_value = store.data.index_select(0, leaving)
            response.relocate_version = store.version.index_select(0, leaving)
            response.relocate_intent = store.interested.index_select(0, leaving)
            response.relocate_holders = store.holders.index_select(0, leaving)
            response.relocate_moves = store.moves.index_select(0, leaving)
            moves = response.relocate_moves + 1
            store.kind[leaving] = ABSENT
            store.interested[leaving] = 0
            store.holders[leaving] = 0
            store.hint[leaving] = node
            home = self._home(moving)
            here = home == self.index
            self._record_home(moving[here], torch.full_like(moving[here], node), moves[here])
            away = ~here & (home != node)
            for target, key, count in zip(home[away].tolist(), moving[away].tolist(), moves[away].tolist()):
                self.home_updates[target][key] = (node, count)
            self._release_dead(leaving)  # (gone: unless this node's own workers still intend to use it)
        copies, copied = keys[replicate], entries[replicate]
        if copies.numel():
            response.replica = copies
            response.replica_value = store.data.index_select(0, copied)
            response.replica_version = store.version.index_select(0, copied)
            response.replica_owner = torch.full_like(copies, self.index)
            current = store.holders.index_select(0, copied)
            store.holders.index_copy_(0, copied, current | them)

    # ---- state --------------------------------------------------------------------------------------
    def quiet(self) -> bool:
        """Nothing left to manage: no key live (no intent signalled or acted, no replica but full
        replication's), nothing pending or waiting to be delivered."""
        with self.lock:
            return not (self.live.numel() or any(self.outbox) or any(self.home_updates) or any(self.pending))


def _unique_first(keys: Tensor) -> tuple[Tensor, Tensor]:
    """(unique keys, the position of each one's first occurrence in ``keys``)."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((unique.shape[0],), keys.shape[0], dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(keys.shape[0]), reduce="amin")
    return unique, first
