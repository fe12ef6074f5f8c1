"""The stages a batch passes through, as in Marius/OAC (SPEC section 1):

    load (sample negatives, read rows from the store) -> transfer to the compute device
    -> compute (forward, backward, optimizer step: the critical section) -> transfer back
    -> write (rows into the store)

Running the stages in this order, one batch at a time, is synchronous training; strategies differ
only in how they schedule the same stages (threads, queues, validation), never in their math.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from cadence.models.kge import KgeModel
from cadence.optim import EntityOptimizer
from cadence.pipeline.batch import Batch, BatchPlan
from cadence.store.embedding_store import EmbeddingStore


class LoadStage:
    """Builds a batch from its plan: triples, shared negatives, the unique rows it touches."""

    def __init__(self, store: EmbeddingStore, train: Tensor, seed: int, negatives: int | None,
                 with_versions: bool = False):
        self.store = store
        self.train = train
        self.seed = seed
        self.negatives = negatives  # None: score against every entity
        self.with_versions = with_versions
        self.all_ids = torch.arange(store.num_rows) if negatives is None else None

    def prepare(self, plan: BatchPlan) -> Batch:
        """The store-independent part: which rows, in which local positions."""
        triples = self.train.index_select(0, plan.triple_ids)
        heads, relations, tails = triples.unbind(1)
        if self.negatives is None:
            return Batch(plan, self.all_ids, heads, relations, tails, None)
        size = plan.triple_ids.shape[0]
        sampled = torch.randint(self.store.num_rows, (self.negatives,), generator=plan.generator(self.seed))
        ids, local = torch.unique(torch.cat([heads, tails, sampled]), return_inverse=True)
        return Batch(plan, ids, local[:size], relations, local[size:2 * size], local[2 * size:])

    def read(self, batch: Batch) -> Batch:
        batch.rows = self.store.pull(batch.ids, with_versions=self.with_versions)
        return batch

    def __call__(self, plan: BatchPlan) -> Batch:
        return self.read(self.prepare(plan))


class TransferStage:
    """Moves a batch's rows to (or back from) a device; free when the device is the CPU."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, batch: Batch) -> Batch:
        if batch.rows is not None and batch.rows.values.device != self.device:
            batch.rows = batch.rows.to(self.device)
            batch.ids, batch.heads, batch.relations, batch.tails = (
                x.to(self.device, non_blocking=True)
                for x in (batch.ids, batch.heads, batch.relations, batch.tails)
            )
            if batch.candidates is not None:
                batch.candidates = batch.candidates.to(self.device, non_blocking=True)
        return batch


class ComputeStage:
    """Forward, backward, and the update of the batch's rows and of the dense parameters."""

    def __init__(self, model: KgeModel, entity_optimizer: EntityOptimizer,
                 dense_optimizer: torch.optim.Optimizer):
        self.model = model
        self.entity_optimizer = entity_optimizer
        self.dense_optimizer = dense_optimizer

    def __call__(self, batch: Batch) -> Batch:
        assert batch.rows is not None, "the load stage fills rows before compute"
        rows = batch.rows.values.requires_grad_(True)
        loss = self.model.loss(rows, batch.heads, batch.relations, batch.tails, batch.candidates)
        self.dense_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            self.entity_optimizer.step(rows, batch.rows.state, rows.grad)
        rows.requires_grad_(False)
        rows.grad = None
        self.dense_optimizer.step()
        batch.loss = loss.detach()
        return batch


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
    to_device: TransferStage
    compute: ComputeStage
    to_host: TransferStage
    write: WriteStage

    def run(self, plan: BatchPlan) -> Batch:
        """All stages in order: one synchronous step."""
        return self.write(self.to_host(self.compute(self.to_device(self.load(plan)))))
