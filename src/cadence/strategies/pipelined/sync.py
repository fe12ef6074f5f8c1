"""Synchronous training: each batch runs through every stage before the next starts.

The reference every asynchronous strategy is tested against (its "sequential twin").
"""

from __future__ import annotations

from cadence.core.strategy import Contract
from cadence.strategies.pipelined.base import SCHEDULES, Schedule


@SCHEDULES.register("sync")
class SyncStrategy(Schedule):
    in_place = True
    contract = Contract((), ())  # (itself)
    keeps_sync_model = True

    def __init__(self, settings=None):
        super().__init__(settings)
        self.next_timestamp = 0

    def run_epoch(self, plans, stages, on_batch):
        for plan in plans:
            batch = stages.run(plan)
            batch.timestamp = self.next_timestamp  # the computation order is the plan order
            self.next_timestamp += 1
            on_batch(batch)
