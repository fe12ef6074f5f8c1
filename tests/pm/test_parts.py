"""The parts of an AdaPM node, each on its own (tests/strategies/adapm/test_adapm.py tests them together):
``Routing`` (home records, the location cache, hints) against a dictionary doing the same by hand,
``Holdings`` (entries made, freed, written) against what they must leave behind, and ``Management``'s
owner-side decision against the paper's rule, with no ``Node`` around them."""

from __future__ import annotations

import threading

import pytest
import torch

from cadence.pm.holdings import Holdings, KeySpace
from cadence.pm.management import Management
from cadence.pm.messages import ABSENT, OWNER, REPLICA, Counters, Request, bit

KEYS, WIDTH = 24, 3


def holdings(index: int = 0, nodes: int = 3, workers: int = 1, full: bool = False) -> Holdings:
    space = KeySpace.table(torch.arange(KEYS), (torch.arange(KEYS).float() * 10).unsqueeze(1).repeat(1, WIDTH))
    return Holdings(index, nodes, space, workers, full)


def keys(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# ---- Routing -------------------------------------------------------------------------------------
def test_a_home_record_keeps_the_owner_of_the_most_relocations() -> None:
    routing = holdings(index=0).routing
    reference: dict[int, tuple[int, int]] = {}
    reports = [(3, 1, 2), (3, 2, 1), (6, 2, 5), (6, 1, 4), (9, 1, 1)]  # (key, owner, moves), out of order
    for key, owner, moves in reports:
        routing.record_home(keys(key), keys(owner), keys(moves))
        if moves > reference.get(key, (0, 0))[1]:
            reference[key] = (owner, moves)
    owners, moves = routing.home_record(keys(3, 6, 9, 12))
    assert owners.tolist() == [reference[3][0], reference[6][0], reference[9][0], 0]  # (12 never left home)
    assert moves.tolist() == [reference[3][1], reference[6][1], reference[9][1], 0]


def test_the_cache_keeps_only_keys_away_from_home_and_empties_when_full() -> None:
    routing = holdings(index=0).routing
    routing.away_limit = 4
    routing.remember(keys(1, 2, 4), keys(1, 0, 2))  # key 1 at its home (1 % 3): no record
    assert routing.cached(keys(1, 2, 4)).tolist() == [1, 0, 2] and len(routing.away) == 2
    routing.remember(keys(5, 7, 8), keys(0, 0, 1))  # 2 + 3 > 4: cleared first, then these three
    assert len(routing.away) == 3
    assert routing.cached(keys(2, 4, 5, 7, 8)).tolist() == [2 % 3, 4 % 3, 0, 0, 1]


def test_a_key_taken_into_an_entry_leaves_the_cache_with_its_owner() -> None:
    routing = holdings(index=0).routing
    routing.remember(keys(4, 5), keys(2, 0))
    assert routing.take_cached(keys(4, 5, 7)).tolist() == [2, 0, 7 % 3]
    assert len(routing.away) == 0


def test_a_hint_is_the_home_record_at_the_home_and_the_cache_elsewhere() -> None:
    home, other = holdings(index=0), holdings(index=1)
    home.routing.record_home(keys(3), keys(2), keys(1))  # key 3 (home 0) moved to node 2
    assert home.routing.answer_hint(keys(3)).tolist() == [2]
    other.routing.remember(keys(3), keys(1))  # a stale cache names this node itself: ask the home
    assert other.routing.answer_hint(keys(3)).tolist() == [0]
    with pytest.raises(KeyError, match="outside the task's key space"):
        home.routing.answer_hint(keys(30))  # homed at 0, never recorded, not held


# ---- Holdings ------------------------------------------------------------------------------------
def test_a_node_starts_with_its_home_share_as_main_copies() -> None:
    held = holdings(index=1)
    assert held.held(OWNER).tolist() == [k for k in range(KEYS) if k % 3 == 1]
    assert held.held(REPLICA).numel() == 0
    full = holdings(index=1, full=True)  # full replication: every other key a replica from the start
    assert full.held(REPLICA).tolist() == [k for k in range(KEYS) if k % 3 != 1] and len(full.syncs) == 16


def test_an_entry_made_for_an_intent_holds_nothing_and_knows_what_the_cache_knew() -> None:
    held = holdings(index=0)
    held.routing.remember(keys(4), keys(2))
    entries = held.entries(keys(4, 5, 4))
    assert entries[0] == entries[2] and held.kind(entries).tolist() == [ABSENT] * 3
    assert held.store.hint.index_select(0, entries).tolist() == [2, 5 % 3, 2]
    assert len(held.routing.away) == 0 and held.peak_entries == len(held.store) == 8 + 2


def test_a_freed_entry_leaves_the_live_set_and_its_owner_in_the_cache() -> None:
    held = holdings(index=0)
    entries = held.entries(keys(4, 5))
    held.store.hint[entries] = torch.tensor([2, 2], dtype=torch.int16)  # 5's owner is its home (2): no record
    held.track(entries)
    held.track(entries.flip(0))
    assert held.live.tolist() == sorted(entries.tolist())
    held.free(entries)
    assert held.live.numel() == 0 and held.store.find(keys(4, 5)).tolist() == [-1, -1]
    assert held.routing.cached(keys(4, 5)).tolist() == [2, 2] and len(held.routing.away) == 1


def test_a_write_changes_the_values_and_the_main_copies_versions_only() -> None:
    held = holdings(index=0)
    owned = held.store.find(keys(0, 3))
    made = held.entries(keys(4))  # (an entry holding nothing)
    entries = torch.cat([owned, made])
    before = held.store.data.index_select(0, entries).clone()
    block = torch.ones(3, WIDTH)
    held.write(entries, block, add=True)
    # (the made entry's row is whatever its reserved memory held, NaN included: compared as such)
    torch.testing.assert_close(held.store.data.index_select(0, entries), before + 1, rtol=0, atol=0, equal_nan=True)
    held.write(entries, block * 7, add=False)
    assert torch.equal(held.store.data.index_select(0, entries), block * 7)
    assert held.store.version.index_select(0, entries).tolist() == [2, 2, 0]
    assert held.store.stamp.index_select(0, entries).tolist() == [held.tick] * 3 and held.tick == 2


def test_a_key_with_an_intent_ending_after_a_workers_clock_is_active() -> None:
    held = holdings(index=0, workers=2)
    entries = held.entries(keys(4, 5, 7))
    held.store.active_end[entries] = torch.tensor([[3, 0], [0, 0], [0, 6]])
    held.clocks = [2, 6]
    assert held.active(entries).tolist() == [True, False, False]


# ---- Management ----------------------------------------------------------------------------------
def management(index: int, technique: str = "adaptive") -> Management:
    return Management(holdings(index=index), technique, 1, Counters(), threading.RLock())


@pytest.mark.parametrize("technique", ["adaptive", "replication", "relocation"])
def test_the_owner_relocates_to_the_only_node_with_intent_and_replicates_to_several(technique: str) -> None:
    """The paper's rule (and its two ablations), decided on the owner alone: node 1 signals intent for
    key 3, which no one else wants, and for key 6, which the owner's own worker wants too."""
    owner = management(0, technique)
    six = owner.store.find(keys(6))
    owner.store.interested[six] = bit(0)
    answer = owner.handle(Request(1, intent=keys(3, 6)))
    expected = {  # technique -> (relocated to node 1, replicated on node 1)
        "adaptive": ([3], [6]),  # one node wants 3: it moves; two want 6: a replica
        "replication": ([], [3, 6]),  # (no relocation: a replica for every other node with intent)
        "relocation": ([3], []),  # (no replica: 6 stays where its owner's worker uses it)
    }[technique]
    assert (answer.relocate.tolist(), answer.replica.tolist()) == expected
    three = owner.store.find(keys(3))
    assert owner.holdings.kind(three).tolist() == ([OWNER] if technique == "replication" else [ABSENT])
    assert owner.store.holders.index_select(0, six).tolist() == ([0] if technique == "relocation" else [bit(1)])
    later = owner.handle(Request(2, intent=keys(3)))  # node 2 asks for 3 afterwards
    if technique == "replication":
        assert later.replica.tolist() == [3]
    else:  # the main copy left: the owner knows where it went, and 2's intent is a non-owner's
        assert later.not_mine.tolist() == [3] and later.hint.tolist() == [1]


def test_a_replica_behind_the_main_copy_gets_its_value_and_one_that_is_not_its_version() -> None:
    owner = management(0, "replication")
    owner.handle(Request(1, intent=keys(3, 6)))
    entries = owner.store.find(keys(3, 6))
    versions = owner.store.version.index_select(0, entries)
    owner.holdings.write(entries[:1], torch.ones(1, WIDTH), add=True)  # key 3 changes on the owner
    answer = owner.handle(Request(1, sync=keys(3, 6), sync_version=versions,
                                  sync_changed=torch.tensor([False, True]), sync_delta=torch.full((1, WIDTH), 2.0)))
    assert answer.refresh.tolist() == [3] and answer.current.tolist() == [6]
    assert torch.equal(answer.refresh_value, owner.store.data.index_select(0, entries[:1]))
    assert torch.equal(owner.store.data.index_select(0, entries[1:]), torch.full((1, WIDTH), 62.0))  # 60 + 2


def test_a_home_hears_of_each_key_once_as_of_its_latest_relocation() -> None:
    """Relocations of the same key queued for its home between two rounds travel as one report,
    the one of the most relocations (the dictionary they replaced kept the last written)."""
    mover = management(1)
    mover.home_updates[0].extend([(keys(3, 6), keys(1, 1), keys(1, 4)), (keys(3,), keys(2,), keys(2,))])
    request = mover.requests()[0]
    assert (request.home.tolist(), request.home_owner.tolist(), request.home_moves.tolist()) == ([3, 6], [2, 1], [2, 4])
    assert mover.home_updates[0] == [] and mover.requests()[0].home.numel() == 0


@pytest.mark.parametrize("concurrent", [True, False])
def test_a_rounds_messages_go_out_at_once_where_the_nodes_run_at_once(concurrent: bool) -> None:
    """``Transport.exchange``: to nodes in other processes (handles that run at once) every request is
    sent before any answer is awaited, so the destinations answer in overlapping time; in one process
    one after another. Each answer lands at its destination's position."""
    import queue
    import time

    from cadence.engines.placement import LocalHandle
    from cadence.strategies.adapm.engine import NodeRunner, Transport

    spans: dict[int, tuple[float, float]] = {}

    class Destination:  # (a node's ``handle`` verb that takes 0.2 s: the time device of this test)
        def __init__(self, index: int):
            self.index = index

        def handle(self, request: Request) -> str:
            start = time.perf_counter()
            time.sleep(0.2)
            spans[self.index] = (start, time.perf_counter())
            return f"answer {self.index} to {request.source}"

    class Handle(LocalHandle):
        pass

    Handle.concurrent = concurrent
    finished: queue.Queue = queue.Queue()
    handles = [Handle(NodeRunner, i, Destination(i), finished) for i in range(3)]
    answers = Transport(handles, None).exchange([None, Request(0), Request(0)])
    assert answers == [None, "answer 1 to 0", "answer 2 to 0"]
    (first_start, first_end), (second_start, second_end) = spans[1], spans[2]
    overlap = min(first_end, second_end) - max(first_start, second_start)
    assert overlap > 0.1 if concurrent else overlap < 0


def test_by_destination_gives_each_node_its_positions_as_a_mask_would() -> None:
    from cadence.pm.messages import by_destination

    generator = torch.Generator().manual_seed(0)
    for size, nodes in ((0, 3), (1, 3), (50, 4), (200, 8)):
        targets = torch.randint(0, nodes, (size,), generator=generator).to(torch.int16)
        split = by_destination(targets, nodes)
        assert len(split) == nodes
        for node in range(nodes):  # the reference: a mask per node
            assert split[node].tolist() == (targets == node).nonzero().squeeze(1).tolist()
