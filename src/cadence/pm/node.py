"""An AdaPM node (seed 001, SPEC section 2): what it holds, the verbs its workers call, and its side
of the management protocol between nodes, each a part of its own:

- ``holdings.Holdings``: an entry per key the node owns or replicates, or has intent for (the row and
  its entity optimizer's state side by side, and the protocol's metadata), its workers' clocks;
- ``routing.Routing``: where the keys it does not hold are (home records, a location cache);
- ``management.Management``: a communication round, this node's side (``act_on_intents``,
  ``requests``, ``install``) and the owner's (``handle``), the decisions to relocate or replicate;
- ``Node`` (here): the parts under one lock, and the verbs.

Verbs (``pull``, ``push`` additive, ``set``, ``intent``, ``advance_clock``, ``current_clock``) work on
any key at any time: a key held here is read or written in place; any other key is a synchronous
remote access to its owner (counted in ``remote_accesses``; ``serve`` is the owner's side).
"""

from __future__ import annotations

import threading
import time

import torch
from torch import Tensor

from cadence.pm.holdings import Holdings, KeySpace
from cadence.pm.management import DenseCopy, Management
from cadence.pm.messages import (ABSENT, OWNER, REPLICA, Counters, ProtocolError, Request, Response,
                                               nbytes)

TECHNIQUES = ("adaptive", "replication", "relocation", "static", "full")
__all__ = ["ABSENT", "OWNER", "REPLICA", "TECHNIQUES", "DenseCopy", "KeySpace", "Node", "ProtocolError", "Request",
           "Response", "nbytes"]


class Node:
    """One node: its holdings, routing and management under one lock, and its workers' verbs."""

    def __init__(self, index: int, nodes: int, space: KeySpace, width: int, technique: str = "adaptive",
                 workers: int = 1):
        if technique not in TECHNIQUES:
            raise ValueError(f"technique {technique!r} (choose one of {', '.join(TECHNIQUES)})")
        if nodes > 63:
            raise ValueError("at most 63 nodes (intent sets are 64-bit masks)")
        self.index, self.nodes, self.technique = index, nodes, technique
        self.width = width  # of a row; values hold the row and its optimizer state
        self.lock = threading.RLock()
        self.counters = Counters()
        self.holdings = Holdings(index, nodes, space, workers, full=technique == "full")
        self.routing = self.holdings.routing
        self.management = Management(self.holdings, technique, workers, self.counters, self.lock)
        self.space, self.store, self.syncs = space, self.holdings.store, self.holdings.syncs
        self.round_done = threading.Condition()  # notified after each completed round (wait_sync)
        self.wake = threading.Event()  # set: the sync thread's rest ends now (a worker waits for a round)
        self.rounds_started = 0
        self.rounds_completed = 0

    # ---- the parts' state, as the engine and the tests read it -------------------------------------
    @property
    def clocks(self) -> list[int]:
        return self.holdings.clocks

    @clocks.setter
    def clocks(self, clocks: list[int]) -> None:
        self.holdings.clocks = clocks

    @property
    def live(self) -> Tensor:
        return self.holdings.live

    @property
    def dense(self) -> list[DenseCopy]:
        return self.management.dense

    @property
    def main_dense(self) -> DenseCopy | None:
        return self.management.main_dense

    @main_dense.setter
    def main_dense(self, copy: DenseCopy | None) -> None:
        self.management.main_dense = copy

    @property
    def home_updates(self) -> list[list[tuple[Tensor, Tensor, Tensor]]]:
        return self.management.home_updates

    # ---- a communication round (management) -----------------------------------------------------
    def act_on_intents(self, horizons: list[float]) -> None:
        self.management.act_on_intents(horizons)

    def requests(self) -> list[Request | None]:
        return self.management.requests()

    def install(self, source: int, response: Response, request: Request) -> None:
        self.management.install(source, response, request)

    def handle(self, request: Request, forward=None, forwarded: bool = False) -> Response:
        return self.management.handle(request, forward, forwarded)

    def quiet(self) -> bool:
        return self.management.quiet()

    # ---- what a node holds (tests, counters) -------------------------------------------------------
    def kind_of(self, keys: Tensor) -> Tensor:
        with self.lock:
            return self.holdings.kind(self.store.find(keys))

    def kind_of_entries(self, entries: Tensor) -> Tensor:
        """The kind of each entry (ABSENT for -1)."""
        return self.holdings.kind(entries)

    def value_of(self, keys: Tensor) -> Tensor:
        """The values held here of ``keys`` (each held: main copy or replica)."""
        with self.lock:
            return self.holdings.value_of(keys)

    def held(self, kind: int | None = None) -> Tensor:
        """The keys held here (sorted): main copies and replicas, or only ``kind``'s."""
        with self.lock:
            return self.holdings.held(kind)

    def entries(self) -> int:
        """Entries in use (keys held, and keys with intent not yet held)."""
        return len(self.store)

    def live_keys(self) -> Tensor:
        """The keys a round looks at (sorted)."""
        with self.lock:
            return self.store.key.index_select(0, self.holdings.live).sort().values

    def hint_of(self, keys: Tensor) -> Tensor:
        with self.lock:
            return self.routing.cached(keys)

    def learn(self, keys: Tensor, owners: Tensor) -> None:
        """Cache where keys not held here are (tests: a stale cache)."""
        with self.lock:
            self.routing.learn(keys, owners)

    def home_record(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """(owner, relocations) of keys homed here, by the home record."""
        with self.lock:
            return self.routing.home_record(keys)

    def load(self, keys: Tensor, values: Tensor) -> None:
        """Every copy here (main copy or replica) of a key in ``keys`` takes its value."""
        with self.lock:
            self.holdings.load(keys, values)

    def memory(self) -> dict[str, int]:
        """Bytes of this node's store: entries (rows and metadata), replica sync rows, home records,
        the location cache."""
        return self.holdings.memory()

    # ---- worker verbs ----------------------------------------------------------------------------
    def intent(self, worker: int, keys: Tensor, start: int, end: int | None = None) -> None:
        """Worker ``worker`` will access ``keys`` while its clock c satisfies start <= c < end."""
        end = start + 1 if end is None else end
        if end <= start:
            raise ValueError(f"intent: end {end} must be after start {start}")
        self.holdings.check(keys)
        if self.technique in ("static", "full") or self.nodes == 1 or not keys.numel():
            return  # (nothing acts on them)
        with self.lock:
            self.management.pending[worker].append((start, end, keys))

    def advance_clock(self, worker: int) -> int:
        self.holdings.clocks[worker] += 1  # (one writer: the worker; readers tolerate a stale value)
        return self.holdings.clocks[worker]

    def current_clock(self, worker: int) -> int:
        return self.holdings.clocks[worker]

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Block until a communication round that starts after this call has completed (its
        actions installed); False on timeout."""
        with self.round_done:
            target = self.rounds_started + 1
            self.wake.set()
            return self.round_done.wait_for(lambda: self.rounds_completed >= target, timeout)

    def holds(self, keys: Tensor) -> bool:
        """Whether every key is held here (main copy or replica)."""
        with self.lock:
            return bool((self.holdings.kind(self.store.find(keys)) != ABSENT).all())

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
        self.holdings.check(keys)
        with self.lock:
            store = self.store
            entries = store.find(keys)
            self.holdings.pulled(keys, entries)
            kind = self.holdings.kind(entries)
            local = kind != ABSENT
            if bool(local.all()):  # (the common case: one gather, no scatter)
                values, stamps = store.data.index_select(0, entries), store.stamp.index_select(0, entries)
                held = entries
            else:
                values = torch.empty(keys.shape[0], self.holdings.space.width)
                stamps = torch.zeros(keys.shape[0], dtype=torch.int64)
                here = local.nonzero().squeeze(1)
                held = entries.index_select(0, here)
                values[here] = store.data.index_select(0, held)
                stamps[here] = store.stamp.index_select(0, held)
                kind = kind.index_select(0, here)
                self._count_misses(entries[~local])
            replica = held[kind == REPLICA]
            if replica.numel():
                now = time.perf_counter()
                self.counters.staleness_total += float((now - store.refreshed.index_select(0, replica)).sum())
                self.counters.staleness_count += replica.numel()
            self.counters.accesses += keys.shape[0]
        missing = (~local).nonzero().squeeze(1)
        if missing.numel():
            values[missing] = self._remote(keys[missing], remote)
        return values, local, stamps

    def _count_misses(self, entries: Tensor) -> None:
        """Why keys a pull reads remotely are not here: no intent acted on here (no entry, or no
        active intent), acted on but not yet sent to the owner, or sent and not arrived (an answer
        not installed yet, a forward that missed, or a key that came and left)."""
        found = entries >= 0
        entries = entries[found]
        counters = self.counters
        signalled = self.store.signalled.index_select(0, entries)
        acted = self.holdings.active(entries)
        counters.misses_in_flight += int(signalled.sum())
        counters.misses_unsent += int((acted & ~signalled).sum())
        counters.misses_not_acted += int((~found).sum()) + int((~acted & ~signalled).sum())

    def commit(self, keys: Tensor, before: Tensor, after: Tensor, local: Tensor, stamps: Tensor, remote) -> None:
        """A worker's update of ``keys`` from ``before`` (pulled) to ``after``: a key held here and
        untouched since the pull is overwritten (so one node equals ``sync`` bit for bit), a key held
        here and changed meanwhile (a merge, another worker, a relocation) takes the delta, any other
        key's delta is pushed to its owner."""
        with self.lock:
            entries = self.holdings.entries_of(keys)
            here = self.holdings.kind(entries) != ABSENT
            clean = here & local & (self.store.stamp.index_select(0, entries.clamp(min=0)) == stamps)
            self.counters.accesses += keys.shape[0]
            if bool(clean.all()):  # (the common case: one write)
                self.holdings.write(entries, after, add=False)
                return
            dirty = here & ~clean
            if bool(clean.any()):
                chosen = clean.nonzero().squeeze(1)
                self.holdings.write(entries[chosen], after[chosen], add=False)
            if bool(dirty.any()):
                chosen = dirty.nonzero().squeeze(1)
                self.holdings.write(entries[chosen], after[chosen] - before[chosen], add=True)
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
        self.holdings.check(keys)
        with self.lock:
            entries = self.store.find(keys)
            here = self.holdings.kind(entries) != ABSENT
            self.counters.accesses += keys.shape[0]
            chosen = here.nonzero().squeeze(1)
            if chosen.numel():
                self.holdings.write(entries[chosen], block[chosen], add=add)
        away = (~here).nonzero().squeeze(1)
        if away.numel():
            self._remote(keys[away], remote, **{"delta" if add else "value": block[away]})

    def _remote(self, keys: Tensor, remote, delta: Tensor | None = None, value: Tensor | None = None):
        """Synchronous remote accesses: read (neither ``delta`` nor ``value``), add or overwrite
        ``keys`` on their owners, following hints until every key is served."""
        out = torch.empty(keys.shape[0], self.holdings.space.width) if delta is None and value is None else None
        todo = torch.arange(keys.shape[0])
        with self.lock:
            self.counters.remote_accesses += keys.shape[0]
            if out is not None:
                self.counters.remote_reads += keys.shape[0]
        for attempt in range(10_000):
            with self.lock:  # it may have arrived meanwhile (a relocation or replica in flight)
                entries = self.store.find(keys[todo])
                kind = self.holdings.kind(entries)
                here = (kind != ABSENT).nonzero().squeeze(1)
                if here.numel():
                    chosen, held, todo = todo[here], entries[here], todo[kind == ABSENT]
                    if out is not None:
                        out[chosen] = self.store.data.index_select(0, held)
                    else:
                        self.holdings.write(held, (delta if delta is not None else value)[chosen], add=delta is not None)
                hints = self.routing.route(keys[todo])
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
                        self.routing.learn(keys[mine[not_mine]], hint)
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
            owned = self.holdings.kind(entries) == OWNER
            mine = owned.nonzero().squeeze(1)
            not_mine = (~owned).nonzero().squeeze(1)
            values = None
            if delta is None and value is None:
                values = self.store.data.index_select(0, entries[mine])
            elif mine.numel():
                self.holdings.write(entries[mine], (delta if delta is not None else value)[mine], add=delta is not None)
            hint = self.routing.answer_hint(keys[not_mine])
            self.counters.bytes_sent += nbytes(values, hint)
            return values, not_mine, hint


def _counter(name: str) -> property:
    def read(node: Node):
        return getattr(node.counters, name)

    def write(node: Node, value) -> None:
        setattr(node.counters, name, value)

    return property(read, write, doc=f"the node's ``{name}`` counter (``messages.Counters``)")


for _name in Counters.NAMES:  # (node.accesses, node.bytes_sent, ...: the engine's and the tests' reads)
    setattr(Node, _name, _counter(_name))
