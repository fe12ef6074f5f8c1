"""The coordinator role: one epoch's data list, the workers' gate and (``ps.dense: workers``) the
dense all-reduce, written once for both engines. On the thread engine it is an object of this
process and the worker threads use its data list, gate and reducer directly; on Ray it lives in an
actor (``ray_engine.CoordinatorActor``) that hands out (position, token) and serves the same verbs to
the worker actors."""

from __future__ import annotations

import collections
from typing import Any, Sequence

from cadence.ps.epoch import ServerSettings, abandon
from cadence.ps.gates import NoGate
from cadence.ps.server import DataList, DenseReducer

GATE_VERBS = (NoGate.wait, NoGate.done, NoGate.leave)


class Coordinator:
    """One epoch at a time: ``begin`` builds the epoch's data list, gate and reducer through the mode's
    hooks; ``stop`` abandons the epoch for every worker; ``release`` lets it go on without a worker
    whose process died."""

    def __init__(self, settings: ServerSettings, mode, shards: list):
        self.settings, self.mode, self.shards = settings, mode, shards
        self.data: DataList | None = None
        self.reducer: DenseReducer | None = None
        self.gate: NoGate = NoGate()
        # worker -> (position, token) of the batches it may hold: with prefetching, the last two taken
        self.held: dict[int, collections.deque] = {}

    def begin(self, batches: Sequence, first_token: int, dead: list[int], live: list[int]) -> None:
        """The epoch over ``batches`` (plans, or on Ray their positions), the ``dead`` workers left out."""
        self.data, self.gate = self.mode.epoch_data(self.settings, batches, first_token, self.shards, dead)
        self.reducer = self.mode.reducer(self.settings, live)
        self.held = {}

    def remote_gate(self) -> tuple[str, ...] | None:
        """The gate verbs a worker in another process calls here: None where each worker builds the
        gate on its own handles of the shards (a gate that keeps no state of its own)."""
        if self.gate.stateless:
            return None
        return tuple(verb.__name__ for verb in GATE_VERBS if getattr(type(self.gate), verb.__name__) is not verb)

    def take(self, worker: int) -> tuple[int, int] | None:
        """The next (position, token) for ``worker``, remembered until it takes two more."""
        item = self.data.take(worker)
        if item is None:
            return None
        self.held.setdefault(worker, collections.deque(maxlen=2)).append((item[0], item[2]))
        return item[0], item[2]

    def abandon(self, worker: int) -> None:
        """``worker`` takes no more batches (it left: killed by fault injection)."""
        self.held.pop(worker, None)
        self.data.abandon(worker)

    def wait(self, worker: int, token: int) -> int | None:
        return self.gate.wait(worker, token)

    def done(self, worker: int) -> None:
        self.gate.done(worker)

    def leave(self, worker: int) -> None:
        self.gate.leave(worker)

    def allreduce(self, worker: int, gradients: Any) -> Any:
        return self.reducer.allreduce(worker, gradients)

    def leave_reducer(self, worker: int) -> None:
        self.reducer.leave(worker)

    def release(self, worker: int) -> None:
        """The worker's process died: the tokens of the batches it held are dropped (a shard ignores
        the drop of a batch that did arrive) and the epoch goes on without it."""
        for taker in self.mode.takers(self.settings, worker):  # (a ShadowSync trainer: its threads)
            for position, token in self.held.pop(taker, ()):
                for shard in self.shards:
                    shard.drop(token, position)
            self.data.abandon(taker)
        self.gate.leave(worker)
        if self.reducer is not None:
            self.reducer.leave(worker)
        self.settle()

    def stop(self, reason: str) -> None:
        """A worker failed (or Ctrl-C): hand out no more batches and release everyone waiting."""
        if self.data is not None:
            abandon(self.data, reason)
        if self.reducer is not None:
            self.reducer.abort(reason)

    def settle(self) -> None:
        """Wait until the one-way verbs sent to the shards so far are applied."""
        for shard in self.shards:
            shard.settle()
