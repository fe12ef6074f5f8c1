"""AdaPM's nodes in one process (the ``threads`` engine): each node is a ``Node`` with its worker
threads and one sync thread; nodes talk through ``LocalTransport`` (a call on the other node,
every tensor in a message counted as bytes communicated).

An epoch: the task's plans are split among the nodes (``Task.partition``) and among each node's
workers; a worker prepares its batches ``lookahead`` batches ahead, signals the intent of each
(its keys, for the one clock at which it will compute it), and per batch pulls, computes, commits
its update and advances its clock. Each node's sync thread runs communication rounds: Algorithm 1
picks which intents to act on, then one grouped message per destination. After the workers finish,
rounds continue until every intent has expired and every replica is dropped (the main copies then
hold every update), so checkpoints and evaluation read the owners' rows.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from typing import Any, Callable

import torch
from torch import Tensor, nn

from cadence.optim import ENTITY_OPTIMIZERS, dense_optimizer
from cadence.pipeline.batch import Batch, BatchPlan
from cadence.pipeline.stages import ComputeStage
from cadence.runtime.adapm.node import OWNER, DenseCopy, Node, ProtocolError, nbytes
from cadence.runtime.adapm.timing import ActionTimer
from cadence.store.embedding_store import RowBlock, create_store


class LocalTransport:
    """Messages between nodes of this process: a direct call on the destination node."""

    def __init__(self, nodes: list[Node]):
        self.nodes = nodes

    def exchange(self, source: int, dest: int, request):
        return self.nodes[dest].handle(request, lambda node, sub: self.nodes[node].handle(sub, forwarded=True))

    def access(self, source: int, dest: int, slots: Tensor, delta: Tensor | None, value: Tensor | None):
        self.nodes[source].bytes_sent += nbytes(slots, delta, value)
        return self.nodes[dest].serve(source, slots, delta, value)


def initial_values(task, state_width: int) -> tuple[Tensor, Tensor]:
    """(keys, [N, width + state] initial values): every key of the task's key space, as the
    pipeline's store starts (the same seeded rows, zero optimizer state)."""
    spec = task.table()
    keys = torch.arange(spec.rows) if spec.fixed else task.known_keys()
    store = create_store(keys.shape[0], spec.width, state_width, "memory", None)
    spec.initialize(store, None if spec.fixed else keys)
    return keys, torch.cat([store.values, store.state], dim=1)


class Cluster:
    """``nodes`` AdaPM nodes of ``threads`` workers each, the run's dense module as node 0's main copy."""

    def __init__(self, config, task, dense: nn.Module):
        self.config, self.task = config, task
        settings = config.adapm
        self.settings = settings
        self.count = config.ps.workers
        entity_class = ENTITY_OPTIMIZERS.get(config.optimizer.entity)
        spec = task.table()
        self.width = spec.width
        keys, initial = initial_values(task, entity_class.state_width(spec.width))
        self.keys = keys
        self.nodes = [Node(index, self.count, keys, initial if index == 0 else initial.clone(), spec.width,
                           entity_class(config.optimizer), settings.technique, settings.threads)
                      for index in range(self.count)]
        self.transport = LocalTransport(self.nodes)
        self.dense = dense
        params = list(dense.parameters())
        self.dense_optimizer = dense_optimizer(config.optimizer, params) if params else None
        for node in self.nodes:
            for worker in range(settings.threads):
                main = node.index == 0 and worker == 0
                module = dense if main else copy.deepcopy(dense)
                optimizer = (self.dense_optimizer if main else
                             dense_optimizer(config.optimizer, list(module.parameters())) if params else None)
                node.dense.append(DenseCopy(module, optimizer, main))
        self.nodes[0].main_dense = self.nodes[0].dense[0]
        immediate = settings.timing == "immediate"
        self.timers = [[ActionTimer(settings.alpha, settings.quantile, settings.initial_rate, immediate=immediate)
                        for _ in range(settings.threads)] for _ in self.nodes]
        self.entity = entity_class(config.optimizer)
        self.epochs = 0
        self.seconds = 0.0

    # ---- one communication round of one node --------------------------------------------------------
    def round(self, node: Node) -> None:
        timers = self.timers[node.index]
        node.round_started()
        node.act_on_intents([timer.horizon(clock) for timer, clock in zip(timers, list(node.clocks))])
        if node.index == 0:
            self._sync_local_dense(node)
        for dest, request in enumerate(node.requests()):
            if request is not None:
                node.install(dest, self.transport.exchange(node.index, dest, request), request)
        node.round_completed()

    @staticmethod
    def _sync_local_dense(node: Node) -> None:
        """Node 0's other workers' dense replicas meet the main copy without a message."""
        main = node.main_dense
        for replica in node.dense[1:]:
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

    # ---- an epoch ------------------------------------------------------------------------------------
    def run_epoch(self, plans: list[BatchPlan], lr: float, on_batch: Callable[[Batch], None]) -> tuple[float, int]:
        for node in self.nodes:
            for dense_copy in node.dense:
                if dense_copy.optimizer is not None:
                    for group in dense_copy.optimizer.param_groups:
                        group["lr"] = lr
        parts = self.task.partition(plans, self.count)
        threads = self.settings.threads
        results: list[tuple[float, int]] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        stop = threading.Event()

        def report(batch: Batch) -> None:
            with lock:
                on_batch(batch)

        def work(node: Node, worker: int, mine: list[BatchPlan]) -> None:
            try:
                outcome = self._work(node, worker, mine, report, stop)
                with lock:
                    results.append(outcome)
            except BaseException as err:  # re-raised on the caller's thread
                with lock:
                    errors.append(err)
                stop.set()

        def sync(node: Node) -> None:
            try:
                while not finished.is_set():
                    self.round(node)
                    finished.wait(self.settings.round_interval)
            except BaseException as err:
                with lock:
                    errors.append(err)
                stop.set()

        finished = threading.Event()
        started = time.perf_counter()
        syncers = [threading.Thread(target=sync, args=(node,), name=f"cadence-adapm-sync-{node.index}", daemon=True)
                   for node in self.nodes] if self.count > 1 else []
        workers = [threading.Thread(target=work, args=(node, w, parts[node.index][w::threads]),
                                    name=f"cadence-adapm-{node.index}.{w}", daemon=True)
                   for node in self.nodes for w in range(threads)]
        for thread in syncers + workers:
            thread.start()
        for thread in workers:
            thread.join()
        finished.set()
        for thread in syncers:
            thread.join()
        if errors:
            raise errors[0]
        self.settle()
        self.seconds += time.perf_counter() - started
        self.epochs += 1
        return sum(r[0] for r in results), sum(r[1] for r in results)

    def settle(self, limit: int = 1000) -> None:
        """Rounds until nothing is left to manage: every worker is past its intents, so replicas are
        dropped with their last deltas and the owners hold every update (and node 0 every dense
        delta: two rounds at least)."""
        if self.count == 1:
            self._sync_local_dense(self.nodes[0])
            return
        for attempt in range(limit):
            for node in self.nodes:
                self.round(node)
            if attempt >= 1 and all(node.quiet() for node in self.nodes):
                return
        raise ProtocolError(f"the nodes did not settle after {limit} rounds")

    def _work(self, node: Node, worker: int, plans: list[BatchPlan], report, stop: threading.Event) -> tuple[float, int]:
        """One worker's share of the epoch: intent ``lookahead`` batches ahead, then per batch pull,
        compute, commit, advance the clock."""
        task, width = self.task, self.width
        dense = node.dense[worker]
        module = dense.module
        compute = ComputeStage(task, module, self.entity, None)  # (the dense step: below, under its lock)
        base = node.current_clock(worker)
        lookahead = self.settings.lookahead
        ready: deque[Batch] = deque()
        remote = self._remote(node)

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

    def _remote(self, node: Node):
        def remote(dest: int, slots: Tensor, delta: Tensor | None, value: Tensor | None):
            return self.transport.access(node.index, dest, slots, delta, value)
        return remote

    # ---- the run's parameters --------------------------------------------------------------------------
    def rows(self) -> Tensor:
        """[N, width + state]: every key's main copy, gathered from its owner."""
        out = torch.empty_like(self.nodes[0].data)
        for node in self.nodes:
            with node.lock:
                owned = (node.kind == OWNER).nonzero().squeeze(1)
                out[owned] = node.data.index_select(0, owned)
        return out

    def load_rows(self, values: Tensor) -> None:
        """Every copy of every key takes ``values`` (between epochs: only owners, and full
        replication's replicas, hold copies)."""
        for node in self.nodes:
            with node.lock:
                node.data.copy_(values)
                node.stamp += 1
                if node.sync.shape[0]:
                    node.sync.copy_(values)

    def load_dense(self) -> None:
        """The replicas take the main dense copy (after a checkpoint was loaded into it)."""
        main = self.nodes[0].main_dense
        value = main.vector()
        for node in self.nodes:
            for dense_copy in node.dense:
                if dense_copy is not main and dense_copy.params:
                    dense_copy.assign(value)
                    dense_copy.sync = value.clone()
                    dense_copy.version = main.version
                    if self.dense_optimizer is not None:
                        dense_copy.optimizer.load_state_dict(copy.deepcopy(self.dense_optimizer.state_dict()))

    def stats(self) -> dict[str, Any]:
        nodes = self.nodes
        accesses = sum(n.accesses for n in nodes)
        remote = sum(n.remote_accesses for n in nodes)
        staleness = sum(n.staleness_total for n in nodes)
        stale_count = sum(n.staleness_count for n in nodes)
        sent = sum(n.bytes_sent for n in nodes)
        epochs = max(1, self.epochs)
        return {
            "nodes": self.count,
            "technique": self.settings.technique,
            "timing": self.settings.timing,
            "lookahead": self.settings.lookahead,
            "worker_threads_per_node": self.settings.threads,
            # bytes of every message (intents, relocations, replicas, deltas, refreshes, remote
            # accesses), per node and epoch
            "bytes_per_epoch": round(sent / self.count / epochs, 1),
            "bytes_per_node": [n.bytes_sent for n in nodes],
            "accesses": accesses,
            "remote_accesses": remote,
            "remote_reads": sum(n.remote_reads for n in nodes),
            "remote_access_share": remote / accesses if accesses else 0.0,
            # mean seconds since the replica's last refresh, over reads of a replica (the paper's
            # Table 2 measure), in milliseconds
            "replica_staleness": round(1000.0 * staleness / stale_count, 4) if stale_count else 0.0,
            "replica_reads": stale_count,
            "relocations": sum(n.relocations_in for n in nodes),
            "replicas_created": sum(n.replicas_created for n in nodes),
            "rounds": sum(n.rounds for n in nodes),
            "adapm_seconds": round(self.seconds, 3),
        }

    def counters(self) -> dict[str, Any]:
        return {"nodes": [{"accesses": n.accesses, "remote_accesses": n.remote_accesses, "bytes_sent": n.bytes_sent,
                           "relocations_in": n.relocations_in, "replicas_created": n.replicas_created,
                           "staleness_total": n.staleness_total, "staleness_count": n.staleness_count,
                           "rounds": n.rounds, "clocks": list(n.clocks)} for n in self.nodes],
                "epochs": self.epochs, "seconds": self.seconds}

    def load_counters(self, meta: dict[str, Any]) -> None:
        saved = meta.get("nodes", [])
        if len(saved) != self.count:
            return
        for node, entry in zip(self.nodes, saved):
            for name in ("accesses", "remote_accesses", "bytes_sent", "relocations_in", "replicas_created",
                         "staleness_total", "staleness_count", "rounds"):
                setattr(node, name, entry[name])
            if len(entry["clocks"]) == len(node.clocks):
                node.clocks = list(entry["clocks"])
                for timer, clock in zip(self.timers[node.index], node.clocks):
                    timer.last_clock = clock
        self.epochs, self.seconds = meta.get("epochs", 0), meta.get("seconds", 0.0)
