"""AdaPM's runtime (SPEC section 2): ``ps.workers`` nodes, parameters relocated or replicated between
them from intent signals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor, nn

from cadence.config import Config
from cadence.core import checkpoint as ckpt
from cadence.core.batch import BatchPlan
from cadence.core.runtime import OnBatch, Runtime
from cadence.engines import PLACEMENTS
from cadence.strategies.adapm.engine import Cluster
from cadence.tasks.base import Task


class AdaPMRuntime(Runtime):
    """AdaPM (SPEC section 2): ``ps.workers`` nodes, parameters relocated or replicated between them
    from intent signals (``cadence.strategies.adapm``). Between epochs every main copy holds every
    update, so checkpoints, evaluation and export read the owners' rows, in the pipeline's format."""

    name = "adapm"

    def __init__(self, config: Config, task: Task):
        super().__init__(config, task)
        self.module = task.dense_module()
        placement = PLACEMENTS.get(config.ps.engine)(config.ps.ray_address, config.threads)
        self.cluster = Cluster(config.adapm, config.optimizer, self.entity_optimizer_class, config.ps.workers, task,
                               self.module, placement)

    def run_epoch(self, plans: list[BatchPlan], on_batch: OnBatch) -> tuple[float, int]:
        return self.cluster.run_nodes(plans, self.epoch_lr(plans), on_batch)

    def parameters(self) -> "Cluster":
        """The trained rows by key, each read from its owner: evaluation moves only the rows it asks
        for (no gather of the table into the driver)."""
        return self.cluster

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
        """The dense part and the counters; the rows go to parts each node writes (``write_parts``)."""
        dense, meta = self._dense_state(self.cluster.dense_optimizer)
        return dense, {**meta, "adapm": self.cluster.counters()}

    def write_parts(self, directory: Path) -> dict[str, str]:
        """Each node writes its main copies into the checkpoint's directory: no row passes through
        the driver (any runtime reads the parts: ``checkpoint.read_tables``)."""
        return self.cluster.write_parts(directory)

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any], counters: bool = True) -> None:
        if "table.keys" in tensors:  # (a checkpoint with its rows in its tensors, or merged by the caller)
            self.cluster.load_table(tensors["table.keys"], tensors["table.values"], tensors["table.state"])
        else:  # written in parts (by these nodes, or another runtime's shards): each node reads them
            self.cluster.load_parts(meta[ckpt.PARTS_DIR], meta[ckpt.PARTS])
        self._load_dense(tensors, meta, self.cluster.dense_optimizer if meta.get("dense_optimizer") else None)
        self.cluster.load_dense()
        if counters and "adapm" in meta:
            self.cluster.load_counters(meta["adapm"])

    def close(self) -> None:
        self.cluster.close()
