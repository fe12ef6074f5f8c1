"""Trainers of ShadowSync and its baselines (SPEC section 5) on the parameter-server runtime.

The embeddings stay on the server shards, one copy, updated Hogwild: every gradient is applied on
arrival, and no pull or push of rows takes a lock (``aggregation.Hogwild``). The dense parameters are one replica per **trainer** (``ps.workers``
trainers), trained Hogwild by its ``shadow.threads`` worker threads (``HogwildWorker``: pull the
batch's rows, compute, apply the dense gradient to the replica at once, push the rows' gradient)
and pulled towards the other replicas by the mode's ``DenseSync``: on a shadow thread in the
background (``shadow-*``), in the foreground every ``shadow.every`` iterations (``fr-*``: by each
worker thread inside its own loop, the paper's FR-EASGD, or with ``shadow.fr_sync: trainer`` once
per k batches of the trainer with its threads paused), or never (``hogwild``).

EASGD's central copy lives on sync servers of its own (``shadow.sync_servers``, the paper's sync
PSs), each holding a slice of the flat dense vector: ``SyncServer`` roles placed in this process
or as Ray actors (processes of their own), reached through their handles, so trainers in threads
and trainers in Ray actors exchange with them alike. MA and BMUF all-reduce among the trainers: a ``ThreadAverager`` for
threads of one process, a gloo group of the shadow thread's own for processes (``GlooAverager``).

Each epoch starts every replica from the run's dense parameters and dense optimizer state, and
ends with the run's dense parameters set to the mean of the replicas (the model that is evaluated
and checkpointed) and its optimizer state to trainer 0's; so a checkpoint resumes exactly what an
unbroken run does at an epoch boundary. ``ShadowTrainer`` is one trainer, the unit a process of
its own holds, the same code on both engines (``ShadowTrainer.run``: a thread of this process per
trainer, ``start_trainers_here``, or a Ray actor per trainer, ``on_ray``). The modes are in
``modes``.
"""

from __future__ import annotations

import copy
import functools
import threading
import time
from typing import Callable

import torch
from torch import Tensor, nn

from cadence.config import OptimizerConfig
from cadence.ps.settings import ParameterServerConfig
from cadence.strategies.shadowsync.settings import ShadowConfig
from cadence.core.batch import on_device
from cadence.core.runtime import OnBatch, WorkerFailed
from cadence.engines.threads import intra_op_share
from cadence.optim import module_optimizer
from cadence.ps.aggregation import Gradient
from cadence.strategies.shadowsync.dense_sync import (RULES, Averager, CentralSlices, DenseSync, ForegroundGate,
                                                            HogwildReplica, ShadowThread, ThreadAverager,
                                                            reset_sync_servers, sync_layout)
from cadence.ps.epoch import EpochPlan, WorkerReport, run_guarded
from cadence.ps.gates import NoGate
from cadence.ps.server import DataList
from cadence.ps.worker import PHASES, Worker, nbytes


def shadow_alpha(shadow: ShadowConfig, trainers: int) -> float:
    """``shadow.alpha``, or its reconstructed default 0.9 / trainers (TF's EASGD moving rate with a
    period of one: the paper gives no value)."""
    return shadow.alpha if shadow.alpha is not None else 0.9 / trainers


def make_rule(shadow: ShadowConfig, trainers: int, rule: str, params: list[Tensor], central: CentralSlices | None,
              averager: Averager | None, training: Callable[[], int]) -> DenseSync:
    """A trainer's ``DenseSync`` for rule ``rule`` (``RULES``: easgd, ma, bmuf) with the ``shadow`` settings."""
    return RULES.get(rule).from_settings(shadow_alpha(shadow, trainers), shadow, params, central, averager, training)


def syncs_per_thread(shadow: ShadowConfig, rule: str) -> bool:
    """``fr-*``: whether each worker thread syncs inside its own loop (``shadow.fr_sync``: thread,
    the default for a rule without a collective) rather than the trainer pausing for one round."""
    if shadow.fr_sync is not None:
        return shadow.fr_sync == "thread"
    return not RULES.get(rule).collective


def shadow_data_list(threads: int, trainers: int, batches, first_token: int, shards: list,
                     dead: list[int]) -> DataList:
    """The epoch's data list of every worker thread (thread n of trainer t is worker t * threads + n):
    any thread takes the next batch, one token a batch, the dead trainers' threads left out."""
    data = DataList(batches, 1, first_token, shards, trainers * threads)
    for index in dead:
        for thread in thread_indices(threads, index):
            data.abandon(thread)
    return data


def thread_indices(threads: int, trainer: int) -> range:
    """The worker indices of trainer ``trainer``'s ``threads`` Hogwild threads."""
    return range(trainer * threads, (trainer + 1) * threads)


def reset_central(servers: list, dense: nn.Module) -> None:
    """EASGD: the central copy on the sync servers starts the epoch from the run's dense parameters."""
    params = [p.detach().cpu() for p in dense.parameters()]
    if servers and params:
        reset_sync_servers(servers, sync_layout(params))  # (the replicas' flat layout)


class TrainerGate(NoGate):
    """The gate of one trainer's worker threads: it knows whether the trainer still trains (a thread
    of it is still taking batches: the shadow thread's ``training``) and, for ``fr-*``, holds each
    batch inside the ``ForegroundGate`` so that a round runs with no batch in flight."""

    stateless = False

    def __init__(self, threads: int, foreground: ForegroundGate | None, on_empty: Callable[[], None] = lambda: None):
        self.foreground, self.on_empty = foreground, on_empty
        self.lock = threading.Lock()
        self.live = threads
        self.inside: set[int] = set()  # workers with a batch in flight (within the foreground gate)
        self.left = threading.Event()  # every thread of the trainer is out of data, or dead

    def wait(self, worker: int, token: int) -> None:
        if self.foreground is not None:
            self.foreground.begin()
            with self.lock:
                self.inside.add(worker)

    def done(self, worker: int) -> None:
        with self.lock:
            inside = worker in self.inside
            self.inside.discard(worker)
        if inside:
            self.foreground.end()

    def leave(self, worker: int) -> None:
        self.done(worker)  # a batch cut short (an error) no longer holds the round back
        with self.lock:
            self.live -= 1
            last = self.live == 0
        if last:
            self.left.set()
            if self.foreground is not None:
                self.foreground.finish()
            self.on_empty()

    def training(self) -> bool:
        return not self.left.is_set()


class HogwildWorker(Worker):
    """A worker thread of a trainer: pulls only its batch's rows (the dense parameters are the
    trainer's replica, shared by its threads), applies the dense gradient to the replica at once and
    pushes the rows' gradient, with no dense part, to the shards."""

    def __init__(self, index: int, router, module: nn.Module, replica: HogwildReplica | None, task,
                 trainer: "ShadowTrainer", slowdown: float = 1.0, emulated_latency: float = 0.0,
                 device: torch.device = torch.device("cpu")):
        super().__init__(index, router, module, task, slowdown, None, emulated_latency, device=device)
        self.replica = replica  # None: the task has no dense parameters
        self.trainer = trainer
        self.iterations = 0  # batches this thread computed (fr-* per thread: a sync every k of them)
        self.syncs = 0  # rounds this thread ran itself (fr-* per thread)

    def fated(self) -> bool:
        return self.trainer.fated()

    def step(self, position, plan, token) -> None:
        started = time.perf_counter()
        batch = self.task.training_batch(plan)
        self.laps.lap("compute")
        rows = self.router.pull(batch.ids)
        self.laps.lap("pull")
        ids = batch.ids
        rows = on_device(batch, rows, self.device)
        rows.requires_grad_(True)
        loss = self.task.train_loss(batch, rows, self.model)
        if self.replica is None:
            (row_grad,) = torch.autograd.grad(loss, [rows], allow_unused=True, materialize_grads=True)
        else:
            dense, (row_grad,) = self.replica.gradients(loss, [rows])
            self.replica.apply(dense)
        batch.ids = ids
        self.bytes_moved += 2 * nbytes(ids) + 2 * nbytes(rows)
        self.delay(time.perf_counter() - started)
        self.laps.lap("compute")
        self.router.push(Gradient(self.index, position, token, plan.size, ids, row_grad.cpu()))
        self.laps.lap("push")
        self.done(batch, loss)
        self.laps.lap("report")
        self.iterations += 1
        rule = self.trainer.thread_rule
        if rule is not None and self.iterations % self.trainer.every == 0:  # fr-* per thread: in its own loop
            rule.round(self.replica.flat, True)
            self.syncs += 1
            self.laps.lap("sync")


class ShadowTrainer:
    """One trainer: its replica (a copy of ``dense`` with a copy of ``optimizer_state``), the gate
    of its worker threads, and its shadow thread (none for ``hogwild``)."""

    def __init__(self, index: int, shadow: ShadowConfig, trainers: int, optimizer_settings: OptimizerConfig, mode,
                 dense: nn.Module, optimizer_state: dict | None, central: CentralSlices | None,
                 averager: Averager | None, training_count: Callable[[], int],
                 device: torch.device = torch.device("cpu"),
                 on_error: Callable[[BaseException], None] = lambda err: None):
        """``trainers``: how many there are (``ps.workers``: EASGD's default alpha divides by it)."""
        self.index, self.threads = index, shadow.threads
        self.module = module = copy.deepcopy(dense).to(device)
        self.optimizer = module_optimizer(optimizer_settings, module, optimizer_state)
        self.replica = HogwildReplica(module, self.optimizer) if self.optimizer is not None else None
        synced = mode.dense_sync is not None and self.replica is not None  # (a task may have no dense part)
        per_thread = synced and mode.foreground and syncs_per_thread(shadow, mode.dense_sync)
        foreground = ForegroundGate(shadow.every) if mode.foreground and synced and not per_thread else None
        self.gate = TrainerGate(shadow.threads, foreground, self._all_left)
        self.workers: list[HogwildWorker] = []
        self.kill_after: int | None = None  # fault injection: batches it pushes before it dies
        self.shadow: ShadowThread | None = None
        self.every = shadow.every
        # fr-* per thread: the rule each worker thread runs every k of its own iterations (no shadow thread)
        self.thread_rule: DenseSync | None = None
        if per_thread:
            self.thread_rule = make_rule(shadow, trainers, mode.dense_sync, self.replica.flat, central, averager,
                                         training_count)
        elif synced:
            rule = make_rule(shadow, trainers, mode.dense_sync, self.replica.flat, central, averager,
                             training_count)
            cap = 0.0 if mode.foreground else shadow.max_syncs_per_second
            self.shadow = ShadowThread(rule, self.replica.flat, self.gate.training, cap,
                                       name=f"cadence-shadow-{index}", gate=foreground, on_error=on_error,
                                       updated=self.replica.updated if shadow.wait_for_update else None,
                                       cpu_share=0.0 if mode.foreground else shadow.cpu_share)

    @property
    def syncs(self) -> int:
        if self.shadow is not None:
            return self.shadow.syncs
        return sum(worker.syncs for worker in self.workers)  # fr-* per thread (0 under hogwild)

    def stop(self) -> None:
        if self.shadow is not None:
            self.shadow.stop()

    def _all_left(self) -> None:
        """Every worker thread is out of data or dead: a dead trainer's shadow thread leaves at once
        (the others' rounds go on without its replica); a finished one syncs on while peers train."""
        if any(worker.died for worker in self.workers) and (self.shadow is None or self.shadow.sync.can_leave):
            self.stop()

    def add_threads(self, router_of: Callable[[int], object], task, plan, device,
                    emulated_latency: float = 0.0) -> list[HogwildWorker]:
        """This trainer's ``shadow.threads`` workers (``router_of(n)``: thread n's router). A trainer
        that ``ps.kill_workers`` kills after k batches dies once its threads pushed k together."""
        self.kill_after = plan.kill_after.get(self.index)
        for n, index in enumerate(thread_indices(self.threads, self.index)):
            self.workers.append(HogwildWorker(index, router_of(n), self.module, self.replica, task, self,
                                              plan.faults.slowdown_in(self.index, plan.epoch), emulated_latency,
                                              device))
        return self.workers

    def fated(self) -> bool:
        """Fault injection: the trainer's process dies once its threads pushed ``kill_after`` batches
        together; each thread dies with the batch it takes next."""
        return self.kill_after is not None and sum(w.pushed for w in self.workers) >= self.kill_after

    def run(self, run_worker: Callable[[HogwildWorker], None], abandon_epoch: Callable[[str], None],
            abandoned: Callable[[], bool] = lambda: False) -> WorkerReport:
        """This trainer's epoch (a thread of this process, or a Ray actor): its threads and shadow
        thread; an error or Ctrl-C, here or (``abandoned``) anywhere in the epoch, stops the shadow
        thread; this trainer's error is raised here. Returns its report."""

        if self.shadow is not None:  # (its errors abandon the epoch: the ``on_error`` it was built with)
            self.shadow.start()
        stopped = True  # unless the threads all finished: an error, or Ctrl-C while joining
        try:
            with intra_op_share(len(self.workers)):
                errors = run_guarded(self.workers, run_worker, abandon_epoch)
            stopped = bool(errors)
        finally:
            if stopped or abandoned():  # no more rounds
                self.stop()
            if self.shadow is not None:
                self.shadow.finish()  # (out of data: its rate cap's wait ends now)
                self.shadow.thread.join()
        if errors:
            index, err = errors[0]
            raise WorkerFailed(f"worker {index} failed: {err!r}; the epoch is abandoned") from err
        self.join_shadow()
        return self.report()

    def join_shadow(self) -> None:
        """Raise the shadow thread's error, if it had one, as the epoch's."""

        if self.shadow is None:
            return
        try:
            self.shadow.join()
        except BaseException as err:
            raise WorkerFailed(f"trainer {self.index}'s shadow thread failed: {err!r}; the epoch is "
                               "abandoned") from err

    @property
    def replica_state(self) -> tuple[dict[str, Tensor], dict | None]:
        return self.module.state_dict(), self.optimizer.state_dict() if self.optimizer is not None else None

    def report(self) -> WorkerReport:
        """What this trainer did in the epoch, its replica included (the run keeps their mean)."""
        mine = self.workers
        return WorkerReport(self.index, sum(w.loss_total for w in mine), sum(w.examples_done for w in mine),
                            sum(w.pushed for w in mine), any(w.died for w in mine),  # (one process)
                            bytes_moved=sum(w.bytes_moved for w in mine),
                            seconds={phase: sum(w.laps.seconds[phase] for w in mine) for phase in PHASES},
                            batches=[item for w in mine for item in w.finished],
                            replica=self.replica_state, syncs=self.syncs,
                            shadow_cpu_seconds=self.shadow.cpu_seconds if self.shadow is not None else 0.0)


def mean_state(states: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The mean of the replicas' state dicts (parameters and floating buffers): the run's dense model
    at an epoch's end."""
    if len(states) == 1:
        return {name: value.detach().clone() for name, value in states[0].items()}
    mean = {}
    for name, value in states[0].items():
        if value.is_floating_point():
            mean[name] = torch.stack([state[name] for state in states]).mean(0)
        else:
            mean[name] = value.clone()
    return mean


class TrainerGroup:
    """The trainers of one epoch in this process (the thread engine): the sync rules' shared parts
    (EASGD's central copy on the sync servers, the MA/BMUF all-reduce), every trainer's threads and
    shadow thread."""

    def __init__(self, shadow: ShadowConfig, ps: ParameterServerConfig, optimizer_settings: OptimizerConfig, mode,
                 dense: nn.Module, optimizer: torch.optim.Optimizer | None, live: list[int], sync_servers: list,
                 device: torch.device = torch.device("cpu"),
                 on_error: Callable[[BaseException], None] = lambda err: None):
        self.emulated_latency, self.mode = ps.emulated_latency, mode
        state = optimizer.state_dict() if optimizer is not None else None
        reset_central(sync_servers, dense)
        central = CentralSlices(sync_servers) if mode.central else None
        averager = ThreadAverager(len(live)) if mode.collective else None
        self.trainers = [ShadowTrainer(index, shadow, ps.workers, optimizer_settings, mode, dense, state, central,
                                       averager.member(n) if averager is not None else None, self.training_count,
                                       device, on_error)
                         for n, index in enumerate(live)]

    def training_count(self) -> int:
        return sum(1 for trainer in self.trainers if trainer.gate.training())

    def workers(self, router, task, plan, device) -> list[HogwildWorker]:
        """Every trainer's worker threads, all on one router (the shards are objects of this process)."""
        return [worker for trainer in self.trainers
                for worker in trainer.add_threads(lambda n: router, task, plan, device, self.emulated_latency)]


def start_trainers_here(engine, plan: EpochPlan, plans: list, on_batch: OnBatch) -> dict:
    """One epoch of ShadowSync trainers as threads of this process (the thread engine): a thread per
    trainer runs ``ShadowTrainer.run``, as a trainer actor does; its worker threads take from the
    coordinator's data list in this process and report each batch live. {pending: trainer index}."""
    settings, coordinator = engine.settings, engine.coordinator
    coordinator.begin(plans, plan.first_token, plan.dead, plan.workers)  # (the trainers gate their own threads)
    data = coordinator.data
    group = TrainerGroup(settings.own, settings.ps, settings.optimizer, engine.mode, engine.dense,
                         engine.dense_optimizer, plan.workers, engine.sync_servers, engine.device,
                         on_error=lambda err: coordinator.stop(f"a shadow thread failed: {err!r}"))
    for worker in group.workers(engine.router, engine.task, plan, engine.device):
        worker.on_batch = on_batch

    def run(trainer: ShadowTrainer) -> WorkerReport:
        return trainer.run(lambda worker: worker.run(data, trainer.gate), coordinator.stop, lambda: data.stopped)

    with intra_op_share(len(group.trainers)):  # (each trainer's threads share its part again)
        return {engine.threads.run(functools.partial(run, trainer), f"cadence-trainer-{trainer.index}"): trainer.index
                for trainer in group.trainers}
