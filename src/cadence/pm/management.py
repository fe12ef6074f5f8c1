"""AdaPM's management protocol (seed 001, SPEC section 2): a node's side of each communication round.

Decided on the owner from the nodes with active intent (``interested``, a bitmask per key):

- exactly one node, and no other holds a replica: **relocate** the main copy there (it stays until
  someone else needs it);
- more than one: a **replica** on every node with active intent but the owner; a node drops its
  replica when its intent expires, sending its last delta with the drop.

Replicas are synchronised through the owner: a per-key ``version`` (incremented on every change of
the main copy); each round a replica sends ``delta = value - sync_state`` with the version it holds;
the owner adds the delta and answers with its full value only if the replica is behind (someone
else changed the main copy meanwhile), and the replica keeps its local updates made since it sent
(``value = owner_value + value - sync_state``).

Each round a node sends every other node one grouped message (``messages.Request``): intents that
became active or expired, replica deltas, location updates for keys homed there; the answer
(``messages.Response``) carries relocations, new replicas, refreshed values and routing hints. A
round visits the keys with something to manage (``Holdings.live``: acted or signalled intents,
replicas), never the key space. The dense parameters are one more managed value (``DenseCopy``): the
main copy on node 0 (its first worker's module), a replica on every other worker, synchronised by
the same delta/version rule each round.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch
from torch import Tensor, nn

from cadence.pm.holdings import Holdings
from cadence.pm.messages import (ABSENT, OWNER, REPLICA, Counters, ProtocolError, Request, Response,
                                               bit, by_destination, nbytes, unique_first)


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


class Management:
    """A node's side of the protocol over its ``holdings``: the intents its workers queued
    (``pending``), the decisions it owes each node (``outbox``), the relocations to report to keys'
    homes (``home_updates``), its workers' dense copies; every method under the node's ``lock``."""

    def __init__(self, holdings: Holdings, technique: str, workers: int, counters: Counters, lock: threading.RLock):
        self.holdings, self.routing = holdings, holdings.routing
        self.store, self.syncs = holdings.store, holdings.syncs
        self.index, self.nodes, self.technique = holdings.index, holdings.nodes, technique
        self.counters, self.lock = counters, lock
        self.pending: list[deque[tuple[int, int, Tensor]]] = [deque() for _ in range(workers)]  # (start, end, keys)
        # per node m: arrays of keys to decide for m; arrays of (keys, owners, moves) to report to m,
        # their home, as the relocations this node made
        self.outbox: list[list[Tensor]] = [[] for _ in range(self.nodes)]
        self.home_updates: list[list[tuple[Tensor, Tensor, Tensor]]] = [[] for _ in range(self.nodes)]
        self.dense: list[DenseCopy] = []  # this node's workers' dense copies
        self.main_dense: DenseCopy | None = None  # node 0: the main copy

    # ---- a communication round: this node's side ----------------------------------------------------
    def act_on_intents(self, horizons: list[float]) -> None:
        """Move each worker's pending intents that start before its horizon to the acted set: every
        batch's keys at once (one lookup, one update of the intents' end clocks, the live set grown once)."""
        with self.lock:
            acted: list[tuple[int, int, Tensor]] = []
            for worker, horizon in enumerate(horizons):
                queue = self.pending[worker]
                while queue and queue[0][0] < horizon:
                    _, end, keys = queue.popleft()
                    acted.append((worker, end, keys))
            if not acted:
                return
            entries = self.holdings.entries(torch.cat([keys for _, _, keys in acted]))
            # each (entry, worker)'s end clock: the latest of its intents'
            workers = self.store.active_end.shape[1]
            cells = entries * workers + torch.cat([torch.full_like(keys, worker) for worker, _, keys in acted])
            ends = torch.cat([torch.full_like(keys, end) for _, end, keys in acted])
            self.store.active_end.view(-1).scatter_reduce_(0, cells, ends, reduce="amax")
            self.holdings.track(entries)

    def requests(self) -> list[Request | None]:
        """This round's message to every other node (None for this node itself)."""
        with self.lock:
            store = self.store
            entries = self.holdings.live  # (every signalled key and every replica is live: no scan of the key space)
            live = store.key.index_select(0, entries)
            active = self.holdings.active(entries)
            signalled = store.signalled.index_select(0, entries)
            kind = store.kind.index_select(0, entries)
            keep = active | signalled | (kind == REPLICA)
            self.holdings.untrack(entries[~keep])  # (nothing left to manage) ...
            self.holdings.free(entries[~keep & (kind == ABSENT)])  # (... and nothing held: freed)
            live, entries, active, signalled, kind = live[keep], entries[keep], active[keep], signalled[keep], kind[keep]
            new, gone = active & ~signalled, signalled & ~active
            me = bit(self.index)
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
            target_new, target_expire = self.routing.route(send_new, entries[sending]), self.routing.route(expire, entries[expiring])
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
                self.holdings.free(gone_entries)
                live, entries, kind = live[~dropping], entries[~dropping], kind[~dropping]
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
            nodes = self.nodes
            new_at, expire_at = by_destination(target_new, nodes), by_destination(target_expire, nodes)
            drop_at = by_destination(target_drop, nodes) if drop.numel() else None
            sync_at = by_destination(target_sync, nodes) if replicas.numel() else None
            for node in range(nodes):
                if node == self.index:
                    requests.append(None)
                    continue
                request = Request(self.index, intent=send_new[new_at[node]], expire=expire[expire_at[node]])
                if drop_at is not None:
                    chosen = drop_at[node]
                    request.drop, request.drop_delta = drop[chosen], drop_delta[chosen]
                if sync_at is not None:
                    chosen = sync_at[node]
                    request.sync, request.sync_changed = replicas[chosen], changed[chosen]
                    request.sync_delta = sync_delta[chosen[request.sync_changed]]
                    request.sync_version = versions[chosen]
                updates = self.home_updates[node]
                if updates:
                    request.home, request.home_owner, request.home_moves = latest(*map(torch.cat, zip(*updates)))
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
                    self.counters.dense_bytes += nbytes(request.dense_delta, request.dense_version)
                self.counters.bytes_sent += request.nbytes()
                requests.append(request)
            self.counters.rounds += 1
            return requests

    def install(self, source: int, response: Response, request: Request) -> None:
        """Apply the answer of node ``source`` to this round's request."""
        now = time.perf_counter()
        with self.lock:
            store = self.store
            if response.not_mine.numel():  # intents and expiries that reached a non-owner: retry there
                keys = response.not_mine
                self.routing.learn(keys, response.hint)
                intended = torch.isin(keys, request.intent)
                entries = store.find(keys)
                exists = entries >= 0
                store.signalled[entries[intended & exists]] = False
                store.signalled[entries[~intended & exists]] = True
                self.holdings.track(entries[~intended & exists])
            if response.relocate.numel():
                keys = response.relocate
                entries = self.holdings.entries(keys)
                value = response.relocate_value.clone()
                was_replica = (store.kind.index_select(0, entries) == REPLICA).nonzero().squeeze(1)
                if was_replica.numel():  # keep the replica's updates not yet sent
                    chosen = entries.index_select(0, was_replica)
                    rows = store.sync.index_select(0, chosen)
                    value[was_replica] += store.data.index_select(0, chosen) - self.syncs.row.index_select(0, rows)
                    self.syncs.release(rows)
                    store.sync.index_fill_(0, chosen, -1)
                store.data.index_copy_(0, entries, value)
                self.holdings.touch(entries)
                store.kind[entries] = OWNER
                store.version.index_copy_(0, entries, response.relocate_version)
                store.interested.index_copy_(0, entries, response.relocate_intent)
                store.holders.index_copy_(0, entries, response.relocate_holders & ~bit(self.index))
                store.hint[entries] = self.index
                moves = response.relocate_moves + 1
                store.moves.index_copy_(0, entries, moves)
                here = self.routing.home(keys) == self.index
                self.routing.record_home(keys[here], torch.full_like(keys[here], self.index), moves[here])
                self.counters.relocations_in += keys.shape[0]
                self._changed(keys, entries)
            if response.replica.numel():
                entries = self.holdings.entries(response.replica)
                absent = store.kind.index_select(0, entries) == ABSENT
                keys, entries, value = response.replica[absent], entries[absent], response.replica_value[absent]
                rows = self.syncs.allocate(keys.shape[0])
                self.syncs.row.index_copy_(0, rows, value)
                store.sync.index_copy_(0, entries, rows)
                store.data.index_copy_(0, entries, value)
                self.holdings.touch(entries)
                store.version.index_copy_(0, entries, response.replica_version[absent])
                store.kind[entries] = REPLICA
                self.holdings.track(entries)
                store.hint[entries] = response.replica_owner[absent].to(torch.int16)
                store.refreshed[entries] = now
                self.counters.replicas_created += keys.shape[0]
            if response.refresh.numel():
                entries = store.find(response.refresh)
                held = self.holdings.kind(entries) == REPLICA
                entries, value = entries[held], response.refresh_value[held]
                rows = store.sync.index_select(0, entries)
                local = store.data.index_select(0, entries) - self.syncs.row.index_select(0, rows)
                store.data.index_copy_(0, entries, value + local)
                self.syncs.row.index_copy_(0, rows, value)
                self.holdings.touch(entries)
                store.version.index_copy_(0, entries, response.refresh_version[held])
                store.refreshed[entries] = now
            if response.current.numel():
                entries = store.find(response.current)
                held = self.holdings.kind(entries) == REPLICA
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
        source, me = request.source, bit(request.source)
        response = Response()
        with self.lock:
            store = self.store
            if request.home.numel():  # (a relocation reported late must not undo a later one: _record_home)
                self.routing.record_home(request.home, request.home_owner, request.home_moves)
            not_mine = []
            for keys, on in ((request.intent, True), (request.expire, False)):
                if not keys.numel():
                    continue
                entries = store.find(keys)
                owned = self.holdings.kind(entries) == OWNER
                mine = entries[owned]
                current = store.interested.index_select(0, mine)
                store.interested.index_copy_(0, mine, current | me if on else current & ~me)
                self._changed(keys[owned], mine)
                if not bool(owned.all()):
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
                if not bool((self.holdings.kind(entries) == OWNER).all()):
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
                response.hint = self.routing.answer_hint(response.not_mine)
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
            self.counters.dense_bytes += nbytes(*response.dense_value)
        self.counters.bytes_sent += response.nbytes()
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
            self.counters.bytes_sent += sub.nbytes()
            answer = forward(node, sub)
            response.absorb(answer)
            left.append(answer.not_mine)
            left_hint.append(answer.hint)
        response.not_mine, response.hint = torch.cat(left), torch.cat(left_hint)

    def _merge(self, keys: Tensor, delta: Tensor, source: int, what: str) -> Tensor:
        """Add replica deltas to the main copies; their entries."""
        entries = self.store.find(keys)
        if not bool((self.holdings.kind(entries) == OWNER).all()):
            raise ProtocolError(f"node {self.index}: a {what} from node {source} for keys it does not own")
        changed = delta.ne(0).any(dim=1)
        self.store.data.index_add_(0, entries, delta)
        self.store.version.index_add_(0, entries, changed.long())
        if bool(changed.any()):
            self.holdings.touch(entries[changed])
        return entries

    def _changed(self, keys: Tensor, entries: Tensor) -> None:
        """The intent set of owned ``keys`` changed: decide for every other node with intent when it
        next asks (``_deliver``)."""
        if self.technique in ("static", "full") or not keys.numel():
            return
        intent = self.store.interested.index_select(0, entries)
        masks = intent.unique().tolist()  # (a few distinct node sets: a key's filter only where they differ)
        present = 0
        for mask in masks:
            present |= mask
        for node in range(self.nodes):
            if node == self.index or not present >> node & 1:
                continue
            chosen = keys if len(masks) == 1 else keys[(intent >> node & 1).bool()]
            self.outbox[node].append(chosen)

    def _deliver(self, node: int, response: Response, only: Tensor | None = None) -> None:
        """The decisions for ``node`` on the keys it has (or had) intent for (``only``: of these
        keys): relocate, replicate, or nothing, by the technique (under the lock)."""
        box = self.outbox[node]
        if not box:
            return
        keys = torch.unique(torch.cat(box))  # (sorted)
        box.clear()
        if only is not None:
            chosen = torch.isin(keys, only)
            if not bool(chosen.all()):
                box.append(keys[~chosen])
            keys = keys[chosen]
            if not keys.numel():
                return
        store = self.store
        entries = store.find(keys)
        owned = self.holdings.kind(entries) == OWNER
        keys, entries = keys[owned], entries[owned]
        intent, holders = store.interested.index_select(0, entries), store.holders.index_select(0, entries)
        wants = (intent >> node & 1).bool()
        keys, entries, intent, holders = keys[wants], entries[wants], intent[wants], holders[wants]
        me, them = bit(self.index), bit(node)
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
            home = self.routing.home(moving)
            here = home == self.index
            self.routing.record_home(moving[here], torch.full_like(moving[here], node), moves[here])
            away = ~here & (home != node)
            homes, reported, counts = home[away], moving[away], moves[away]
            for target in homes.unique().tolist():  # (a few nodes, not keys)
                chosen = homes == target
                self.home_updates[target].append((reported[chosen], torch.full_like(reported[chosen], node),
                                                  counts[chosen]))
            self.holdings.release_dead(leaving)  # (gone: unless this node's own workers still intend to use it)
        copies, copied = keys[replicate], entries[replicate]
        if copies.numel():
            response.replica = copies
            response.replica_value = store.data.index_select(0, copied)
            response.replica_version = store.version.index_select(0, copied)
            response.replica_owner = torch.full_like(copies, self.index)
            current = store.holders.index_select(0, copied)
            store.holders.index_copy_(0, copied, current | them)

    def quiet(self) -> bool:
        """Nothing left to manage: no key live (no intent signalled or acted, no replica but full
        replication's), nothing pending or waiting to be delivered."""
        with self.lock:
            return not (self.holdings.anything_live() or any(self.outbox) or any(self.home_updates) or any(self.pending))


def latest(keys: Tensor, owners: Tensor, moves: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Relocation reports with one per key: the one of the most relocations (the newest)."""
    order = torch.argsort(moves, descending=True, stable=True)
    keys, first = unique_first(keys.index_select(0, order))
    chosen = order.index_select(0, first)
    return keys, owners.index_select(0, chosen), moves.index_select(0, chosen)
