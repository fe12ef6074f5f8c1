"""What runs on AdaPM's nodes, and the ``threads`` engine.

``NodeRunner`` is one node with its worker threads and its sync thread, the same in a thread of
this process and in a Ray actor (``ray_nodes``). ``Cluster`` is the ``threads`` engine: every node in
this process, talking through ``LocalTransport`` (a call on the other node; every tensor of a
message counted as bytes communicated).

An epoch: the task's plans are split among the nodes (``Task.partition``) and among each node's
workers; a worker prepares its batches ``lookahead`` batches ahead, signals the intent of each
(its keys, for the one clock at which it will compute it), and per batch pulls, computes, commits
its update and advances its clock. Each node's sync thread runs communication rounds until every
node's workers are done: Algorithm 1 picks which intents to act on, then one grouped message per
destination. Then rounds continue until every intent has expired and every replica is dropped (the
main copies hold every update), so checkpoints and evaluation read the owners' rows.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
import functools
import threading
import time
from collections import deque
from typing import Any, Callable

import torch
from torch import Tensor, nn

from cadence.config import Config
from cadence.optim import ENTITY_OPTIMIZERS, module_optimizer
from cadence.core.batch import Batch, BatchPlan
from cadence.core.runtime import serialized
from cadence.engines.threads import ThreadGroup, run_threads
from cadence.pipeline.stages import ComputeStage
from cadence.strategies.adapm.node import OWNER, DenseCopy, Node, ProtocolError, nbytes
from cadence.strategies.adapm.timing import ActionTimer
from cadence.core.rows import RowBlock
from cadence.store.embedding_store import create_store


class LocalTransport:
    """Messages between nodes of this process: a direct call on the destination node."""

    def __init__(self, nodes: list[Node]):
        self.nodes = nodes

    def exchange(self, source: int, dest: int, request):
        return self.nodes[dest].handle(request, lambda node, sub: self.nodes[node].handle(sub, forwarded=True))

    def access(self, source: int, dest: int, slots: Tensor, delta: Tensor | None, value: Tensor | None):
        self.nodes[source].bytes_sent += nbytes(slots, delta, value)
        return self.nodes[dest].serve(source, slots, delta, value)


def key_space(task) -> Tensor:
    """Every key a node has a slot for, sorted: a fixed table's 0..N-1, or the keys in the data."""
    spec = task.table()
    return torch.arange(spec.rows) if spec.fixed else task.known_keys()


def initial_values(task, state_width: int) -> tuple[Tensor, Tensor]:
    """(keys, [N, width + state] initial values): every key of the task's key space, as the
    pipeline's store starts (the same seeded rows, zero optimizer state)."""
    spec = task.table()
    keys = key_space(task)
    store = create_store(keys.shape[0], spec.width, state_width, "memory", None)
    spec.initialize(store, None if spec.fixed else keys)
    return keys, torch.cat([store.values, store.state], dim=1)


class NodeRunner:
    """One node and what runs on it: its worker threads (each with its dense copy and an Algorithm 1
    timer), its sync thread, and a transport to the other nodes. The same in a thread of this
    process (``Cluster``) and in a Ray actor (``ray_nodes.NodeActor``)."""

    def __init__(self, config: Config, task, index: int, keys: Tensor, initial: Tensor, dense: nn.Module,
                 main_module: bool):
        self.config, self.task = config, task
        settings = self.settings = config.adapm
        self.count = config.ps.workers
        entity_class = ENTITY_OPTIMIZERS.get(config.optimizer.entity)
        self.width = task.table().width
        self.entity = entity_class(config.optimizer)
        self.node = Node(index, self.count, keys, initial, self.width, settings.technique, settings.threads)
        self.transport = None  # set once every node exists (``connect``)
        for worker in range(settings.threads):
            main = index == 0 and worker == 0
            module = dense if main and main_module else copy.deepcopy(dense)
            optimizer = module_optimizer(config.optimizer, module)
            self.node.dense.append(DenseCopy(module, optimizer, main))
        if index == 0:
            self.node.main_dense = self.node.dense[0]
        immediate = settings.timing == "immediate"
        self.timers = [ActionTimer(settings.alpha, settings.quantile, settings.initial_rate, immediate=immediate)
                       for _ in range(settings.threads)]

    def connect(self, transport) -> None:
        self.transport = transport

    def set_lr(self, lr: float) -> None:
        for dense_copy in self.node.dense:
            if dense_copy.optimizer is not None:
                for group in dense_copy.optimizer.param_groups:
                    group["lr"] = lr

    # ---- one communication round ----------------------------------------------------------------------
    def round(self) -> None:
        node = self.node
        node.round_started()
        node.act_on_intents([timer.horizon(clock) for timer, clock in zip(self.timers, list(node.clocks))])
        if node.index == 0:
            self._sync_local_dense()
        for dest, request in enumerate(node.requests()):
            if request is not None:
                node.install(dest, self.transport.exchange(node.index, dest, request), request)
        node.round_completed()

    def _sync_local_dense(self) -> None:
        """Node 0's other workers' dense replicas meet the main copy without a message."""
        main = self.node.main_dense
        for replica in self.node.dense[1:]:
            if not replica.params:
                return
            with replica.lock:
                now = replica.vector()
                delta, replica.sync = now - replica.sync, now
            with main.lock:
                if bool(delta.ne(0).any()):
                    main.add(delta)
                    main.version += 1
                value = main.vector()
            with replica.lock:
                replica.assign(value + (replica.vector() - replica.sync))
                replica.sync = value
                replica.version = main.version

    # ---- this node's share of an epoch ------------------------------------------------------------------
    def start_sync(self, stop: threading.Event) -> None:
        """Start this node's sync thread: rounds until ``stop_sync``. It runs until every node's
        workers are done (not only this node's): other nodes' intents and remote accesses are
        answered by ``handle`` and ``serve`` either way, but this node's queued home-record updates
        and replica deltas travel only in its own rounds."""
        self._sync_done = threading.Event()
        self._syncer = ThreadGroup(lambda key, err: stop.set())
        if self.count == 1:
            return

        def rounds() -> None:
            while not self._sync_done.is_set():
                self.round()
                self._sync_done.wait(self.settings.round_interval)

        self._syncer.spawn(rounds, f"cadence-adapm-sync-{self.node.index}")

    def stop_sync(self) -> None:
        self._sync_done.set()
        self._syncer.join().raise_first()

    def work(self, plans: list[BatchPlan], report: Callable[[Batch], None], stop: threading.Event) -> tuple[float, int]:
        """Run this node's workers over ``plans`` (round-robin among them; the sync thread runs
        beside them: ``start_sync``); (summed loss, examples). ``stop``: another node failed, leave
        early."""
        threads, index = self.settings.threads, self.node.index
        jobs = {w: functools.partial(self._work, w, plans[w::threads], report, stop) for w in range(threads)}
        group = run_threads(jobs, lambda w: f"cadence-adapm-{index}.{w}", lambda w, err: stop.set())
        group.raise_first()
        return sum(r[0] for r in group.results.values()), sum(r[1] for r in group.results.values())

    def _work(self, worker: int, plans: list[BatchPlan], report, stop: threading.Event) -> tuple[float, int]:
        """One worker's share of the epoch: intent ``lookahead`` batches ahead, then per batch pull,
        compute, commit, advance the clock."""
        node, task, width = self.node, self.task, self.width
        dense = node.dense[worker]
        module = dense.module
        compute = ComputeStage(task, module, self.entity, None)  # (the dense step: below, under its lock)
        base = node.current_clock(worker)
        lookahead = self.settings.lookahead
        ready: deque[Batch] = deque()
        transport = self.transport

        def remote(dest: int, slots: Tensor, delta: Tensor | None, value: Tensor | None):
            return transport.access(node.index, dest, slots, delta, value)

        def signal(position: int) -> None:
            batch = task.prepare(plans[position])
            node.intent(worker, batch.ids, base + position, base + position + 1)
            ready.append(batch)

        loss_total, examples = 0.0, 0
        for position in range(min(lookahead, len(plans))):
            signal(position)
        if self.count > 1 and plans:  # the loader ran ahead: let rounds bring the first batch's rows here
            for _ in range(self.settings.start_rounds):
                while not node.wait_sync(timeout=0.5) and not stop.is_set():
                    pass
                if stop.is_set() or node.holds(ready[0].ids):
                    break
        for position in range(len(plans)):
            if stop.is_set():
                break
            if position + lookahead < len(plans):
                signal(position + lookahead)
            batch = ready.popleft()
            before, local, stamps = node.pull(batch.ids, remote)
            batch.rows = RowBlock(before[:, :width].clone(), before[:, width:].clone())
            module.zero_grad(set_to_none=True)
            compute(batch)  # forward, backward, the rows' optimizer step (the pipeline's stage)
            after = torch.cat([batch.rows.values.detach(), batch.rows.state], dim=1)
            if dense.optimizer is not None:
                with dense.lock:
                    dense.optimizer.step()
                    if dense.main:
                        dense.version += 1
            node.commit(batch.ids, before, after, local, stamps, remote)
            node.advance_clock(worker)
            loss_total += task.loss_total(float(batch.loss), batch.size)
            examples += batch.size
            report(batch)
        return loss_total, examples

    # ---- this node's parameters ----------------------------------------------------------------------
    def owned(self) -> tuple[Tensor, Tensor]:
        """(slots, values) of the main copies held here."""
        node = self.node
        with node.lock:
            slots = (node.kind == OWNER).nonzero().squeeze(1)
            return slots, node.data.index_select(0, slots)

    def load_rows(self, values: Tensor) -> None:
        """Every copy here takes ``values`` (between epochs only owners, and full replication's
        replicas, hold copies)."""
        node = self.node
        with node.lock:
            node.data.copy_(values)
            node.stamp += 1
            if node.sync.shape[0]:
                node.sync.copy_(values)

    def main_dense_state(self) -> tuple[dict[str, Tensor], dict | None]:
        """Node 0: the main dense module's state and its optimizer's."""
        main = self.node.main_dense
        optimizer = main.optimizer.state_dict() if main.optimizer is not None else None
        return {k: v.detach().clone() for k, v in main.module.state_dict().items()}, copy.deepcopy(optimizer)

    def load_dense(self, state: dict[str, Tensor], optimizer_state: dict | None, version: int) -> None:
        """Every dense copy here takes the main copy's ``state`` (a loaded checkpoint) and, when given,
        its optimizer's state."""
        for dense_copy in self.node.dense:
            if not dense_copy.params:
                continue
            with dense_copy.lock:
                dense_copy.module.load_state_dict(state)
                dense_copy.sync = dense_copy.vector()
                dense_copy.version = version
                if optimizer_state is not None and dense_copy.optimizer is not None:
                    dense_copy.optimizer.load_state_dict(copy.deepcopy(optimizer_state))

    def quiet(self) -> bool:
        return self.node.quiet()

    COUNTERS = ("accesses", "remote_accesses", "remote_reads", "bytes_sent", "relocations_in", "replicas_created",
                "staleness_total", "staleness_count", "rounds")

    def counters(self) -> dict[str, Any]:
        node = self.node
        return {**{name: getattr(node, name) for name in self.COUNTERS}, "clocks": list(node.clocks)}

    def load_counters(self, entry: dict[str, Any]) -> None:
        node = self.node
        for name in self.COUNTERS:
            setattr(node, name, entry.get(name, 0))
        if len(entry.get("clocks", [])) == len(node.clocks):
            node.clocks = list(entry["clocks"])
            for timer, clock in zip(self.timers, node.clocks):
                timer.last_clock = clock


def summarize(settings, counters: list[dict[str, Any]], epochs: int, seconds: float) -> dict[str, Any]:
    """summary.json's AdaPM fields from every node's counters."""
    total = {name: sum(c[name] for c in counters) for name in NodeRunner.COUNTERS}
    nodes = len(counters)
    stale = total["staleness_count"]
    return {
        "nodes": nodes,
        "technique": settings.technique,
        "timing": settings.timing,
        "lookahead": settings.lookahead,
        "worker_threads_per_node": settings.threads,
        # bytes of every message (intents, relocations, replicas, deltas, refreshes, remote accesses,
        # forwarded parts, dense deltas), per node and epoch
        "bytes_per_epoch": round(total["bytes_sent"] / nodes / max(1, epochs), 1),
        "bytes_per_node": [c["bytes_sent"] for c in counters],
        "accesses": total["accesses"],
        "remote_accesses": total["remote_accesses"],
        "remote_reads": total["remote_reads"],
        "remote_access_share": total["remote_accesses"] / total["accesses"] if total["accesses"] else 0.0,
        # mean time since the replica's last refresh over reads of a replica (Table 2's measure), ms
        "replica_staleness": round(1000.0 * total["staleness_total"] / stale, 4) if stale else 0.0,
        "replica_reads": stale,
        "relocations": total["relocations_in"],
        "replicas_created": total["replicas_created"],
        "rounds": total["rounds"],
        "adapm_seconds": round(seconds, 3),
    }


class NodeCluster(ABC):
    """AdaPM's nodes for one run, wherever they run (``clusters.CLUSTERS``: threads of this process,
    or Ray actors); the runtime drives both through these members alone."""

    keys: Tensor  # every key of the task's key space, sorted
    dense: nn.Module  # the run's dense module (the main copy, or the driver's copy of it)
    dense_optimizer: torch.optim.Optimizer | None

    @abstractmethod
    def run_nodes(self, plans: list[BatchPlan], lr: float, on_batch: Callable[[Batch], None]) -> tuple[float, int]:
        """One epoch on every node; (summed loss, examples); the nodes settle before it returns."""

    @abstractmethod
    def rows(self) -> Tensor:
        """Every key's row and entity optimizer state, from its owner, in ``keys`` order."""

    @abstractmethod
    def load_rows(self, values: Tensor) -> None:
        """Every owner takes its keys' rows from ``values`` (``keys`` order)."""

    @abstractmethod
    def load_dense(self) -> None:
        """Every node's dense copy takes ``dense`` and its optimizer state."""

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...

    @abstractmethod
    def counters(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_counters(self, meta: dict[str, Any]) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class Cluster(NodeCluster):
    """The ``threads`` engine: ``ps.workers`` nodes in this process, the run's dense module as node
    0's first worker's (the main copy)."""

    def __init__(self, config: Config, task, dense: nn.Module):
        self.config, self.task, self.settings = config, task, config.adapm
        self.count = config.ps.workers
        entity_class = ENTITY_OPTIMIZERS.get(config.optimizer.entity)
        keys, initial = initial_values(task, entity_class.state_width(task.table().width))
        self.keys = keys
        self.runners = [NodeRunner(config, task, index, keys, initial if index == 0 else initial.clone(), dense, True)
                        for index in range(self.count)]
        self.nodes = [runner.node for runner in self.runners]
        self.transport = LocalTransport(self.nodes)
        for runner in self.runners:
            runner.connect(self.transport)
        self.dense = dense
        self.dense_optimizer = self.nodes[0].main_dense.optimizer  # the run's (checkpointed)
        self.epochs = 0
        self.seconds = 0.0

    def run_nodes(self, plans: list[BatchPlan], lr: float, on_batch: Callable[[Batch], None]) -> tuple[float, int]:
        for runner in self.runners:
            runner.set_lr(lr)
        parts = self.task.partition(plans, self.count)
        stop = threading.Event()
        report = serialized(on_batch)
        started = time.perf_counter()
        for runner in self.runners:
            runner.start_sync(stop)
        try:
            jobs = {runner.node.index: functools.partial(runner.work, parts[runner.node.index], report, stop)
                    for runner in self.runners}
            group = run_threads(jobs, lambda index: f"cadence-adapm-node-{index}", lambda index, err: stop.set())
        finally:
            for runner in self.runners:
                runner.stop_sync()
        group.raise_first()
        results = list(group.results.values())
        self.settle()
        self.seconds += time.perf_counter() - started
        self.epochs += 1
        return sum(r[0] for r in results), sum(r[1] for r in results)

    def settle(self, limit: int = 1000) -> None:
        """Rounds until nothing is left to manage: every worker is past its intents, so replicas are
        dropped with their last deltas and the owners hold every update (and node 0 every dense
        delta: two rounds at least)."""
        if self.count == 1:
            self.runners[0]._sync_local_dense()
            return
        for attempt in range(limit):
            for runner in self.runners:
                runner.round()
            if attempt >= 1 and all(runner.quiet() for runner in self.runners):
                return
        raise ProtocolError(f"the nodes did not settle after {limit} rounds")

    # ---- the run's parameters ----------------------------------------------------------------------------
    def rows(self) -> Tensor:
        """[N, width + state]: every key's main copy, gathered from its owner."""
        out = torch.empty_like(self.nodes[0].data)
        for runner in self.runners:
            slots, values = runner.owned()
            out[slots] = values
        return out

    def load_rows(self, values: Tensor) -> None:
        for runner in self.runners:
            runner.load_rows(values)

    def load_dense(self) -> None:
        """The replicas take the main dense copy and its optimizer state (a checkpoint was loaded
        into them)."""
        state, optimizer = self.runners[0].main_dense_state()
        main = self.nodes[0].main_dense
        for runner in self.runners:
            runner.load_dense(state, optimizer, main.version)

    def stats(self) -> dict[str, Any]:
        return summarize(self.settings, [runner.counters() for runner in self.runners], self.epochs, self.seconds)

    def counters(self) -> dict[str, Any]:
        return {"nodes": [runner.counters() for runner in self.runners], "epochs": self.epochs, "seconds": self.seconds}

    def load_counters(self, meta: dict[str, Any]) -> None:
        saved = meta.get("nodes", [])
        if len(saved) == self.count:
            for runner, entry in zip(self.runners, saved):
                runner.load_counters(entry)
        self.epochs, self.seconds = meta.get("epochs", 0), meta.get("seconds", 0.0)

    def close(self) -> None:
        pass
