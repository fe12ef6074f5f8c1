"""One epoch of a parameter-server mode, written once for both engines: the plan of the epoch, each
worker's report, and ``Engine.run_workers``, the driver's side of the epoch. An engine only says
how its roles start (worker threads or actors: ``start_workers``; a mode's roles of its own, such as
ShadowSync's trainers, through ``launch``: a ``Launcher`` the mode brings, so no engine knows a
mode) and how its processes fail; collecting the reports, abandoning the epoch on the first error, reporting each
batch, and keeping the replicas are the same code on every engine."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from cadence.config import Config, OptimizerConfig
from cadence.ps.settings import ParameterServerConfig
from cadence.core.batch import finished_batch
from cadence.core.runtime import OnBatch, WorkerFailed, serialized
from cadence.engines.placement import finish
from cadence.engines.threads import run_threads
from cadence.ps.server import DataList
from cadence.ps.worker import Faults


@dataclass(frozen=True)
class ServerSettings:
    """What the parameter-server family reads of a run's config: its sections, taken once at the
    edge (``of``). Engines, modes, the coordinator and the actors take these, never the root config
    (an actor is pickled with these sections only)."""

    ps: ParameterServerConfig
    own: Any  # the mode's own section (``mode.section``: ShadowSync's ``shadow``), or None
    optimizer: OptimizerConfig
    batch_size: int  # train.batch_size
    device: str
    threads: int  # torch intra-op threads (per actor on Ray)
    entity: type  # the entity optimizer's class (``optimizer.entity``, resolved once)

    @classmethod
    def of(cls, config: Config, entity: type, mode) -> "ServerSettings":
        return cls(config.ps, config.section(mode.section), config.optimizer, config.train.batch_size, config.device, config.threads,
                   entity)


@dataclass
class EpochPlan:
    """What every engine needs to run one epoch of a parameter-server mode."""

    epoch: int
    batches: int
    first_token: int
    workers: list[int]  # the live workers
    dead: list[int]  # workers that died in earlier epochs
    faults: Faults
    kill_after: dict[int, int]  # worker -> batches it still pushes before it dies (fault injection)


@dataclass
class WorkerReport:
    index: int
    loss_total: float
    examples: int
    pushed: int
    died: bool  # fault injection killed it (it stays dead)
    lost: bool = False  # its process died unexpectedly; the engine replaces it next epoch
    bytes_moved: int = 0  # tensor bytes it pulled and pushed
    batches: list[tuple[int, float]] = field(default_factory=list)  # (plan index, loss) of its finished batches
    replica: tuple | None = None  # its dense replica (state, optimizer state) when it held one
    syncs: int = 0  # dense syncs of its replica (ShadowSync)
    rng_state: Any = None  # its random state at the end (a sole worker actor hands the driver's back)
    throttled_seconds: float = 0.0  # a straggler under a CPU quota: seconds the kernel held its process back
    shadow_cpu_seconds: float = 0.0  # ShadowSync: CPU seconds its shadow thread ran
    seconds: dict[str, float] = field(default_factory=dict)  # where its time went, by phase (``worker.PHASES``)


class Engine(ABC):
    """Where the parameter server's roles run (``ENGINES``): built once per run, it owns the shards
    for the whole run and runs one epoch's workers at a time; the runtime drives every engine through
    these members alone. ``run_workers`` is the epoch's protocol on the driver, the same on every
    engine; the abstract members below are what differs."""

    shards: list  # handles with the ``ServerShard`` verbs, in shard order
    start_seconds: float  # spent building the engine's processes before training
    dense: nn.Module  # the run's dense module (shard 0's, or the driver's copy of it)
    dense_optimizer: torch.optim.Optimizer | None  # the run's dense optimizer when the workers hold the dense part
    syncs: int  # dense syncs of every trainer's replica (ShadowSync)
    mode: Any  # the parameter-server mode (``PS_MODES``)

    def run_workers(self, plan: EpochPlan, plans: list, on_batch: OnBatch) -> list[WorkerReport]:
        """One epoch's workers (or trainers) over ``plans``; one report per worker; ``on_batch``
        once per pushed batch (live where the worker reaches it, else as its report arrives). The
        first error abandons the epoch for all and is raised here once every worker has stopped; a
        worker whose process died is released and the epoch goes on without it."""
        report = serialized(on_batch)
        runs = self.mode.start_epoch(self, plan, plans, report)
        by_index = {item.index: item for item in plans}
        reports: list[WorkerReport] = []
        failure: tuple[int, BaseException] | None = None
        try:
            for pending in self.as_completed(list(runs)):
                index = runs.pop(pending)
                try:
                    result: WorkerReport = pending.result()
                except Exception as err:  # noqa: BLE001 - its process died, or it failed: abandon the epoch
                    if self.lost(err):
                        self.release(index)
                        reports.append(WorkerReport(index, 0.0, 0, 0, False, lost=True))
                    elif failure is None:
                        failure = (index, err)
                        self.abandon(f"worker {index} failed: {err!r}")
                    continue
                reports.append(result)
                for plan_index, batch_loss in result.batches:  # a worker out of reach: as its report arrives
                    report(finished_batch(by_index[plan_index], batch_loss))
        except BaseException:  # Ctrl-C while waiting: release every worker, let them stop, let it through
            self.abandon("interrupted")
            for pending in runs:
                finish(pending)
            raise
        if failure is not None:
            raise self.failure(*failure)
        self.settle()
        kept = sorted((r for r in reports if r.replica is not None and not r.died), key=lambda r: r.index)
        self.mode.keep(self, [r.replica for r in kept], sum(r.syncs for r in reports))
        self.after_epoch(plan, reports)
        return reports

    @abstractmethod
    def start_workers(self, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        """GBA's family: start each live worker's epoch; {pending: worker index}."""

    @abstractmethod
    def launch(self, launcher: "Launcher", plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        """A mode's own roles for the epoch: the ``launcher``'s way for this engine; {pending: index}."""

    @abstractmethod
    def as_completed(self, pendings: list) -> Iterator:
        """The pendings in the order they finish."""

    def lost(self, err: BaseException) -> bool:
        """Whether ``err`` says the worker's process died (the epoch goes on without it)."""
        return False

    def release(self, index: int) -> None:
        """Worker ``index``'s process died: drop the batches it held."""

    @abstractmethod
    def abandon(self, reason: str) -> None:
        """Stop handing out batches and release every worker waiting on a shard."""

    def failure(self, index: int, err: BaseException) -> BaseException:
        """The exception the epoch raises for worker ``index``'s error."""
        if isinstance(err, WorkerFailed):
            return err
        failed = WorkerFailed(f"worker {index} failed: {err!r}; the epoch is abandoned")
        failed.__cause__ = err
        return failed

    def settle(self) -> None:
        """Wait until the one-way verbs of the epoch reached the shards."""

    def after_epoch(self, plan: EpochPlan, reports: list[WorkerReport]) -> None:
        """What the engine does with its workers once the epoch ended (retire or replace processes)."""

    @abstractmethod
    def recover(self) -> None:
        """Restart what a ``ShardLost`` took (the shards start empty; the trainer reloads them)."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine's threads or processes."""


class Launcher(ABC):
    """How a mode starts roles of its own for an epoch (ShadowSync's trainers), one way per engine:
    ``Engine.launch`` calls the one for its kind, so the mode knows the engines and no engine knows
    the mode. Each returns {pending: worker index}, as ``Engine.start_workers`` does."""

    @abstractmethod
    def in_process(self, engine, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        """On the thread engine (``ps.engines.ThreadEngine``): threads of this process."""

    @abstractmethod
    def on_actors(self, engine, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        """On the Ray engine (``ps.ray_engine.RayEngine``): in its worker actors (``TaskWorker.run_job``)."""


def run_guarded(workers: list, run, on_error) -> list:
    """Run ``run(worker)`` for each worker on a thread of its own and join them; the first to raise
    abandons the epoch for all (``on_error(reason)``: release every worker). Returns the errors as
    (worker index, exception)."""
    group = run_threads({worker.index: functools.partial(run, worker) for worker in workers},
                        lambda index: f"cadence-worker-{index}",
                        lambda index, err: on_error(f"worker {index} failed: {err!r}"))
    return group.errors


def new_data_list(ps: ParameterServerConfig, mode, batches, first_token: int, shards: list) -> DataList:
    return DataList(batches, mode.tokens_per_step(ps), first_token, shards, ps.workers,
                    mode.per_worker_batches, mode.fresh_tokens)


def abandon(data: DataList, reason: str) -> None:
    """A worker failed: hand out no more batches and release everyone waiting on a shard (sync's
    barrier, backup workers' next step), so the epoch ends within a batch instead of hanging."""
    data.stop()
    for shard in data.shards:
        shard.abort(reason)
