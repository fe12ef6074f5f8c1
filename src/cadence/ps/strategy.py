"""A parameter-server mode as an entry of the strategy registry (``cadence.strategies.catalog``): the
runtime kind every such entry builds, and the entry itself; each family registers its own modes'."""

from __future__ import annotations

from cadence.config import Config
from cadence.engines import PLACEMENTS, cgroups
from cadence.errors import ConfigError
from cadence.core.runtime import Runtime
from cadence.core.strategy import BuildContext, RuntimeKind, Strategy
from cadence.ps.modes import ParameterServerMode
from cadence.ps.runtime import ParameterServerRuntime
from cadence.ps.worker import Faults

PARAMETER_SERVER = RuntimeKind(
    "parameter_server",
    keys=("ps.shards", "ps.stragglers", "ps.straggler_cause", "ps.straggler_quota", "ps.kill_workers",
          "ps.emulated_latency", "ps.ray_address", "ps.ray_idle_processes", "ps.dense"),
    owns_message="the parameter-server runtime", runs_on="the parameter server", engine=True)


class ServerStrategy(Strategy):
    """A parameter-server mode as a registered strategy."""

    runtimes = (PARAMETER_SERVER,)

    def __init__(self, mode: ParameterServerMode):
        self.mode = mode
        self.name, self.description = mode.name, mode.description
        self.reads = mode.reads
        self.contract, self.keeps_sync_model = mode.contract, mode.keeps_sync_model

    def runtime(self, config: Config) -> RuntimeKind:
        return PARAMETER_SERVER

    def unread(self, config: Config) -> dict[str, str]:
        return dict(self.mode.ignores)

    def check(self, config: Config) -> None:
        PLACEMENTS.get(config.ps.engine)
        Faults.parse(config.ps.stragglers, config.ps.kill_workers, config.ps.workers)
        if config.ps.straggler_cause == "cpu_quota":
            if config.ps.engine != "ray":
                raise ConfigError("ps.straggler_cause: cpu_quota slows a worker's process: it needs ps.engine: ray "
                                  "(on threads a straggler sleeps: ps.straggler_cause: sleep)")
            why = cgroups.unavailable()
            if why is not None:
                raise ConfigError(f"ps.straggler_cause: cpu_quota: {why}")
        self.mode.check(config.section(self.mode.section))

    def build(self, config: Config, task, context: BuildContext) -> Runtime:
        runtime = ParameterServerRuntime(config, task, self.mode)
        runtime.strategy = self.name
        return runtime
