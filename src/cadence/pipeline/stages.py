"""The stages a batch passes through, as in Marius/OAC (SPEC section 1):

    load (the task prepares the batch, rows are read from the store) -> upload to the compute
    device -> compute (the task's loss, backward, optimizer steps: the critical section)
    -> download -> write (rows into the store)

For a task that updates its rows in place (``task.updates_in_place``: word2vec's or Surprise's loop), the
compute stage is ``InPlaceStage``: the task's steps on the store's rows, the batch split among
threads; the load and write stages then move no row (the batch has no ids).

Running the stages in this order, one batch at a time, is synchronous training; strategies differ
only in how they schedule the same stages (threads, queues, validation), never in their math. The
stages know no task: ``task.prepare`` and ``task.loss`` are their only task-specific calls. The
transfers, their streams and events are the ``DeviceLink``'s (pipeline/transfer.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from cadence.optim import EntityOptimizer, InPlaceDense, row_gradient
from cadence.core.batch import Batch, BatchPlan
from cadence.core.keys import KeyIndex
from cadence.engines.threads import Parts, ThreadGovernor
from cadence.pipeline.transfer import DeviceLink
from cadence.store.embedding_store import EmbeddingStore


class LoadStage:
    """Builds a batch from its plan (``task.prepare``): the unique rows it touches, in store rows."""

    def __init__(self, store: EmbeddingStore, task, index: KeyIndex | None = None, with_versions: bool = False,
                 pin: bool = False):
        self.store = store
        self.task = task
        self.index = index  # None: keys are rows
        self.with_versions = with_versions
        self.pin = pin  # rows into pinned memory (for an accelerator)

    def prepare(self, plan: BatchPlan) -> Batch:
        """The store-independent part: which rows, in which local positions."""
        batch = self.task.training_batch(plan)
        if self.index is not None:
            batch.ids = self.index.rows(batch.ids)
        return batch

    def read(self, batch: Batch) -> Batch:
        batch.rows = self.store.pull(batch.ids, with_versions=self.with_versions, pin=self.pin)
        return batch

    def __call__(self, plan: BatchPlan) -> Batch:
        return self.read(self.prepare(plan))


class Compute(ABC):
    """The compute stage: a batch in, its rows (and the dense parameters) updated and its loss set."""

    @abstractmethod
    def __call__(self, batch: Batch) -> Batch: ...

    def close(self) -> None:
        """Release what it keeps (threads)."""


class ComputeStage(Compute):
    """Forward, backward, and the update of the batch's rows and of the dense parameters."""

    def __init__(self, task, dense: nn.Module, entity_optimizer: EntityOptimizer,
                 dense_optimizer: torch.optim.Optimizer | None, governor: ThreadGovernor | None = None):
        self.task = task
        self.dense = dense
        self.entity_optimizer = entity_optimizer
        self.dense_optimizer = dense_optimizer  # None: the dense module has no parameters
        # its rule stepped in place: optimizer.step()'s update in fewer operators (cadence.optim)
        self.dense_rule = (None if dense_optimizer is None else
                           InPlaceDense(dense_optimizer, [p for group in dense_optimizer.param_groups
                                                          for p in group["params"]]))
        self.governor = governor  # chooses the computing thread's intra-op threads; None: left as they are

    def __call__(self, batch: Batch) -> Batch:
        assert batch.rows is not None, "the load stage fills rows before compute"
        if self.governor is not None:
            self.governor.apply()
            try:
                return self._compute(batch)
            finally:
                self.governor.step(batch.size)
        return self._compute(batch)

    def _compute(self, batch: Batch) -> Batch:
        # where the task has one operator for the whole step (and the row rule is one it applies),
        # that operator; else autograd's path, the reference it equals
        row_step = self.entity_optimizer.row_step()
        fused = None if row_step is None else self.task.fused_step(batch, batch.rows, self.dense, row_step)
        if fused is not None:
            batch.loss, dense_grads = fused
            if self.dense_rule is not None:
                self.dense_rule.step(dense_grads)
            else:  # the caller steps the dense parameters (AdaPM's node, under its lock): their gradients
                # where autograd's backward would have left them
                for param, grad in zip(self.dense.parameters(), dense_grads):
                    param.grad = grad
            return batch
        rows = batch.rows.values.requires_grad_(True)
        loss = self.task.train_loss(batch, rows, self.dense)
        loss.backward()
        with torch.no_grad():
            self.entity_optimizer.step(rows, batch.rows.state, row_gradient(rows))
        rows.requires_grad_(False)
        rows.grad = None
        if self.dense_rule is not None:
            self.dense_rule.step_gradients()
        batch.loss = loss.detach()
        return batch


class InPlaceStage(Compute):
    """The compute of a task that updates its rows in place (``task.step_in_place``): the batch in
    ``PIECES_PER_THREAD`` pieces per thread (``threads`` of them: the calling thread and kept
    helpers), each thread taking the next piece as it is free, on the store's rows themselves
    (Hogwild between the threads), so a thread that another process keeps from its core trains
    fewer pieces rather than hold the batch up; the batch's loss is the pieces' sum. The task has no
    dense parameter to update on this path."""

    PIECES_PER_THREAD = 4

    def __init__(self, task, store: EmbeddingStore, threads: int):
        self.task = task
        self.store = store
        self.threads = Parts(threads, "cadence-in-place")
        self.pieces = 1 if self.threads.count == 1 else self.threads.count * self.PIECES_PER_THREAD

    def __call__(self, batch: Batch) -> Batch:
        pieces, values = self.pieces, self.store.values
        losses = self.threads.share(lambda piece: self.task.step_in_place(batch, values, piece, pieces), pieces)
        batch.loss = torch.tensor(sum(losses), dtype=torch.float64)
        return batch

    def close(self) -> None:
        self.threads.close()


class WriteStage:
    """Writes a batch's updated rows into the store (an overwrite of value and state)."""

    def __init__(self, store: EmbeddingStore):
        self.store = store

    def __call__(self, batch: Batch) -> Batch:
        assert batch.rows is not None
        self.store.set(batch.ids, batch.rows)
        return batch


@dataclass
class Stages:
    load: LoadStage
    link: DeviceLink  # upload, the compute stream, download
    compute: Compute
    write: WriteStage

    def run(self, plan: BatchPlan) -> Batch:
        """All stages in order: one synchronous step."""
        batch = self.link.upload(self.load(plan))
        with self.link.computing(batch):
            batch = self.compute(batch)
        return self.write(self.link.download(batch))
