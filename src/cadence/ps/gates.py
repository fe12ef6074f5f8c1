"""Worker-side gates: what a worker waits for before it pulls parameters for its next batch.

- ``NoGate``: never waits (async, bsp, gba, hop_bw).
- ``StepBarrier``: the batch's pull waits until the server has applied every step before the batch's
  token (``pull_after``: the shards wait, then read, in the pull's one round trip), so the batch is
  computed on exactly the parameters of its global step (sync: staleness 0).
- ``BoundedStaleness``: a worker may be at most ``bound`` batches ahead of the slowest live worker
  (Hop-BS / SSP). Workers that died or ran out of data stop counting as the slowest.
"""

from __future__ import annotations

import threading

from cadence.ps.server import ServerShard


class NoGate:
    # a gate that keeps no state of its own (it reads only the shards) can be built by each worker
    # on its own handles of the shards; one that does (clocks) lives in one place (Ray: the coordinator)
    stateless = True

    def wait(self, worker: int, token: int) -> int | None:
        """Block until ``worker`` may take its next batch (``token``'s); the slowest live worker's
        clock then (a lower bound of it from then on: clocks only grow), where the gate keeps clocks."""

    def admits(self, clock: int, floor: int | None) -> bool:
        """Whether a worker that has finished ``clock`` batches may go on without asking, knowing the
        slowest clock was at least ``floor`` (a worker in another process skips the round trip)."""
        return False

    def pull_after(self, token: int) -> int | None:
        """The global steps the shards must have applied before the pull of a batch of ``token``
        reads (``ServerShard.pull_rows``'s ``after``); None: read at once."""
        return None

    def done(self, worker: int) -> None: ...

    def leave(self, worker: int) -> None: ...


class StepBarrier(NoGate):
    def __init__(self, shards: list[ServerShard]):
        self.shards = shards  # every shard: rows and dense parameters must all belong to the step

    def pull_after(self, token):
        return token  # (each shard waits in the pull: every shard's part is pulled, empty or not)


class BoundedStaleness(NoGate):
    stateless = False

    def __init__(self, workers: int, bound: int):
        self.bound = bound
        self.clocks = {w: 0 for w in range(workers)}  # batches pushed, per live worker
        self.changed = threading.Condition()

    def wait(self, worker, token):
        with self.changed:
            self.changed.wait_for(lambda: self.clocks[worker] - min(self.clocks.values()) <= self.bound)
            return min(self.clocks.values())

    def admits(self, clock, floor):
        return floor is not None and clock - floor <= self.bound

    def done(self, worker):
        with self.changed:
            self.clocks[worker] += 1
            self.changed.notify_all()

    def leave(self, worker):
        with self.changed:
            self.clocks.pop(worker, None)
            if not self.clocks:
                self.clocks[-1] = 1 << 62  # nobody left to wait for
            self.changed.notify_all()
