"""The runtime contract: where a task's parameters live and how an epoch's batches run over them.

Each strategy family builds a runtime (``cadence.strategies``); the trainer only calls these verbs:
``run_epoch``, ``parameters`` (a read view by key), ``dense``, ``stats``, and ``state`` /
``load_state`` for checkpoints in one format::

    table.keys [K] int64 (sorted), table.values [K, width], table.state [K, S],
    (table.versions [K] on the pipeline), dense.<name>, dense_optimizer.*

so resume, eval, export and ``--init-from`` are the same code whichever runtime wrote a run.
``run_epoch`` calls ``on_batch`` once per finished batch on every runtime.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager, Protocol

import torch
from torch import Tensor, nn

from cadence.config import Config
from cadence.core import checkpoint as ckpt
from cadence.core.batch import Batch, BatchPlan
from cadence.core.keys import KeyIndex
from cadence.core.rows import TableSpec
from cadence.optim import ENTITY_OPTIMIZERS, dense_lr

OnBatch = Callable[[Batch], None]


class Trainable(Protocol):
    """What the runtime contract reads of a task (``cadence.tasks.Task`` has it)."""

    def table(self) -> TableSpec: ...

    def num_epochs(self) -> int: ...


def serialized(on_batch: OnBatch) -> OnBatch:
    """``on_batch`` for threads that finish batches side by side: one call at a time."""
    lock = threading.Lock()

    def report(batch: Batch) -> None:
        with lock:
            on_batch(batch)

    return report


class WorkerFailed(RuntimeError):
    """A worker raised: every other worker was released and the epoch abandoned."""


class ShardLost(RuntimeError):
    """A process holding rows died: its state since the last checkpoint is gone (the trainer calls
    ``Runtime.recover`` and reloads the last checkpoint)."""


class Runtime(ABC):
    name: str  # the runtime's name in summary.json: pipeline | parameter_server | adapm
    strategy: str = ""  # the registered strategy that built it (``Strategy.build`` sets it)

    def __init__(self, config: Config, task: Trainable):
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

    def table_on_disk(self) -> int:
        """Bytes of this process's table files (a memory-mapped store); 0: its rows live in memory."""
        return 0

    def evict(self) -> None:
        """Drop what the page cache holds of a table on disk (``EmbeddingStore.evict``), between
        epochs; nothing where rows live in memory."""

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
