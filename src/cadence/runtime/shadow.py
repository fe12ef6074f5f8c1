"""Trainers of ShadowSync and its baselines (SPEC section 5) on the parameter-server runtime.

The embeddings stay on the server shards, one copy, updated Hogwild: every gradient is applied on
arrival (``ApplyEach``). The dense parameters are one replica per **trainer** (``ps.workers``
trainers), trained Hogwild by its ``shadow.threads`` worker threads (``HogwildWorker``: pull the
batch's rows, compute, apply the dense gradient to the replica at once, push the rows' gradient)
and pulled towards the other replicas by the mode's ``DenseSync``: on a shadow thread in the
background (``shadow-*``), in the foreground every ``shadow.every`` batches (``fr-*``), or never
(``hogwild``).

Each epoch starts every replica from the run's dense parameters and dense optimizer state, and
ends with the run's dense parameters set to the mean of the replicas (the model that is evaluated
and checkpointed) and its optimizer state to trainer 0's; so a checkpoint resumes exactly what an
unbroken run does at an epoch boundary. ``ShadowTrainer`` is one trainer, the unit a process of
its own would hold; ``run_trainers`` runs an epoch of trainers as threads of this process.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Callable

import torch
from torch import Tensor, nn

from cadence.runtime.aggregation import Gradient
from cadence.runtime.dense_sync import (RULES, Averager, Bmuf, CentralCopy, DenseSync, Easgd, ForegroundGate,
                                        HogwildReplica, ModelAverage, ShadowThread, ThreadAverager)
from cadence.runtime.gates import NoGate
from cadence.runtime.server import DataList
from cadence.runtime.worker import Worker, _nbytes


def shadow_alpha(config) -> float:
    """``shadow.alpha``, or its reconstructed default 0.9 / trainers (TF's EASGD moving rate with a
    period of one: the paper gives no value)."""
    alpha = config.shadow.alpha
    return alpha if alpha is not None else 0.9 / config.ps.workers


def make_rule(config, rule: str, params: list[Tensor], central: CentralCopy | None, averager: Averager | None,
              training: Callable[[], int]) -> DenseSync:
    """Trainer's ``DenseSync`` for rule ``easgd``, ``ma`` or ``bmuf`` with the ``shadow`` settings."""
    alpha, shadow = shadow_alpha(config), config.shadow
    RULES.get(rule)  # (a rule this function does not know is a bug: fail loudly below)
    if rule == "easgd":
        return Easgd(alpha, central, training)
    if rule == "ma":
        return ModelAverage(alpha, averager)
    if rule == "bmuf":
        return Bmuf(alpha, averager, params, shadow.block_lr, shadow.block_momentum, shadow.nesterov)
    raise AssertionError(f"no dense sync rule {rule!r}")


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
                 kill_after: int | None = None, slowdown: float = 1.0, emulated_latency: float = 0.0,
                 device: torch.device = torch.device("cpu")):
        super().__init__(index, router, module, task, slowdown, kill_after, emulated_latency, device=device)
        self.replica = replica  # None: the task has no dense parameters

    def step(self, position, plan, token) -> None:
        started = time.perf_counter()
        batch = self.task.prepare(plan)
        rows = self.router.pull(batch.ids)
        ids = batch.ids
        if self.device.type != "cpu":
            rows = rows.to(self.device)
            batch.ids = batch.ids.to(self.device)
            batch.inputs = {name: value.to(self.device) for name, value in batch.inputs.items()}
        rows.requires_grad_(True)
        loss = self.task.loss(batch, rows, self.model)
        if self.replica is None:
            (row_grad,) = torch.autograd.grad(loss, [rows])
        else:
            dense, (row_grad,) = self.replica.gradients(loss, [rows])
            self.replica.apply(dense)
        self.loss_total += self.task.loss_total(float(loss.detach()), plan.size)
        batch.ids = ids
        self.bytes_moved += 2 * _nbytes(ids) + 2 * _nbytes(rows)
        self.delay(time.perf_counter() - started)
        self.router.push(Gradient(self.index, position, token, plan.size, ids, row_grad.cpu()))


class ShadowTrainer:
    """One trainer: its replica (a copy of ``dense`` with a copy of ``optimizer_state``), the gate
    of its worker threads, and its shadow thread (none for ``hogwild``)."""

    def __init__(self, index: int, config, mode, dense: nn.Module, optimizer_state: dict | None,
                 central: CentralCopy | None, averager: Averager | None, training_count: Callable[[], int],
                 device: torch.device = torch.device("cpu"),
                 on_error: Callable[[BaseException], None] = lambda err: None):
        from cadence.runtime.engines import replica_optimizer

        self.index = index
        self.module = module = copy.deepcopy(dense).to(device)
        self.optimizer = replica_optimizer(config, module, optimizer_state)
        self.replica = HogwildReplica(module, self.optimizer) if self.optimizer is not None else None
        shadow = config.shadow
        synced = mode.dense_sync is not None and self.replica is not None  # (a task may have no dense part)
        foreground = ForegroundGate(shadow.every) if mode.foreground and synced else None
        self.gate = TrainerGate(shadow.threads, foreground, self._all_left)
        self.workers: list[HogwildWorker] = []
        self.shadow: ShadowThread | None = None
        if synced:
            rule = make_rule(config, mode.dense_sync, self.replica.params, central, averager, training_count)
            cap = 0.0 if mode.foreground else shadow.max_syncs_per_second
            self.shadow = ShadowThread(rule, self.replica.params, self.gate.training, cap,
                                       name=f"cadence-shadow-{index}", gate=foreground, on_error=on_error)

    @property
    def syncs(self) -> int:
        return self.shadow.syncs if self.shadow is not None else 0

    def stop(self) -> None:
        if self.shadow is not None:
            self.shadow.stop()

    def _all_left(self) -> None:
        """Every worker thread is out of data or dead: a dead trainer's shadow thread leaves at once
        (the others' rounds go on without its replica); a finished one syncs on while peers train."""
        if any(worker.died for worker in self.workers):
            self.stop()

    def add_worker(self, worker: HogwildWorker) -> HogwildWorker:
        self.workers.append(worker)
        return worker

    def report(self):
        from cadence.runtime.engines import WorkerReport

        mine = self.workers
        return WorkerReport(self.index, sum(w.loss_total for w in mine), sum(w.examples_done for w in mine),
                            sum(w.pushed for w in mine), bool(mine) and all(w.died for w in mine),
                            bytes_moved=sum(w.bytes_moved for w in mine))


def mean_state(modules: list[nn.Module]) -> dict[str, Tensor]:
    """The mean of the replicas' parameters (and buffers): the run's dense model at an epoch's end."""
    states = [module.state_dict() for module in modules]
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
    (EASGD's central copy, the MA/BMUF all-reduce), every trainer's threads and shadow thread."""

    def __init__(self, config, mode, dense: nn.Module, optimizer: torch.optim.Optimizer | None,
                 live: list[int], device: torch.device = torch.device("cpu"),
                 on_error: Callable[[BaseException], None] = lambda err: None):
        self.config, self.mode = config, mode
        state = optimizer.state_dict() if optimizer is not None else None
        params = [p.detach().to(device) for p in dense.parameters()]
        central = CentralCopy(params) if mode.dense_sync == "easgd" and params else None
        averager = ThreadAverager(len(live)) if mode.dense_sync in ("ma", "bmuf") else None
        self.trainers = [ShadowTrainer(index, config, mode, dense, state, central,
                                       averager.member(n) if averager is not None else None, self.training_count,
                                       device, on_error)
                         for n, index in enumerate(live)]

    def training_count(self) -> int:
        return sum(1 for trainer in self.trainers if trainer.gate.training())

    def workers(self, router, task, plan, device) -> list[HogwildWorker]:
        """Each trainer's ``shadow.threads`` workers (worker n of trainer t is data-list worker
        t * threads + n). A trainer that ``ps.kill_workers`` kills after k batches loses each of
        its threads after k / threads of theirs (at least one each, unless k is 0)."""
        threads, workers = self.config.shadow.threads, []
        for trainer in self.trainers:
            kill = plan.kill_after.get(trainer.index)
            per_thread = None if kill is None else (max(1, kill // threads) if kill else 0)
            for n in range(threads):
                workers.append(trainer.add_worker(HogwildWorker(
                    trainer.index * threads + n, router, trainer.module, trainer.replica, task, per_thread,
                    plan.faults.slowdown_in(trainer.index, plan.epoch), self.config.ps.emulated_latency, device)))
        return workers


def run_trainers(engine, plan, plans) -> list:
    """One epoch of ShadowSync trainers as threads of this process; returns one ``WorkerReport`` per
    trainer. On an error or Ctrl-C every worker is released, every shadow thread stopped and joined
    (a collective round completes or is left), and the error raised here."""
    from cadence.runtime.engines import WorkerFailed, abandon, run_guarded

    config, threads = engine.config, engine.config.shadow.threads
    data = DataList(plans, 1, plan.first_token, engine.shards, config.ps.workers * threads)
    for index in plan.dead:
        for n in range(threads):
            data.abandon(index * threads + n)
    group = TrainerGroup(config, engine.mode, engine.dense, engine.dense_optimizer, plan.workers, engine.device,
                         on_error=lambda err: abandon(data, f"a shadow thread failed: {err!r}"))
    workers = group.workers(engine.router, engine.task, plan, engine.device)
    gates = {worker.index: trainer.gate for trainer in group.trainers for worker in trainer.workers}
    shadows = [trainer.shadow for trainer in group.trainers if trainer.shadow is not None]
    intra_op = torch.get_num_threads()
    # each worker thread gets an equal share of the cores (one when the threads outnumber them)
    torch.set_num_threads(max(1, intra_op // len(workers)))
    for shadow in shadows:
        shadow.start()
    try:
        errors = run_guarded(workers, lambda worker: gates[worker.index], data)
    except BaseException:  # Ctrl-C while joining: release every worker, then let it through
        abandon(data, "interrupted")
        raise
    finally:
        for trainer in group.trainers:
            if data.stopped:  # an error or an interruption: no more rounds
                trainer.stop()
        for shadow in shadows:
            shadow.thread.join()
        torch.set_num_threads(intra_op)
    if errors:
        index, err = errors[0]
        raise WorkerFailed(f"worker {index} failed: {err!r}; the epoch is abandoned") from err
    for trainer in group.trainers:
        try:
            if trainer.shadow is not None:
                trainer.shadow.join()
        except BaseException as err:  # an error of a shadow thread fails the epoch
            raise WorkerFailed(f"trainer {trainer.index}'s shadow thread failed: {err!r}; the epoch is "
                               "abandoned") from err
    engine.dense.load_state_dict(mean_state([trainer.module for trainer in group.trainers]))
    if engine.dense_optimizer is not None:
        engine.dense_optimizer.load_state_dict(group.trainers[0].optimizer.state_dict())
    engine.syncs += sum(trainer.syncs for trainer in group.trainers)
    return [trainer.report() for trainer in group.trainers]
