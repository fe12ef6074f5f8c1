"""AdaPM's nodes as Ray actors (``--strategy adapm --engine ray``).

Each ``NodeActor`` is one node: it builds the task itself (``task.recipe()``: it reads its own data),
allocates and initialises its store from the task's seeded rows (no table passes through the
driver), and hosts the same ``NodeRunner`` as the thread engine: its worker threads and its sync
thread. Nodes talk to each other directly, actor to actor: a round's grouped message is a call of
the destination's ``handle``, a forwarded part a call of ``handle_forwarded``, a synchronous remote
access a call of ``serve``. The actors are threaded (``max_concurrency``), so a node answers the
others while its own workers and sync thread run. The driver hands each node its share of an
epoch's plans, runs the settling rounds between epochs, and gathers the owners' rows only for
evaluation and checkpoints.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch
from torch import Tensor, nn

from cadence.config import Config
from cadence.optim import ENTITY_OPTIMIZERS, module_optimizer
from cadence.core.batch import Batch, BatchPlan, finished_batch
from cadence.strategies.adapm.engine import NodeCluster, NodeRunner, initial_values, key_space, summarize
from cadence.strategies.adapm.node import ProtocolError, nbytes
from cadence.core.runtime import WorkerFailed, serialized
from cadence.engines.ray import cluster_nodes, connect, on_node, pack, ray, ray_get, unpack

CONCURRENCY = 16  # calls an actor serves at once: its epoch, rounds, and the other nodes' messages


class RayTransport:
    """Messages from one node actor to the others: calls of their methods, waited for."""

    def __init__(self, handles: list, runner: NodeRunner):
        self.handles, self.runner = handles, runner

    def exchange(self, source: int, dest: int, request):
        return unpack(ray.get(self.handles[dest].handle.remote(pack(request))))

    def forward(self, node: int, sub):
        return unpack(ray.get(self.handles[node].handle_forwarded.remote(pack(sub))))

    def access(self, source: int, dest: int, slots: Tensor, delta: Tensor | None, value: Tensor | None):
        self.runner.node.bytes_sent += nbytes(slots, delta, value)
        return unpack(ray.get(self.handles[dest].serve.remote(source, *pack((slots, delta, value)))))


class NodeActor:
    """One AdaPM node in its own process."""

    def __init__(self, config: Config, recipe_box: list, index: int, threads: int):
        torch.set_num_threads(threads)
        self.task = ray.get(recipe_box[0])()
        entity_class = ENTITY_OPTIMIZERS.get(config.optimizer.entity)
        keys, initial = initial_values(self.task, entity_class.state_width(self.task.table().width))
        self.runner = NodeRunner(config, self.task, index, keys, initial, self.task.dense_module(), True)
        self.stop = threading.Event()

    def ping(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def connect(self, handles: list) -> None:
        self.transport = RayTransport(handles, self.runner)
        self.runner.connect(self.transport)

    def start_epoch(self, lr: float) -> None:
        self.stop.clear()
        self.runner.set_lr(lr)
        self.runner.start_sync(self.stop)

    def work(self, plans: list[BatchPlan]) -> tuple[float, int, list[tuple[int, float]]]:
        """This node's share of the epoch; (summed loss, examples, (plan index, loss) of each batch)."""
        finished: list[tuple[int, float]] = []
        report = serialized(lambda batch: finished.append((batch.plan.index, float(batch.loss))))
        loss, examples = self.runner.work(unpack(plans), report, self.stop)
        return loss, examples, finished

    def end_epoch(self) -> None:
        self.runner.stop_sync()

    def abort(self) -> None:
        self.stop.set()

    # ---- the protocol: other nodes' calls ------------------------------------------------------------
    # (tensors cross as numpy arrays: ``_pack`` / ``_unpack``; pickled tensors cost milliseconds each)
    def handle(self, request):
        return pack(self.runner.node.handle(unpack(request), self.transport.forward))

    def handle_forwarded(self, request):
        return pack(self.runner.node.handle(unpack(request), forwarded=True))

    def serve(self, source: int, slots, delta, value):
        return pack(self.runner.node.serve(source, *unpack((slots, delta, value))))

    # ---- the driver's calls ---------------------------------------------------------------------------
    def round(self) -> bool:
        self.runner.round()
        return self.runner.quiet()

    def sync_local_dense(self) -> None:
        self.runner._sync_local_dense()

    def owned(self):
        return pack(self.runner.owned())

    def load_rows(self, values) -> None:
        self.runner.load_rows(unpack(values))

    def main_dense_state(self):
        return pack(self.runner.main_dense_state())

    def load_dense(self, state, optimizer, version: int) -> None:
        self.runner.load_dense(unpack(state), unpack(optimizer), version)

    def counters(self) -> dict[str, Any]:
        return self.runner.counters()

    def load_counters(self, entry: dict[str, Any]) -> None:
        self.runner.load_counters(entry)


_ACTOR: list[Any] = []


def _actor_class():
    if not _ACTOR:
        _ACTOR.append(ray.remote(NodeActor))
    return _ACTOR[0]


class RayCluster(NodeCluster):
    """The driver's side: one ``NodeActor`` per node, dealt round-robin over the cluster's machines;
    the same interface as the thread engine's ``Cluster``."""

    def __init__(self, config: Config, task, dense: nn.Module):
        if not ray.is_initialized():
            connect(config.ps.ray_address, config.threads)
        self.config, self.task, self.settings = config, task, config.adapm
        self.count = config.ps.workers
        self.keys = key_space(task)
        self.dense = dense  # the driver's copy of the main dense module (refreshed after each epoch)
        self.dense_optimizer = module_optimizer(config.optimizer, dense)
        recipe_box = [ray.put(task.recipe())]
        machines = cluster_nodes()
        threads = max(1, config.threads)
        started = time.perf_counter()
        self.actors = [_actor_class().options(
            num_cpus=0, max_concurrency=CONCURRENCY,
            scheduling_strategy=on_node(machines[index % len(machines)]),
        ).remote(config, recipe_box, index, threads) for index in range(self.count)]
        self.hosts = ray_get([actor.ping.remote() for actor in self.actors])
        ray_get([actor.connect.remote(self.actors) for actor in self.actors])
        self.start_seconds = time.perf_counter() - started
        self.epochs = 0
        self.seconds = 0.0

    def run_nodes(self, plans: list[BatchPlan], lr: float, on_batch: Callable[[Batch], None]) -> tuple[float, int]:
        parts = self.task.partition(plans, self.count)
        started = time.perf_counter()
        ray_get([actor.start_epoch.remote(lr) for actor in self.actors])  # every sync thread runs until all are done
        calls = {actor.work.remote(pack(parts[index])): index for index, actor in enumerate(self.actors)}
        results, pending = [], list(calls)
        by_index = {plan.index: plan for plan in plans}
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                try:
                    results.append(ray.get(done[0]))
                    for plan_index, batch_loss in results[-1][2]:  # the node's batches, as its result arrives
                        on_batch(finished_batch(by_index[plan_index], batch_loss))
                except Exception as err:  # one node failed: the others stop at their next batch
                    for actor in self.actors:
                        actor.abort.remote()
                    ray.wait(pending, num_returns=len(pending), timeout=60)
                    raise WorkerFailed(f"AdaPM node {calls[done[0]]} failed: {err}; the epoch is abandoned") from err
        finally:
            ray_get([actor.end_epoch.remote() for actor in self.actors])
        self.settle()
        self.seconds += time.perf_counter() - started
        self.epochs += 1
        self._refresh_dense()
        return sum(r[0] for r in results), sum(r[1] for r in results)

    def settle(self, limit: int = 1000) -> None:
        if self.count == 1:
            ray_get(self.actors[0].sync_local_dense.remote())
            return
        for attempt in range(limit):
            quiet = ray_get([actor.round.remote() for actor in self.actors])
            if attempt >= 1 and all(quiet):
                return
        raise ProtocolError(f"the nodes did not settle after {limit} rounds")

    def _refresh_dense(self) -> None:
        state, optimizer = unpack(ray_get(self.actors[0].main_dense_state.remote()))
        self.dense.load_state_dict(state)
        if self.dense_optimizer is not None and optimizer is not None:
            self.dense_optimizer.load_state_dict(optimizer)

    # ---- the run's parameters ----------------------------------------------------------------------------
    def rows(self) -> Tensor:
        """[N, width + state]: every key's main copy, gathered from its owner (evaluation, checkpoints)."""
        out = None
        for slots, values in unpack(ray_get([actor.owned.remote() for actor in self.actors])):
            if out is None:
                out = torch.empty(self.keys.shape[0], values.shape[1])
            out[slots] = values
        return out

    def load_rows(self, values: Tensor) -> None:
        ref = ray.put(pack(values))
        ray_get([actor.load_rows.remote(ref) for actor in self.actors])

    def load_dense(self) -> None:
        """Every node takes the driver's dense module and optimizer state (a loaded checkpoint)."""
        state = {k: v.detach().clone() for k, v in self.dense.state_dict().items()}
        optimizer = self.dense_optimizer.state_dict() if self.dense_optimizer is not None else None
        ray_get([actor.load_dense.remote(*pack((state, optimizer)), 0) for actor in self.actors])

    def stats(self) -> dict[str, Any]:
        counters = ray_get([actor.counters.remote() for actor in self.actors])
        return {**summarize(self.settings, counters, self.epochs, self.seconds),
                "engine": "ray", "engine_start_seconds": round(self.start_seconds, 3),
                "node_hosts": len(set(self.hosts))}

    def counters(self) -> dict[str, Any]:
        return {"nodes": ray_get([actor.counters.remote() for actor in self.actors]), "epochs": self.epochs,
                "seconds": self.seconds}

    def load_counters(self, meta: dict[str, Any]) -> None:
        saved = meta.get("nodes", [])
        if len(saved) == self.count:
            ray_get([actor.load_counters.remote(entry) for actor, entry in zip(self.actors, saved)])
        self.epochs, self.seconds = meta.get("epochs", 0), meta.get("seconds", 0.0)

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
