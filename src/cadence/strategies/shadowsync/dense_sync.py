"""How a trainer's dense replica is kept in step with the others (ShadowSync, SPEC section 5).

Each trainer holds one replica ``w_i`` of the dense parameters, trained Hogwild by its worker
threads; a ``DenseSync`` pulls it towards the others, either on a **shadow thread** that loops in
the background while any trainer still trains (``shadow-*``: the sync gap is measured, not set) or
in the foreground every ``shadow.every`` iterations (``fr-*``). The rules, with ``alpha`` the
elastic parameter:

| rule   | one sync of trainer i                                                                      |
|--------|--------------------------------------------------------------------------------------------|
| EASGD  | w_ps <- (1 - a) w_ps + a w_i (on the central copy, atomically); w_i <- (1 - a) w_i + a w_ps |
| MA     | w_avg <- allreduce(w_i) / n; w_i <- (1 - a) w_i + a w_avg                                  |
| BMUF   | w_avg <- allreduce(w_i) / n; d <- w_avg - w_g; m <- mu m + eta d; w_g <- w_g + m;          |
|        | w_i <- (1 - a) w_i + a t, t = w_g (+ mu m with Nesterov)                                   |

The final step is an elastic interpolation into the *live* replica, not an overwrite: the worker
threads keep training while a sync is under way, and their updates since the snapshot are kept
(the paper's point; its Algorithm 4 step 8 reads "w_g + n w_desc", where n is the step size eta:
``block_lr``). BMUF's momentum and Nesterov follow fairseq's BMUF (block_lr 1, block_momentum
0.875 are its defaults); with momentum 0 and block_lr 1 BMUF is MA.

Collectives among trainers go through an ``Averager`` (``ThreadAverager`` for trainers that are
threads of one process; a gloo process group of its own for trainer processes). Every trainer
takes part in every round until *all* of them are out of data: each round also reduces a "still
training" count, so no trainer waits at a collective that another has left (a trainer that dies
leaves the averager, and the rounds go on without it).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor

from cadence.strategies.shadowsync.settings import ShadowConfig
from cadence.optim import InPlaceDense
from cadence.registry import Registry

log = logging.getLogger(__name__)

Params = Sequence[Tensor]  # a replica's dense parameters (leaf tensors, updated in place)


def elastic(local: Tensor, target: Tensor, alpha: float) -> None:
    """local <- (1 - alpha) local + alpha target, in place (on the live replica), in ONE kernel
    (``lerp_``): worker threads read the replica meanwhile, and a multiply then an add would show
    them, between the two, weights scaled by 1 - alpha. alpha = 0 touches nothing: a read-modify-
    write would lose a worker thread's update made meanwhile."""
    if alpha == 0:
        return
    with torch.no_grad():
        local.lerp_(target, alpha)


def one_buffer(params: Params) -> bool:
    """Whether ``params`` can share one flat buffer (``HogwildReplica``: one dtype and device)."""
    return bool(params) and len({(p.dtype, p.device) for p in params}) == 1


def sync_layout(params: Params) -> list[Tensor]:
    """A copy of ``params`` as a replica's sync sees them: one flat tensor where they share a buffer."""
    with torch.no_grad():
        if one_buffer(params):
            return [torch.cat([p.detach().reshape(-1) for p in params])]
        return [p.detach().clone() for p in params]


def snapshot(params: Params) -> list[Tensor]:
    with torch.no_grad():
        return [p.detach().clone() for p in params]


# ---- where the others are ----------------------------------------------------------------------
class Averager(ABC):
    """An all-reduce among the trainers: every live trainer calls ``mean`` once a round."""

    can_leave = True  # whether a trainer can leave the rounds (else it stays in them, not training)

    @abstractmethod
    def mean(self, tensors: list[Tensor], training: bool) -> tuple[list[Tensor], int]:
        """(the mean of every live trainer's ``tensors``, how many of them still train)."""

    @abstractmethod
    def leave(self) -> None:
        """This trainer is gone (it died): the rounds go on without it."""


class ThreadAverager:
    """The all-reduce of trainers that are threads of one process: a barrier per round; ``member(i)``
    is trainer i's handle. A trainer that leaves no longer counts toward a round."""

    def __init__(self, trainers: int):
        self.lock = threading.Condition()
        self.members = set(range(trainers))
        self.round = 0
        self.arrived: dict[int, tuple[list[Tensor], bool]] = {}
        self.results: dict[int, tuple[list[Tensor], int]] = {}

    def member(self, trainer: int) -> "ThreadMember":
        return ThreadMember(self, trainer)

    def _mean(self, trainer: int, tensors: list[Tensor], training: bool) -> tuple[list[Tensor], int]:
        with self.lock:
            my_round = self.round
            self.arrived[trainer] = (tensors, training)
            self._maybe_finish()
            while self.round == my_round:
                self.lock.wait()
            return self.results[my_round]

    def _maybe_finish(self) -> None:
        if not self.members or not self.members <= set(self.arrived):
            return
        parts = [self.arrived[m] for m in sorted(self.members)]
        count = len(parts)
        means = [torch.stack([p[0][k] for p in parts]).sum(0) / count for k in range(len(parts[0][0]))]
        self.results = {self.round: (means, sum(1 for p in parts if p[1]))}
        self.arrived = {}
        self.round += 1
        self.lock.notify_all()

    def _leave(self, trainer: int) -> None:
        with self.lock:
            self.members.discard(trainer)
            self.arrived.pop(trainer, None)
            self._maybe_finish()


class ThreadMember(Averager):
    def __init__(self, group: ThreadAverager, trainer: int):
        self.group, self.trainer = group, trainer

    def mean(self, tensors: list[Tensor], training: bool) -> tuple[list[Tensor], int]:
        return self.group._mean(self.trainer, tensors, training)

    def leave(self) -> None:
        self.group._leave(self.trainer)


class GlooAverager(Averager):
    """The all-reduce of trainer processes (the Ray engine): a gloo process group of the shadow
    thread's own (``dist.new_group``, made by every rank in the same order), so its collectives never
    interleave with another thread's on a shared group. One flat all-reduce a round carries the
    replica and the "still training" count. A peer that dies makes the round fail within the group's
    ``timeout`` (``PeerLost``), never hang; a process cannot leave a gloo group, so ``leave`` is
    the caller's to handle (it stops syncing)."""

    def __init__(self, group):
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.size = dist.get_world_size(group)

    can_leave = False

    def mean(self, tensors: list[Tensor], training: bool) -> tuple[list[Tensor], int]:
        flat = torch.cat([t.reshape(-1).float() for t in tensors] + [torch.tensor([1.0 if training else 0.0])])
        try:
            self.dist.all_reduce(flat, group=self.group)
        except RuntimeError as err:  # gloo: a connection closed, or the timeout passed
            raise PeerLost(f"a trainer left the dense all-reduce ({err})") from None
        means, offset = [], 0
        for tensor in tensors:
            means.append((flat[offset:offset + tensor.numel()] / self.size).reshape(tensor.shape).to(tensor.dtype))
            offset += tensor.numel()
        return means, int(round(flat[-1].item()))

    def leave(self) -> None:
        """A process cannot leave a gloo group: its peers' next round fails with ``PeerLost``."""


class PeerLost(RuntimeError):
    """Another trainer died during a collective sync."""


class CentralCopy:
    """EASGD's central copy w_ps (the sync parameter server): one exchange at a time."""

    def __init__(self, initial: Params):
        self.lock = threading.Lock()
        self.values = snapshot(initial)

    def exchange(self, local: list[Tensor], alpha: float) -> list[Tensor]:
        """w_ps <- (1 - alpha) w_ps + alpha local; returns the new w_ps (a copy)."""
        with self.lock:
            for central, mine in zip(self.values, local):
                elastic(central, mine, alpha)
            return [value.clone() for value in self.values]


class SyncServer:
    """One sync parameter server (the paper's sync PS): the slice of EASGD's central copy it holds,
    exchanged one trainer at a time. A role (``engines.placement``): an object of this process on
    the thread engine, a Ray actor of its own on the Ray engine (a process a CPU quota can slow)."""

    def __init__(self) -> None:
        self.copy: CentralCopy | None = None

    def reset(self, initial: Tensor) -> None:
        """The slice starts from ``initial`` (the run's dense parameters, each epoch)."""
        self.copy = CentralCopy([initial])

    def exchange(self, local: Tensor, alpha: float) -> Tensor:
        """EASGD's exchange of this slice: the new w_ps slice."""
        return self.copy.exchange([local], alpha)[0]


def slices(params: Params, servers: int) -> list[Tensor]:
    """The replica's parameters as one flat vector cut into ``servers`` near-equal slices, in order
    (server i holds slice i)."""
    flat = torch.cat([p.detach().reshape(-1) for p in params]) if len(params) != 1 else params[0].detach().reshape(-1)
    return list(torch.tensor_split(flat, servers))


class CentralSlices:
    """EASGD's central copy as a trainer sees it: sliced over ``shadow.sync_servers`` sync servers
    (``Handle``s of ``SyncServer``), each exchanging its slice; remote servers in parallel."""

    def __init__(self, servers: list):
        self.servers = servers

    def exchange(self, local: list[Tensor], alpha: float) -> list[Tensor]:
        """The new central copy, on the device of ``local`` (the sync servers hold theirs in host
        memory: a replica on a GPU sends its slices there and takes the result back)."""
        parts = [part.cpu() for part in slices(local, len(self.servers))]
        if len(self.servers) > 1 and self.servers[0].concurrent:
            pendings = [server.start(SyncServer.exchange, part, alpha) for server, part in zip(self.servers, parts)]
            central = [pending.result() for pending in pendings]
        else:
            central = [server.call(SyncServer.exchange, part, alpha) for server, part in zip(self.servers, parts)]
        flat = torch.cat(central).to(local[0].device)
        return [piece.view_as(mine) for piece, mine in zip(torch.split(flat, [t.numel() for t in local]), local)]


def reset_sync_servers(servers: list, params: Params) -> None:
    """Every sync server's slice starts from ``params`` (the run's dense parameters)."""
    for server, part in zip(servers, slices(params, len(servers))):
        server.call(SyncServer.reset, part.to("cpu", copy=True))


# ---- the rules ---------------------------------------------------------------------------------
class DenseSync(ABC):
    """One sync of a trainer's replica; ``round`` says whether this trainer still trains and returns
    how many trainers still do (0: every trainer is out of data, the shadow thread stops)."""

    collective = False  # a round is a collective: every trainer takes part until all are out of data
    reads: tuple[str, ...] = ()  # the shadow.* keys this rule alone reads
    central = False  # a round exchanges with a central copy (EASGD's, held by the sync parameter server)
    averager: Averager | None = None

    def __init__(self, alpha: float):
        self.alpha = alpha

    @property
    def can_leave(self) -> bool:
        """Whether this trainer can stop syncing before its peers (a gloo group cannot shrink: a
        trainer fated to die stays in the rounds, as one out of data does, until they end)."""
        return self.averager is None or self.averager.can_leave

    @classmethod
    def from_settings(cls, alpha: float, shadow: ShadowConfig, params: Params, central: CentralSlices | None,
                      averager: Averager | None, training: Callable[[], int]) -> "DenseSync":
        """A trainer's rule from the ``shadow`` settings (``RULES.get(name).from_settings(...)``); every
        registered rule has one."""
        raise NotImplementedError(f"{cls.__name__} is not built from the shadow settings")

    @abstractmethod
    def round(self, params: Params, training: bool) -> int: ...

    def leave(self) -> None:
        """This trainer syncs no more (it died, or was stopped): its peers' rounds go on without it."""


class Easgd(DenseSync):
    reads = ("shadow.sync_servers", "shadow.sync_server_resource")
    central = True

    def __init__(self, alpha: float, central: CentralCopy | CentralSlices, training: Callable[[], int]):
        super().__init__(alpha)
        self.central = central
        self.training = training  # how many trainers still train (no collective: a shared count)

    @classmethod
    def from_settings(cls, alpha, shadow, params, central, averager, training):
        return cls(alpha, central, training)

    def round(self, params: Params, training: bool) -> int:
        central = self.central.exchange(snapshot(params), self.alpha)
        for param, value in zip(params, central):
            elastic(param.data, value, self.alpha)
        return self.training()


class ModelAverage(DenseSync):
    collective = True

    def __init__(self, alpha: float, averager: Averager):
        super().__init__(alpha)
        self.averager = averager

    @classmethod
    def from_settings(cls, alpha, shadow, params, central, averager, training):
        return cls(alpha, averager)

    def round(self, params: Params, training: bool) -> int:
        means, still = self.averager.mean(snapshot(params), training)
        for param, mean in zip(params, means):
            elastic(param.data, mean, self.alpha)
        return still

    def leave(self) -> None:
        self.averager.leave()


class Bmuf(DenseSync):
    reads = ("shadow.block_lr", "shadow.block_momentum", "shadow.nesterov")
    collective = True

    def __init__(self, alpha: float, averager: Averager, initial: Params, block_lr: float = 1.0,
                 block_momentum: float = 0.0, nesterov: bool = False):
        super().__init__(alpha)
        self.averager = averager
        self.block_lr, self.block_momentum, self.nesterov = block_lr, block_momentum, nesterov
        self.global_ = snapshot(initial)
        self.momentum = [torch.zeros_like(value) for value in self.global_]

    @classmethod
    def from_settings(cls, alpha, shadow, params, central, averager, training):
        return cls(alpha, averager, params, shadow.block_lr, shadow.block_momentum, shadow.nesterov)

    def round(self, params: Params, training: bool) -> int:
        means, still = self.averager.mean(snapshot(params), training)
        for param, mean, global_, momentum in zip(params, means, self.global_, self.momentum):
            momentum.mul_(self.block_momentum).add_(mean - global_, alpha=self.block_lr)
            global_.add_(momentum)
            target = global_ + self.block_momentum * momentum if self.nesterov else global_
            elastic(param.data, target, self.alpha)
        return still

    def leave(self) -> None:
        self.averager.leave()


RULES: Registry[type[DenseSync]] = Registry("dense sync rule")
RULES.register("easgd")(Easgd)
RULES.register("ma")(ModelAverage)
RULES.register("bmuf")(Bmuf)


# ---- a replica trained by several threads ------------------------------------------------------
class HogwildReplica:
    """One trainer's dense replica, trained by its worker threads without a lock (Hogwild). A thread
    takes its gradients with ``torch.autograd.grad`` (never through the shared ``.grad`` fields,
    which the threads would overwrite for one another) and applies them in place with the dense
    optimizer's rule (``cadence.optim.InPlaceDense``: through ``.data``, no lock); the optimizer's
    state is shared and updated the same racy way (Hogwild's bargain). One thread gives exactly the
    ``torch.optim`` step."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.module, self.optimizer = module, optimizer
        self.params = [p for p in module.parameters()]
        self.rule = InPlaceDense(optimizer, self.params)
        self.updated = threading.Event()  # set by every apply (a shadow thread waits for it)
        self.flat = self._flatten()

    def _flatten(self) -> list[Tensor]:
        """Lay the parameters out in one flat buffer (each parameter becomes a view of it) and return
        what a sync works on: [the buffer], so that a round is a few kernels whatever the number of
        layers (a round of many small ops holds the interpreter against the worker threads). Left as
        they are when they differ in dtype or device."""
        params = self.params
        if not one_buffer(params):
            return list(params)
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            offset = 0
            for param in params:
                param.data = flat[offset:offset + param.numel()].view_as(param)
                offset += param.numel()
        return [flat]

    def gradients(self, loss: Tensor, others: Sequence[Tensor] = ()) -> tuple[list[Tensor], list[Tensor]]:
        """(gradients of the replica's parameters, of ``others``: the batch's rows) of ``loss``."""
        wanted = [*self.params, *others]
        grads = torch.autograd.grad(loss, wanted, allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for t, g in zip(wanted, grads)]
        return grads[:len(self.params)], grads[len(self.params):]

    def apply(self, grads: Sequence[Tensor]) -> None:
        self.rule.step(list(grads))
        self.updated.set()


# ---- the shadow thread -------------------------------------------------------------------------
class ForegroundGate:
    """``fr-*``: every ``every`` batches of a trainer, its worker threads stop while one round runs
    (the sync in the foreground). Workers wrap each batch in ``with gate.batch():``; the sync thread
    waits for its ``turn`` (``every`` more batches done, or the trainer out of data), which returns
    once no batch is in flight, runs the round, and calls ``resume``."""

    def __init__(self, every: int):
        self.every = every
        self.cond = threading.Condition()
        self.done = 0  # batches finished
        self.due = every  # the count at which the next round is due
        self.active = 0  # batches in flight
        self.pausing = False
        self.finished = False

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    def begin(self) -> None:
        """A batch starts (it waits while a round is due or under way)."""
        with self.cond:
            while self.pausing:
                self.cond.wait()
            self.active += 1

    def end(self) -> None:
        with self.cond:
            self.active -= 1
            self.done += 1
            if self.done >= self.due:  # the k-th batch: no new batch starts until the round ran
                self.pausing = True
            self.cond.notify_all()

    def finish(self) -> None:
        """The trainer is out of data."""
        with self.cond:
            self.finished = True
            self.cond.notify_all()

    def turn(self, stopping: threading.Event) -> None:
        with self.cond:
            while not self.pausing and not self.finished and not stopping.is_set():
                self.cond.wait(0.1)
            self.pausing = True
            while self.active:  # the batches in flight finish first
                self.cond.wait()
            self.due = self.done + self.every

    def resume(self) -> None:
        with self.cond:
            self.pausing = False
            self.cond.notify_all()

    def release(self) -> None:
        """No round will run again (the sync thread ended): batches never wait for one."""
        with self.cond:
            self.every = self.due = float("inf")
            self.pausing = False
            self.cond.notify_all()


class ShadowThread:
    """Loops ``sync.round`` while trainers train (``training()`` says whether this one still does):
    a collective rule until every trainer is out of data (its peers need it in their rounds), the
    central copy (EASGD) until this trainer is. In the background (``shadow-*``) at most
    ``max_per_second`` rounds a second (0: no cap) and using at most ``cpu_share`` of a core (a round
    of c CPU seconds is followed by a rest until c / cpu_share seconds have passed since it began;
    0: no cap); with a ``ForegroundGate`` (``fr-*``) a round every ``every`` batches with the
    workers paused. ``stop()`` (Ctrl-C, an error) ends it after
    the round under way and leaves the rule's collective, so no peer waits for it."""

    def __init__(self, sync: DenseSync, params: Params, training: Callable[[], bool], max_per_second: float = 0.0,
                 name: str = "cadence-shadow", gate: ForegroundGate | None = None,
                 on_error: Callable[[BaseException], None] = lambda err: None,
                 updated: threading.Event | None = None, cpu_share: float = 0.0):
        self.sync, self.params, self.training, self.gate = sync, params, training, gate
        self.cpu_share = cpu_share
        # set by every update of the replica: a background round waits for one (shadow.wait_for_update)
        self.updated = updated
        self.on_error = on_error  # (the trainer abandons its epoch: a replica no longer synced is no ShadowSync)
        self.min_interval = 1.0 / max_per_second if max_per_second > 0 else 0.0
        self.stopping = threading.Event()
        # set when this trainer is out of data (``finish``) or stopped: the rate cap's wait ends then,
        # not 1 / max_per_second later (a cap of 1e-4 a second slept ~3 hours past the data's end)
        self.woken = threading.Event()
        self.syncs = 0
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # CPU time the thread ran (its own clock), rests and waits excluded
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> "ShadowThread":
        self.thread.start()
        return self

    def _loop(self) -> None:
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            while True:
                if self.gate is not None:
                    self.gate.turn(self.stopping)
                else:
                    self._wait_for_update()
                round_start, round_cpu = time.perf_counter(), time.thread_time()
                training = self.training() and not self.stopping.is_set()
                try:
                    still = self.sync.round(self.params, training)
                finally:
                    if self.gate is not None:
                        self.gate.resume()
                self.syncs += 1
                if still == 0 or self.stopping.is_set() or (not training and not self.sync.collective):
                    break
                took = time.perf_counter() - round_start
                wait = self.min_interval - took
                if self.cpu_share > 0:
                    wait = max(wait, (time.thread_time() - round_cpu) / self.cpu_share - took)
                if wait > 0 and training:
                    self.woken.wait(wait)
        except PeerLost as err:  # a peer's process died: this replica trains on, unsynced
            log.warning("%s: %s; this trainer trains on unsynced to the end of the epoch", self.thread.name, err)
        except BaseException as err:  # reported by join(): the trainer fails with it
            self.error = err
            self.on_error(err)
        finally:
            self.seconds = time.perf_counter() - started
            self.cpu_seconds = time.thread_time() - cpu_started
            if self.gate is not None:
                self.gate.release()  # no round will come: no worker may wait for one
            if self.sync.collective:
                self.sync.leave()  # (after the last round every peer is out too: leaving changes nothing)

    def _wait_for_update(self) -> None:
        """Until the replica took an update since the last round (a round with nothing new only takes
        the cores and the interpreter from the worker threads), its trainer stops training, or a stop."""
        if self.updated is None:
            return
        while not self.updated.wait(0.05):
            if self.stopping.is_set() or not self.training():
                return
        self.updated.clear()

    def stop(self) -> None:
        self.stopping.set()
        self.woken.set()

    def finish(self) -> None:
        """This trainer is out of data: no more waiting on the rate cap (a collective rule's rounds
        go on while peers train, uncapped: they only wait for the peers)."""
        self.woken.set()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)
        if self.error is not None:
            raise self.error

    @property
    def syncs_per_second(self) -> float:
        return self.syncs / self.seconds if self.seconds > 0 else 0.0
