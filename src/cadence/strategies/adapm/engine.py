"""AdaPM's nodes, written once for every engine.

``NodeRunner`` is the node role: one node with its worker threads and its sync thread; its public
methods are the verbs its peers and the driver call. ``Cluster`` is the driver's side. Both run on
any ``engines.placement`` (``ps.engine``): with ``threads`` every node is an object of this process
and a verb is a method call; with ``ray`` every node is an actor, and the nodes call each other's
verbs directly, actor to actor. ``Transport`` carries a node's messages through its peers' handles
(every tensor of a message counted as bytes communicated).

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
import functools
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from cadence.config import OptimizerConfig
from cadence.strategies.adapm.settings import AdapmConfig
from cadence.optim import module_optimizer, set_lr
from cadence.core.batch import Batch, BatchPlan, finished_batch
from cadence.core.runtime import WorkerFailed, serialized
from cadence.engines.placement import Handle, Placement, finish
from cadence.engines.threads import ThreadGroup, run_threads
from cadence.pipeline.stages import ComputeStage
from cadence.core.initial import INIT_CHUNK_ROWS
from cadence.pm.holdings import KeySpace
from cadence.pm.management import DenseCopy
from cadence.pm.messages import OWNER, Counters, ProtocolError, nbytes
from cadence.pm.node import Node
from cadence.strategies.adapm.timing import ActionTimer, RoundPace

from cadence.core import checkpoint as ckpt
from cadence.core.rows import RowBlock

# the longest a worker's start waits for rounds to bring its first batch's rows (adapm.start_rounds)
START_SECONDS = 10.0


class Transport:
    """A node's messages to the others: its peers' verbs, called through their handles."""

    def __init__(self, handles: list[Handle], node: Node):
        self.handles, self.node = handles, node

    def exchange(self, requests: list) -> list:
        """Each destination's answer to its request (None for none): sent all at once where the
        handles run at once (other processes), else one after another."""
        sent = [(dest, request) for dest, request in enumerate(requests) if request is not None]
        if sent and self.handles[sent[0][0]].concurrent:
            pending = [(dest, self.handles[dest].start(NodeRunner.handle, request)) for dest, request in sent]
            answers = {dest: call.result() for dest, call in pending}
        else:
            answers = {dest: self.handles[dest].call(NodeRunner.handle, request) for dest, request in sent}
        return [answers.get(dest) for dest in range(len(requests))]

    def forward(self, node: int, sub):
        return self.handles[node].call(NodeRunner.handle_forwarded, sub)

    def access(self, source: int, dest: int, slots: Tensor, delta: Tensor | None, value: Tensor | None):
        self.node.bytes_sent += nbytes(slots, delta, value)
        return self.handles[dest].call(NodeRunner.serve, source, slots, delta, value)


def key_space(task) -> Tensor:
    """Every key a node has a slot for, sorted: a fixed table's 0..N-1, or the keys in the data."""
    spec = task.table()
    return torch.arange(spec.rows) if spec.fixed else task.known_keys()


def node_key_space(task, state_width: int) -> KeySpace:
    """The task's key space as a node sees it: a fixed table's keys 0..N-1 a chunk at a time (the
    chunks its initial rows are drawn in), or a vocabulary's keys in the data; every key's initial
    value as the pipeline's store starts it (the same seeded row, zero optimizer state)."""
    spec = task.table()
    width = spec.width + state_width

    def initial(keys: Tensor) -> Tensor:
        return torch.cat([spec.initial_values(keys), torch.zeros(keys.shape[0], state_width)], dim=1)

    if spec.fixed:
        def chunks():
            for start in range(0, spec.rows, INIT_CHUNK_ROWS):
                yield torch.arange(start, min(start + INIT_CHUNK_ROWS, spec.rows))
        return KeySpace(spec.rows, width, True, chunks, initial)
    keys = task.known_keys()
    return KeySpace(keys.shape[0], width, False, lambda: keys.split(INIT_CHUNK_ROWS), initial)


class NodeRunner:
    """The node role: one node and what runs on it (its worker threads, each with its dense copy and
    an Algorithm 1 timer, and its sync thread); the same object in this process and in a Ray actor.

    ``task``: what gives the run's task here (``Placement.ship``); ``dense``: the module node 0's first
    worker trains as the main copy (in this process: the run's own) and every other worker a copy of,
    or None to build it from the task (an actor)."""

    def __init__(self, settings: AdapmConfig, optimizer: OptimizerConfig, entity: type, count: int,
                 task: Callable[[], Any], index: int, dense: nn.Module | None):
        task = self.task = task()
        self.settings = settings
        self.count = count
        self.width = task.table().width
        self.entity = entity(optimizer)
        space = node_key_space(task, entity.state_width(self.width))
        self.node = Node(index, count, space, self.width, settings.technique, settings.threads)
        self.transport: Transport | None = None  # set once every node exists (``connect``)
        self.stop = threading.Event()  # set: leave the epoch early (this node or another failed)
        dense = task.dense_module() if dense is None else dense
        for worker in range(settings.threads):
            main = index == 0 and worker == 0
            module = dense if main else copy.deepcopy(dense)
            self.node.dense.append(DenseCopy(module, module_optimizer(optimizer, module), main))
        if index == 0:
            self.node.main_dense = self.node.dense[0]
        immediate = settings.timing == "immediate"
        self.timers = [ActionTimer(settings.alpha, settings.quantile, settings.initial_rate, immediate=immediate)
                       for _ in range(settings.threads)]

    def connect(self, handles: list[Handle]) -> None:
        """Every node's handle, this node's included (once every node exists)."""
        self.transport = Transport(handles, self.node)

    # ---- the protocol: other nodes' calls ---------------------------------------------------------------
    def handle(self, request):
        """A round's grouped message from another node."""
        return self.node.handle(request, self.transport.forward)

    def handle_forwarded(self, request):
        """A part of a message another node forwarded here (answered, never forwarded again)."""
        return self.node.handle(request, forwarded=True)

    def serve(self, source: int, slots: Tensor, delta: Tensor | None, value: Tensor | None):
        """A synchronous remote access of another node's worker."""
        return self.node.serve(source, slots, delta, value)

    def set_lr(self, lr: float) -> None:
        for dense_copy in self.node.dense:
            set_lr(dense_copy.optimizer, lr)

    # ---- one communication round ----------------------------------------------------------------------
    def round(self) -> bool:
        """One communication round of this node; whether it is quiet right after it."""
        node = self.node
        node.round_started()
        node.act_on_intents([timer.horizon(clock) for timer, clock in zip(self.timers, list(node.clocks))])
        if node.index == 0:
            self.sync_local_dense()
        requests = node.requests()
        for dest, (request, response) in enumerate(zip(requests, self.transport.exchange(requests))):
            if request is not None:
                node.install(dest, response, request)
        node.round_completed()
        return node.quiet()

    def sync_local_dense(self) -> None:
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
    def start_epoch(self, lr: float) -> None:
        """Start this node's sync thread: rounds until ``end_epoch``. It runs until every node's
        workers are done (not only this node's): other nodes' intents and remote accesses are
        answered by ``handle`` and ``serve`` either way, but this node's queued home-record updates
        and replica deltas travel only in its own rounds."""
        self.set_lr(lr)
        self.stop.clear()
        self._sync_done = threading.Event()
        self._syncer = ThreadGroup(lambda key, err: self.stop.set())
        if self.count == 1:
            return

        settings, node, done = self.settings, self.node, self._sync_done
        pace = RoundPace(settings.sync_share, settings.round_interval, max(1, settings.lookahead // 4))

        def rounds() -> None:
            while not done.is_set():
                node.wake.clear()
                spent = time.thread_time()
                self.round()
                spent = time.thread_time() - spent  # (this thread's CPU: the other nodes' answers included)
                node.wake.wait(pace.rest(spent, max(node.clocks), time.perf_counter()))

        self._syncer.spawn(rounds, f"cadence-adapm-sync-{self.node.index}")

    def end_epoch(self) -> BaseException | None:
        """Stop the sync thread; its error, if it failed (returned, so every node's is stopped)."""
        self._sync_done.set()
        self.node.wake.set()
        errors = self._syncer.join().errors
        return errors[0][1] if errors else None

    def abort(self) -> None:
        """Another node failed: this node's workers leave at their next batch."""
        self.stop.set()

    def work(self, plans: list[BatchPlan], report: Callable[[Batch], None] | None) -> tuple[float, int, list]:
        """Run this node's workers over ``plans`` (round-robin among them; the sync thread runs
        beside them: ``start_epoch``): (summed loss, examples, finished). Each finished batch goes to
        ``report`` as it finishes, or where no callable reaches this node (an actor), into
        ``finished`` as (plan index, loss)."""
        finished: list[tuple[int, float]] = []
        if report is None:
            report = serialized(lambda batch: finished.append((batch.plan.index, float(batch.loss))))
        threads, index, stop = self.settings.threads, self.node.index, self.stop
        shares = self.task.partition_workers(plans, threads)  # (round-robin, or MF's column blocks)
        jobs = {w: functools.partial(self._work, w, shares[w], report, stop) for w in range(threads)}
        group = run_threads(jobs, lambda w: f"cadence-adapm-{index}.{w}", lambda w, err: stop.set())
        group.raise_first()
        results = group.results.values()
        return sum(r[0] for r in results), sum(r[1] for r in results), finished

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
            batch = task.training_batch(plans[position])
            node.intent(worker, batch.ids, base + position, base + position + 1)
            ready.append(batch)

        loss_total, examples = 0.0, 0
        for position in range(min(lookahead, len(plans))):
            signal(position)
        if self.count > 1 and plans:  # the loader ran ahead: let rounds bring the first batch's rows here
            # (at most START_SECONDS in all: rounds that never bring them, or never come, only delay
            # the start; a row not here yet is read remotely)
            deadline = time.monotonic() + START_SECONDS
            for _ in range(self.settings.start_rounds):
                while not node.wait_sync(timeout=0.5) and not stop.is_set() and time.monotonic() < deadline:
                    pass
                if stop.is_set() or node.holds(ready[0].ids) or time.monotonic() >= deadline:
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
        """(keys, values) of the main copies held here, by key."""
        node = self.node
        with node.lock:
            keys = node.held(OWNER)
            return keys, node.store.data.index_select(0, node.store.find(keys))

    def rows_of(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """(positions in ``keys``, rows) of the keys whose main copy is held here: a read of the
        trained rows by key (evaluation) that moves only the rows asked for."""
        node = self.node
        with node.lock:  # (one lookup; the rows without their optimizer state, gathered once)
            entries = node.store.find(keys)
            positions = (node.kind_of_entries(entries) == OWNER).nonzero().squeeze(1)
            chosen = entries.index_select(0, positions)
            return positions, node.store.data[:, :self.width].index_select(0, chosen)

    def save_part(self, path: str) -> str:
        """Write the main copies held here (``table.keys/values/state``, a checkpoint part) to
        ``path``, fsynced, in this node's process; its sha256."""
        keys, values = self.owned()
        width = self.width
        return ckpt.write_tensors(Path(path), {"table.keys": keys,
                                               "table.values": values[:, :width].contiguous(),
                                               "table.state": values[:, width:].contiguous()})

    def load_parts(self, directory: str, parts: dict[str, str]) -> None:
        """Every copy here takes the rows of a checkpoint written in parts (any runtime's: read
        and verified in this node's process, nothing passes through the driver)."""
        tables = ckpt.read_tables({ckpt.PARTS: parts, ckpt.PARTS_DIR: directory})
        self.load_table(tables["table.keys"], tables["table.values"], tables["table.state"])

    def load_table(self, keys: Tensor, values: Tensor, state: Tensor) -> None:
        """Every copy here of a key in ``keys`` takes its row and state (a key not held here, or
        held here and not in ``keys``, is left alone: another run's parameters, ``--init-from``)."""
        node = self.node
        with node.lock:
            node.load(keys, torch.cat([values, state], dim=1))

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
        """Nothing left to manage here: no replica, no intent, nothing queued."""
        return self.node.quiet()

    COUNTERS = Counters.NAMES

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
        # of which the dense parameters' (replica deltas to node 0, the main copy's values back)
        "dense_bytes_per_epoch": round(total["dense_bytes"] / nodes / max(1, epochs), 1),
        "accesses": total["accesses"],
        "remote_accesses": total["remote_accesses"],
        "remote_reads": total["remote_reads"],
        # why each remotely read key was not here: no intent acted on for it here yet, acted on but
        # not yet sent, sent and not arrived (or arrived and left)
        "remote_read_causes": {cause: total[f"misses_{cause}"] for cause in ("not_acted", "unsent", "in_flight")},
        "remote_access_share": total["remote_accesses"] / total["accesses"] if total["accesses"] else 0.0,
        # mean time since the replica's last refresh over reads of a replica (Table 2's measure), ms
        "replica_staleness": round(1000.0 * total["staleness_total"] / stale, 4) if stale else 0.0,
        "replica_reads": stale,
        "relocations": total["relocations_in"],
        "replicas_created": total["replicas_created"],
        "rounds": total["rounds"],
        "adapm_seconds": round(seconds, 3),
    }


class Cluster:
    """The driver's side of AdaPM's nodes for one run, on any placement (``ps.engine``): it places
    ``nodes`` node roles, hands each its share of an epoch's plans, runs the settling rounds between
    epochs, and gathers the owners' rows only for evaluation and checkpoints. ``dense`` is the run's
    dense module, refreshed from node 0's main copy after each epoch (in this process it is that
    main copy)."""

    def __init__(self, settings: AdapmConfig, optimizer: OptimizerConfig, entity: type, nodes: int, task,
                 dense: nn.Module, placement: Placement):
        self.settings, self.task, self.count, self.placement = settings, task, nodes, placement
        self.keys = key_space(task)
        self.spec = task.table()
        self.dense = dense
        self.dense_optimizer = module_optimizer(optimizer, dense)  # the run's copy (checkpoints)
        source = placement.ship(task)
        local = placement.share(dense)  # the run's module, where the nodes can train it themselves
        self.nodes = [placement.place(NodeRunner, index, settings, optimizer, entity, nodes, source, index, local)
                      for index in range(nodes)]
        placement.ready()
        placement.each(self.nodes, NodeRunner.connect, self.nodes)
        self.epochs = 0
        self.seconds = 0.0

    def run_nodes(self, plans: list[BatchPlan], lr: float, on_batch: Callable[[Batch], None]) -> tuple[float, int]:
        """One epoch on every node; (summed loss, examples); the nodes settle before it returns.
        ``on_batch`` fires once per finished batch: live where the placement reaches the nodes with
        a callable, else as each node's result arrives."""
        parts = self.task.partition(plans, self.count)
        report = serialized(on_batch)
        live = self.placement.share(report)
        by_index = {plan.index: plan for plan in plans}
        started = time.perf_counter()
        self.placement.each(self.nodes, NodeRunner.start_epoch, lr)  # every sync thread runs until all are done
        calls = {node.start(NodeRunner.work, parts[node.index], live): node.index for node in self.nodes}
        loss, examples = 0.0, 0
        try:
            for pending in self.placement.as_completed(list(calls)):
                try:
                    node_loss, node_examples, finished = pending.result()
                except Exception as err:  # one node failed: the others stop at their next batch
                    self.placement.each(self.nodes, NodeRunner.abort)
                    for other in calls:
                        if other is not pending:
                            finish(other)
                    raise WorkerFailed(f"AdaPM node {calls[pending]} failed: {err}; the epoch is abandoned") from err
                loss, examples = loss + node_loss, examples + node_examples
                for plan_index, batch_loss in finished:  # the node's batches, as its result arrives
                    report(finished_batch(by_index[plan_index], batch_loss))
        finally:
            errors = [error for error in self.placement.each(self.nodes, NodeRunner.end_epoch) if error is not None]
        if errors:
            raise errors[0]
        self.settle()
        self.seconds += time.perf_counter() - started
        self.epochs += 1
        state, optimizer = self.nodes[0].call(NodeRunner.main_dense_state)
        self.dense.load_state_dict(state)
        if self.dense_optimizer is not None and optimizer is not None:
            self.dense_optimizer.load_state_dict(optimizer)
        return loss, examples

    def settle(self, limit: int = 1000) -> None:
        """Rounds until nothing is left to manage: every worker is past its intents, so replicas are
        dropped with their last deltas and the owners hold every update (and node 0 every dense
        delta: two rounds at least)."""
        if self.count == 1:
            self.nodes[0].call(NodeRunner.sync_local_dense)
            return
        for attempt in range(limit):
            quiet = self.placement.each(self.nodes, NodeRunner.round)
            # quiet after its own round is not enough (a later node's round may give it work): once
            # every node says so, ask again after all the rounds (one more call, not one per round)
            if attempt >= 1 and all(quiet) and all(self.placement.each(self.nodes, NodeRunner.quiet)):
                return
        raise ProtocolError(f"the nodes did not settle after {limit} rounds")

    # ---- the run's parameters ----------------------------------------------------------------------------
    def rows(self) -> Tensor:
        """[N, width + state]: every key's main copy, gathered from its owner (evaluation, checkpoints)."""
        out = None
        for keys, values in self.placement.each(self.nodes, NodeRunner.owned):
            if out is None:
                out = torch.empty(self.keys.shape[0], values.shape[1])
            out[torch.searchsorted(self.keys, keys)] = values
        return out

    def values(self, keys: Tensor) -> Tensor:
        """[n, width] trained rows of ``keys``, each from its owner (only these rows move); a key
        outside the key space reads its initial values."""
        out = torch.empty(keys.shape[0], self.spec.width)
        found = torch.zeros(keys.shape[0], dtype=torch.bool)
        for positions, rows in self.placement.each(self.nodes, NodeRunner.rows_of, keys):
            out[positions] = rows
            found[positions] = True
        missing = (~found).nonzero().squeeze(1)
        if missing.numel():
            out[missing] = self.spec.initial_values(keys.index_select(0, missing))
        return out

    def part_names(self) -> list[str]:
        return [f"node-{index:03d}-of-{self.count:03d}.safetensors" for index in range(self.count)]

    def write_parts(self, directory: Path) -> dict[str, str]:
        """Each node writes the main copies it holds into ``directory`` itself, all at once; {file: sha256}."""
        names = self.part_names()
        calls = [node.start(NodeRunner.save_part, str(directory / name)) for node, name in zip(self.nodes, names)]
        return {name: call.result() for name, call in zip(names, calls)}

    def load_parts(self, directory: str, parts: dict[str, str]) -> None:
        """Each node reads a checkpoint's parts itself."""
        self.placement.each(self.nodes, NodeRunner.load_parts, directory, parts)

    def load_table(self, keys: Tensor, values: Tensor, state: Tensor) -> None:
        """Each node takes the rows of the keys it has slots for."""
        self.placement.each(self.nodes, NodeRunner.load_table, keys, values, state)

    def load_dense(self) -> None:
        """Every node's dense copies take ``dense`` and its optimizer state (a loaded checkpoint)."""
        state = {k: v.detach().clone() for k, v in self.dense.state_dict().items()}
        optimizer = self.dense_optimizer.state_dict() if self.dense_optimizer is not None else None
        self.placement.each(self.nodes, NodeRunner.load_dense, state, optimizer, 0)

    def stats(self) -> dict[str, Any]:
        counters = self.placement.each(self.nodes, NodeRunner.counters)
        return {**summarize(self.settings, counters, self.epochs, self.seconds), **self.placement.fields()}

    def counters(self) -> dict[str, Any]:
        return {"nodes": self.placement.each(self.nodes, NodeRunner.counters), "epochs": self.epochs,
                "seconds": self.seconds}

    def load_counters(self, meta: dict[str, Any]) -> None:
        saved = meta.get("nodes", [])
        if len(saved) == self.count:
            for node, entry in zip(self.nodes, saved):
                node.call(NodeRunner.load_counters, entry)
        self.epochs, self.seconds = meta.get("epochs", 0), meta.get("seconds", 0.0)

    def close(self) -> None:
        self.placement.close()
