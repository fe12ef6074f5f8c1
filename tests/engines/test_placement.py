"""Roles and where they run (``cadence.engines.placement``): a verb is named by the role's method,
never a string; ``start`` runs concurrently with the caller (tested in time); ``as_completed``
yields in finishing order; the parameter server's shard takes its verbs the same way."""

from __future__ import annotations

import time

import pytest

from cadence.engines import PLACEMENTS
from cadence.engines.placement import InProcess, verb_of
from cadence.errors import ConfigError


class Clock:
    """A role that holds its verb for a while and says when it ran (a sleep: a unit-test device)."""

    def __init__(self, name: str):
        self.name = name
        self.peers: list = []

    def hold(self, seconds: float) -> tuple[str, float, float]:
        started = time.perf_counter()
        time.sleep(seconds)
        return self.name, started, time.perf_counter()

    def meet(self, handles: list) -> None:
        self.peers = handles

    def ask(self, peer: int) -> str:
        """A role calls a peer's verb through its handle, as AdaPM's nodes do."""
        return self.peers[peer].call(Clock.name_of)

    def name_of(self) -> str:
        return self.name

    def _private(self) -> None:
        pass


def test_a_verb_is_the_roles_method_never_a_string() -> None:
    assert verb_of(Clock, Clock.hold) == "hold"
    for wrong in ("hold", Clock._private, InProcess.place, len):
        with pytest.raises(TypeError, match="is not a verb of Clock"):
            verb_of(Clock, wrong)
    handle = InProcess().place(Clock, 0, "a")
    with pytest.raises(TypeError):
        handle.call("hold", 0.0)


def test_started_verbs_overlap_in_time_and_finish_in_their_own_order() -> None:
    placement = InProcess()
    slow, fast = placement.place(Clock, 0, "slow"), placement.place(Clock, 1, "fast")
    before = time.perf_counter()
    pendings = [slow.start(Clock.hold, 0.4), fast.start(Clock.hold, 0.1)]
    assert time.perf_counter() - before < 0.1  # start returns at once
    order = [pending.result() for pending in placement.as_completed(pendings)]
    assert [name for name, _, _ in order] == ["fast", "slow"]
    (_, fast_start, fast_end), (_, slow_start, slow_end) = order
    assert fast_start < slow_end and slow_start < fast_end  # the two ran at the same time


def test_each_calls_every_role_and_roles_call_their_peers() -> None:
    placement = InProcess()
    handles = [placement.place(Clock, index, f"node{index}") for index in range(3)]
    placement.each(handles, Clock.meet, handles)
    assert [handles[0].call(Clock.ask, peer) for peer in range(3)] == ["node0", "node1", "node2"]
    assert placement.share(handles) is handles  # in this process a role gets the object itself


def test_an_error_in_a_started_verb_is_raised_by_its_result() -> None:
    placement = InProcess()
    handle = placement.place(Clock, 0, "a")
    pending = handle.start(Clock.hold, -1.0)  # time.sleep refuses a negative time
    with pytest.raises(ValueError):
        next(iter(placement.as_completed([pending]))).result()


def test_the_engine_names_the_placement() -> None:
    assert isinstance(PLACEMENTS.get("threads")(None, 1), InProcess)
    with pytest.raises(ConfigError, match="ps.engine"):
        PLACEMENTS.get("carrier-pigeon")


def test_a_shard_takes_its_verbs_as_methods_not_strings() -> None:
    from cadence.ps.server import ServerShard

    shard = ServerShard.__new__(ServerShard)  # (no table needed: the verb is refused before any call)
    with pytest.raises(TypeError, match="is not a verb of ServerShard"):
        shard.submit("save_part", "/nowhere")
    with pytest.raises(TypeError, match="is not a verb of ServerShard"):
        shard.submit(Clock.hold, 0.0)
