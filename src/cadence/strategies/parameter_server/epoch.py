"""What one epoch of a parameter-server mode is made of, on either engine: the plan of the epoch,
each worker's report, the engine interface, the workers' threads, the data list, and GBA's family's
epoch on the thread engine (``worker_epoch``)."""

from __future__ import annotations

import copy
import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from cadence.config import Config, OptimizerConfig, ParameterServerConfig, ShadowConfig
from cadence.core.runtime import OnBatch, WorkerFailed
from cadence.optim import module_optimizer
from cadence.engines.threads import run_threads
from cadence.strategies.parameter_server.server import DataList
from cadence.strategies.parameter_server.worker import Faults, Worker


@dataclass(frozen=True)
class ServerSettings:
    """What the parameter-server family reads of a run's config: its sections, taken once at the
    edge (``of``). Engines, modes, the coordinator and the actors take these, never the root config
    (an actor is pickled with these sections only)."""

    ps: ParameterServerConfig
    shadow: ShadowConfig
    optimizer: OptimizerConfig
    batch_size: int  # train.batch_size
    device: str
    threads: int  # torch intra-op threads (per actor on Ray)

    @classmethod
    def of(cls, config: Config) -> "ServerSettings":
        return cls(config.ps, config.shadow, config.optimizer, config.train.batch_size, config.device, config.threads)


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


class Engine(ABC):
    """Where the parameter server's roles run (``ENGINES``): built once per run, it owns the shards
    for the whole run and runs one epoch's workers at a time; the runtime drives every engine through
    these members alone."""

    shards: list  # handles with the ``ServerShard`` verbs, in shard order
    start_seconds: float  # spent building the engine's processes before training
    dense_optimizer: torch.optim.Optimizer | None  # the run's dense optimizer when the workers hold the dense part
    syncs: int  # dense syncs of every trainer's replica (ShadowSync)

    @abstractmethod
    def run_workers(self, plan: EpochPlan, plans: list, on_batch: OnBatch) -> list[WorkerReport]:
        """One epoch's workers over ``plans``; one report per worker; ``on_batch`` once per pushed batch."""

    @abstractmethod
    def recover(self) -> None:
        """Restart what a ``ShardLost`` took (the shards start empty; the trainer reloads them)."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine's threads or processes."""


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


def worker_epoch(engine, plan: EpochPlan, plans: list, on_batch: OnBatch) -> list[WorkerReport]:
    """GBA's family on the thread engine: one epoch of ``Worker`` threads over ``engine``'s shards
    (``ParameterServerMode.thread_epoch``), taking from the coordinator role in this process; the
    first error abandons the epoch for all."""
    settings = engine.settings
    coordinator = engine.coordinator
    coordinator.begin(plans, plan.first_token, plan.dead, plan.workers)
    reducer = coordinator.reducer
    state = engine.dense_optimizer.state_dict() if engine.dense_optimizer is not None else None
    workers = []
    for index in plan.workers:
        model = copy.deepcopy(engine.dense)
        optimizer = module_optimizer(settings.optimizer, model, state) if reducer is not None else None
        worker = Worker(index, engine.router, model, engine.task, plan.faults.slowdown_in(index, plan.epoch),
                        plan.kill_after.get(index), settings.ps.emulated_latency, reducer, optimizer, engine.device)
        worker.on_batch = on_batch
        workers.append(worker)
    errors = run_guarded(workers, lambda worker: worker.run(coordinator.data, coordinator.gate), coordinator.stop)
    if errors:
        index, err = errors[0]
        raise WorkerFailed(f"worker {index} failed: {err!r}; the epoch is abandoned") from err
    if reducer is not None:  # the replicas the run may keep: a live worker's first
        keeper = next((w for w in workers if not w.died), workers[0])
        optimizer_state = keeper.dense_optimizer.state_dict() if keeper.dense_optimizer is not None else None
        engine.mode.keep(engine, [(keeper.model.state_dict(), optimizer_state)], 0)
    return [WorkerReport(w.index, w.loss_total, w.examples_done, w.pushed, w.died, bytes_moved=w.bytes_moved,
                         batches=w.finished) for w in workers]
