"""The adapm family's entries in the strategy registry (``cadence.strategies.catalog``)."""

from __future__ import annotations

from cadence.config import Config
from cadence.core.runtime import Runtime
from cadence.core.strategy import BuildContext, Contract, RuntimeKind, Strategy
from cadence.engines import PLACEMENTS
from cadence.errors import ConfigError
from cadence.strategies.adapm.runtime import AdaPMRuntime

ADAPM = RuntimeKind(
    "adapm", keys=("adapm", "ps.ray_address", "ps.ray_idle_processes"), owns_message="strategy adapm", runs_on="AdaPM's nodes",
    foreign_message="{key} does not apply to strategy adapm (its nodes hold the rows: ps.workers sets the number "
                    "of nodes, adapm.* the rest)",
    engine=True)
MAX_NODES = 63  # nodes of one AdaPM run: a node's bit in a key's int64 masks (the sign bit unused)


class AdaPMStrategy(Strategy):
    """``adapm``: ``ps.workers`` nodes (threads of this process, or Ray actors)."""

    name = "adapm"
    description = ("AdaPM: nodes relocate or replicate each row just in time from the workers' intent signals "
                   "(Algorithm 1)")
    runtimes = (ADAPM,)
    # 2 nodes (a short look-ahead, so that tiny epochs still relocate and replicate); one node is sync
    contract = Contract(("ps.workers=2", "adapm.lookahead=4"), ("ps.workers=1",))

    def runtime(self, config: Config) -> RuntimeKind:
        return ADAPM

    def check(self, config: Config) -> None:
        PLACEMENTS.get(config.ps.engine)
        if config.ps.workers > MAX_NODES:
            # (a key's intent and replica holders are one 64-bit mask of nodes: ``pm.holdings``)
            raise ConfigError(f"ps.workers: {config.ps.workers} adapm nodes; at most {MAX_NODES} (each key keeps "
                              "its nodes' intent and replicas as one 64-bit mask)")
        if config.device.startswith("cuda"):
            # (``auto`` trains on the CPU here and evaluates on the GPU, where there is one)
            raise ConfigError(f"device: {config.device!r}: adapm's nodes compute on the CPU, each holding its "
                              "share of the rows in host memory (as the paper's nodes do); use device: cpu or auto")

    def node_parts(self, config: Config) -> tuple[int, int]:
        """Each node trains its own part with the rows it holds (the paper's App. C partitioning on MF)."""
        return config.ps.workers, config.adapm.threads

    def build(self, config: Config, task, context: BuildContext) -> Runtime:
        runtime = AdaPMRuntime(config, task)
        runtime.strategy = self.name
        return runtime


STRATEGIES = (AdaPMStrategy(),)
