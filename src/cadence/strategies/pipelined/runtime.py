"""The pipeline runtime: one process; the rows in an ``EmbeddingStore`` (memory or mmap), the dense
module on the compute device, the stages scheduled by a pipeline schedule (``sync``, ``async``,
``oac``, ``pdasgd``)."""

from __future__ import annotations

from typing import Any, ContextManager

import torch
from torch import Tensor, nn

from cadence.config import Config
from cadence.core import checkpoint as ckpt
from cadence.core.batch import Batch, BatchPlan
from cadence.core.keys import KeyIndex
from cadence.core.runtime import OnBatch, RowsView, Runtime
from cadence.engines.threads import ThreadGovernor, usable_cores
from cadence.optim import module_optimizer, set_lr
from cadence.pipeline.stages import ComputeStage, InPlaceStage, LoadStage, Stages, WriteStage
from cadence.pipeline.transfer import DeviceLink
from cadence.resources import limit_allocator_arenas
from cadence.store.embedding_store import create_store
from cadence.tasks.base import Task


class PipelineRuntime(Runtime):
    name = "pipeline"

    def __init__(self, config: Config, task: Task, store_path: str, device: torch.device, schedule):
        super().__init__(config, task)
        spec, state_width = self.spec, self.entity_optimizer_class.state_width(self.spec.width)
        self.index = None if spec.fixed else KeyIndex(task.known_keys())
        rows = spec.rows if spec.fixed else self.index.keys.shape[0]
        mapped = store_path if config.store.backend == "mmap" else None
        if mapped is not None:  # (before the stage threads take arenas of their own)
            limit_allocator_arenas(config.store.malloc_arenas)
        self.store = create_store(rows, spec.width, state_width, config.store.backend, mapped)
        spec.initialize(self.store, None if self.index is None else self.index.keys)
        self.store.advise(config.store.readahead)
        self.module = task.dense_module().to(device)
        self.dense_optimizer = module_optimizer(config.optimizer, self.module)
        self.device = device
        link = DeviceLink(device)
        # the compute thread's intra-op threads, re-chosen by measurement (on the CPU: an accelerator's
        # kernels do not run in OpenMP teams)
        self.governor = (ThreadGovernor(torch.get_num_threads())
                         if config.adapt_threads and device.type == "cpu" and schedule.governed
                         and not task.updates_in_place else None)
        if task.updates_in_place:  # the task's own steps on the rows, a part per usable core
            assert schedule.in_place and spec.fixed, "the strategy's entry refuses a task updating rows in place"
            self.in_place_threads = config.threads or usable_cores()
            compute = InPlaceStage(task, self.store, self.in_place_threads)
        else:
            compute = ComputeStage(task, self.module, self.entity_optimizer_class(config.optimizer),
                                   self.dense_optimizer, self.governor)
        self.stages = Stages(
            load=LoadStage(self.store, task, self.index, pin=link.accelerated),
            link=link,
            compute=compute,
            write=WriteStage(self.store),
        )
        self.schedule = schedule

    def run_epoch(self, plans: list[BatchPlan], on_batch: OnBatch) -> tuple[float, int]:
        total: Tensor | None = None  # on the loss's device: no synchronisation per batch
        examples = 0

        def finished(batch: Batch) -> None:
            nonlocal total, examples
            if total is None:
                total = torch.zeros((), dtype=torch.float64, device=batch.loss.device)
            total.add_(batch.loss, alpha=self.task.loss_weight(batch.size))  # (one operator)
            examples += batch.size
            on_batch(batch)

        set_lr(self.dense_optimizer, self.epoch_lr(plans))
        if self.governor is not None:
            self.governor.restart()  # (the pause between epochs is no step's time)
        self.schedule.run_epoch(plans, self.stages, finished)
        return (0.0 if total is None else float(total)), examples

    def parameters(self) -> RowsView:
        return RowsView(self.store.values, self.spec, self.index)

    def dense(self) -> nn.Module:
        return self.module

    def stats(self) -> dict[str, Any]:
        governed = {} if self.governor is None else self.governor.stats()
        in_place = {"in_place_threads": self.in_place_threads} if self.task.updates_in_place else {}
        return {**self.schedule.stats(), **governed, **in_place}

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
        self.schedule.close()
        self.stages.compute.close()

    def sweeping(self) -> ContextManager[None]:
        return self.store.sweeping()

    def table_on_disk(self) -> int:
        return self.store.disk_bytes

    def evict(self) -> None:
        self.store.evict()
