"""Workers of the parameter-server runtime: pull, compute, push (GBA, SPEC section 3).

A worker repeatedly takes (batch plan, token) from the data list, waits at its mode's gate, pulls
the dense parameters and the rows of the batch's keys, computes the gradient of the task's loss of
the batch, and pushes (gradient, token) to every shard without waiting for it to be applied. The
worker knows no task: ``task.prepare`` and ``task.loss`` are the only task-specific calls.
Fault injection for experiments: a straggler sleeps between its pull and its push so that each
batch takes ``slowdown`` times as long and its gradient is as stale as a slow machine's would be; a
killed worker takes one more batch and dies with it (its batch and token are dropped).
"""

from __future__ import annotations

import time
from typing import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn

from cadence.errors import ConfigError
from cadence.optim import row_gradient
from cadence.core.batch import Batch, BatchPlan, on_device
from cadence.ps.aggregation import Gradient
from cadence.ps.gates import NoGate
from cadence.ps.server import Aborted, DataList, ServerShard


class ShardRouter:
    """Routes feature keys to shards (key % shards); shard 0 holds the dense parameters. A batch's
    calls to the shards go out together (``submit``) and are then collected: with remote shards
    the round trips overlap."""

    def __init__(self, shards: list):
        self.shards = shards
        self.width = shards[0].width
        # defer: a push waits for this worker's next pull and rides on it (one call per shard instead
        # of two; the order push-then-pull is kept). Only where no one waits for the push meanwhile.
        self.defer = False
        self.deferred: list | None = None  # per shard: the part of the last gradient not yet sent

    def owner(self, keys: Tensor) -> Tensor:
        return keys.remainder(len(self.shards))

    def pull(self, keys: Tensor, create: bool = True, dense: bool = False, after: int | None = None):
        """Rows of ``keys`` (unseen keys are added unless ``create`` is False: evaluation), and with
        ``dense`` also shard 0's dense parameters and global step, in the same round trip; with
        ``after``, each shard's once it has applied that many global steps (a step's barrier)."""
        verb = ServerShard.pull_rows if create else ServerShard.peek_rows
        parts, self.deferred = self.deferred, None
        single = len(self.shards) == 1
        owner = None if single else self.owner(keys)
        calls = []
        for index, shard in enumerate(self.shards):
            mine = slice(None) if single else (owner == index).nonzero().squeeze(1)
            with_dense = dense and index == 0  # the dense parameters ride along with shard 0's rows
            part = parts[index] if parts is not None else None
            if part is not None:
                calls.append((mine, shard.submit(ServerShard.push_then_pull, part, keys[mine], with_dense, after)))
            elif with_dense:
                calls.append((mine, shard.submit(ServerShard.pull_with_dense, keys[mine], after)))
            elif after is not None:  # (every shard: the barrier is every shard's)
                calls.append((mine, shard.submit(verb, keys[mine], after)))
            elif single or mine.numel():
                calls.append((mine, shard.submit(verb, keys[mine])))
        if single:
            return calls[0][1].result()
        rows = torch.empty(keys.shape[0], self.width)
        dense_state = None
        for mine, call in calls:
            result = call.result()
            if isinstance(result, tuple):
                result, dense_state = result
            rows[mine] = result
        return (rows, dense_state) if dense else rows

    def pull_rows(self, keys: Tensor, create: bool = True) -> Tensor:
        return self.pull(keys, create)

    def push(self, gradient: Gradient) -> None:
        """Split a batch's gradient by owner; every shard sees every batch, so tokens stay aligned."""
        if len(self.shards) == 1:
            parts = [gradient]
        else:
            owner = self.owner(gradient.keys)
            parts = []
            for index in range(len(self.shards)):
                mine = (owner == index).nonzero().squeeze(1)
                parts.append(replace(gradient, keys=gradient.keys[mine], rows=gradient.rows[mine],
                                     dense=gradient.dense if index == 0 else None))
        self.flush()
        if self.defer:
            self.deferred = parts
            return
        for shard, part in zip(self.shards, parts):
            shard.push(part)

    def flush(self) -> None:
        """Send a deferred push now (the end of the data, a worker's death)."""
        parts, self.deferred = self.deferred, None
        for shard, part in zip(self.shards, parts or ()):
            shard.push(part)

    def drop(self, token: int, batch: int | None = None) -> None:
        for shard in self.shards:
            shard.drop(token, batch)


@dataclass(frozen=True)
class Faults:
    slowdown: dict[int, float]  # worker -> factor
    kill_after: dict[int, int]  # worker -> batches pushed before it dies
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)  # worker -> slowed epochs (1-based, inclusive)

    @classmethod
    def parse(cls, stragglers: list[str], kills: list[str], workers: int) -> "Faults":
        windows, plain = {}, []
        for item in stragglers:  # "WORKER:SLOWDOWN@FIRST-LAST": a transient straggler, slowed in those epochs
            text, _, window = str(item).partition("@")
            plain.append(text)
            if not window:
                continue
            try:
                first, last = (int(part) for part in window.split("-"))
            except ValueError:
                raise ConfigError(f"ps.stragglers: {item!r}: the window must be @FIRST-LAST epochs") from None
            if not 1 <= first <= last:
                raise ConfigError(f"ps.stragglers: {item!r}: the window must satisfy 1 <= FIRST <= LAST")
            windows[text] = (first, last)
        slowdown = _parse(plain, "ps.stragglers", float, workers, minimum=1.0)
        windows = {int(text.split(":")[0]): window for text, window in windows.items()}  # (valid: parsed above)
        return cls(slowdown, _parse(kills, "ps.kill_workers", int, workers, minimum=0), windows)

    def slowdown_in(self, worker: int, epoch: int) -> float:
        """The worker's slowdown in ``epoch`` (0-based), outside a transient straggler's window 1."""
        window = self.windows.get(worker)
        if window is not None and not window[0] <= epoch + 1 <= window[1]:
            return 1.0
        return self.slowdown.get(worker, 1.0)


def _parse(items: list[str], key: str, kind: type, workers: int, minimum: float) -> dict:
    parsed = {}
    for item in items:
        try:
            worker_text, value_text = str(item).split(":")
            worker, value = int(worker_text), kind(value_text)
        except ValueError:
            raise ConfigError(f"{key}: {item!r} is not WORKER:{'SLOWDOWN' if kind is float else 'AFTER_STEPS'}") from None
        if not 0 <= worker < workers:
            raise ConfigError(f"{key}: worker {worker} does not exist (workers 0..{workers - 1})")
        if value < minimum:
            raise ConfigError(f"{key}: {item!r}: the value must be at least {minimum:g}")
        parsed[worker] = value
    return parsed


# Where a worker's time goes, phase by phase (summary.json's ``worker_seconds``, summed over the
# workers): taking a batch, waiting at its gate, pulling (a step's barrier included), computing
# (a straggler's slowdown included), pushing, all-reducing dense gradients (``ps.dense: workers``),
# reporting the batch, and syncing a replica (ShadowSync's foreground rounds)
PHASES = ("take", "gate", "pull", "compute", "push", "reduce", "report", "sync")


class Laps:
    """A stopwatch over ``PHASES``: ``lap(phase)`` adds the time since the last lap to ``phase``."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.last = time.perf_counter()

    def restart(self) -> None:
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self.last
        self.last = now


class Worker:
    """One parameter-server worker of any task: ``task.prepare`` a plan, pull its rows and the dense
    parameters, ``task.loss``, backward, push (gradient, token)."""

    def __init__(self, index: int, router: ShardRouter, model: nn.Module, task,
                 slowdown: float = 1.0, kill_after: int | None = None, emulated_latency: float = 0.0,
                 reducer=None, dense_optimizer: torch.optim.Optimizer | None = None,
                 device: torch.device = torch.device("cpu")):
        self.index = index
        self.router = router
        self.device = device  # where the batch is computed: rows and inputs go there, gradients come back
        self.model = model.to(device)  # a replica: overwritten by every pull, or (``reducer``) the worker's own
        self.reducer = reducer  # ps.dense: workers: dense gradients are all-reduced, not pushed
        self.dense_optimizer = dense_optimizer
        self.task = task
        self.slowdown = slowdown
        self.kill_after = kill_after
        self.emulated_latency = emulated_latency
        self.pushed = 0
        self.examples_done = 0
        self.loss_total = 0.0  # the epoch's summed loss (``task.loss_total`` of each batch)
        self.bytes_moved = 0  # tensor bytes pulled and pushed (keys, rows, dense parameters, gradients)
        self.died = False
        self.on_batch: Callable[[Batch], None] | None = None  # called for each finished batch (threads)
        self.finished: list[tuple[int, float]] = []  # (plan index, loss) of each finished batch, without on_batch
        self.pull_after: Callable[[int], int | None] = NoGate().pull_after  # the gate's (``run``): a pull's barrier
        self.laps = Laps()  # where its time went (``PHASES``)

    def run(self, data: DataList, gate: NoGate) -> None:
        self.pull_after = gate.pull_after  # (what a pull of a batch of a token waits for: a step's barrier)
        if self.reducer is not None:
            return self._run_with_dense_here(data, gate)
        laps = self.laps
        laps.restart()
        try:
            while (item := data.take(self.index)) is not None:
                laps.lap("take")
                position, plan, token = item
                if self.fated():
                    self.died = True
                    self.router.flush()  # what it pushed before stays pushed
                    self.router.drop(token)  # the batch and its token are lost with the worker
                    data.abandon(self.index)
                    return
                gate.wait(self.index, token)
                laps.lap("gate")
                self.step(position, plan, token)
                self.pushed += 1
                self.examples_done += plan.size
                gate.done(self.index)
                laps.lap("gate")
            laps.lap("take")  # (the take that found the data list empty)
            self.router.flush()
            laps.lap("push")
        except Aborted:  # another worker failed and the epoch is abandoned: the engine reports why
            return
        finally:
            gate.leave(self.index)

    def _run_with_dense_here(self, data: DataList, gate: NoGate) -> None:
        """PERSIA's split: rounds of one batch (or none, once the data ran out) per live worker; the
        rows go to the servers as usual, the dense gradients are all-reduced and every replica takes
        the same optimizer step; the epoch ends with a round in which no worker had a batch."""
        laps = self.laps
        laps.restart()
        try:
            while True:
                item = data.take(self.index)
                laps.lap("take")
                gradients = None
                if item is not None:
                    position, plan, token = item
                    if self.fated():
                        self.died = True
                        self.router.drop(token)
                        data.abandon(self.index)
                        return
                    gate.wait(self.index, token)
                    laps.lap("gate")
                    gradients = self.step(position, plan, token)
                total, count = self.reducer.allreduce(self.index, gradients)
                laps.lap("reduce")
                if count == 0:
                    return
                self.bytes_moved += 2 * nbytes(total)  # an all-reduce moves about twice the gradients
                for name, parameter in self.model.named_parameters():
                    parameter.grad = total[name].div(count).to(self.device)
                if self.dense_optimizer is not None:
                    self.dense_optimizer.step()
                self.model.zero_grad(set_to_none=True)
                laps.lap("compute")
                if item is not None:
                    self.pushed += 1
                    self.examples_done += plan.size
                    gate.done(self.index)
                    laps.lap("gate")
        except Aborted:
            return
        finally:
            gate.leave(self.index)
            self.reducer.leave(self.index)

    def fated(self) -> bool:
        """Fault injection: this worker dies with the batch it just took."""
        return self.kill_after is not None and self.pushed >= self.kill_after

    def step(self, position: int, plan: BatchPlan, token: int) -> dict[str, Tensor] | None:
        """One batch: pull (once the shards have applied the global steps the gate asks for:
        ``pull_after``), compute, push the rows' gradient (and the dense one, unless the dense
        parameters live here: then they are returned for the all-reduce)."""
        started = time.perf_counter()
        after = self.pull_after(token)
        batch = self.task.training_batch(plan)
        self.laps.lap("compute")
        if self.reducer is None:
            rows, (dense_state, pulled_step) = self.router.pull(batch.ids, dense=True, after=after)
            self.model.load_state_dict(dense_state)
        else:
            rows, dense_state, pulled_step = self.router.pull(batch.ids, after=after), None, None
        self.laps.lap("pull")
        ids = batch.ids  # pushed from the host
        rows = on_device(batch, rows, self.device)
        rows.requires_grad_(True)
        self.model.zero_grad(set_to_none=True)
        loss = self.task.train_loss(batch, rows, self.model)
        loss.backward()
        dense = {name: (p.grad.detach() if p.grad is not None else torch.zeros_like(p)).to("cpu", copy=True)
                 for name, p in self.model.named_parameters()}
        batch.ids = ids
        here = self.reducer is not None  # (then the dense gradients travel in the all-reduce instead)
        self.bytes_moved += 2 * nbytes(batch.ids) + 2 * nbytes(rows) + nbytes(dense_state) + (0 if here else nbytes(dense))
        self.delay(time.perf_counter() - started)  # between pull and push: the gradient goes stale
        self.laps.lap("compute")
        self.router.push(Gradient(self.index, position, token, plan.size, batch.ids, row_gradient(rows).cpu(),
                                  None if here else dense, pulled_step))
        self.laps.lap("push")
        self.done(batch, loss)
        self.laps.lap("report")
        return dense if here else None

    def done(self, batch: Batch, loss: Tensor) -> None:
        """The batch is pushed: its loss counted, and the batch reported to ``on_batch`` here, or (a
        worker in another process, where ``on_batch`` is None) kept in ``finished`` for the driver."""
        batch.loss = loss.detach()
        value = float(batch.loss)
        self.loss_total += self.task.loss_total(value, batch.size)
        if self.on_batch is not None:
            self.on_batch(batch)
        else:
            self.finished.append((batch.plan.index, value))

    def delay(self, elapsed: float) -> None:
        """Fault injection: an emulated machine of its own adds ``emulated_latency`` to each batch,
        and a straggler's batch takes ``slowdown`` times as long as that total; both while the worker
        holds pulled parameters, so the server moves on meanwhile and the gradient it pushes is
        stale, as a real straggler's is."""
        pause = self.emulated_latency * self.slowdown + elapsed * (self.slowdown - 1.0)
        if pause > 0:
            time.sleep(pause)


def nbytes(value) -> int:
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    return 0
