"""A strategy added in one file, as docs/ARCHITECTURE.md ("Adding a strategy") describes.

``reverse-sync`` trains each epoch's batches one at a time, every ``reverse.every``-th epoch last
plan first (0: never, which is sync's computation): a pipeline schedule (``run_epoch`` over the
stages) wrapped in the pipelined family's registry entry, with a config section of its own
(``reverse``: its setting, its default, its check). Registering it is the only step: ``cadence
train --strategy reverse-sync`` (or ``Config.strategy``) then runs it on every task, with
checkpoints, ``--resume``, ``--record-order``, ``compare`` and the summary, and the contract tests
hold it to the settings it declares; nothing in cadence's packages learns its name. Its sequential
twin is ``sync`` replaying its recorded order, or ``sync`` itself with ``reverse.every: 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cadence.core.strategy import Contract
from cadence.settings import SECTIONS, section, setting
from cadence.strategies.catalog import STRATEGIES
from cadence.strategies.pipelined.base import Schedule
from cadence.strategies.pipelined.strategy import PipelineStrategy

NAME = "reverse-sync"
SECTION = "reverse"


@dataclass
class ReverseConfig:
    """``reverse-sync``'s one setting."""

    every: int = setting(1, non_negative=True)  # every N-th epoch (from the first) runs last plan first; 0: never


class ReverseSync(Schedule):
    """One batch end to end at a time, in reverse plan order every ``reverse.every``-th epoch."""

    section = SECTION  # built with its section alone (``settings``: a ``ReverseConfig``)
    reads = (SECTION,)
    contract = Contract((f"{SECTION}.every=1",), (f"{SECTION}.every=0",))

    def __init__(self, settings: ReverseConfig):
        super().__init__(settings)
        self.next_timestamp = 0

    def run_epoch(self, plans, stages, on_batch):
        every = self.settings.every
        reverse = bool(plans) and every > 0 and plans[0].epoch % every == 0
        for plan in (reversed(plans) if reverse else plans):
            batch = stages.run(plan)
            batch.timestamp = self.next_timestamp  # the computation order
            self.next_timestamp += 1
            on_batch(batch)


def register() -> None:
    section(SECTION)(ReverseConfig)
    STRATEGIES.register(NAME)(PipelineStrategy(NAME, ReverseSync))


def unregister() -> None:
    STRATEGIES.unregister(NAME)
    SECTIONS.pop(SECTION)
