"""An AdaPM node (seed 001, SPEC section 2): a node-local store of every key the node owns or
replicates, the verbs its workers call, and the management protocol between nodes.

Every node allocates one slot per key of the task's key space (fixed tables: key = slot; a growing
vocabulary: the keys in the data, sorted) and initialises all of them from the task's seeded initial
rows, so any node can hold any parameter; ``kind`` says which it holds: the **main copy** (it is the
key's *owner*), a **replica**, or nothing. A value is the row and its entity optimizer's state side
by side (``[width + state_width]``), so a worker's optimizer step is a local computation and its
result an additive delta, as in the reference implementation.

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
carries relocations, new replicas, refreshed values and routing hints. The home node of a key
(``key % nodes``) always knows its owner; every node caches the last known owner of a key
(``hint``), and a message that reaches a former owner is answered with a hint and retried.

The dense parameters are one more managed value: the main copy on node 0 (its first worker's
module), a replica on every other worker, synchronised by the same delta/version rule each round.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


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
    intent: Tensor = field(default_factory=_empty)  # slots: the source's intent became active
    expire: Tensor = field(default_factory=_empty)  # slots: its intent expired (no replica held)
    drop: Tensor = field(default_factory=_empty)  # slots of replicas dropped (intent expired) ...
    drop_delta: Tensor | None = None  # ... with their last deltas
    sync: Tensor = field(default_factory=_empty)  # slots of replicas held ...
    sync_version: Tensor = field(default_factory=_empty)  # ... the versions they hold ...
    sync_changed: Tensor = field(default_factory=_empty)  # ... which changed since the last round (bool) ...
    sync_delta: Tensor | None = None  # ... and the deltas of those only (an unchanged replica sends none)
    home: Tensor = field(default_factory=_empty)  # slots homed at the destination that moved ...
    home_owner: Tensor = field(default_factory=_empty)  # ... their new owners ...
    home_moves: Tensor = field(default_factory=_empty)  # ... as of this many relocations (the latest wins)
    dense_delta: Tensor | None = None  # the source's dense replicas' deltas (to node 0)
    dense_version: Tensor | None = None

    def nbytes(self) -> int:
        return nbytes(self.intent, self.expire, self.drop, self.drop_delta, self.sync, self.sync_delta,
                      self.sync_version, self.sync_changed, self.home, self.home_owner, self.home_moves, self.dense_delta, self.dense_version)


@dataclass
class Response:
    relocate: Tensor = field(default_factory=_empty)  # slots whose main copy moves to the requester ...
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


class Node:
    """One node: its store, its workers' verbs, and its side of the management protocol."""

    def __init__(self, index: int, nodes: int, keys: Tensor, initial: Tensor, width: int,
                 technique: str = "adaptive", workers: int = 1):
        if technique not in TECHNIQUES:
            raise ValueError(f"technique {technique!r} (choose one of {', '.join(TECHNIQUES)})")
        if nodes > 63:
            raise ValueError("at most 63 nodes (intent sets are 64-bit masks)")
        self.index, self.nodes, self.technique = index, nodes, technique
        self.keys = keys  # [N] int64, sorted: slot -> key
        self.key_is_slot = bool(keys.shape[0]) and int(keys[-1]) == keys.shape[0] - 1  # 0..N-1: a fixed table
        self.width = width  # of a row; values hold the row and its optimizer state
        n = keys.shape[0]
        self.data = initial  # [N, width + state] float32 (every node starts from the same initial rows)
        self.home = keys.remainder(nodes)
        mine = self.home == index
        self.kind = torch.where(mine, OWNER, ABSENT).to(torch.int8)
        self.stamp = torch.zeros(n, dtype=torch.int64)  # local changes (a worker's write: set or add)
        self.version = torch.zeros(n, dtype=torch.int64)  # owner: the main copy's; replica: the one held
        self.sync = torch.zeros(0, self.data.shape[1])  # replica sync state, by slot (allocated lazily)
        self.refreshed = torch.zeros(n, dtype=torch.float64)  # replica: last refresh (staleness)
        self.moves = torch.zeros(n, dtype=torch.int64)  # owner: relocations of the main copy so far
        self.hint = self.home.to(torch.int16)  # location cache: the last known owner
        self.home_owner = self.home.to(torch.int16).clone()  # authoritative for keys homed here ...
        self.home_moves = torch.zeros(n, dtype=torch.int64)  # ... as of this many relocations
        self.interested = torch.zeros(n, dtype=torch.int64)  # owner: bitmask of nodes with active intent
        self.holders = torch.zeros(n, dtype=torch.int64)  # owner: bitmask of replica holders
        self.signalled = torch.zeros(n, dtype=torch.bool)  # this node told the owner of its intent
        self.active_end = torch.zeros(workers, n, dtype=torch.int64)  # acted intents: end clock per worker
        # the slots a round has to look at (sorted): acted intents, signalled ones, replicas; a round
        # visits these, not the key space, and drops those with nothing left to manage
        self.live = torch.empty(0, dtype=torch.int64)
        self.clocks = [0] * workers
        self.pending: list[deque[tuple[int, int, Tensor]]] = [deque() for _ in range(workers)]  # (start, end, slots)
        self.outbox: list[set[int]] = [set() for _ in range(nodes)]  # slots to decide for node m
        self.home_updates: list[dict[int, tuple[int, int]]] = [{} for _ in range(nodes)]  # slot -> (owner, moves)
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
        if technique == "full":  # every key on every node from the start: a replica unless owned
            self._ensure_sync()
            replica = ~mine
            self.kind[replica] = REPLICA
            self.sync[replica] = self.data[replica]
            self.refreshed[:] = time.perf_counter()

    # ---- slots -----------------------------------------------------------------------------------
    def slots(self, keys: Tensor) -> Tensor:
        if self.key_is_slot:
            return keys
        position = torch.searchsorted(self.keys, keys)
        if bool((position >= self.keys.shape[0]).any()) or not torch.equal(self.keys[position], keys):
            raise KeyError("a key outside the task's key space")
        return position

    def locate(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """(slots, found) of ``keys``, any of which may lie outside the key space (its slot is then
        meaningless and ``found`` False): a checkpoint's or an evaluation's keys."""
        if not self.keys.numel():
            return torch.zeros_like(keys), torch.zeros(keys.shape, dtype=torch.bool)
        if self.key_is_slot:  # (a fixed table: key = slot)
            return keys.clamp(0, self.keys.shape[0] - 1), (keys >= 0) & (keys < self.keys.shape[0])
        position = torch.searchsorted(self.keys, keys).clamp_(max=self.keys.shape[0] - 1)
        return position, self.keys.index_select(0, position) == keys

    def _ensure_sync(self) -> None:
        if self.sync.shape[0] != self.data.shape[0]:
            self.sync = torch.zeros_like(self.data)

    # ---- worker verbs ----------------------------------------------------------------------------
    def intent(self, worker: int, keys: Tensor, start: int, end: int | None = None) -> None:
        """Worker ``worker`` will access ``keys`` while its clock c satisfies start <= c < end."""
        end = start + 1 if end is None else end
        if end <= start:
            raise ValueError(f"intent: end {end} must be after start {start}")
        if self.technique in ("static", "full") or self.nodes == 1 or not keys.numel():
            return  # (nothing acts on them)
        with self.lock:
            self.pending[worker].append((start, end, self.slots(keys)))

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
            return bool((self.kind.index_select(0, self.slots(keys)) != ABSENT).all())

    def round_started(self) -> None:
        with self.round_done:
            self.rounds_started += 1

    def round_completed(self) -> None:
        with self.round_done:
            self.rounds_completed = self.rounds_started
            self.round_done.notify_all()

    def pull(self, keys: Tensor, remote) -> tuple[Tensor, Tensor, Tensor]:
        """(values, local mask, stamps) of ``keys``: local ones read here, the others from their
        owners (``remote(node, slots) -> (values, not_mine, hints)``, synchronously)."""
        slots = self.slots(keys)
        with self.lock:
            kind = self.kind.index_select(0, slots)
            local = kind != ABSENT
            values = self.data.index_select(0, slots)
            stamps = self.stamp.index_select(0, slots)
            replica = (kind == REPLICA).nonzero().squeeze(1)
            if replica.numel():
                now = time.perf_counter()
                self.staleness_total += float((now - self.refreshed.index_select(0, slots[replica])).sum())
                self.staleness_count += replica.numel()
            self.accesses += slots.shape[0]
        missing = (~local).nonzero().squeeze(1)
        if missing.numel():
            values[missing] = self._remote(slots[missing], remote)
        return values, local, stamps

    def commit(self, keys: Tensor, before: Tensor, after: Tensor, local: Tensor, stamps: Tensor, remote) -> None:
        """A worker's update of ``keys`` from ``before`` (pulled) to ``after``: a key held here and
        untouched since the pull is overwritten (so one node equals ``sync`` bit for bit), a key held
        here and changed meanwhile (a merge, another worker) takes the delta, any other key's delta is
        pushed to its owner."""
        slots = self.slots(keys)
        with self.lock:
            kind = self.kind.index_select(0, slots)
            here = kind != ABSENT
            clean = here & local & (self.stamp.index_select(0, slots) == stamps)
            dirty = here & ~clean
            self.accesses += slots.shape[0]
            if bool(clean.any()):
                chosen = clean.nonzero().squeeze(1)
                self._write(slots[chosen], after[chosen], add=False)
            if bool(dirty.any()):
                chosen = dirty.nonzero().squeeze(1)
                self._write(slots[chosen], after[chosen] - before[chosen], add=True)
        away = (~here).nonzero().squeeze(1)
        if away.numel():
            self._remote(slots[away], remote, delta=after[away] - before[away])

    def push(self, keys: Tensor, delta: Tensor, remote) -> None:
        """The verb ``push``: add ``delta`` to the values of ``keys`` (wherever they are)."""
        self._apply(keys, delta, True, remote)

    def set(self, keys: Tensor, values: Tensor, remote) -> None:
        """The verb ``set``: overwrite the values of ``keys`` (on a replica: the change travels to the
        owner as a delta, like any local update)."""
        self._apply(keys, values, False, remote)

    def _apply(self, keys: Tensor, block: Tensor, add: bool, remote) -> None:
        slots = self.slots(keys)
        with self.lock:
            here = self.kind.index_select(0, slots) != ABSENT
            self.accesses += slots.shape[0]
            chosen = here.nonzero().squeeze(1)
            if chosen.numel():
                self._write(slots[chosen], block[chosen], add=add)
        away = (~here).nonzero().squeeze(1)
        if away.numel():
            self._remote(slots[away], remote, **{"delta" if add else "value": block[away]})

    def _write(self, slots: Tensor, block: Tensor, add: bool) -> None:
        if add:
            self.data.index_add_(0, slots, block)
        else:
            self.data.index_copy_(0, slots, block)
        self.stamp.index_add_(0, slots, torch.ones_like(slots))
        owned = slots[self.kind.index_select(0, slots) == OWNER]
        self.version.index_add_(0, owned, torch.ones_like(owned))

    def _remote(self, slots: Tensor, remote, delta: Tensor | None = None, value: Tensor | None = None):
        """Synchronous remote accesses: read (neither ``delta`` nor ``value``), add or overwrite
        ``slots`` on their owners, following hints until every key is served."""
        out = torch.empty(slots.shape[0], self.data.shape[1]) if delta is None and value is None else None
        todo = torch.arange(slots.shape[0])
        with self.lock:
            self.remote_accesses += slots.shape[0]
            if out is not None:
                self.remote_reads += slots.shape[0]
        for attempt in range(10_000):
            with self.lock:  # it may have arrived meanwhile (a relocation or replica in flight)
                kind = self.kind.index_select(0, slots[todo])
                here = (kind != ABSENT).nonzero().squeeze(1)
                if here.numel():
                    chosen, todo = todo[here], todo[kind == ABSENT]
                    if out is not None:
                        out[chosen] = self.data.index_select(0, slots[chosen])
                    else:
                        self._write(slots[chosen], (delta if delta is not None else value)[chosen], add=delta is not None)
                hints = self._route(slots[todo])
            if not todo.numel():
                return out
            unresolved = []
            for node in hints.unique().tolist():
                mine = todo[hints == node]
                if node == self.index:  # arriving here: wait for the sync thread to install it
                    unresolved.append(mine)
                    continue
                values, not_mine, hint = remote(node, slots[mine],
                                                None if delta is None else delta[mine],
                                                None if value is None else value[mine])
                served = torch.ones(mine.shape[0], dtype=torch.bool)
                if not_mine.numel():
                    served[not_mine] = False
                    with self.lock:  # (a replica may have arrived meanwhile: its owner is known)
                        self._learn(slots[mine[not_mine]], hint)
                    unresolved.append(mine[not_mine])
                if out is not None:
                    out[mine[served]] = values
            todo = torch.cat(unresolved) if unresolved else torch.empty(0, dtype=torch.int64)
            if not todo.numel():
                return out
            time.sleep(0.0002 * min(attempt + 1, 50))
        raise ProtocolError(f"node {self.index}: {todo.numel()} keys found no owner after 10000 attempts")

    def serve(self, source: int, slots: Tensor, delta: Tensor | None, value: Tensor | None):
        """Another node's synchronous access to ``slots``: (values read, positions not owned here,
        hints for them). Replicas do not serve: only the main copy."""
        with self.lock:
            owned = self.kind.index_select(0, slots) == OWNER
            mine = owned.nonzero().squeeze(1)
            not_mine = (~owned).nonzero().squeeze(1)
            values = None
            if delta is None and value is None:
                values = self.data.index_select(0, slots[mine])
            elif mine.numel():
                self._write(slots[mine], (delta if delta is not None else value)[mine], add=delta is not None)
            hint = self._answer_hint(slots[not_mine])
            self.bytes_sent += nbytes(values, hint)
            return values, not_mine, hint

    def _learn(self, slots: Tensor, hints: Tensor) -> None:
        """Cache where keys not held here are (a key held here keeps its own record)."""
        absent = self.kind.index_select(0, slots) == ABSENT
        self.hint[slots[absent]] = hints[absent].to(torch.int16)

    def _route(self, slots: Tensor) -> Tensor:
        """Where to send a message about keys not held here: the cached owner, unless the cache
        names this node (a stale answer): then the home node's record, or the home node."""
        hints = self.hint.index_select(0, slots).long()
        stale = hints == self.index
        if bool(stale.any()):
            hints[stale] = self._answer_hint(slots[stale])
        return hints

    def _record_home(self, slots: Tensor, owners: Tensor, moves: Tensor) -> None:
        """The home node's record of where its keys are, as of ``moves`` relocations (the newest wins)."""
        newer = moves > self.home_moves.index_select(0, slots)
        self.home_owner[slots[newer]] = owners[newer].to(torch.int16)
        self.home_moves[slots[newer]] = moves[newer]

    def _answer_hint(self, slots: Tensor) -> Tensor:
        """Where to look for keys not owned here: the home node's record if this is the home; else
        this node's cache (a former owner knows where it sent the key: fresher than a home record
        whose update is still on its way), unless the cache names this node: then the home node."""
        mine = self.home.index_select(0, slots) == self.index
        cached = self.hint.index_select(0, slots).long()
        elsewhere = torch.where(cached == self.index, self.home.index_select(0, slots), cached)
        return torch.where(mine, self.home_owner.index_select(0, slots).long(), elsewhere)

    # ---- a communication round: this node's side ----------------------------------------------------
    def act_on_intents(self, horizons: list[float]) -> None:
        """Move each worker's pending intents that start before its horizon to the acted set."""
        with self.lock:
            for worker, horizon in enumerate(horizons):
                queue = self.pending[worker]
                while queue and queue[0][0] < horizon:
                    _, end, slots = queue.popleft()
                    current = self.active_end[worker].index_select(0, slots)
                    self.active_end[worker].index_copy_(0, slots, torch.maximum(current, torch.full_like(current, end)))
                    self._track(slots)

    def _track(self, slots: Tensor) -> None:
        """Rounds look at ``slots`` from now on (until nothing is left to manage for them)."""
        if slots.numel():
            self.live = torch.unique(torch.cat([self.live, slots]))

    def requests(self) -> list[Request | None]:
        """This round's message to every other node (None for this node itself)."""
        with self.lock:
            live = self.live  # (every signalled slot and every replica is live: no scan of the key space)
            clocks = torch.tensor(self.clocks, dtype=torch.int64).unsqueeze(1)
            active = (self.active_end.index_select(1, live) > clocks).any(0)
            signalled = self.signalled.index_select(0, live)
            keep = active | signalled | (self.kind.index_select(0, live) == REPLICA)
            self.live = live = live[keep]
            active, signalled = active[keep], signalled[keep]
            new = live[active & ~signalled]
            gone = live[signalled & ~active]
            me = _bit(self.index)
            # intents on keys owned here change the owner's record directly
            for slots, on in ((new, True), (gone, False)):
                owned = slots[self.kind.index_select(0, slots) == OWNER]
                if owned.numel():
                    current = self.interested.index_select(0, owned)
                    self.interested.index_copy_(0, owned, current | me if on else current & ~me)
                    self.signalled[owned] = on
                    self._changed(owned)
            kind_new, kind_gone = self.kind.index_select(0, new), self.kind.index_select(0, gone)
            send_new = new[kind_new == ABSENT]
            replicas_new = new[kind_new == REPLICA]
            self.signalled[replicas_new] = True
            drop = gone[kind_gone == REPLICA]
            expire = gone[kind_gone == ABSENT]
            target_new, target_expire = self._route(send_new), self._route(expire)
            self.signalled[send_new] = True  # (undone if the destination is not the owner)
            self.signalled[expire] = False  # (redone if the destination is not the owner)
            if drop.numel():
                drop_delta = self.data.index_select(0, drop) - self.sync.index_select(0, drop)
                target_drop = self.hint.index_select(0, drop)
                self.kind[drop] = ABSENT
                self.signalled[drop] = False
            if self.technique == "full":  # (every key not owned here: a replica from the start)
                replicas = (self.kind == REPLICA).nonzero().squeeze(1)
            else:
                replicas = live[self.kind.index_select(0, live) == REPLICA]
            if replicas.numel():
                sync_delta = self.data.index_select(0, replicas) - self.sync.index_select(0, replicas)
                self.sync.index_copy_(0, replicas, self.data.index_select(0, replicas))
                changed = sync_delta.ne(0).any(dim=1)  # (a zero delta would change nothing on the owner)
                target_sync = self.hint.index_select(0, replicas)
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
                    request.sync_version = self.version.index_select(0, replicas[chosen])
                updates = self.home_updates[node]
                if updates:
                    request.home = torch.tensor(list(updates.keys()), dtype=torch.int64)
                    request.home_owner = torch.tensor([owner for owner, _ in updates.values()], dtype=torch.int64)
                    request.home_moves = torch.tensor([moves for _, moves in updates.values()], dtype=torch.int64)
                    updates.clear()
                if node == 0 and self.dense and self.dense[0].params:
                    deltas, versions = [], []
                    for copy in self.dense:
                        with copy.lock:
                            now = copy.vector()
                            deltas.append(now - copy.sync)
                            copy.sync = now
                            versions.append(copy.version)
                    request.dense_delta = torch.stack(deltas)
                    request.dense_version = torch.tensor(versions, dtype=torch.int64)
                self.bytes_sent += request.nbytes()
                requests.append(request)
            self.rounds += 1
            return requests

    def install(self, source: int, response: Response, request: Request) -> None:
        """Apply the answer of node ``source`` to this round's request."""
        now = time.perf_counter()
        with self.lock:
            if response.not_mine.numel():  # intents and expiries that reached a non-owner: retry there
                slots = response.not_mine
                self._learn(slots, response.hint)
                intended = torch.isin(slots, request.intent)
                self.signalled[slots[intended]] = False
                self.signalled[slots[~intended]] = True
            if response.relocate.numel():
                slots = response.relocate
                was_replica = self.kind.index_select(0, slots) == REPLICA
                value = response.relocate_value.clone()
                if bool(was_replica.any()):  # keep the replica's updates not yet sent
                    chosen = was_replica.nonzero().squeeze(1)
                    self._ensure_sync()
                    value[chosen] += self.data.index_select(0, slots[chosen]) - self.sync.index_select(0, slots[chosen])
                self.data.index_copy_(0, slots, value)
                self.stamp.index_add_(0, slots, torch.ones_like(slots))
                self.kind[slots] = OWNER
                self.version.index_copy_(0, slots, response.relocate_version)
                self.interested.index_copy_(0, slots, response.relocate_intent)
                self.holders.index_copy_(0, slots, response.relocate_holders & ~_bit(self.index))
                self.hint[slots] = self.index
                self.moves.index_copy_(0, slots, response.relocate_moves + 1)
                homed_here = self.home.index_select(0, slots) == self.index
                here = slots[homed_here]
                self._record_home(here, torch.full_like(here, self.index), self.moves.index_select(0, here))
                self.relocations_in += slots.shape[0]
                self._changed(slots)
            if response.replica.numel():
                slots = response.replica
                self._ensure_sync()
                absent = self.kind.index_select(0, slots) == ABSENT
                slots, value = slots[absent], response.replica_value[absent]
                self.data.index_copy_(0, slots, value)
                self.sync.index_copy_(0, slots, value)
                self.stamp.index_add_(0, slots, torch.ones_like(slots))
                self.version.index_copy_(0, slots, response.replica_version[absent])
                self.kind[slots] = REPLICA
                self._track(slots)
                self.hint[slots] = response.replica_owner[absent].to(torch.int16)
                self.refreshed[slots] = now
                self.replicas_created += slots.shape[0]
            if response.refresh.numel():
                slots = response.refresh
                held = self.kind.index_select(0, slots) == REPLICA
                slots, value = slots[held], response.refresh_value[held]
                local = self.data.index_select(0, slots) - self.sync.index_select(0, slots)
                self.data.index_copy_(0, slots, value + local)
                self.sync.index_copy_(0, slots, value)
                self.stamp.index_add_(0, slots, torch.ones_like(slots))
                self.version.index_copy_(0, slots, response.refresh_version[held])
                self.refreshed[slots] = now
            if response.current.numel():
                slots = response.current
                held = self.kind.index_select(0, slots) == REPLICA
                self.version.index_copy_(0, slots[held], response.current_version[held])
                self.refreshed[slots[held]] = now
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
            if request.home.numel():  # (a relocation reported late must not undo a later one: _record_home)
                self._record_home(request.home, request.home_owner, request.home_moves)
            not_mine = []
            for slots, on in ((request.intent, True), (request.expire, False)):
                if not slots.numel():
                    continue
                owned = self.kind.index_select(0, slots) == OWNER
                mine = slots[owned]
                current = self.interested.index_select(0, mine)
                self.interested.index_copy_(0, mine, current | me if on else current & ~me)
                self._changed(mine)
                not_mine.append(slots[~owned])
            if request.drop.numel():
                self._merge(request.drop, request.drop_delta, source, "drop")
                current = self.holders.index_select(0, request.drop)
                self.holders.index_copy_(0, request.drop, current & ~me)
                current = self.interested.index_select(0, request.drop)
                self.interested.index_copy_(0, request.drop, current & ~me)
                self._changed(request.drop)
            if request.sync.numel():
                slots, changed = request.sync, request.sync_changed
                if not bool((self.kind.index_select(0, slots) == OWNER).all()):
                    raise ProtocolError(f"node {self.index}: a sync from node {source} for keys it does not own")
                before = self.version.index_select(0, slots)  # (the versions before this message's deltas)
                if bool(changed.any()):
                    self._merge(slots[changed], request.sync_delta, source, "sync")
                behind = request.sync_version < before  # someone else changed the main copy
                response.refresh = slots[behind]
                response.refresh_value = self.data.index_select(0, response.refresh)
                response.refresh_version = self.version.index_select(0, response.refresh)
                response.current = slots[~behind]
                response.current_version = self.version.index_select(0, response.current)
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
        self.bytes_sent += response.nbytes()
        if forward is not None and response.not_mine.numel():
            self._forward(request, response, forward)
        return response

    def _forward(self, request: Request, response: Response, forward) -> None:
        """One hop (never from a forwarded message): the owner's answer joins this response (the
        owner's bytes are counted there, the forwarded message's here)."""
        slots, hints = response.not_mine, response.hint
        intended = torch.isin(slots, request.intent)
        left, left_hint = [], []
        for node in hints.unique().tolist():
            chosen = hints == node
            if node in (self.index, request.source):
                left.append(slots[chosen])
                left_hint.append(hints[chosen])
                continue
            sub = Request(request.source, intent=slots[chosen & intended], expire=slots[chosen & ~intended])
            self.bytes_sent += sub.nbytes()
            answer = forward(node, sub)
            response.absorb(answer)
            left.append(answer.not_mine)
            left_hint.append(answer.hint)
        response.not_mine, response.hint = torch.cat(left), torch.cat(left_hint)

    def _merge(self, slots: Tensor, delta: Tensor, source: int, what: str) -> Tensor:
        """Add replica deltas to the main copies; the versions before the merge."""
        owned = self.kind.index_select(0, slots) == OWNER
        if not bool(owned.all()):
            raise ProtocolError(f"node {self.index}: a {what} from node {source} for keys it does not own")
        before = self.version.index_select(0, slots)
        changed = delta.ne(0).any(dim=1)
        self.data.index_add_(0, slots, delta)
        self.version.index_add_(0, slots, changed.long())
        self.stamp.index_add_(0, slots, changed.long())  # a worker's commit of a pull before this adds, not overwrites
        return before

    def _changed(self, slots: Tensor) -> None:
        """The intent set of owned ``slots`` changed: decide for every other node with intent when it
        next asks (``_deliver``)."""
        if self.technique in ("static", "full") or not slots.numel():
            return
        intent = self.interested.index_select(0, slots)
        for node in range(self.nodes):
            if node == self.index:
                continue
            chosen = slots[(intent >> node & 1).bool()]
            if chosen.numel():
                self.outbox[node].update(chosen.tolist())

    def _deliver(self, node: int, response: Response, only: Tensor | None = None) -> None:
        """The decisions for ``node`` on the keys it has (or had) intent for (``only``: of these
        keys): relocate, replicate, or nothing, by the technique (under the lock)."""
        box = self.outbox[node]
        chosen = box if only is None else box.intersection(only.tolist())
        if not chosen:
            return
        slots = torch.tensor(sorted(chosen), dtype=torch.int64)
        box.difference_update(chosen)
        slots = slots[self.kind.index_select(0, slots) == OWNER]
        intent, holders = self.interested.index_select(0, slots), self.holders.index_select(0, slots)
        wants = (intent >> node & 1).bool()
        slots, intent, holders = slots[wants], intent[wants], holders[wants]
        me, them = _bit(self.index), _bit(node)
        if self.technique == "adaptive":
            relocate = (intent == them) & ((holders & ~them) == 0)
            replicate = ~relocate & ((holders & them) == 0)
        elif self.technique == "replication":
            relocate = torch.zeros(slots.shape[0], dtype=torch.bool)
            replicate = (holders & them) == 0
        else:  # relocation only: move it to a node with intent whenever the owner has none
            relocate = (intent & me) == 0
            replicate = torch.zeros_like(relocate)
        moving = slots[relocate]
        if moving.numel():
            response.relocate = moving
            response.relocate_value = self.data.index_select(0, moving)
            response.relocate_version = self.version.index_select(0, moving)
            response.relocate_intent = self.interested.index_select(0, moving)
            response.relocate_holders = self.holders.index_select(0, moving)
            response.relocate_moves = self.moves.index_select(0, moving)
            moves = response.relocate_moves + 1
            self.kind[moving] = ABSENT
            self.interested[moving] = 0
            self.holders[moving] = 0
            self.hint[moving] = node
            home = self.home.index_select(0, moving)
            here = home == self.index
            self._record_home(moving[here], torch.full_like(moving[here], node), moves[here])
            away = ~here & (home != node)
            for target, slot, count in zip(home[away].tolist(), moving[away].tolist(), moves[away].tolist()):
                self.home_updates[target][slot] = (node, count)
        copies = slots[replicate]
        if copies.numel():
            response.replica = copies
            response.replica_value = self.data.index_select(0, copies)
            response.replica_version = self.version.index_select(0, copies)
            response.replica_owner = torch.full_like(copies, self.index)
            current = self.holders.index_select(0, copies)
            self.holders.index_copy_(0, copies, current | them)

    # ---- state --------------------------------------------------------------------------------------
    def quiet(self) -> bool:
        """Nothing left to manage: no intent signalled or pending, no replica (but full replication's),
        nothing waiting to be delivered."""
        with self.lock:
            live = self.live  # (every signalled slot and every replica is live)
            replicas = self.technique != "full" and bool((self.kind.index_select(0, live) == REPLICA).any())
            return not (replicas or bool(self.signalled.index_select(0, live).any()) or any(self.outbox)
                        or any(self.home_updates) or any(self.pending))
