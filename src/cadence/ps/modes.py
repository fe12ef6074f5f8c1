"""A parameter-server mode: what a strategy family on the parameter server chooses, registered in
``PS_MODES`` by the family that defines it (GBA and its baselines: ``cadence.strategies.
parameter_server``, SPEC section 3; ShadowSync and its baselines: ``cadence.strategies.shadowsync``,
SPEC section 5). A mode is a few small choices over the shared roles (the aggregation rule on the
servers, the gate on the workers) and hooks with GBA's family as the default (where the dense
parameters live, the epoch's data list, what one epoch runs, what the run keeps of it, its summary
fields); ShadowSync overrides the hooks, none copies the engines, and nothing here names a mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from cadence.ps.settings import ParameterServerConfig
from cadence.core.runtime import OnBatch
from cadence.core.strategy import Contract
from cadence.registry import Registry
from cadence.ps.aggregation import Aggregation, ApplyEach, Hogwild
from cadence.ps.gates import NoGate
from cadence.ps.epoch import EpochPlan, ServerSettings, new_data_list
from cadence.ps.server import DataList, DenseReducer, ServerShard


@dataclass(frozen=True)
class ParameterServerMode:
    """A parameter-server mode: its choices (the aggregation rule on the shards, the gate on the
    workers, tokens per step) and the hooks the engines and the runtime call. The defaults are GBA's
    family (SPEC section 3): every worker pulls, computes and pushes one batch at a time; ShadowSync's
    modes override them (``shadowsync.modes.ShadowSyncMode``). No engine, shard or runtime asks which
    mode runs."""

    section: ClassVar[str | None] = None  # the config section of the mode's own settings (``ServerSettings.own``)
    # keys of the parameter-server runtime this mode leaves unread, each with why (``Strategy.unread``)
    ignores: ClassVar[dict[str, str]] = {}

    name: str
    aggregation: Callable[[ParameterServerConfig], Aggregation]
    gate: Callable[[ParameterServerConfig, list[ServerShard]], NoGate]
    tokens_per_step: Callable[[ParameterServerConfig], int]  # batches per token: one global step's worth
    description: str
    per_worker_batches: bool = False  # each worker computes exactly one local batch per step
    fresh_tokens: bool = False  # a batch's token is the current step when it is taken (backup workers)
    own_keys: tuple[str, ...] = ()  # the keys of the modes' settings (ps.*, shadow.*) this mode reads
    contract: Contract = Contract()  # its contract tests' settings (``Strategy.contract``)
    keeps_sync_model: bool = False  # (``Strategy.keeps_sync_model``)

    @property
    def reads(self) -> tuple[str, ...]:
        return self.own_keys

    def check(self, own: Any) -> None:
        """A ``ConfigError`` for a setting this mode cannot honour (``own``: its section, or None)."""

    def sync_servers(self, own: Any, placement) -> list:
        """The sync servers this mode's trainers exchange with (handles placed by ``placement``, started
        once per run; ShadowSync's EASGD: ``shadow.sync_servers``); none by default."""
        return []

    # ---- where the dense parameters live ----------------------------------------------------------
    def dense_on_workers(self, ps: ParameterServerConfig) -> bool:
        """Whether the dense parameters live on the workers (``ps.dense: workers``: PERSIA's split)
        instead of on shard 0."""
        return ps.dense == "workers"

    def reducer(self, settings: ServerSettings, live: list[int]) -> DenseReducer | None:
        """The all-reduce of the workers' dense gradients, when they hold the dense parameters."""
        return DenseReducer(live) if self.dense_on_workers(settings.ps) else None

    # ---- an epoch ---------------------------------------------------------------------------------------
    def epoch_data(self, settings: ServerSettings, batches, first_token: int, shards: list,
                   dead: list[int]) -> tuple[DataList, NoGate]:
        """The epoch's data list and the workers' gate, the dead workers left out of both."""
        data = new_data_list(settings.ps, self, batches, first_token, shards)
        gate = self.gate(settings.ps, shards)
        for index in dead:
            gate.leave(index)
            data.abandon(index)
        return data, gate

    def takers(self, settings: ServerSettings, worker: int) -> list[int]:
        """The data-list takers of worker process ``worker`` (whose tokens go when it dies)."""
        return [worker]

    def start_epoch(self, engine, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        """Start one epoch's roles on ``engine`` (``Engine.run_workers`` collects them): every
        worker pulls, computes and pushes one batch at a time. {pending: worker index}."""
        return engine.start_workers(plan, plans, on_batch)

    def keep(self, engine, replicas: list[tuple[dict, dict | None]], syncs: int) -> None:
        """What the run keeps of the workers' dense replicas (state, optimizer state) at the epoch's
        end: with ``ps.dense: workers`` every replica took the same steps, so the first."""
        if replicas:
            engine.dense.load_state_dict(replicas[0][0])
            if engine.dense_optimizer is not None and replicas[0][1] is not None:
                engine.dense_optimizer.load_state_dict(replicas[0][1])

    def summary_fields(self, settings: ServerSettings, seconds: float, examples: int, syncs: int,
                       shadow_cpu_seconds: float) -> dict[str, Any]:
        """This mode's own fields in summary.json (``syncs`` and ``shadow_cpu_seconds``: the dense
        syncs of the workers' replicas and the CPU seconds their shadow threads ran, ShadowSync's)."""
        return {}


PS_MODES: Registry[ParameterServerMode] = Registry("parameter-server strategy")


# choices shared by the families' modes
no_gate = lambda config, shards: NoGate()  # noqa: E731
one_batch = lambda config: 1  # noqa: E731  every gradient is a step of its own
apply_each = lambda config: ApplyEach()  # noqa: E731
hogwild_rows = lambda config: Hogwild()  # noqa: E731  ShadowSync's tables: no lock on the rows
