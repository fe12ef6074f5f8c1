"""The pipelined family's entries in the strategy registry (``cadence.strategies.catalog``)."""

from __future__ import annotations

from cadence.config import Config
from cadence.core.runtime import Runtime
from cadence.core.strategy import BuildContext, RuntimeKind, Strategy
from cadence.errors import ConfigError
from cadence.strategies.pipelined import control, pdasgd, sync  # noqa: F401  (register the schedules)
from cadence.strategies.pipelined.base import SCHEDULES, Schedule
from cadence.strategies.pipelined.runtime import PipelineRuntime

PIPELINE = RuntimeKind(
    "pipeline", keys=("record_order", "batch_order", "store", "pipeline"), owns_message="the one-process pipeline",
    runs_on="the one-process pipeline (use --workers N > 1 or a parameter-server strategy)")


class PipelineStrategy(Strategy):
    """A pipeline schedule as a registered strategy: one process, ``ps.workers: 1`` on threads."""

    runtimes = (PIPELINE,)

    def __init__(self, name: str, schedule: type[Schedule]):
        self.name, self.schedule = name, schedule
        self.reads = schedule.reads
        self.contract, self.keeps_sync_model = schedule.contract, schedule.keeps_sync_model
        self.description = (schedule.__doc__ or "").strip().splitlines()[0] if schedule.__doc__ else ""

    def runtime(self, config: Config) -> RuntimeKind:
        ps = config.ps
        if ps.workers != 1 or ps.engine != "threads":
            raise ConfigError(f"strategy {self.name} runs in one process (the pipeline): it needs ps.workers=1 and "
                              f"ps.engine=threads (got ps.workers={ps.workers}, ps.engine={ps.engine}); use "
                              "--workers 1, or a parameter-server strategy (sync, async, bsp, gba, hop_bs, hop_bw)")
        return PIPELINE

    def in_place(self, config: Config) -> bool:
        try:
            self.runtime(config)
        except ConfigError:
            return False
        return self.schedule.in_place

    def build(self, config: Config, task, context: BuildContext) -> Runtime:
        settings = config.section(self.schedule.section)
        runtime = PipelineRuntime(config, task, context.store_path, context.device, self.schedule(settings))
        runtime.strategy = self.name
        return runtime


STRATEGIES = tuple(PipelineStrategy(name, SCHEDULES.get(name)) for name in SCHEDULES.names())
