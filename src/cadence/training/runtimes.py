"""Where a task's parameters live and how an epoch's batches run over them: the two runtimes.

- ``PipelineRuntime``: one process; the rows in an ``EmbeddingStore`` (memory or mmap), the dense
  module on the compute device, the stages scheduled by a pipeline strategy (``sync``, ``async``,
  ``oac``).
- ``ParameterServerRuntime``: server shards that own the rows (``key % shards``) and, on shard 0,
  the dense module; workers pull, compute and push (gradient, token); a parameter-server mode
  (``sync``, ``async``, ``bsp``, ``gba``, ``hop_bs``, ``hop_bw``) chooses the shards' aggregation
  and the workers' gate; an engine (threads or Ray actors) runs the workers.

Both expose the same verbs to the trainer: ``run_epoch``, ``parameters`` (a read view by key),
``dense``, ``stats``, and ``state``/``load_state`` for checkpoints in one format::

    table.keys [K] int64 (sorted), table.values [K, width], table.state [K, S],
    (table.versions [K] on the pipeline), dense.<name>, dense_optimizer.*

so resume, eval, export and ``--init-from`` are the same code whichever runtime wrote a run.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from pathlib import Path
from contextlib import nullcontext
from typing import Any, Callable, ContextManager

import torch
from torch import Tensor, nn

from cadence.config import Config
from cadence.optim import ENTITY_OPTIMIZERS, dense_lr, dense_optimizer, set_lr
from cadence.pipeline.batch import Batch, BatchPlan
from cadence.pipeline.stages import ComputeStage, KeyIndex, LoadStage, Stages, WriteStage
from cadence.pipeline.transfer import DeviceLink
from cadence.runtime.engines import ENGINES, EpochPlan, dense_here
from cadence.runtime.worker import Faults, ShardRouter
from cadence.store.embedding_store import create_store
from cadence.tasks.base import TableSpec, Task
from cadence.training import checkpoint as ckpt

log = logging.getLogger("cadence")

OnBatch = Callable[[Batch], None]


def _dense_optimizer(config: Config, module: nn.Module) -> torch.optim.Optimizer | None:
    parameters = list(module.parameters())
    return dense_optimizer(config.optimizer, parameters) if parameters else None


class Runtime(ABC):
    name: str

    def __init__(self, config: Config, task: Task):
        self.config = config
        self.task = task
        self.entity_optimizer_class = ENTITY_OPTIMIZERS.get(config.optimizer.entity)
        self.spec: TableSpec = task.table()

    @abstractmethod
    def run_epoch(self, plans: list[BatchPlan], on_batch: OnBatch) -> tuple[float, int]:
        """Train on every plan once; return (sum of loss x batch size, batch examples)."""

    def epoch_lr(self, plans: list[BatchPlan]) -> float:
        """The dense rate of the epoch these plans belong to (``optimizer.schedule``)."""
        epoch = plans[0].epoch if plans else 0
        return dense_lr(self.config.optimizer, self.task.num_epochs(), epoch)

    @abstractmethod
    def parameters(self):
        """A ``ParameterView`` of the current rows."""

    @abstractmethod
    def dense(self) -> nn.Module:
        """The current dense module."""

    def stats(self) -> dict[str, Any]:
        return {}

    @abstractmethod
    def table_tensors(self) -> dict[str, Tensor]:
        """``table.keys/values/state`` of every row (gathered into this process)."""

    @abstractmethod
    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Checkpoint tensors and JSON metadata (the module docstring's format)."""

    @abstractmethod
    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any], counters: bool = True) -> None:
        """Restore a checkpoint; ``counters=False`` (``--init-from``): parameters only."""

    def close(self) -> None:
        """Release threads or remote resources."""

    def sweeping(self) -> ContextManager[None]:
        """Around a read of every row (a checkpoint): a memory-mapped table reads ahead meanwhile."""
        return nullcontext()

    def recover(self) -> None:
        """Restart what a ``ShardLost`` took (the trainer then reloads the last checkpoint)."""

    # ``write_parts(directory) -> {file: sha256}``: a runtime whose rows live elsewhere (server
    # shards) has them written into the checkpoint's directory there; None: rows are ``tensors``.
    write_parts: Callable[[Path], dict[str, str]] | None = None

    def _dense_state(self, optimizer: torch.optim.Optimizer | None) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors = {f"dense.{k}": v.detach() for k, v in self.dense().state_dict().items()}
        meta: dict[str, Any] = {}
        if optimizer is not None:
            optimizer_tensors, meta = ckpt.flatten_optimizer(optimizer)
            tensors.update(optimizer_tensors)
        return tensors, {"dense_optimizer": meta}

    def _load_dense(self, tensors: dict[str, Tensor], meta: dict[str, Any],
                    optimizer: torch.optim.Optimizer | None) -> None:
        state = {k[len("dense."):]: v for k, v in tensors.items() if k.startswith("dense.")}
        self.dense().load_state_dict(state)
        if optimizer is not None:
            ckpt.restore_optimizer(optimizer, tensors, meta["dense_optimizer"])


class RowsView:
    """``ParameterView`` of a block of rows: row = key (``index`` None), or the keys of ``index`` in
    order (a growing vocabulary's store, a checkpoint's ``table.keys``); unknown keys read their
    initial values."""

    def __init__(self, rows: Tensor, spec: TableSpec, index: KeyIndex | None = None):
        self.rows, self.spec, self.index = rows, spec, index

    def values(self, keys: Tensor) -> Tensor:
        if self.index is None:
            return self.rows.index_select(0, keys)
        position, found = self.index.locate(keys)
        if bool(found.all()):
            return self.rows.index_select(0, position)
        values = self.spec.initial_values(keys)
        mine = found.nonzero().squeeze(1)
        values[mine] = self.rows.index_select(0, position[mine])
        return values


class PipelineRuntime(Runtime):
    name = "pipeline"

    def __init__(self, config: Config, task: Task, store_path: str, device: torch.device, strategy):
        super().__init__(config, task)
        spec, state_width = self.spec, self.entity_optimizer_class.state_width(self.spec.width)
        self.index = None if spec.fixed else KeyIndex(task.known_keys())
        rows = spec.rows if spec.fixed else self.index.keys.shape[0]
        mapped = store_path if config.store.backend == "mmap" else None
        self.store = create_store(rows, spec.width, state_width, config.store.backend, mapped)
        spec.initialize(self.store, None if self.index is None else self.index.keys)
        self.store.advise(config.store.readahead)
        self.module = task.dense_module().to(device)
        self.dense_optimizer = _dense_optimizer(config, self.module)
        self.device = device
        link = DeviceLink(device)
        self.stages = Stages(
            load=LoadStage(self.store, task, self.index, pin=link.accelerated),
            link=link,
            compute=ComputeStage(task, self.module, self.entity_optimizer_class(config.optimizer), self.dense_optimizer),
            write=WriteStage(self.store),
        )
        self.strategy = strategy

    def run_epoch(self, plans: list[BatchPlan], on_batch: OnBatch) -> tuple[float, int]:
        total = torch.zeros((), dtype=torch.float64)
        examples = 0

        def finished(batch: Batch) -> None:
            nonlocal total, examples
            total += self.task.loss_total(batch.loss.cpu(), batch.size)
            examples += batch.size
            on_batch(batch)

        set_lr(self.dense_optimizer, self.epoch_lr(plans))
        self.strategy.run_epoch(plans, self.stages, finished)
        return float(total), examples

    def parameters(self) -> RowsView:
        return RowsView(self.store.values, self.spec, self.index)

    def dense(self) -> nn.Module:
        return self.module

    def stats(self) -> dict[str, Any]:
        return self.strategy.stats()

    def keys(self) -> Tensor:
        return torch.arange(self.store.num_rows) if self.index is None else self.index.keys

    def table_tensors(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.state()[0].items() if k.startswith("table.")}

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors = {"table.keys": self.keys(), **{f"table.{k}": v for k, v in self.store.tensors().items()}}
        dense, meta = self._dense_state(self.dense_optimizer)
        return {**tensors, **dense}, meta

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any], counters: bool = True) -> None:
        if "table.keys" not in tensors:  # rows written in parts by server shards (a switched job)
            tensors = {**tensors, **ckpt.read_tables(meta)}
        keys = tensors["table.keys"]
        if torch.equal(keys, self.keys()):
            versions = tensors.get("table.versions", torch.full((keys.shape[0],), -1, dtype=torch.int64))
            self.store.load_tensors({"values": tensors["table.values"], "state": tensors["table.state"],
                                     "versions": versions if counters else torch.full_like(versions, -1)})
        else:  # another run's parameters (``--init-from``): the keys both know
            position, found = KeyIndex(self.keys()).locate(keys)
            both = found.nonzero().squeeze(1)
            self.store.values[position[both]] = tensors["table.values"][both]
            self.store.state[position[both]] = tensors["table.state"][both]
        self._load_dense(tensors, meta, self.dense_optimizer)

    def close(self) -> None:
        self.strategy.close()

    def sweeping(self) -> ContextManager[None]:
        return self.store.sweeping()


class ParameterServerRuntime(Runtime):
    name = "parameter_server"

    def __init__(self, config: Config, task: Task, mode):
        super().__init__(config, task)
        self.mode = mode
        ps = config.ps
        self.faults = Faults.parse(ps.stragglers, ps.kill_workers, ps.workers)
        self.model = task.dense_module()  # shard 0's dense module (threads), or the driver's copy of it (ray)
        self.engine = ENGINES.get(ps.engine)(config, task, mode, self.model)
        self.router = ShardRouter(self.engine.shards)
        self.dead: set[int] = set()
        self.replaced = 0  # worker processes that died unexpectedly and were replaced
        self.worker_examples = [0] * ps.workers
        self.bytes_moved = 0
        self.train_seconds = 0.0

    @property
    def shards(self) -> list:
        return self.engine.shards

    def run_epoch(self, plans: list[BatchPlan], on_batch: OnBatch) -> tuple[float, int]:
        ps = self.config.ps
        for shard in self.shards:
            shard.resume()  # (a failed epoch left them aborted)
        if dense_here(self.config):  # the replicas start from the run's optimizer state, its rate included
            set_lr(self.engine.dense_optimizer, self.epoch_lr(plans))
        elif list(self.model.parameters()):
            self.shards[0].set_dense_lr(self.epoch_lr(plans))
        live = [index for index in range(ps.workers) if index not in self.dead]
        kill_after = {}
        for index, after in self.faults.kill_after.items():
            kill_after[index] = max(0, after - self.worker_examples[index] // self.config.train.batch_size)
        epoch = EpochPlan(plans[0].epoch if plans else 0, len(plans), self.shards[0].get_global_step(), live,
                          sorted(self.dead), self.faults, kill_after)
        started = time.perf_counter()
        reports = self.engine.run_epoch(epoch, plans)
        for shard in self.shards:
            shard.flush()
        self.train_seconds += time.perf_counter() - started
        loss, examples = 0.0, 0
        for report in reports:
            loss += report.loss_total
            examples += report.examples
            self.worker_examples[report.index] += report.examples
            self.bytes_moved += report.bytes_moved
            if report.died:
                self.dead.add(report.index)
                log.warning("worker %d was killed after %d batches (fault injection); its batch was dropped",
                            report.index, report.pushed)
            if report.lost:
                self.replaced += 1
        return loss, examples

    def parameters(self) -> "RouterView":
        return RouterView(self.router)

    def dense(self) -> nn.Module:
        if dense_here(self.config):  # the engine keeps the workers' (identical) replica here
            return self.model
        state, _ = self.shards[0].pull_dense()  # (ray: the driver's copy is refreshed from shard 0)
        self.model.load_state_dict(state)
        return self.model

    def stats(self) -> dict[str, Any]:
        seconds = self.train_seconds
        per_shard = [shard.stats() for shard in self.shards]
        return {
            "workers": self.config.ps.workers,
            "engine": self.config.ps.engine,
            # building the engine's processes before training (ray: actors import torch, read the data)
            "engine_start_seconds": round(self.engine.start_seconds, 3),
            "worker_examples_per_second": [round(e / seconds, 1) if seconds > 0 else 0.0 for e in self.worker_examples],
            "vocabulary_added": sum(s["vocabulary_added"] for s in per_shard),
            # every batch's gradient reaches every shard: shard 0's counts count each batch once
            **{k: v for k, v in per_shard[0].items() if k != "vocabulary_added"},
            "shards": per_shard,
            "workers_killed": sorted(self.dead),
            "workers_replaced": self.replaced,
            # tensor bytes between workers and shards (keys, rows, gradients, dense), per example
            "bytes_moved_per_example": round(self.bytes_moved / max(1, sum(self.worker_examples)), 1),
            **(self._shadow_stats() if self.mode.replicas else {}),
        }

    def _shadow_stats(self) -> dict[str, Any]:
        """ShadowSync's metrics (SPEC section 5): syncs per second over the training time, the sync
        gap (the seed's equation: EPS / batch size / syncs per second, i.e. batches of a trainer
        between two syncs of its replica; null when nothing synced: hogwild) and the examples in
        flight, ELP = batch x Hogwild threads x trainers."""
        batch, seconds = self.config.train.batch_size, self.train_seconds
        syncs, examples = self.engine.syncs, sum(self.worker_examples)
        per_second = syncs / seconds if seconds > 0 else 0.0
        eps = examples / seconds if seconds > 0 else 0.0
        return {
            "dense_syncs": syncs,
            "syncs_per_second": round(per_second, 6),
            "sync_gap": round(eps / batch / per_second, 6) if per_second > 0 else None,
            "examples_in_flight": batch * self.config.shadow.threads * self.config.ps.workers,
        }

    # ---- checkpoints: every shard writes and reads its own part ---------------------------------
    def part_names(self) -> list[str]:
        count = len(self.shards)
        return [f"shard-{index:03d}-of-{count:03d}.safetensors" for index in range(count)]

    def write_parts(self, directory: Path) -> dict[str, str]:
        """Each shard writes its rows into ``directory`` itself (in parallel); {file: sha256}."""
        names = self.part_names()
        calls = [shard.submit("save_part", str(directory / name)) for shard, name in zip(self.shards, names)]
        return {name: call.result() for name, call in zip(names, calls)}

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        if dense_here(self.config):
            tensors, meta = self._dense_state(self.engine.dense_optimizer)
            optimizer_meta = meta["dense_optimizer"]
        else:
            tensors, optimizer_meta = self.shards[0].dense_checkpoint()
        meta = {"dense_optimizer": optimizer_meta, "global_steps": [s.get_global_step() for s in self.shards],
                "dead": sorted(self.dead), "worker_examples": self.worker_examples, "ps_seconds": self.train_seconds,
                "bytes_moved": self.bytes_moved, "dense_syncs": self.engine.syncs}
        return tensors, meta

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any], counters: bool = True) -> None:
        parts = meta.get(ckpt.PARTS)
        if "table.keys" not in tensors and parts is not None and sorted(parts) == self.part_names():
            directory = Path(meta[ckpt.PARTS_DIR])  # each shard reads its own part: no row passes through here
            calls = [shard.submit("load_part", str(directory / name), parts[name])
                     for shard, name in zip(self.shards, self.part_names())]
            for call in calls:
                call.result()
        else:
            if "table.keys" not in tensors:
                tensors = {**tensors, **ckpt.read_tables(meta)}
            self._import_rows(tensors["table.keys"], tensors["table.values"], tensors["table.state"])
        dense = {k: v for k, v in tensors.items() if not k.startswith("table.")}
        if dense_here(self.config):
            optimizer = self.engine.dense_optimizer
            self._load_dense(dense, meta, optimizer if meta.get("dense_optimizer") else None)
        else:
            self.shards[0].load_dense_checkpoint(dense, meta.get("dense_optimizer"))
        steps = meta.get("global_steps")
        if steps is not None and len(steps) == len(self.shards):  # a switched job continues the step count
            for shard, step in zip(self.shards, steps):
                shard.set_global_step(step)
        if counters:
            self.dead = set(meta.get("dead", []))
            self.worker_examples = list(meta.get("worker_examples", self.worker_examples))
            self.train_seconds = meta.get("ps_seconds", 0.0)
            self.bytes_moved = meta.get("bytes_moved", 0)
            self.engine.syncs = meta.get("dense_syncs", 0)

    def table_tensors(self) -> dict[str, Tensor]:
        """Every row, gathered here (tests, small tables): ``table.keys/values/state``, sorted by key."""
        return ckpt.merge_tables([shard.export_rows() for shard in self.shards])

    def _import_rows(self, keys: Tensor, values: Tensor, state: Tensor) -> None:
        owner = keys.remainder(len(self.shards))
        for index, shard in enumerate(self.shards):
            mine = (owner == index).nonzero().squeeze(1)
            if self.spec.fixed:
                mine = mine[keys[mine] < self.spec.rows]
            shard.import_rows(keys[mine], values[mine], state[mine])

    def recover(self) -> None:
        """A shard's process died (``ShardLost``): restart it empty; the trainer then reloads every
        shard from the last checkpoint."""
        self.engine.recover()
        self.router = ShardRouter(self.engine.shards)

    def close(self) -> None:
        self.engine.close()


class RouterView:
    """``ParameterView`` of the server shards (unseen keys read their initial rows, none is added)."""

    def __init__(self, router: ShardRouter):
        self.router = router

    def values(self, keys: Tensor) -> Tensor:
        return self.router.pull_rows(keys, create=False)


class AdaPMRuntime(Runtime):
    """AdaPM (SPEC section 2): ``ps.workers`` nodes, parameters relocated or replicated between them
    from intent signals (``cadence.runtime.adapm``). Between epochs every main copy holds every
    update, so checkpoints, evaluation and export read the owners' rows, in the pipeline's format."""

    name = "adapm"

    def __init__(self, config: Config, task: Task):
        super().__init__(config, task)
        self.module = task.dense_module()
        if config.ps.engine == "ray":
            from cadence.runtime.adapm.ray_nodes import RayCluster

            self.cluster = RayCluster(config, task, self.module)
        else:
            from cadence.runtime.adapm.engine import Cluster

            self.cluster = Cluster(config, task, self.module)
        self.index = None if self.spec.fixed else KeyIndex(self.cluster.keys)

    def run_epoch(self, plans: list[BatchPlan], on_batch: OnBatch) -> tuple[float, int]:
        return self.cluster.run_epoch(plans, self.epoch_lr(plans), on_batch)

    def parameters(self) -> RowsView:
        return RowsView(self.cluster.rows()[:, :self.spec.width], self.spec, self.index)

    def dense(self) -> nn.Module:
        return self.module

    def stats(self) -> dict[str, Any]:
        return self.cluster.stats()

    def table_tensors(self) -> dict[str, Tensor]:
        rows = self.cluster.rows()
        width = self.spec.width
        return {"table.keys": self.cluster.keys, "table.values": rows[:, :width].contiguous(),
                "table.state": rows[:, width:].contiguous()}

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        dense, meta = self._dense_state(self.cluster.dense_optimizer)
        return {**self.table_tensors(), **dense}, {**meta, "adapm": self.cluster.counters()}

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any], counters: bool = True) -> None:
        if "table.keys" not in tensors:  # rows written in parts by server shards (a switched job)
            tensors = {**tensors, **ckpt.read_tables(meta)}
        keys = tensors["table.keys"]
        loaded = torch.cat([tensors["table.values"], tensors["table.state"]], dim=1)
        if torch.equal(keys, self.cluster.keys):
            rows = loaded
        else:  # another run's parameters (``--init-from``): the keys both know
            rows = self.cluster.rows()
            position, found = (self.index or KeyIndex(self.cluster.keys)).locate(keys)
            both = found.nonzero().squeeze(1)
            rows[position[both]] = loaded[both]
        self.cluster.load_rows(rows)
        self._load_dense(tensors, meta, self.cluster.dense_optimizer if meta.get("dense_optimizer") else None)
        self.cluster.load_dense()
        if counters and "adapm" in meta:
            self.cluster.load_counters(meta["adapm"])

    def close(self) -> None:
        self.cluster.close()

