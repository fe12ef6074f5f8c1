"""Where a key is (seed 001, SPEC section 2): a node's routing of keys it does not hold to their owners.

A key's home node (``key % nodes``) always knows its owner: a record for each home key that left
(``records``: owner and the relocations it is current as of, the newest wins). Every node caches the
last known owner of keys it neither holds nor has an entry for (``away``, at most ``away_limit`` keys:
cleared when full, the home records answer meanwhile); a key with an entry keeps its hint in the
entry (the store's ``hint`` column). A message that reaches a former owner is answered with a hint
(``answer_hint``) and retried there. Every method works on arrays of keys; the caller holds the
node's lock.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cadence.pm.entries import Column, Entries
from cadence.pm.messages import ABSENT, kinds, unique_first


class Routing:
    def __init__(self, index: int, nodes: int, store: Entries, away_limit: int):
        """``store``: the node's entries (their ``hint`` column is this routing's for keys with an entry)."""
        self.index, self.nodes, self.store = index, nodes, store
        self.records = Entries({"owner": Column((), torch.int16, index), "moves": Column((), torch.int64, 0)})
        self.away = Entries({"owner": Column((), torch.int16, None)})
        self.away_limit = away_limit

    def home(self, keys: Tensor) -> Tensor:
        return keys.remainder(self.nodes)

    def take_cached(self, keys: Tensor) -> Tensor:
        """The last known owners of keys about to get an entry (distinct, none with one yet): the
        cache's, their records leaving it (the entry's hint holds it from now on), else their homes."""
        hints = self.home(keys)
        if len(self.away):
            away = self.away.find(keys)
            known = (away >= 0).nonzero().squeeze(1)
            hints[known] = self.away.owner.index_select(0, away[known]).long()
            self.away.remove(away[known])
        return hints

    def cached(self, keys: Tensor, entries: Tensor | None = None) -> Tensor:
        """The last known owner of each key: its entry's, the cache's, or its home (``entries``: the
        keys' entries, where the caller looked them up already)."""
        hints = self.home(keys)
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

    def remember(self, keys: Tensor, owners: Tensor, distinct: bool = False) -> None:
        """Cache the owners of keys without an entry here (a key at its home needs no record);
        ``distinct``: no key twice in ``keys`` (else the first owner named counts)."""
        if not keys.numel():
            return
        if not distinct:
            keys, first = unique_first(keys)
            owners = owners.index_select(0, first)
        at_home = owners == self.home(keys)
        found = self.away.find(keys)
        self.away.remove(found[at_home & (found >= 0)])
        keep = ~at_home
        if bool(keep.any()):
            if len(self.away) + int(keep.sum()) > self.away_limit:
                self.away.clear()
            entries = self.away.find_or_add(keys[keep])
            self.away.owner.index_copy_(0, entries, owners[keep].to(torch.int16))

    def learn(self, keys: Tensor, hints: Tensor) -> None:
        """Cache where keys not held here are (a key held here keeps its own record)."""
        entries = self.store.find(keys)
        absent = (entries >= 0) & (kinds(self.store, entries) == ABSENT)
        self.store.hint[entries[absent]] = hints[absent].to(torch.int16)
        none = entries < 0
        self.remember(keys[none], hints[none])

    def route(self, keys: Tensor, entries: Tensor | None = None) -> Tensor:
        """Where to send a message about keys not held here: the cached owner, unless the cache
        names this node (a stale answer): then the home node's record, or the home node."""
        if not keys.numel():
            return torch.empty(0, dtype=torch.int64)
        hints = self.cached(keys, entries)
        stale = hints == self.index
        if bool(stale.any()):
            hints[stale] = self.answer_hint(keys[stale])
        return hints

    def record_home(self, keys: Tensor, owners: Tensor, moves: Tensor) -> None:
        """The home node's record of where its keys are, as of ``moves`` relocations (the newest wins)."""
        if not keys.numel():
            return
        records = self.records.find_or_add(keys)
        newer = moves > self.records.moves.index_select(0, records)
        self.records.owner[records[newer]] = owners[newer].to(torch.int16)
        self.records.moves[records[newer]] = moves[newer]

    def home_record(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """(owner, relocations) of keys homed here, by the home record."""
        found = self.records.find(keys)
        known = found >= 0
        owners = torch.full(keys.shape, self.index, dtype=torch.int64)
        moves = torch.zeros(keys.shape, dtype=torch.int64)
        owners[known] = self.records.owner.index_select(0, found[known]).long()
        moves[known] = self.records.moves.index_select(0, found[known])
        return owners, moves

    def answer_hint(self, keys: Tensor) -> Tensor:
        """Where to look for keys not owned here: the home node's record if this is the home; else
        this node's cache (a former owner knows where it sent the key: fresher than a home record
        whose update is still on its way), unless the cache names this node: then the home node.
        A key homed here that never left has a record or is held here: any other is no key."""
        if not keys.numel():
            return torch.empty(0, dtype=torch.int64)
        home = self.home(keys)
        cached = self.cached(keys)
        hints = torch.where(cached == self.index, home, cached)
        mine = (home == self.index).nonzero().squeeze(1)
        if mine.numel():
            records = self.records.find(keys.index_select(0, mine))
            if bool((records < 0).any()):
                raise KeyError(f"node {self.index}: a key outside the task's key space "
                               f"({int(keys.index_select(0, mine)[records < 0][0])})")
            hints[mine] = self.records.owner.index_select(0, records).long()
        return hints

    def nbytes(self) -> int:
        return self.records.nbytes() + self.away.nbytes()
