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
  engine against proxies of the shards and the coordinator.

Per batch a worker makes one call to the coordinator (take), then pulls the rows of every shard
and the dense parameters in parallel (``ShardRouter.pull``: one overlapped round trip), computes,
and pushes to every shard without waiting (one-way; the next call to that shard first waits for
it, so each worker's verbs reach each shard in program order, as a thread's do). Tensors cross
as numpy arrays, which Ray moves zero-copy through its object store.

Faults: a worker actor that dies has its batch's token released by the coordinator (the epoch
goes on without it) and is replaced before the next epoch; a shard actor that dies fails the
epoch with ``ShardLost`` (the trainer restarts every shard and reloads the last checkpoint); a
worker that raises abandons the epoch (``WorkerFailed``); every role is released with the run (its
process kept idle for the driver's next run, or killed: ``Hosts.give_back``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import secrets
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from cadence.device import resolve_device
from cadence.core.runtime import OnBatch, ShardLost
from cadence.engines import ray as ray_support
from cadence.engines.ray import (RayPending, RayPlacement, completed, Actor, cluster_nodes, connect, hosts, kill,
                                node_host, pack, ray, ray_get, unpack)
from cadence.engines.cgroups import STRAGGLER_QUOTAS, CpuQuota
from cadence.engines.placement import verb_of
from cadence.engines.channel import Channel, ChannelClosed, ChannelServer, Reply
from cadence.optim import module_optimizer
from cadence.ps.epoch import Engine, EpochPlan, Launcher, ServerSettings, WorkerReport
from cadence.ps.gates import NoGate
from cadence.ps.coordinator import GATE_VERBS, Coordinator
from cadence.ps.server import ServerShard, build_shard
from cadence.ps.worker import ShardRouter, Worker

def shutdown() -> None:
    """Kill the actors of every engine of this process, and the processes it kept (the Ray
    connection itself stays)."""
    for engine in list(_ENGINES):
        engine.close()
    hosts().clear()


class _Call:
    """A remote call in flight (``result`` waits for it): a Ray object ref, or a channel's reply."""

    def __init__(self, ref: Any, shard: int | None = None):
        self.ref = ref
        self.shard = shard

    def result(self) -> Any:
        try:
            if isinstance(self.ref, Reply):
                return unpack(self.ref.result())
            return unpack(ray_get(self.ref))
        except (ray.exceptions.RayActorError, ChannelClosed) as err:
            if self.shard is None:
                raise
            raise ShardLost(f"server shard {self.shard}'s process died ({type(err).__name__})") from None


class RemoteShard:
    """A server shard held by a ``ShardServer`` actor, with ``ServerShard``'s verbs. Every call
    carries this handle's sequence number and the actor starts one handle's calls in that order
    (``ShardServer.call``), so ``push``, ``drop`` and ``close_token`` are sent without waiting and
    still reach the shard before this handle's next call: program order, as in a thread, without a
    round trip. ``settle`` waits until the one-way calls sent so far have been applied.

    Calls are Ray actor calls, or after ``direct()`` requests on a channel to the actor (a worker's
    per-batch verbs: ``channel`` module); the sequence numbers order both alike."""

    ONE_WAY = tuple(verb.__name__ for verb in (ServerShard.push, ServerShard.drop, ServerShard.close_token))

    def __init__(self, handle: Any, index: int, width: int, address: tuple | None = None, secret: bytes = b""):
        self.handle = handle
        self.index = index
        self.width = width
        self.address = address  # the actor's channel
        self.secret = secret  # the run's channel secret
        self.caller = uuid.uuid4().hex  # each process's copy of a handle is a caller of its own
        self._seq = 0
        self._pending: list[_Call] = []
        self._lock = threading.Lock()  # the coordinator's threads share its handles
        self._channel: Channel | None = None

    def direct(self) -> None:
        """From now on this copy's calls go over a channel to the actor (one caller: a worker)."""
        if self.address is not None and self._channel is None:
            try:
                self._channel = Channel(self.address, self.secret)
            except ChannelClosed as err:
                raise ShardLost(f"server shard {self.index}: {err}") from None

    def _remote(self, method: str, args: tuple) -> _Call:
        packed = pack(args)
        with self._lock:  # sequence numbers in submission order
            seq, self._seq = self._seq, self._seq + 1
            if self._channel is not None:
                return _Call(self._channel.submit((self.caller, seq, method, packed)), self.index)
            return _Call(self.handle.start(ShardServer.call, self.caller, seq, method, *packed), self.index)

    def submit(self, verb, *args: Any) -> _Call:
        """Call ``verb`` (a method of ``ServerShard``, never a string) without waiting for it."""
        return self._remote(verb_of(ServerShard, verb), args)

    def settle(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for call in pending:
            call.result()

    def close_channel(self) -> None:
        """This copy's channel closed (its calls go through Ray again)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def __getattr__(self, method: str):
        """``shard.verb(*args)`` as on a ``ServerShard``: only its verbs (another name fails here, as
        it would on a shard of this process)."""
        verb = getattr(ServerShard, method, None)
        if method.startswith("_") or not callable(verb):
            raise AttributeError(method)
        if method in self.ONE_WAY:
            return functools.partial(self._send, method)
        return lambda *args: self.submit(verb, *args).result()

    def _send(self, method: str, *args: Any) -> None:
        call = self._remote(method, args)
        with self._lock:
            self._pending.append(call)
            settled = self._pending[:128] if len(self._pending) >= 256 else []
            del self._pending[:len(settled)]
        for old in settled:  # long applied by now: collected, so errors surface and replies are read
            old.result()

    def __reduce__(self):
        return RemoteShard, (self.handle, self.index, self.width, self.address, self.secret)


TAKE = (Coordinator.take.__name__,)  # a worker's request on its channel to the coordinator
DIRECT_VERBS = (Coordinator.take.__name__, *(verb.__name__ for verb in GATE_VERBS))  # what that channel serves


# ---- the actors -------------------------------------------------------------------------------------------
class ShardServer(Actor):
    """Holds server shard ``index`` for the whole run."""

    def __init__(self, settings: ServerSettings, spec, mode, index: int, dense_blob: bytes | None, threads: int,
                 secret: bytes):

        torch.set_num_threads(threads)
        dense = pickle.loads(dense_blob) if dense_blob is not None else None
        self.shard = build_shard(settings.optimizer, settings.ps, settings.entity, spec, mode, index,
                                 dense)

        self.turns = threading.Condition()
        self.next_seq: dict[str, int] = {}  # caller -> sequence number of its next call
        self.channel = ChannelServer(lambda request: self.call(*request[:3], *request[3]), node_host(), secret)

    def endpoint(self) -> tuple:
        return self.channel.address

    def close(self) -> None:
        """The run is over: stop listening (its process may host the next run's roles)."""
        self.channel.close()

    def call(self, caller: str, seq: int, method: str, *args: Any) -> Any:
        """Run a caller's calls in its order: each waits for its turn, takes the shard's lock, and
        only then lets the caller's next call start (the lock is re-entrant, and a call that waits
        on the shard's condition releases it). A lock-free shard (Hogwild rows) takes no lock: a
        caller's next call starts when this one has finished, other callers' calls run beside it."""
        verb = getattr(self.shard, verb_of(ServerShard, getattr(ServerShard, method, None)))
        if self.shard.lock_free:
            with self.turns:
                self.turns.wait_for(lambda: self.next_seq.get(caller, 0) == seq)
            try:
                return pack(verb(*unpack(args)))
            finally:
                with self.turns:
                    self.next_seq[caller] = seq + 1
                    self.turns.notify_all()
        lock = self.shard.changed
        with self.turns:
            self.turns.wait_for(lambda: self.next_seq.get(caller, 0) == seq)
            lock.acquire()
            self.next_seq[caller] = seq + 1
            self.turns.notify_all()
        try:
            return pack(verb(*unpack(args)))
        finally:
            lock.release()


class _PerThreadShard:
    """A shard as the coordinator's threads see it: each thread calls through a handle of its own
    (``own_copy``) over a channel of its own. A channel serves one request at a time, so a take that
    waits on a shard for its step (backup workers' fresh tokens) holds up only its own worker's
    channel; and a take's shard calls cost a channel's round trip, not a Ray call's (0.5-1 ms of CPU
    on each side). Each thread's calls reach the shard in its program order; calls of different
    threads are ordered by the shard's lock alone, as the thread engine's are by the data list's.
    ``settle`` waits for every thread's one-way calls."""

    def __init__(self, shard: RemoteShard):
        self.shard = shard
        self.local = threading.local()
        self.copies: list[RemoteShard] = []
        self.lock = threading.Lock()

    def _mine(self) -> RemoteShard:
        copy = getattr(self.local, "copy", None)
        if copy is None:
            copy = self.local.copy = own_copy(self.shard)
            copy.direct()
            with self.lock:
                self.copies.append(copy)
        return copy

    def settle(self) -> None:
        with self.lock:
            copies = list(self.copies)
        for copy in copies:
            copy.settle()

    def close_channels(self) -> None:
        with self.lock:
            copies, self.copies = self.copies, []
        for copy in copies:  # (the run is over: replies still owed are not read)
            copy.close_channel()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._mine(), name)


class CoordinatorActor(Coordinator, Actor):
    """The coordinator role in an actor: ``begin`` over batch positions; ``take`` and the gate's verbs
    served on the workers' channels (the rest are Ray calls); its own calls to the shards over a
    channel per thread (``_PerThreadShard``)."""

    def __init__(self, settings: ServerSettings, mode, shards: list[RemoteShard], secret: bytes):
        super().__init__(settings, mode, [_PerThreadShard(shard) for shard in shards])
        self.channel = ChannelServer(self._direct, node_host(), secret)

    def endpoint(self) -> tuple:
        return self.channel.address

    def close(self) -> None:
        self.channel.close()
        for shard in self.shards:
            shard.close_channels()

    def _direct(self, request: tuple) -> Any:
        """A worker's request on its channel: ``take`` or a verb of the gate (``GATE_VERBS``)."""
        verb, *args = request
        if verb not in DIRECT_VERBS:
            raise ValueError(f"the coordinator's channel serves {', '.join(DIRECT_VERBS)}, not {verb!r}")
        return getattr(self, verb)(*args)

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

    def __init__(self, coordinator: Any, channel: Channel, plans: list, prefetch: bool):
        self.coordinator, self.channel, self.plans, self.prefetch = coordinator, channel, plans, prefetch
        self.ahead: Reply | None = None

    def take(self, worker: int):
        reply, self.ahead = self.ahead or self.channel.submit(TAKE + (worker,)), None
        item = reply.result()
        if item is None:
            return None
        if self.prefetch:
            self.ahead = self.channel.submit(TAKE + (worker,))
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


class _RemoteGate(NoGate):
    """The coordinator's gate, over the worker's channel to it (the takes' channel: one connection
    keeps the worker's verbs in program order); only the methods the gate's class overrides are
    called remotely. ``done`` is sent without waiting: the next verb on the channel is served after
    it, and its reply (an error too) is read before the next ``wait`` or ``leave``."""

    def __init__(self, channel: Channel, active: tuple[str, ...]):
        self.channel, self.active = channel, active
        self.sent: Reply | None = None  # the last one-way ``done``

    def _call(self, verb: str, *args: Any) -> None:
        if self.sent is not None:
            sent, self.sent = self.sent, None
            sent.result()
        if verb in self.active:
            self.channel.submit((verb, *args)).result()

    def wait(self, worker, token):
        self._call(Coordinator.wait.__name__, worker, token)

    def done(self, worker):
        if Coordinator.done.__name__ in self.active:
            self.sent = self.channel.submit((Coordinator.done.__name__, worker))

    def leave(self, worker):
        self._call(Coordinator.leave.__name__, worker)


class TaskWorker(Actor):
    """Worker ``index``: builds the task (and reads its data) itself, keeps it for the run."""

    def __init__(self, index: int, settings: ServerSettings, mode, recipe_box: list, shards: list[RemoteShard],
                 coordinator: Any, coordinator_address: tuple, threads: int, secret: bytes):

        torch.set_num_threads(threads)
        self.index, self.settings, self.coordinator, self.threads = index, settings, coordinator, threads
        self.last_quota: CpuQuota | None = None  # a straggler's last quota (its measured CPU rate is reused)
        self.mode = mode  # (the mode itself travels: its family's module need not be imported here)
        self.task = ray.get(recipe_box[0])()
        for shard in shards:  # this worker's per-batch calls take the channels
            shard.direct()
        self.channel = Channel(coordinator_address, secret)
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
                           local_gate or _RemoteGate(self.channel, gate))
        finally:
            for shard in self.router.shards:
                shard.settle()
        replica = None
        if dense is not None:
            replica = (self.model.state_dict(), optimizer.state_dict() if optimizer is not None else None)
        return pack(WorkerReport(self.index, worker.loss_total, worker.examples_done, worker.pushed, worker.died,
                                 bytes_moved=worker.bytes_moved, batches=worker.finished, replica=replica,
                                 rng_state=torch.get_rng_state(),
                                 throttled_seconds=quota.throttled["throttled_seconds"] if quota else 0.0))

    def straggling(self, slowdown: float) -> CpuQuota | None:
        """``ps.straggler_cause: cpu_quota``: the quota that makes this process ``slowdown`` times
        slower for the epoch (``ps.straggler_quota``: its own measured CPU rate, or its torch threads'
        cores, over the slowdown), or None (no straggler, or one that sleeps)."""
        if self.settings.ps.straggler_cause != "cpu_quota" or slowdown <= 1.0:
            return None
        known = getattr(self.last_quota, "measured_cores", None)  # measured in an earlier slowed epoch
        quota = STRAGGLER_QUOTAS.get(self.settings.ps.straggler_quota)
        self.last_quota = quota(f"{os.getpid()}-worker-{self.index}", self.threads, slowdown, known)
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


def own_copy(shard: RemoteShard) -> RemoteShard:
    """A handle of the same shard with a caller of its own (its own sequence, its own channel)."""
    return RemoteShard(shard.handle, shard.index, shard.width, shard.address, shard.secret)


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
        self.sync_placement = placement
        self.recipe = [ray.put(task.recipe())]  # in a list: fetched by each worker when it starts
        self.concurrency = max(32, 3 * settings.ps.workers + 8)
        self.placed = 0
        self.actors: list[Any] = []
        self.secret = secrets.token_bytes(32)  # admits this run's processes to its channels
        self.start_seconds = 0.0  # waiting for the actors to be built (recorded in summary.json)
        self.syncs = 0  # ShadowSync: dense syncs of every trainer's replica
        self._start()
        _ENGINES.add(self)

    def _new(self, cls: type, *args: Any, gpus: float = 0.0) -> Any:
        """An actor of ``cls`` on the next node in turn, in a process the driver kept from its last
        run where one is idle there (``engines.ray.Hosts``). ``num_cpus=0``: actors never wait for a
        CPU (three 1-CPU actors on a 2-CPU node would leave one pending forever). An actor that asks
        for ``gpus`` (a worker of a ``device: cuda`` run: a share of one GPU each) goes wherever
        Ray finds that share instead, in a process of its own."""
        nodes = cluster_nodes()
        node = nodes[self.placed % len(nodes)]
        self.placed += 1
        actor = hosts().take(cls, args, None if gpus else node, self.concurrency, gpus)
        self.actors.append(actor)
        return actor

    def _start(self) -> None:
        started = time.perf_counter()  # every role built (torch imported, the task and its data read)
        self.placed = 0
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
        self.sync_servers = self.mode.sync_servers(self.settings.own, self.sync_placement)
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
        if getattr(self, "sync_placement", None) is not None:
            self.sync_placement.close()
        actors, self.actors = self.actors, []
        hosts().give_back(actors)
