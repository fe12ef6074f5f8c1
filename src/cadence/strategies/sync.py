"""Synchronous training: each batch runs through every stage before the next starts.

The reference every asynchronous strategy is tested against (its "sequential twin").
"""

from __future__ import annotations

from cadence.strategies.base import STRATEGIES, Strategy


@STRATEGIES.register("sync")
class SyncStrategy(Strategy):
    def run_epoch(self, plans, stages, on_batch):
        for plan in plans:
            on_batch(stages.run(plan))
