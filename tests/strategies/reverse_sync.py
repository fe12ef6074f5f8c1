"""A strategy added in one file, as docs/ARCHITECTURE.md ("Adding a strategy") describes.

``reverse-sync`` trains each epoch's batches one at a time, last plan first: a pipeline schedule
(``run_epoch`` over the stages) wrapped in the pipelined family's registry entry. Registering it is
the only step: ``cadence train --strategy reverse-sync`` (or ``Config.strategy``) then runs it on
every task, with checkpoints, ``--resume``, ``--record-order``, ``compare`` and the summary; nothing
in cadence's packages learns its name. Its sequential twin is ``sync`` replaying its recorded order.
"""

from __future__ import annotations

from cadence.strategies import STRATEGIES
from cadence.strategies.pipelined import PipelineStrategy
from cadence.strategies.pipelined.base import Schedule

NAME = "reverse-sync"


class ReverseSync(Schedule):
    """One batch end to end at a time, in reverse plan order."""

    def __init__(self, settings=None):  # (it reads no config section: ``Schedule.section`` None)
        super().__init__(settings)
        self.next_timestamp = 0

    def run_epoch(self, plans, stages, on_batch):
        for plan in reversed(plans):
            batch = stages.run(plan)
            batch.timestamp = self.next_timestamp  # the computation order: reversed plan order
            self.next_timestamp += 1
            on_batch(batch)


def register() -> None:
    STRATEGIES.register(NAME)(PipelineStrategy(NAME, ReverseSync))


def unregister() -> None:
    STRATEGIES.unregister(NAME)
