"""The ``ray`` engine: the parameter server as long-lived Ray actors.

Actors, created once per run and dealt round-robin over the cluster's nodes (shards first), each
a role built in a process of the driver's ``engines.ray.Hosts`` (one the last run left idle on that
node, or a new one):

- ``ShardServer`` i builds server shard i itself (``build_shard``: its rows, optimizer state and
  aggregation rule; shard 0 also the dense module) and holds it for the whole run. Nothing of a
  table ever passes through the driver: evaluation pulls rows by key, a checkpoint has each shard
  write its own part file (``ServerShard.save_part``) and a resume has each read its own.
- ``CoordinatorActor`` is the coordinator role (``coordinator``, the thread engine's too) over batch
  *positions*: it holds the epoch's ``DataList`` and the mode's gate and hands out (position, token).
- ``TaskWorker`` i builds the task itself from the run's config (``task.recipe()``: it reads its
  own data; a task whose data was handed in as an object travels whole, once), computes each
  epoch's plans (a pure function of seed and epoch) and runs the very ``Worker`` loop of the thread
  engine against proxies of the shards and the coordinator; a mode's own roles run in it as jobs
  (``run_job``: ShadowSync's trainers, ``strategies.shadowsync.on_ray``).

Per batch a worker makes one call to the coordinator (take), then pulls the rows of every shard
and the dense parameters in parallel (``ShardRouter.pull``: one overlapped round trip), computes,
and pushes to every shard without waiting (one-way; the next call to that shard first waits for
it, so each worker's verbs reach each shard in program order, as a thread's do). How a call
crosses is ``engines.remote``'s (``OrderedProxy`` and ``OrderedRole`` for the shards, a
``VerbChannel`` to the coordinator): verbs named by their methods. Tensors cross as numpy arrays,
which Ray moves zero-copy through its object store.

Faults: a worker actor that dies has its batch's token released by the coordinator (the epoch
goes on without it) and is replaced before the next epoch; a shard actor that dies fails the
epoch with ``ShardLost`` (the trainer restarts every shard and reloads the last checkpoint); a
worker that raises abandons the epoch (``WorkerFailed``); every role is released with the run (its
process kept idle for the driver's next run, or killed: ``Hosts.give_back``).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import time
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from cadence.device import resolve_device
from cadence.core.runtime import OnBatch, ShardLost
from cadence.engines import ray as ray_support
from cadence.engines.ray import (RayPending, RayPlacement, completed, Actor, connect, hosts, kill,
                                node_host, pack, ray, ray_get, unpack)
from cadence.engines.cgroups import STRAGGLER_QUOTAS, CpuQuota
from cadence.engines.channel import ChannelServer, Reply
from cadence.engines.remote import OrderedProxy, OrderedRole, PerThread, VerbChannel, VerbServer
from cadence.optim import module_optimizer
from cadence.ps.epoch import Engine, EpochPlan, Launcher, ServerSettings, WorkerReport
from cadence.ps.gates import NoGate
from cadence.ps.coordinator import Coordinator
from cadence.ps.server import ServerShard, build_shard
from cadence.ps.worker import ShardRouter, Worker

def shutdown() -> None:
    """Kill the actors of every engine of this process, and the processes it kept (the Ray
    connection itself stays)."""
    for engine in list(_ENGINES):
        engine.close()
    hosts().clear()


class RemoteShard(OrderedProxy):
    """A server shard held by a ``ShardServer`` actor, with ``ServerShard``'s verbs, called in this
    caller's program order (``engines.remote.OrderedProxy``): ``push``, ``drop`` and ``close_token``
    are sent without waiting and still reach the shard before this handle's next call. A worker's
    per-batch calls go over a channel to the actor after ``direct()``."""

    ONE_WAY = (ServerShard.push, ServerShard.drop, ServerShard.close_token)

    def __init__(self, handle: Any, index: int, width: int, address: tuple | None = None, secret: bytes = b""):
        super().__init__(handle, ShardServer.call, ServerShard, self.ONE_WAY, address, secret)
        self.index = index
        self.width = width

    def lost(self, err: BaseException) -> BaseException:
        return ShardLost(f"server shard {self.index}'s process died ({type(err).__name__})")

    def __reduce__(self):
        return RemoteShard, (self.handle, self.index, self.width, self.address, self.secret)


# what a worker's channel to the coordinator serves: its takes, and the gate's verbs where the gate keeps state
WORKER_VERBS = (Coordinator.take, Coordinator.wait, Coordinator.done, Coordinator.leave)


# ---- the actors -------------------------------------------------------------------------------------------
class ShardServer(Actor):
    """Holds server shard ``index`` for the whole run."""

    def __init__(self, settings: ServerSettings, spec, mode, index: int, dense_blob: bytes | None, threads: int,
                 secret: bytes):

        torch.set_num_threads(threads)
        dense = pickle.loads(dense_blob) if dense_blob is not None else None
        self.shard = build_shard(settings.optimizer, settings.ps, settings.entity, spec, mode, index,
                                 dense)

        self.calls = OrderedRole(self.shard, ServerShard, None if self.shard.lock_free else self.shard.changed)
        self.channel = ChannelServer(self.calls.serve, node_host(), secret)

    def endpoint(self) -> tuple:
        return self.channel.address

    def close(self) -> None:
        """The run is over: stop listening (its process may host the next run's roles)."""
        self.channel.close()

    def call(self, caller: str, seq: int, method: str, *args: Any) -> Any:
        """A ``RemoteShard``'s call through Ray, in its caller's order (``OrderedRole.call``): the
        shard's lock taken in turn, none for a lock-free shard (Hogwild rows)."""
        return self.calls.call(caller, seq, method, *args)


class CoordinatorActor(Coordinator, Actor):
    """The coordinator role in an actor: ``begin`` over batch positions; ``take`` and the gate's verbs
    served on the workers' channels (``WORKER_VERBS``; the rest are Ray calls); its own calls to the
    shards over a channel per thread (``engines.remote.PerThread``: a take that waits on a shard for
    its step, backup workers' fresh tokens, holds up only its own worker's channel)."""

    def __init__(self, settings: ServerSettings, mode, shards: list[RemoteShard], secret: bytes):
        super().__init__(settings, mode, [PerThread(shard) for shard in shards])
        self.channel = VerbServer(self, Coordinator, WORKER_VERBS, node_host(), secret)

    def endpoint(self) -> tuple:
        return self.channel.address

    def close(self) -> None:
        self.channel.close()
        for shard in self.shards:
            shard.close_channels()

    def open(self, batches: int, first_token: int, dead: list[int], live: list[int]) -> tuple[str, ...] | None:
        """``begin`` over positions 0 .. batches - 1; the gate verbs the workers call here."""
        self.begin(range(batches), first_token, dead, live)
        return self.remote_gate()

    def allreduce(self, worker: int, gradients: Any) -> Any:
        return pack(super().allreduce(worker, unpack(gradients)))


class RemoteData:
    """What a worker actor sees of the coordinator's data list: positions become its own plans.
    Takes go over the worker's channel to the coordinator. With ``prefetch`` the next position is
    asked for as soon as one arrives, so the round trip overlaps the batch's computation (not with
    fresh tokens, whose token is the step at the take)."""

    def __init__(self, coordinator: Any, channel: VerbChannel, plans: list, prefetch: bool):
        self.coordinator, self.channel, self.plans, self.prefetch = coordinator, channel, plans, prefetch
        self.ahead: Reply | None = None

    def take(self, worker: int):
        reply, self.ahead = self.ahead or self.channel.submit(Coordinator.take, worker), None
        item = reply.result()
        if item is None:
            return None
        if self.prefetch:
            self.ahead = self.channel.submit(Coordinator.take, worker)
        return item[0], self.plans[item[0]], item[1]

    def abandon(self, worker: int) -> None:
        self.coordinator.call(CoordinatorActor.abandon, worker)


class _RemoteReducer:
    """The coordinator's ``DenseReducer``, as a worker sees it."""

    def __init__(self, coordinator: Any):
        self.coordinator = coordinator

    def allreduce(self, worker: int, gradients):
        return unpack(self.coordinator.call(CoordinatorActor.allreduce, worker, pack(gradients)))

    def leave(self, worker: int) -> None:
        self.coordinator.call(CoordinatorActor.leave_reducer, worker)


class RemoteGate(NoGate):
    """The coordinator's gate, over the worker's channel to it (the takes' channel: one connection
    keeps the worker's verbs in program order); only the methods the gate's class overrides are
    called remotely. ``done`` is sent without waiting: the next verb on the channel is served after
    it, and its reply (an error too) is read before the next ``wait`` or ``leave``. A ``wait`` the
    gate's own rule already admits (``local.admits``: ``hop_bs``'s worker no more than its bound ahead
    of the slowest clock it last heard of, a lower bound of the slowest clock now) is not asked for:
    one round trip every few batches instead of one a batch."""

    def __init__(self, channel: VerbChannel, active: tuple[str, ...], local: NoGate):
        self.channel, self.active = channel, active  # (active: the names ``Coordinator.remote_gate`` gave)
        self.local = local  # the gate's rule, built here (its state stays at the coordinator)
        self.sent: list[Reply] = []  # one-way ``done``s not read yet
        self.clock = 0  # batches this worker finished
        self.floor: int | None = None  # the slowest live worker's clock, as last heard

    def _call(self, verb, *args: Any) -> Any:
        sent, self.sent = self.sent, []
        for reply in sent:
            reply.result()
        if verb.__name__ in self.active:
            return self.channel.submit(verb, *args).result()
        return None

    def wait(self, worker, token):
        if not self.local.admits(self.clock, self.floor):
            self.floor = self._call(Coordinator.wait, worker, token)

    def done(self, worker):
        self.clock += 1
        if Coordinator.done.__name__ in self.active:
            self.sent.append(self.channel.submit(Coordinator.done, worker))

    def leave(self, worker):
        self._call(Coordinator.leave, worker)


class TaskWorker(Actor):
    """Worker ``index``: builds the task (and reads its data) itself, keeps it for the run."""

    def __init__(self, index: int, settings: ServerSettings, mode, recipe_box: list, shards: list[RemoteShard],
                 coordinator: Any, coordinator_address: tuple, threads: int, secret: bytes):

        torch.set_num_threads(threads)
        self.index, self.settings, self.coordinator, self.threads = index, settings, coordinator, threads
        self.last_quota: CpuQuota | None = None  # a straggler's last quota (its measured CPU rate, or probe, goes on)
        self.mode = mode  # (the mode itself travels: its family's module need not be imported here)
        self.task = ray.get(recipe_box[0])()
        for shard in shards:  # this worker's per-batch calls take the channels
            shard.direct()
        self.channel = VerbChannel(coordinator_address, secret, Coordinator)
        self.coordinator_address, self.secret = coordinator_address, secret
        self.router = ShardRouter(shards)
        self.device = resolve_device(settings.device)  # the GPU Ray gave this actor, when it asked for one
        self.model = self.task.dense_module().to(self.device)
        self.plans: tuple[int, list] | None = None
        self.kept: dict[str, Any] = {}  # what a job keeps here between its calls (``run_job``)
        self.at_close: list[Callable[[], None]] = []  # a job's clean-up when the run ends (``close``)

    def run_worker(self, epoch: int, slowdown: float, kill_after: int | None, gate: tuple[str, ...] | None,
                  rng_state: Tensor, dense: Any = None) -> Any:
        """``dense``: with ``ps.dense: workers``, the run's dense state and optimizer state to start
        from; the replica's are returned with the worker's counters."""
        torch.set_rng_state(rng_state)
        plans = self.plans_for(epoch)
        reducer, optimizer = None, None
        if dense is not None:
            model_state, optimizer_state = unpack(dense)
            self.model.load_state_dict(model_state)
            optimizer = module_optimizer(self.settings.optimizer, self.model, optimizer_state)
            reducer = _RemoteReducer(self.coordinator)
        quota = self.straggling(slowdown)
        worker = Worker(self.index, self.router, self.model, self.task, 1.0 if quota else slowdown, kill_after,
                        self.settings.ps.emulated_latency, reducer, optimizer, self.device)
        local_gate = self.mode.gate(self.settings.ps, self.router.shards) if gate is None else None
        # a worker fated to die (fault injection) takes no batch ahead: it dies with exactly one
        prefetch = not self.mode.fresh_tokens and kill_after is None
        # a push may ride on the next pull where nobody waits for it meanwhile (no gate, fixed tokens)
        self.router.defer = type(local_gate) is NoGate and not self.mode.fresh_tokens and reducer is None
        self.router.deferred = None
        try:
            with quota or contextlib.nullcontext():
                worker.run(RemoteData(self.coordinator, self.channel, plans, prefetch),
                           local_gate or RemoteGate(self.channel, gate, self.mode.gate(self.settings.ps, self.router.shards)))
        finally:
            for shard in self.router.shards:
                shard.settle()
        replica = None
        if dense is not None:
            replica = (self.model.state_dict(), optimizer.state_dict() if optimizer is not None else None)
        return pack(WorkerReport(self.index, worker.loss_total, worker.examples_done, worker.pushed, worker.died,
                                 bytes_moved=worker.bytes_moved, batches=worker.finished, replica=replica,
                                 rng_state=torch.get_rng_state(),
                                 throttled_seconds=quota.throttled["throttled_seconds"] if quota else 0.0,
                                 seconds=worker.laps.seconds))

    def straggling(self, slowdown: float) -> CpuQuota | None:
        """``ps.straggler_cause: cpu_quota``: the quota that makes this process ``slowdown`` times
        slower for the epoch (``ps.straggler_quota``: its own measured CPU rate, or its torch threads'
        cores, over the slowdown), or None (no straggler, or one that sleeps)."""
        if self.settings.ps.straggler_cause != "cpu_quota" or slowdown <= 1.0:
            return None
        quota = STRAGGLER_QUOTAS.get(self.settings.ps.straggler_quota)  # (an earlier epoch's rate or probe goes on)
        self.last_quota = quota(f"{os.getpid()}-worker-{self.index}", self.threads, slowdown, self.last_quota)
        return self.last_quota

    def run_job(self, job: Callable[..., Any], *args: Any) -> Any:
        """``job(self, *args)`` in this worker's process: a mode's roles of its own (ShadowSync's
        trainer), a function of the mode's module (shipped by reference), with this worker's task,
        model, channels and plans; what it leaves to undo when the run ends goes in ``at_close``."""
        return job(self, *args)

    def plans_for(self, epoch: int) -> list:
        """Epoch ``epoch``'s batch plans (a pure function of the seed and the epoch: computed here)."""
        if self.plans is None or self.plans[0] != epoch:
            self.plans = (epoch, self.task.plan(epoch))
        return self.plans[1]

    def close(self) -> None:
        """The run is over: this worker's channels closed, and what its jobs left undone (``at_close``)."""
        self.channel.close()
        self.kept.clear()
        for shard in self.router.shards:
            shard.close_channel()
        undo, self.at_close = self.at_close, []
        for step in undo:
            step()


# ---- the engine (driver side) -----------------------------------------------------------------------------
_ENGINES: "set[RayEngine]" = set()



class RayEngine(Engine):
    """``engines.build_engine(placement, settings, task, mode, dense)`` on a Ray placement: the actors of
    one run (module docstring); the placement places EASGD's sync servers."""

    def __init__(self, settings: ServerSettings, task, mode, dense: nn.Module, placement: RayPlacement):
        if not ray.is_initialized():
            connect(settings.ps.ray_address, settings.threads)
        self.settings, self.mode = settings, mode
        self.threads = ray_support.settings["threads"]
        self.spec = task.table()
        self.dense = dense
        # shard 0 starts from the driver's initial dense module, unless the workers hold it (ps.dense)
        self.dense_blob = None if mode.dense_on_workers(settings.ps) else pickle.dumps(dense)
        self.dense_optimizer = module_optimizer(settings.optimizer, dense) if mode.dense_on_workers(settings.ps) else None
        self.placement = placement  # where every role of the run goes (EASGD's sync servers too)
        self.recipe = [ray.put(task.recipe())]  # in a list: fetched by each worker when it starts
        self.concurrency = max(32, 3 * settings.ps.workers + 8)
        self.secret = secrets.token_bytes(32)  # admits this run's processes to its channels
        self.start_seconds = 0.0  # waiting for the actors to be built (recorded in summary.json)
        self.syncs = 0  # ShadowSync: dense syncs of every trainer's replica
        self._start()
        _ENGINES.add(self)

    @property
    def actors(self) -> list:
        """The run's roles (shards, coordinator, workers), as the placement holds them."""
        return self.placement.actors

    def _new(self, cls: type, *args: Any, gpus: float = 0.0) -> Any:
        """An actor of ``cls`` placed by the run's placement (``RayPlacement.actor``: the next node in
        turn, in a process the driver kept from its last run where one is idle there; a worker of a
        ``device: cuda`` run, asking for a share of one GPU, wherever Ray finds it). Actors never
        wait for a CPU (``num_cpus=0``: three 1-CPU actors on a 2-CPU node would leave one pending)."""
        return self.placement.actor(cls, *args, concurrency=self.concurrency, gpus=gpus)

    def _start(self) -> None:
        started = time.perf_counter()  # every role built (torch imported, the task and its data read)
        handles = [self._new(ShardServer, self.settings, self.spec, self.mode, index,
                             self.dense_blob if index == 0 else None, self.threads, self.secret)
                   for index in range(self.settings.ps.shards)]
        addresses = ray_get([handle.start(ShardServer.endpoint) for handle in handles])
        self.shards = [RemoteShard(handle, index, self.spec.width, address, self.secret)
                       for index, (handle, address) in enumerate(zip(handles, addresses))]
        self.coordinator = self._new(CoordinatorActor, self.settings, self.mode, self.shards, self.secret)
        self.coordinator_address = self.coordinator.call(CoordinatorActor.endpoint)
        self.workers = {index: self._worker(index) for index in range(self.settings.ps.workers)}
        # EASGD's sync servers: actors of their own (a process each: what a CPU quota or a slow link limits)
        self.sync_servers = self.mode.sync_servers(self.settings.own, self.placement)
        # every actor is built before training starts: setup, as the thread engine's is, not the
        # first epoch's time (the shards' and the coordinator's waits above included)
        ray_get([actor.start(Actor.ping) for actor in (self.coordinator, *self.workers.values())])
        self.start_seconds += time.perf_counter() - started

    def _worker(self, index: int) -> Any:
        gpus = 1.0 / self.settings.ps.workers if resolve_device(self.settings.device).type == "cuda" else 0.0
        return self._new(TaskWorker, index, self.settings, self.mode, self.recipe, self.shards, self.coordinator,
                         self.coordinator_address, self.threads, self.secret, gpus=gpus)

    # ---- one epoch: the protocol is ``Engine.run_workers``; here, how the actors start and fail ------
    def begin(self, plan: EpochPlan) -> tuple[tuple[str, ...] | None, Any, list[Tensor]]:
        """The coordinator's epoch; (its gate verbs, the run's dense state when the workers hold it,
        each worker's random state)."""
        gate = self.coordinator.call(CoordinatorActor.open, plan.batches, plan.first_token, plan.dead, plan.workers)
        dense = None
        if self.mode.dense_on_workers(self.settings.ps):
            dense = pack((self.dense.state_dict(),
                           self.dense_optimizer.state_dict() if self.dense_optimizer is not None else None))
        # Dropout draws from torch's default generator. A single worker continues this process's
        # stream and hands it back, exactly as a thread would; several get streams of their own.
        if len(plan.workers) == 1:
            states = [torch.get_rng_state()]
        else:
            seeds = torch.randint(0, 1 << 62, (len(plan.workers),)).tolist()
            states = [torch.Generator().manual_seed(seed).get_state() for seed in seeds]
        return gate, dense, states

    def start_workers(self, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        """GBA's family: each live worker actor runs the ``Worker`` loop for the epoch."""
        gate, dense, states = self.begin(plan)
        return {RayPending(self.workers[index].start(
                    TaskWorker.run_worker, plan.epoch, plan.faults.slowdown_in(index, plan.epoch), plan.kill_after.get(index),
                    gate, state, dense)): index
                for index, state in zip(plan.workers, states)}

    def launch(self, launcher: Launcher, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
        return launcher.on_actors(self, plan, plans, on_batch)

    def as_completed(self, pendings: list) -> Iterator:
        return completed(pendings)

    def lost(self, err: BaseException) -> bool:
        return isinstance(err, ray.exceptions.RayActorError)

    def release(self, index: int) -> None:
        self.coordinator.call(CoordinatorActor.release, index)

    def failure(self, index: int, err: BaseException) -> BaseException:
        if isinstance(err, ShardLost) or not self._shards_alive():
            return ShardLost(f"a server shard's process died during the epoch ({err})")
        return super().failure(index, err)

    def settle(self) -> None:
        self.coordinator.call(CoordinatorActor.settle)  # the data list's drops and closes are applied

    def after_epoch(self, plan: EpochPlan, reports: list[WorkerReport]) -> None:
        for report in reports:
            if len(plan.workers) == 1 and report.rng_state is not None:
                torch.set_rng_state(report.rng_state)
            if report.died:  # fault injection: its process goes with it
                kill(self.workers.pop(report.index))
            elif report.lost:
                self.workers[report.index] = self._worker(report.index)

    def abandon(self, reason: str) -> None:
        try:
            self.coordinator.call(CoordinatorActor.stop, reason)
        except Exception:  # noqa: BLE001 - a dead shard cannot be told; its callers fail anyway
            for shard in self.shards:
                try:
                    shard.abort(reason)
                except Exception:  # noqa: BLE001
                    pass

    def _shards_alive(self) -> bool:
        try:
            ray_get([shard.handle.start(Actor.ping) for shard in self.shards])
            return True
        except ray.exceptions.RayActorError:
            return False

    def recover(self) -> None:
        """After ``ShardLost``: every role is built anew (in the processes still alive); the shards
        start empty (the trainer reloads the last checkpoint into them)."""
        self._release()
        self._start()

    def close(self) -> None:
        self._release()
        _ENGINES.discard(self)

    def sync_server_pids(self) -> list[int]:
        """The process ids of the sync servers' actors (a benchmark puts them under a CPU quota)."""
        return ray_get([server.actor.start(Actor.pid) for server in self.sync_servers])

    def _release(self) -> None:
        """Every role of the run released; its processes kept for the next run, or killed."""
        if getattr(self, "placement", None) is not None:
            self.placement.close()
