"""pdASGD (SPEC section 4, seed 003): the forward and backward passes in separate threads, with
layer-wise lock-free updates.

    forward thread:  load batch t (rows from the store), forward with the current shared weights
                     -> hand the graph to a free backward thread -> load batch t + 1, ...
    backward thread (K of them): backward through the graph; ``pdasgd``: each parameter is updated
                     the moment its gradient exists (layer-wise, LU); ``pdasgd-bu``: all of them
                     after the whole pass (block updates, the seed's ablation); then the batch's
                     rows: the entity optimizer's step from this batch's row gradients, applied
                     to the rows as they are in the store now, written back

Shared weights, graphs in flight. Each batch's forward runs on aliases of the shared parameters
(``p.data``: the same storage, a version counter of their own) made leaves for that batch, so each
graph accumulates its own gradients (no thread sees another's ``.grad``) and each update is written
through ``.data`` by ``cadence.optim.InPlaceDense`` without a lock. A graph therefore reads, in its
backward pass, whatever the weights are by then (the seed: the backward graph "holds pointers to
the most up-to-date version of the global parameters"), and autograd's version check is never
tripped. Updates to the same parameter from two backward threads race the Hogwild way.

Staleness, per parameter: the number of updates it received between the forward that read it and
the update this batch makes to it (``layer_staleness`` in summary.json; 0 for every update of a
sequential run).

Streams (CUDA). Each backward thread owns a CUDA stream, and the forward of the batch handed to
it runs on that stream too: autograd runs each backward op on the stream of its forward op, so a
graph's forward and backward share one stream, and the next batch's forward, on another thread's
stream, overlaps them on the device. The stream orders the hand-over (no event is needed between
forward and backward); the upload's and the write's events order the rest (``pipeline.transfer``).
Dense updates from one stream and reads from another race on the device as they do on the CPU
(Hogwild).

Threads and the interpreter. torch's kernels release the GIL, so a forward and K backward passes
overlap where the time is in kernels (matrix products, convolutions); the Python between kernels
(module calls, autograd's bookkeeping, the hooks) holds it and runs one thread at a time. Each
pdASGD thread pins its own intra-op (OpenMP) threads (``pdasgd.intra_op_threads``, default 1), so
K + 1 threads do not start K + 1 teams of all cores each. docs/strategies/pdasgd.md measures both.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
import time

from typing import Callable

import torch
from torch import Tensor, nn

from cadence.engines import cgroups
from cadence.engines.threads import ThreadGroup, intra_op_threads
from cadence.errors import ConfigError
from cadence.optim import InPlaceDense, row_gradient
from cadence.strategies.pipelined.settings import PdasgdConfig
from cadence.core.batch import Batch, BatchPlan
from cadence.core.strategy import Contract
from cadence.pipeline.stages import ComputeStage, Stages
from cadence.core.rows import RowBlock
from cadence.strategies.pipelined.base import SCHEDULES, Schedule

_POLL = 0.05  # seconds between checks of the stop flag while blocked
STOP_GRACE = 10.0  # seconds the backward threads get to finish the pass they are in after a stop


class _LossOf(nn.Module):
    """The task's loss as a module whose only submodule is the dense module, so that
    ``torch.func.functional_call`` can run it on a batch's aliases of the shared parameters."""

    def __init__(self, task, dense: nn.Module):
        super().__init__()
        self.task, self.dense = task, dense

    def forward(self, batch: Batch, rows: Tensor) -> Tensor:
        return self.task.train_loss(batch, rows, self.dense)


class Staleness:
    """Per parameter: updates counted so far (its version), and the staleness of each update."""

    def __init__(self, names: list[str]):
        self.names = names
        self.versions = [0] * len(names)
        self.total = [0] * len(names)
        self.most = [0] * len(names)
        self.updates = [0] * len(names)
        self.lock = threading.Lock()  # the bookkeeping only; the weights are updated without it

    def read(self) -> list[int]:
        return list(self.versions)

    def update(self, index: int, seen: int) -> None:
        with self.lock:
            stale = self.versions[index] - seen
            self.versions[index] += 1
            self.total[index] += stale
            self.most[index] = max(self.most[index], stale)
            self.updates[index] += 1

    def stats(self) -> dict:
        updates = sum(self.updates)
        return {
            "staleness_mean": round(sum(self.total) / updates, 4) if updates else 0.0,
            "staleness_max": max(self.most, default=0),
            "layer_staleness": {name: round(total / count, 4) if count else 0.0
                                for name, total, count in zip(self.names, self.total, self.updates)},
            "layer_updates": dict(zip(self.names, self.updates)),
        }


class _InFlight:
    """One batch between its forward and the end of its backward."""

    __slots__ = ("batch", "rows", "loss", "leaves", "seen", "done")

    def __init__(self, batch: Batch, rows: Tensor, loss: Tensor, leaves: list[Tensor], seen: list[int]):
        self.batch, self.rows, self.loss, self.leaves, self.seen = batch, rows, loss, leaves, seen
        self.done = threading.Event()


@SCHEDULES.register("pdasgd")
class Pdasgd(Schedule):
    layerwise = True  # LU; ``pdasgd-bu``: False

    section = "pdasgd"  # PdasgdConfig
    reads = ("pdasgd",)
    governed = False  # each forward and backward thread pins its own intra-op threads (pdasgd.intra_op_threads)
    # K backward threads; one backward thread with a barrier after each batch is sync
    contract = Contract(("pdasgd.backward_threads=2",), ("pdasgd.backward_threads=1", "pdasgd.barrier=true"))

    def __init__(self, settings: PdasgdConfig):
        super().__init__(settings)
        self.next_timestamp = 0
        self.staleness: Staleness | None = None
        self.busy = {"forward_busy_seconds": 0.0, "backward_busy_seconds": 0.0}
        self.streams: list = []  # CUDA: backward thread i's stream (the process's ``side-i`` stream)
        # pdasgd.slow_thread: that thread's last quota (its CPU rate measured unslowed, or the probe so
        # far, goes on in the next epoch) and what its quotas throttled, summed over epochs
        self.slow_quota: cgroups.CpuQuota | None = None
        self.throttled_seconds = 0.0

    def _streams(self, stages: Stages, threads: int) -> list:
        if len(self.streams) != threads:
            self.streams = [stages.link.side_stream(index) for index in range(threads)]
        return self.streams

    # ---- the epoch ------------------------------------------------------------------------------
    def run_epoch(self, plans: list[BatchPlan], stages: Stages, on_batch: Callable[[Batch], None]) -> None:
        compute = stages.compute
        assert isinstance(compute, ComputeStage), "pdASGD computes through autograd (no task updates in place under it)"
        names = [name for name, _ in compute.dense.named_parameters()]
        params = [param for _, param in compute.dense.named_parameters()]
        if self.staleness is None or self.staleness.names != names:
            self.staleness = Staleness(names)
        rule = InPlaceDense(compute.dense_optimizer, params) if compute.dense_optimizer is not None else None
        model = _LossOf(compute.task, compute.dense)
        threads = self.settings.backward_threads
        handoff: list[queue.Queue] = [queue.Queue() for _ in range(threads)]  # each backward thread's graphs
        free: queue.Queue = queue.Queue()  # backward threads without a graph, by index
        for index in range(threads):
            free.put(index)
        streams = self._streams(stages, threads)  # CUDA: one per backward thread (None on the CPU)
        stop, finished = threading.Event(), threading.Lock()
        group = ThreadGroup()
        if self.settings.slow_thread >= 0 and (why := cgroups.unavailable()) is not None:
            raise ConfigError(f"pdasgd.slow_thread: slowing a backward thread takes a CPU quota on it: {why}")

        def backward_thread(index: int) -> None:
            with intra_op_threads(self.settings.intra_op_threads), self._slowed(index):
                while not stop.is_set():
                    try:
                        item = handoff[index].get(timeout=_POLL)
                    except queue.Empty:
                        continue
                    if item is None:
                        return
                    try:
                        began = time.perf_counter()
                        self._backward(item, stages, rule, streams[index])
                        with finished:
                            self.busy["backward_busy_seconds"] += time.perf_counter() - began
                            on_batch(item.batch)
                    except BaseException:  # surfaced on the forward thread (the group keeps it)
                        stop.set()
                        raise
                    finally:
                        item.done.set()
                        free.put(index)

        for index in range(threads):
            group.spawn(functools.partial(backward_thread, index), f"cadence-pdasgd-backward-{index}")
        try:
            with intra_op_threads(self.settings.intra_op_threads):
                def free_thread() -> int | None:  # a backward thread without a graph (None: stopped)
                    while not stop.is_set():
                        try:
                            return free.get(timeout=_POLL)
                        except queue.Empty:
                            pass
                    return None

                for plan in plans:
                    if stop.is_set():
                        break
                    # CUDA: the taker is chosen first, the forward runs on its stream; on the CPU the
                    # forward runs first and any thread free by then takes the graph
                    taker = free_thread() if streams[0] is not None else None
                    if streams[0] is not None and taker is None:
                        break
                    began = time.perf_counter()
                    item = self._forward(plan, stages, model, names, params,
                                         streams[taker] if taker is not None else None)
                    self.busy["forward_busy_seconds"] += time.perf_counter() - began
                    if taker is None and (taker := free_thread()) is None:
                        break
                    handoff[taker].put(item)
                    if self.settings.barrier:  # the sequential twin: this batch ends before the next
                        while not item.done.wait(timeout=_POLL) and not stop.is_set():
                            pass
        except BaseException:
            stop.set()  # Ctrl-C or an error in the forward pass: the backward threads leave after their pass
            raise
        finally:
            for queue_ in handoff:
                queue_.put(None)  # after every handed-over graph: each queue is FIFO
            group.join(timeout=STOP_GRACE)
        group.raise_first()

    # ---- the two passes ---------------------------------------------------------------------------
    def _forward(self, plan: BatchPlan, stages: Stages, model: _LossOf, names: list[str],
                 params: list[Tensor], stream=None) -> _InFlight:
        """The batch's forward, on ``stream``: the stream of the backward thread that takes its graph."""
        batch = stages.link.upload(stages.load(plan))
        batch.timestamp = self.next_timestamp  # the computation order is the order of the forwards
        self.next_timestamp += 1
        with stages.link.computing(batch, stream):
            rows = batch.rows.values.requires_grad_(True)
            seen = self.staleness.read()
            # this batch's leaves: aliases of the shared storage with version counters of their own
            leaves = [param.data.requires_grad_(True) for param in params]
            loss = torch.func.functional_call(model, {f"dense.{n}": leaf for n, leaf in zip(names, leaves)},
                                              (batch, rows), strict=False)
        return _InFlight(batch, rows, loss, leaves, seen)

    def _backward(self, item: _InFlight, stages: Stages, rule: InPlaceDense | None, stream=None) -> None:
        batch, rows = item.batch, item.rows
        with stages.link.computing(batch, stream):  # (the stream its forward ran on)
            handles = []
            if rule is not None and self.layerwise:
                for index, leaf in enumerate(item.leaves):
                    handles.append(leaf.register_post_accumulate_grad_hook(
                        self._layer_update(index, rule, item.seen[index])))
            try:
                item.loss.backward()
            finally:
                for handle in handles:
                    handle.remove()
            if rule is not None and not self.layerwise:
                for index, leaf in enumerate(item.leaves):
                    self._step(index, leaf, rule, item.seen[index])
            with torch.no_grad():
                grad = row_gradient(rows)
                # the rows as they are now (other batches wrote some since this forward read them):
                # the update applies to them, as the dense updates apply to the current weights
                current = stages.load.store.pull(batch.store_ids)
                values, state = current.values.to(rows.device), current.state.to(rows.device)
                stages.compute.entity_optimizer.step(values, state, grad)
            rows.grad = None
            batch.rows = RowBlock(values, state)
            batch.loss = item.loss.detach()
        stages.write(stages.link.download(batch))
        item.loss = None  # (the graph is freed with it)
        item.leaves = []

    def _layer_update(self, index: int, rule: InPlaceDense, seen: int):
        def hook(leaf: Tensor) -> None:
            self._step(index, leaf, rule, seen)
        return hook

    def _step(self, index: int, leaf: Tensor, rule: InPlaceDense, seen: int) -> None:
        if leaf.grad is None:  # a parameter this batch's loss did not use
            return
        rule.step_one(index, leaf.grad)
        leaf.grad = None
        self.staleness.update(index, seen)

    @contextlib.contextmanager
    def _slowed(self, index: int):
        """Backward thread ``index`` under its CPU quota for the epoch (``pdasgd.slow_thread``), or free."""
        slowdown = self.settings.slowed(index)
        if slowdown is None:
            yield
            return
        quota = cgroups.RelativeCpuQuota.after(self.slow_quota, f"{os.getpid()}-pdasgd-backward-{index}", slowdown,
                                               thread=True)
        with quota:
            yield
        self.slow_quota = quota  # (its measured rate, or its unfinished probe, serves the next epoch)
        self.throttled_seconds += quota.throttled["throttled_seconds"]

    def stats(self) -> dict:
        out = {"backward_threads": self.settings.backward_threads,
               "layerwise_updates": self.layerwise,
               **{key: round(value, 4) for key, value in self.busy.items()}}
        if self.staleness is not None:
            out.update(self.staleness.stats())
        if self.settings.slow_thread >= 0:
            out["slowed_thread_throttled_seconds"] = round(self.throttled_seconds, 4)
        return out


@SCHEDULES.register("pdasgd-bu")
class PdasgdBlockUpdates(Pdasgd):
    """The seed's ablation: the same threads, every parameter updated after the whole backward pass."""

    layerwise = False
