"""Engines host the parameter server's shards and run its workers, one epoch at a time.

An engine is built once per run on the run's placement (``build_engine``: ``engines.PLACEMENTS``
by ``ps.engine``, the one registry of where roles run) and owns the
shards for the whole run: ``engine.shards`` are handles with the ``ServerShard`` verbs (the shard
itself in a thread, or a proxy of the Ray actor that holds it), so the runtime drives checkpoints,
evaluation and flushing the same way on every engine. ``run_workers(epoch, plans, on_batch)`` runs one
epoch's workers and returns what each did.

- ``threads`` (the default): the shards are objects of this process and each worker is a thread;
  torch releases the GIL inside its kernels, so workers overlap their compute.
- ``ray`` (``cadence.ps.ray_engine``): each shard is a long-lived Ray actor holding its table
  and optimizer state for the whole run, each worker an actor that builds the task (reading its
  data) itself; the coordinator hands out batch positions and tokens only.
"""

from __future__ import annotations

import copy
import functools
from typing import Iterator

from torch import nn

from cadence.device import resolve_device
from cadence.core.batch import BatchPlan
from cadence.core.runtime import OnBatch
from cadence.engines.placement import InProcess, Placement
from cadence.optim import module_optimizer
from cadence.ps.coordinator import Coordinator
from cadence.ps.server import build_shard
from cadence.ps.worker import ShardRouter, Worker
from cadence.ps.epoch import Engine, EpochPlan, Launcher, ServerSettings, WorkerReport

def build_engine(placement: Placement, settings: ServerSettings, task, mode, dense: nn.Module) -> Engine:
    """The parameter server's engine on ``placement``: its roles objects and threads of this process,
    or (a placement whose roles run in processes of their own: Ray) each an actor; Ray's engine is
    imported here, when it is used, never by ``import cadence``."""
    if not placement.separate_processes:
        return ThreadEngine(settings, task, mode, dense, placement)
    from cadence.ps.ray_engine import RayEngine

    return RayEngine(settings, task, mode, dense, placement)


class ThreadEngine(Engine):
    def __init__(self, settings: ServerSettings, task, mode, dense: nn.Module, placement: InProcess):
        self.settings, self.task, self.mode = settings, task, mode
        spec = task.table()
        on_server = None if mode.dense_on_workers(settings.ps) else dense
        self.shards = [build_shard(settings.optimizer, settings.ps, settings.entity, spec, mode, index, on_server if index == 0 else None)
                       for index in range(settings.ps.shards)]
        self.router = ShardRouter(self.shards)
        self.coordinator = Coordinator(settings, mode, self.shards)  # the epoch's data list and gate, in this process
        self.dense = dense
        self.device = resolve_device(settings.device)  # where the workers compute
        self.start_seconds = 0.0  # nothing to start: the shards and workers live in this process
        # ps.dense: workers: the run's copy of the dense optimizer (checkpoints); replicas start from it
        self.dense_optimizer = module_optimizer(settings.optimizer, dense) if mode.dense_on_workers(settings.ps) else None
        self.syncs = 0  # dense syncs of every trainer's replica (ShadowSync)
        self.threads = placement  # the workers' (or trainers') threads
        self.sync_servers = mode.sync_servers(settings.own, self.threads)  # (EASGD's: objects of this process)

    # ---- one epoch: the protocol is ``Engine.run_workers``; here, how the roles start ----------------
    def start_workers(self, plan: EpochPlan, plans: list[BatchPlan], on_batch: OnBatch) -> dict:
        """A thread per live worker, each with its own dense copy, all on this process's shards and
        the coordinator's data list and gate."""
        coordinator = self.coordinator
        coordinator.begin(plans, plan.first_token, plan.dead, plan.workers)
        reducer = coordinator.reducer
        state = self.dense_optimizer.state_dict() if self.dense_optimizer is not None else None
        runs = {}
        for index in plan.workers:
            model = copy.deepcopy(self.dense)
            optimizer = module_optimizer(self.settings.optimizer, model, state) if reducer is not None else None
            worker = Worker(index, self.router, model, self.task, plan.faults.slowdown_in(index, plan.epoch),
                            plan.kill_after.get(index), self.settings.ps.emulated_latency, reducer, optimizer,
                            self.device)
            worker.on_batch = on_batch
            runs[self.threads.run(functools.partial(self._work, worker), f"cadence-worker-{index}")] = index
        return runs

    def _work(self, worker: Worker) -> WorkerReport:
        worker.run(self.coordinator.data, self.coordinator.gate)
        replica = None
        if worker.dense_optimizer is not None:  # (ps.dense: workers) the replicas the run may keep
            replica = (worker.model.state_dict(), worker.dense_optimizer.state_dict())
        return WorkerReport(worker.index, worker.loss_total, worker.examples_done, worker.pushed, worker.died,
                            bytes_moved=worker.bytes_moved, batches=worker.finished, replica=replica,
                            seconds=worker.laps.seconds)

    def launch(self, launcher: Launcher, plan: EpochPlan, plans: list[BatchPlan], on_batch: OnBatch) -> dict:
        return launcher.in_process(self, plan, plans, on_batch)

    def as_completed(self, pendings: list) -> Iterator:
        return self.threads.as_completed(pendings)

    def abandon(self, reason: str) -> None:
        self.coordinator.stop(reason)

    def recover(self) -> None:
        """Nothing to restart: the shards live in this process."""

    def close(self) -> None:
        pass
