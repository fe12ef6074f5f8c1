"""A worker in another process reaches the coordinator's bounded-staleness gate over its channel
(``ray_engine.RemoteGate``): it skips the round trip only where the gate's own rule admits the step
from the slowest clock it last heard of, so no worker ever runs past the bound, with fewer calls."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("ray")

from cadence.ps.coordinator import Coordinator  # noqa: E402
from cadence.ps.gates import BoundedStaleness  # noqa: E402
from cadence.ps.ray_engine import RemoteGate  # noqa: E402


class Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class Channel:
    """The coordinator's gate verbs called in this process (what the worker's channel would carry)."""

    def __init__(self, gate: BoundedStaleness):
        self.gate, self.asked = gate, []

    def submit(self, verb, *args):
        self.asked.append(verb.__name__)
        return Done(getattr(self.gate, verb.__name__)(*args))


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_no_worker_passes_the_bound_and_fewer_waits_are_asked(bound: int) -> None:
    shared = BoundedStaleness(2, bound)
    active = (Coordinator.wait.__name__, Coordinator.done.__name__, Coordinator.leave.__name__)
    channels = [Channel(shared) for _ in range(2)]
    gates = [RemoteGate(channel, active, BoundedStaleness(2, bound)) for channel in channels]
    finished = [0, 0]
    ahead = []  # at each step's start: how far the worker is past the other's finished batches
    lock = threading.Lock()

    def work(worker: int, pause: float) -> None:
        for _ in range(12):
            gates[worker].wait(worker, 0)
            with lock:
                ahead.append(finished[worker] - finished[1 - worker] if finished[1 - worker] < 12 else 0)
            time.sleep(pause)
            with lock:
                finished[worker] += 1
            gates[worker].done(worker)
        gates[worker].leave(worker)

    threads = [threading.Thread(target=work, args=(0, 0.0)), threading.Thread(target=work, args=(1, 0.004))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert max(ahead) <= bound  # the fast worker never starts a batch more than the bound ahead
    assert finished == [12, 12]
    waits = channels[0].asked.count("wait") + channels[1].asked.count("wait")
    assert waits < 24 if bound > 0 else waits == 24  # with a bound, steps the rule admits are not asked
