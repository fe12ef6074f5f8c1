"""ShadowSync's trainers on the Ray engine (``ps.engine: ray``): each live worker actor of the
parameter server (``ps.ray_engine.TaskWorker``) runs one trainer's epoch as a job of this module
(``TaskWorker.run_job``): the same ``ShadowTrainer`` as on threads, its worker threads on channels
of their own to the shards and the coordinator. EASGD's central copy is on the sync servers (actors
of their own); MA and BMUF all-reduce over a gloo group of the trainers, made for the epoch at a
rendezvous on the first trainer's node and destroyed after it. Imported only when a run uses Ray."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from typing import Any

import torch
from torch import Tensor

from cadence.engines.remote import VerbChannel
from cadence.engines.ray import RayPending, node_host, pack, unpack
from cadence.ps.epoch import EpochPlan
from cadence.ps.coordinator import Coordinator
from cadence.ps.ray_engine import CoordinatorActor, RemoteData, TaskWorker
from cadence.ps.worker import ShardRouter, Worker
from cadence.strategies.shadowsync.dense_sync import CentralSlices, GlooAverager
from cadence.strategies.shadowsync.trainer import ShadowTrainer, reset_central

GLOO_TIMEOUT = datetime.timedelta(seconds=60)
STORE = "gloo store"  # rank 0's rendezvous store, kept in its worker between the two jobs (``TaskWorker.kept``)


def start_trainers(engine, plan: EpochPlan) -> dict:
    """On the driver: each live worker actor of ``engine`` (a ``RayEngine``) runs one trainer's epoch;
    EASGD's central copy on the sync servers starts from the run's dense parameters, MA and BMUF meet
    at a gloo rendezvous on the first trainer's node. {pending: trainer index}."""
    _, dense, states = engine.begin(plan)
    reset_central(engine.sync_servers, engine.dense)
    collective = engine.mode.collective and any(True for _ in engine.dense.parameters())
    host, port = (engine.workers[plan.workers[0]].call(TaskWorker.run_job, rendezvous) if collective
                  else (None, None))
    return {RayPending(engine.workers[index].start(
                TaskWorker.run_job, run_trainer, plan, state, dense,
                (host, port, rank, len(plan.workers)) if collective else None, engine.sync_servers)): index
            for rank, (index, state) in enumerate(zip(plan.workers, states))}


def rendezvous(worker: TaskWorker) -> tuple[str, int]:
    """Open the trainers' gloo rendezvous on ``worker``'s node (its trainer is rank 0 and holds the
    store): the store listens on a port the OS picks as it binds. (A port probed free and bound
    later can be taken meanwhile: EADDRINUSE, seen once under ``benchmarks/ps_cluster.py``.)"""
    store = worker.kept[STORE] = open_store(node_host())
    return node_host(), store.port


def run_trainer(worker: TaskWorker, plan: EpochPlan, rng_state: Tensor, dense: Any, meeting: tuple | None,
                sync_servers: list) -> Any:
    """One epoch of ``worker``'s trainer: its dense replica starts from ``dense`` (the run's state
    and optimizer state), ``shadow.threads`` worker threads train it, each with its own channels to
    the shards and the coordinator, and its shadow thread syncs it: EASGD with the central copy on
    the sync servers (``sync_servers``: their handles), MA and BMUF over a gloo group of the trainers
    (``meeting``: host, port, rank, size)."""
    torch.set_rng_state(rng_state)
    plans = worker.plans_for(plan.epoch)
    model_state, optimizer_state = unpack(dense)
    worker.model.load_state_dict(model_state)
    settings, index = worker.settings, worker.index
    central = CentralSlices(sync_servers) if worker.mode.central else None
    averager = None
    if meeting is not None:
        host, port, rank, size = meeting
        averager = join_gloo(worker.kept.pop(STORE) if rank == 0 else open_store(host, port, size), rank, size)
        if leave_gloo not in worker.at_close:  # (once: the run may end in the middle of an epoch)
            worker.at_close.append(leave_gloo)

    def abandon_epoch(reason: str) -> None:
        worker.coordinator.call(CoordinatorActor.stop, reason)

    trainer = ShadowTrainer(index, settings.own, settings.ps.workers, settings.optimizer, worker.mode, worker.model,
                            optimizer_state, central, averager, lambda: int(trainer.gate.training()), worker.device,
                            on_error=lambda err: abandon_epoch(f"trainer {index}'s shadow thread failed: {err!r}"))

    def router_of(thread: int) -> ShardRouter:
        shards = [shard.copy() for shard in worker.router.shards]
        for shard in shards:
            shard.direct()
        return ShardRouter(shards)

    def run_worker(thread: Worker) -> None:
        data = RemoteData(worker.coordinator, VerbChannel(worker.coordinator_address, worker.secret, Coordinator), plans,
                          prefetch=plan.kill_after.get(index) is None)
        try:
            thread.run(data, trainer.gate)
        finally:
            data.channel.close()
            for shard in thread.router.shards:
                shard.settle()

    quota = worker.straggling(plan.faults.slowdown_in(index, plan.epoch))
    if quota is not None:  # the process is slowed for real: its threads do not also sleep
        plan = dataclasses.replace(plan, faults=dataclasses.replace(plan.faults, slowdown={}))
    trainer.add_threads(router_of, worker.task, plan, worker.device, settings.ps.emulated_latency)
    try:
        with quota or contextlib.nullcontext():
            report = trainer.run(run_worker, abandon_epoch)
    finally:
        if averager is not None:
            leave_gloo()
    report.rng_state = torch.get_rng_state()
    report.throttled_seconds = quota.throttled["throttled_seconds"] if quota else 0.0
    return pack(report)


def open_store(host: str, port: int = 0, size: int | None = None) -> Any:
    """The gloo rendezvous's store: with ``port`` 0 the master's, listening on a port the OS picks;
    else a client of the master at ``host:port``."""
    import torch.distributed as dist

    if port == 0:
        return dist.TCPStore(host, 0, size, True, GLOO_TIMEOUT, wait_for_workers=False)
    return dist.TCPStore(host, port, size, False, GLOO_TIMEOUT)


def join_gloo(store: Any, rank: int, size: int) -> GlooAverager:
    """This trainer's place in the epoch's gloo group (met at ``store``), and the shadow thread's
    group within it."""
    import torch.distributed as dist

    leave_gloo()
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=GLOO_TIMEOUT)
    return GlooAverager(dist.new_group(backend="gloo", timeout=GLOO_TIMEOUT))  # (the shadow thread's own group)


def leave_gloo() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
