"""ShadowSync and its baselines (SPEC section 5) as parameter-server modes, registered in
``PS_MODES``: ``shadow-easgd``, ``shadow-ma``, ``shadow-bmuf`` (a shadow thread syncs each
trainer's dense replica in the background), ``fr-*`` (the same rules in the foreground) and
``hogwild`` (never synced). Their trainers start through ``TRAINERS``, a ``Launcher``: threads of
this process on the thread engine (``trainer.start_trainers_here``), jobs in the worker actors on
Ray (``on_ray``, imported only then).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from cadence.core.runtime import OnBatch
from cadence.core.strategy import Contract
from cadence.errors import ConfigError
from cadence.ps.epoch import EpochPlan, Launcher, ServerSettings
from cadence.ps.gates import NoGate
from cadence.ps.modes import PS_MODES, ParameterServerMode, hogwild_rows, no_gate, one_batch
from cadence.ps.server import DataList, DenseReducer
from cadence.ps.settings import ParameterServerConfig
from cadence.strategies.shadowsync.dense_sync import RULES, SyncServer
from cadence.strategies.shadowsync.settings import ShadowConfig
from cadence.strategies.shadowsync.trainer import mean_state, shadow_data_list, start_trainers_here, thread_indices


class TrainerLauncher(Launcher):
    """ShadowSync's trainers for an epoch, on either engine."""

    def in_process(self, engine, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        return start_trainers_here(engine, plan, plans, on_batch)

    def on_actors(self, engine, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        from cadence.strategies.shadowsync import on_ray  # (Ray: imported when a run uses it)

        return on_ray.start_trainers(engine, plan)


TRAINERS = TrainerLauncher()
MODES: list[str] = []  # this family's, in the order they are listed


@dataclass(frozen=True)
class ShadowSyncMode(ParameterServerMode):
    """ShadowSync and its baselines: each of ``ps.workers`` trainers holds a dense replica trained
    Hogwild by ``shadow.threads`` worker threads, rows applied on arrival; ``dense_sync`` (a rule of
    ``RULES``; None: never synced) keeps the replicas in step on a shadow thread, or with
    ``foreground`` every ``shadow.every`` iterations: in each worker thread's own loop
    (``shadow.fr_sync: thread``) or for the trainer with its threads paused. Its hooks: the dense
    parameters on the trainers, one data list for every trainer's threads, trainers for an epoch,
    the mean of the replicas kept at its end, ShadowSync's metrics."""

    section: ClassVar[str | None] = "shadow"
    ignores: ClassVar[dict[str, str]] = {"ps.dense": "every trainer holds a dense replica of its own"}
    dense_sync: str | None = None
    foreground: bool = False

    @property
    def reads(self) -> tuple[str, ...]:
        """``shadow.threads``; a synced mode's ``alpha`` and its rule's keys; the foreground's
        ``every`` and ``fr_sync``, the shadow thread's rate settings."""
        if self.dense_sync is None:
            return ("shadow.threads",)
        timing = (("shadow.every", "shadow.fr_sync") if self.foreground
                  else ("shadow.max_syncs_per_second", "shadow.cpu_share", "shadow.wait_for_update"))
        return ("shadow.threads", "shadow.alpha", *RULES.get(self.dense_sync).reads, *timing)

    @property
    def central(self) -> bool:
        """Whether the rule syncs with a central copy (EASGD's, on the sync servers)."""
        return self.dense_sync is not None and RULES.get(self.dense_sync).central

    @property
    def collective(self) -> bool:
        """Whether the rule's rounds are a collective of the trainers (an all-reduce: MA, BMUF)."""
        return self.dense_sync is not None and RULES.get(self.dense_sync).collective

    def sync_servers(self, shadow: ShadowConfig, placement) -> list:
        """EASGD's sync servers, ``shadow.sync_servers`` of them (none for MA, BMUF and hogwild)."""
        if not self.central:
            return []
        # (called by every trainer's rounds: over channels, where they run in processes of their own)
        try:
            servers = [placement.place(SyncServer, index, direct=True, resource=shadow.sync_server_resource)
                       for index in range(shadow.sync_servers)]
        except ConfigError as err:
            raise ConfigError(f"shadow.sync_server_resource: {err}") from None
        placement.ready()
        return servers

    def check(self, shadow: ShadowConfig) -> None:
        if shadow.sync_servers < 1:
            raise ConfigError(f"shadow.sync_servers must be at least 1; got {shadow.sync_servers}")
        if self.foreground and shadow.fr_sync == "thread" and self.collective:
            raise ConfigError(f"shadow.fr_sync: thread: {self.name}'s all-reduce needs one member per trainer, "
                              "not per worker thread; use shadow.fr_sync: trainer (the default for it)")

    def dense_on_workers(self, ps: ParameterServerConfig) -> bool:
        return True  # a replica per trainer

    def reducer(self, settings: ServerSettings, live: list[int]) -> DenseReducer | None:
        return None  # the replicas meet through the sync rule, not a gradient all-reduce

    def epoch_data(self, settings: ServerSettings, batches, first_token: int, shards: list,
                   dead: list[int]) -> tuple[DataList, NoGate]:
        # every worker thread of every trainer takes from one list; the trainers gate their own threads
        data = shadow_data_list(settings.own.threads, settings.ps.workers, batches, first_token, shards, dead)
        return data, self.gate(settings.ps, shards)

    def takers(self, settings: ServerSettings, worker: int) -> list[int]:
        return list(thread_indices(settings.own.threads, worker))

    def start_epoch(self, engine, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        return engine.launch(TRAINERS, plan, plans, on_batch)  # (each trainer gates its own threads)

    def keep(self, engine, replicas: list[tuple[dict[str, Tensor], dict | None]], syncs: int) -> None:
        """The run's dense parameters become the mean of the replicas (state dicts, trainer order), its
        dense optimizer state the first trainer's; the syncs are counted."""
        if replicas:
            engine.dense.load_state_dict(mean_state([state for state, _ in replicas]))
            if engine.dense_optimizer is not None and replicas[0][1] is not None:
                engine.dense_optimizer.load_state_dict(replicas[0][1])
        engine.syncs += syncs

    def summary_fields(self, settings: ServerSettings, seconds: float, examples: int, syncs: int,
                       shadow_cpu_seconds: float) -> dict[str, Any]:
        """ShadowSync's metrics (SPEC section 5): syncs per second over the training time, the sync gap
        (the seed's equation: EPS / batch size / syncs per second, i.e. batches of a trainer between
        two syncs of its replica; null when nothing synced: hogwild), the examples in flight,
        ELP = batch x Hogwild threads x trainers, and the shadow threads' CPU: seconds, and the mean
        share of a core one took over the training time (``shadow.cpu_share`` caps it)."""
        batch = settings.batch_size
        per_second = syncs / seconds if seconds > 0 else 0.0
        eps = examples / seconds if seconds > 0 else 0.0
        return {
            "dense_syncs": syncs,
            "syncs_per_second": round(per_second, 6),
            "sync_gap": round(eps / batch / per_second, 6) if per_second > 0 else None,
            "examples_in_flight": batch * settings.own.threads * settings.ps.workers,
            "shadow_cpu_seconds": round(shadow_cpu_seconds, 6),
            "shadow_cpu_share": round(shadow_cpu_seconds / seconds / settings.ps.workers, 4) if seconds > 0 else 0.0,
        }


def _register(mode: ShadowSyncMode) -> None:
    PS_MODES.register(mode.name)(mode)
    MODES.append(mode.name)


_RULE_TEXT = {
    "easgd": "EASGD with a central copy on the sync parameter server",
    "ma": "model averaging over an all-reduce of the trainers",
    "bmuf": "BMUF: an all-reduce, then a block update with block momentum",
}
# 2 trainers x 2 Hogwild threads; one trainer of one thread (with alpha 0: EASGD's pull towards the
# central copy off) computes what sync does
_TWO_TRAINERS = ("ps.workers=2", "shadow.threads=2")
_ONE_TRAINER = ("ps.workers=1", "shadow.threads=1")
for _rule, _text in _RULE_TEXT.items():
    _register(ShadowSyncMode(
        f"shadow-{_rule}", hogwild_rows, no_gate, one_batch,
        f"ShadowSync: {_text}, on a shadow thread in the background; embeddings Hogwild",
        contract=Contract(_TWO_TRAINERS, (*_ONE_TRAINER, "shadow.alpha=0")), dense_sync=_rule))
    _register(ShadowSyncMode(
        f"fr-{_rule}", hogwild_rows, no_gate, one_batch,
        f"{_text} in the foreground every shadow.every iterations (of each worker thread, or of the trainer: "
        "shadow.fr_sync); embeddings Hogwild",
        contract=Contract((*_TWO_TRAINERS, "shadow.every=2"), (*_ONE_TRAINER, "shadow.alpha=0")),
        dense_sync=_rule, foreground=True))
_register(ShadowSyncMode(
    "hogwild", hogwild_rows, no_gate, one_batch,
    "trainers' dense replicas never synced (averaged at the end of each epoch); embeddings Hogwild",
    contract=Contract(_TWO_TRAINERS, _ONE_TRAINER)))
