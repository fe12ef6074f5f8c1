"""Engines host the parameter server's shards and run its workers, one epoch at a time.

An engine is built once per run (``ENGINES.get(name)(config, task, mode, dense)``) and owns the
shards for the whole run: ``engine.shards`` are handles with the ``ServerShard`` verbs (the shard
itself in a thread, or a proxy of the Ray actor that holds it), so the runtime drives checkpoints,
evaluation and flushing the same way on every engine. ``run_epoch(epoch, plans)`` runs one
epoch's workers and returns what each did.

- ``threads`` (the default): the shards are objects of this process and each worker is a thread;
  torch releases the GIL inside its kernels, so workers overlap their compute.
- ``ray`` (``cadence.runtime.ray_engine``): each shard is a long-lived Ray actor holding its table
  and optimizer state for the whole run, each worker an actor that builds the task (reading its
  data) itself; the coordinator hands out batch positions and tokens only.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cadence.device import resolve_device
from cadence.optim import dense_optimizer
from cadence.pipeline.batch import BatchPlan
from cadence.registry import Registry
from cadence.runtime.server import DataList, DenseReducer, build_shard
from cadence.runtime.worker import Faults, ShardRouter, Worker
from cadence.runtime.shadow import run_trainers

ENGINES: Registry[Any] = Registry("engine", "ps.engine")


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


class WorkerFailed(RuntimeError):
    """A worker raised: every other worker was released and the epoch abandoned."""


class ShardLost(RuntimeError):
    """A server shard's process died: its state since the last checkpoint is gone."""


def dense_here(config) -> bool:
    """Whether the dense parameters live on the workers: ``ps.dense: workers`` (PERSIA's split), or a
    mode whose trainers hold replicas (ShadowSync and its baselines)."""
    from cadence.strategies.parameter_server import PS_MODES

    replicas = config.strategy in PS_MODES and PS_MODES.get(config.strategy).replicas
    return config.ps.dense == "workers" or replicas


def run_guarded(workers: list[Worker], run, on_error) -> list:
    """Run ``run(worker)`` for each worker on a thread of its own and join them; the first to raise
    abandons the epoch for all (``on_error(reason)``: release every worker). Returns the errors as
    (worker index, exception)."""
    errors: list[tuple[int, BaseException]] = []

    def guarded(worker: Worker) -> None:
        try:
            run(worker)
        except BaseException as err:  # re-raised by the caller, on its thread
            errors.append((worker.index, err))
            on_error(f"worker {worker.index} failed: {err!r}")

    threads = [threading.Thread(target=guarded, args=(w,), name=f"cadence-worker-{w.index}", daemon=True)
               for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def replica_optimizer(config, module: nn.Module, state: dict | None) -> torch.optim.Optimizer | None:
    """A worker replica's dense optimizer, continuing from ``state`` (the run's optimizer state)."""
    parameters = list(module.parameters())
    if not parameters:
        return None
    optimizer = dense_optimizer(config.optimizer, parameters)
    if state is not None:
        optimizer.load_state_dict(copy.deepcopy(state))
    return optimizer


def new_data_list(config, mode, batches, first_token: int, shards: list) -> DataList:
    ps = config.ps
    return DataList(batches, mode.tokens_per_step(ps), first_token, shards, ps.workers,
                    mode.per_worker_batches, mode.fresh_tokens)


def abandon(data: DataList, reason: str) -> None:
    """A worker failed: hand out no more batches and release everyone waiting on a shard (sync's
    barrier, backup workers' next step), so the epoch ends within a batch instead of hanging."""
    data.stop()
    for shard in data.shards:
        shard.abort(reason)


@ENGINES.register("threads")
class ThreadEngine:
    def __init__(self, config, task, mode, dense: nn.Module):
        self.config, self.task, self.mode = config, task, mode
        spec = task.table()
        on_server = None if dense_here(config) else dense
        self.shards = [build_shard(config, spec, mode, index, on_server if index == 0 else None)
                       for index in range(config.ps.shards)]
        self.router = ShardRouter(self.shards)
        self.dense = dense
        self.device = resolve_device(config.device)  # where the workers compute
        self.start_seconds = 0.0  # nothing to start: the shards and workers live in this process
        # ps.dense: workers: the run's copy of the dense optimizer (checkpoints); replicas start from it
        self.dense_optimizer = replica_optimizer(config, dense, None) if dense_here(config) else None
        self.syncs = 0  # dense syncs of every trainer's replica (ShadowSync)

    def run_epoch(self, plan: EpochPlan, plans: list[BatchPlan]) -> list[WorkerReport]:
        if self.mode.replicas:  # ShadowSync: trainers of Hogwild threads, each with a dense replica
            return run_trainers(self, plan, plans)
        data = new_data_list(self.config, self.mode, plans, plan.first_token, self.shards)
        gate = self.mode.gate(self.config.ps, self.shards)
        for index in plan.dead:
            gate.leave(index)
            data.abandon(index)
        reducer = DenseReducer(plan.workers) if dense_here(self.config) else None
        workers = []
        for index in plan.workers:
            model = copy.deepcopy(self.dense)
            optimizer = None
            if reducer is not None:
                state = self.dense_optimizer.state_dict() if self.dense_optimizer is not None else None
                optimizer = replica_optimizer(self.config, model, state)
            workers.append(Worker(index, self.router, model, self.task, plan.faults.slowdown_in(index, plan.epoch),
                                  plan.kill_after.get(index), self.config.ps.emulated_latency, reducer, optimizer,
                                  self.device))
        def on_error(reason: str) -> None:
            abandon(data, reason)
            if reducer is not None:
                reducer.abort(reason)

        errors = run_guarded(workers, lambda worker: worker.run(data, gate), on_error)
        if errors:
            index, err = errors[0]
            raise WorkerFailed(f"worker {index} failed: {err!r}; the epoch is abandoned") from err
        if reducer is not None:  # every replica took the same steps: keep one (a live one) as the run's
            keeper = next((w for w in workers if not w.died), workers[0])
            self.dense.load_state_dict(keeper.model.state_dict())
            if self.dense_optimizer is not None:
                self.dense_optimizer.load_state_dict(keeper.dense_optimizer.state_dict())
        return [WorkerReport(w.index, w.loss_total, w.examples_done, w.pushed, w.died, bytes_moved=w.bytes_moved)
                for w in workers]

    def recover(self) -> None:
        """Nothing to restart: the shards live in this process."""

    def close(self) -> None:
        pass


@ENGINES.register("ray")
def ray_engine(config, task, mode, dense: nn.Module):
    """Shards, coordinator and workers as Ray actors (``pip install cadence[ray]``); Ray is imported
    here, when the engine is used, never by ``import cadence``."""
    from cadence.runtime.ray_engine import RayEngine

    return RayEngine(config, task, mode, dense)
