"""AdaPM's messages between nodes (seed 001, SPEC section 2): each round a node sends every other
node one grouped ``Request`` and gets one ``Response``; both name keys, and carry values, versions
and node sets as arrays (one tensor a field). And what every part of a node shares: what an entry
holds (``ABSENT``, ``OWNER``: the main copy, ``REPLICA``), node sets as bitmasks, the errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

ABSENT, OWNER, REPLICA = 0, 1, 2


def nbytes(*tensors: Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


_NO_KEYS = torch.empty(0, dtype=torch.int64)


def empty(width: int = 0) -> Tensor:
    """No keys (one shared tensor: a message's empty fields are never written in place), or no rows."""
    return torch.empty((0, width), dtype=torch.float32) if width else _NO_KEYS


@dataclass
class Request:
    """One grouped message from node ``source`` to one destination in a round."""

    source: int
    intent: Tensor = field(default_factory=empty)  # keys: the source's intent became active
    expire: Tensor = field(default_factory=empty)  # keys: its intent expired (no replica held)
    drop: Tensor = field(default_factory=empty)  # keys of replicas dropped (intent expired) ...
    drop_delta: Tensor | None = None  # ... with their last deltas
    sync: Tensor = field(default_factory=empty)  # keys of replicas held ...
    sync_version: Tensor = field(default_factory=empty)  # ... the versions they hold ...
    sync_changed: Tensor = field(default_factory=empty)  # ... which changed since the last round (bool) ...
    sync_delta: Tensor | None = None  # ... and the deltas of those only (an unchanged replica sends none)
    home: Tensor = field(default_factory=empty)  # keys homed at the destination that moved ...
    home_owner: Tensor = field(default_factory=empty)  # ... their new owners ...
    home_moves: Tensor = field(default_factory=empty)  # ... as of this many relocations (the latest wins)
    dense_delta: Tensor | None = None  # the source's dense replicas' deltas (to node 0)
    dense_version: Tensor | None = None

    def nbytes(self) -> int:
        return nbytes(self.intent, self.expire, self.drop, self.drop_delta, self.sync, self.sync_delta,
                      self.sync_version, self.sync_changed, self.home, self.home_owner, self.home_moves, self.dense_delta, self.dense_version)


@dataclass
class Response:
    relocate: Tensor = field(default_factory=empty)  # keys whose main copy moves to the requester ...
    relocate_value: Tensor | None = None
    relocate_version: Tensor = field(default_factory=empty)
    relocate_intent: Tensor = field(default_factory=empty)  # ... with the nodes with intent
    relocate_holders: Tensor = field(default_factory=empty)  # ... and replica holders
    relocate_moves: Tensor = field(default_factory=empty)
    replica: Tensor = field(default_factory=empty)  # new replicas for the requester
    replica_value: Tensor | None = None
    replica_version: Tensor = field(default_factory=empty)
    replica_owner: Tensor = field(default_factory=empty)  # (an answer may come through a forwarder)
    refresh: Tensor = field(default_factory=empty)  # replicas that were behind: full values
    refresh_value: Tensor | None = None
    refresh_version: Tensor = field(default_factory=empty)
    current: Tensor = field(default_factory=empty)  # replicas that were not behind: versions only
    current_version: Tensor = field(default_factory=empty)
    not_mine: Tensor = field(default_factory=empty)  # intents sent to a non-owner ...
    hint: Tensor = field(default_factory=empty)  # ... and where to send them
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


def bit(node: int) -> int:
    return 1 << node


def by_destination(targets: Tensor, nodes: int) -> list[Tensor]:
    """The positions in ``targets`` (a node each) of each node 0..nodes-1, ascending: one stable sort
    for every destination, not a mask a destination."""
    if not targets.numel():
        return [_NO_KEYS] * nodes
    order = torch.argsort(targets, stable=True)
    return list(order.split(torch.bincount(targets.long(), minlength=nodes).tolist()))


def unique_first(keys: Tensor) -> tuple[Tensor, Tensor]:
    """(unique keys, the position of each one's first occurrence in ``keys``)."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((unique.shape[0],), keys.shape[0], dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(keys.shape[0]), reduce="amin")
    return unique, first


def kinds(store, entries: Tensor) -> Tensor:
    """What each of a node's ``entries`` holds (its store's ``kind`` column; ABSENT for -1: no entry)."""
    found = entries >= 0
    if bool(found.all()):
        return store.kind.index_select(0, entries)
    kind = store.kind.index_select(0, entries.clamp(min=0))
    return torch.where(found, kind, torch.tensor(ABSENT, dtype=torch.int8))


@dataclass
class Counters:
    """A node's counters (the run's AdaPM fields in summary.json come from them)."""

    accesses: int = 0
    remote_accesses: int = 0
    remote_reads: int = 0  # (of which reads: a key not here when its batch was pulled)
    bytes_sent: int = 0
    relocations_in: int = 0
    replicas_created: int = 0
    staleness_total: float = 0.0
    staleness_count: int = 0
    rounds: int = 0
    dense_bytes: int = 0  # (of bytes_sent: the dense replicas' deltas and the main copy's values)
    # the keys of remote reads by why they were not here (``Node._count_misses``)
    misses_not_acted: int = 0
    misses_unsent: int = 0
    misses_in_flight: int = 0

    NAMES = ("accesses", "remote_accesses", "remote_reads", "bytes_sent", "relocations_in", "replicas_created",
             "staleness_total", "staleness_count", "rounds", "dense_bytes", "misses_not_acted", "misses_unsent",
             "misses_in_flight")
