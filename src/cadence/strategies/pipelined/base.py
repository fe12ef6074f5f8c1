"""The pipeline's schedule interface.

A schedule decides how the batches of an epoch pass through the pipeline's stages
(``cadence.pipeline``): one at a time (sync), many in flight (async, OAC), or a forward thread
handing each batch to backward threads (pdASGD). It never changes the math of a stage, so every
schedule can be checked against the synchronous run of the same batches. The trainer calls ``run_epoch`` once per
epoch and ``on_batch`` once per finished batch (for progress, counters and the computation order).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar

from cadence.core.batch import Batch, BatchPlan
from cadence.core.strategy import Contract
from cadence.pipeline.stages import Stages
from cadence.registry import Registry

SCHEDULES: Registry[type["Schedule"]] = Registry("pipeline schedule", "strategy")


class Schedule(ABC):
    """``section``: the name of the one config section the schedule reads (None: none); it is built
    with that section alone (``settings``), never the root config."""

    section: ClassVar[str | None] = None
    reads: ClassVar[tuple[str, ...]] = ()  # the keys of its section it reads (all of them: the section)
    # whether the pipeline's compute stage may re-choose its intra-op threads (``adapt_threads``);
    # false where the schedule pins its threads' counts itself (pdASGD)
    governed: ClassVar[bool] = True
    # whether it may run a task that updates its rows in place (``Task.updates_in_place``): true where
    # the compute stage takes one batch at a time, in order (nothing else reads or writes rows then)
    in_place: ClassVar[bool] = False
    # its contract tests' settings and whether it keeps sync's model (``Strategy.contract``, ``keeps_sync_model``)
    contract: ClassVar[Contract] = Contract()
    keeps_sync_model: ClassVar[bool] = False

    def __init__(self, settings: Any = None):
        self.settings = settings

    @abstractmethod
    def run_epoch(self, plans: list[BatchPlan], stages: Stages, on_batch: Callable[[Batch], None]) -> None:
        """Train on every plan once, calling ``on_batch`` as each batch finishes writing."""

    def stats(self) -> dict[str, int]:
        """Counters this strategy reports in summary.json (stale reads, repaired rows, ...)."""
        return {}

    def close(self) -> None:
        """Release threads or remote resources."""
