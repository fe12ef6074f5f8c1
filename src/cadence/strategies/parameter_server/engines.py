"""Engines host the parameter server's shards and run its workers, one epoch at a time.

An engine is built once per run (``ENGINES.get(name)(config, task, mode, dense)``) and owns the
shards for the whole run: ``engine.shards`` are handles with the ``ServerShard`` verbs (the shard
itself in a thread, or a proxy of the Ray actor that holds it), so the runtime drives checkpoints,
evaluation and flushing the same way on every engine. ``run_workers(epoch, plans, on_batch)`` runs one
epoch's workers and returns what each did.

- ``threads`` (the default): the shards are objects of this process and each worker is a thread;
  torch releases the GIL inside its kernels, so workers overlap their compute.
- ``ray`` (``cadence.strategies.parameter_server.ray_engine``): each shard is a long-lived Ray actor holding its table
  and optimizer state for the whole run, each worker an actor that builds the task (reading its
  data) itself; the coordinator hands out batch positions and tokens only.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from cadence.device import resolve_device
from cadence.core.batch import BatchPlan
from cadence.core.runtime import OnBatch, WorkerFailed, serialized
from cadence.registry import Registry
from cadence.optim import module_optimizer
from cadence.strategies.parameter_server.server import DenseReducer, build_shard
from cadence.strategies.parameter_server.worker import ShardRouter, Worker
from cadence.strategies.parameter_server.epoch import (Engine, EpochPlan, WorkerReport, abandon, new_data_list,
                                                      run_guarded)
from cadence.strategies.parameter_server.shadow import run_trainers

ENGINES: Registry[Any] = Registry("engine", "ps.engine")


@ENGINES.register("threads")
class ThreadEngine(Engine):
    def __init__(self, config, task, mode, dense: nn.Module):
        self.config, self.task, self.mode = config, task, mode
        spec = task.table()
        on_server = None if mode.dense_on_workers(config.ps) else dense
        self.shards = [build_shard(config.optimizer, config.ps, spec, mode, index, on_server if index == 0 else None)
                       for index in range(config.ps.shards)]
        self.router = ShardRouter(self.shards)
        self.dense = dense
        self.device = resolve_device(config.device)  # where the workers compute
        self.start_seconds = 0.0  # nothing to start: the shards and workers live in this process
        # ps.dense: workers: the run's copy of the dense optimizer (checkpoints); replicas start from it
        self.dense_optimizer = module_optimizer(config.optimizer, dense, None) if mode.dense_on_workers(config.ps) else None
        self.syncs = 0  # dense syncs of every trainer's replica (ShadowSync)

    def run_workers(self, plan: EpochPlan, plans: list[BatchPlan], on_batch: OnBatch) -> list[WorkerReport]:
        on_batch = serialized(on_batch)
        if self.mode.replicas:  # ShadowSync: trainers of Hogwild threads, each with a dense replica
            return run_trainers(self, plan, plans, on_batch)
        data = new_data_list(self.config.ps, self.mode, plans, plan.first_token, self.shards)
        gate = self.mode.gate(self.config.ps, self.shards)
        for index in plan.dead:
            gate.leave(index)
            data.abandon(index)
        reducer = DenseReducer(plan.workers) if self.mode.dense_on_workers(self.config.ps) else None
        workers = []
        for index in plan.workers:
            model = copy.deepcopy(self.dense)
            optimizer = None
            if reducer is not None:
                state = self.dense_optimizer.state_dict() if self.dense_optimizer is not None else None
                optimizer = module_optimizer(self.config.optimizer, model, state)
            workers.append(Worker(index, self.router, model, self.task, plan.faults.slowdown_in(index, plan.epoch),
                                  plan.kill_after.get(index), self.config.ps.emulated_latency, reducer, optimizer,
                                  self.device))
            workers[-1].on_batch = on_batch
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
        return [WorkerReport(w.index, w.loss_total, w.examples_done, w.pushed, w.died, bytes_moved=w.bytes_moved,
                             batches=w.finished)
                for w in workers]

    def recover(self) -> None:
        """Nothing to restart: the shards live in this process."""

    def close(self) -> None:
        pass


@ENGINES.register("ray")
def ray_engine(config, task, mode, dense: nn.Module):
    """Shards, coordinator and workers as Ray actors (``pip install cadence[ray]``); Ray is imported
    here, when the engine is used, never by ``import cadence``."""
    from cadence.strategies.parameter_server.ray_engine import RayEngine

    return RayEngine(config, task, mode, dense)
