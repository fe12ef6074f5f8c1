"""Batch plans and batches.

A ``BatchPlan`` names which training triples form batch ``index`` of ``epoch``. Everything random
about a batch (the epoch's shuffle, its negatives) derives from (seed, epoch, index), so a batch is
the same whichever thread builds it, in whatever order, and after a resume.
A ``Batch`` is what flows through the stages; each stage fills its fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from cadence.store.embedding_store import RowBlock, derive_seed


@dataclass(frozen=True)
class BatchPlan:
    epoch: int
    index: int
    triple_ids: Tensor  # [B] rows of the training triples

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(seed, "batch", self.epoch, self.index))


@dataclass
class Batch:
    plan: BatchPlan
    ids: Tensor  # [U] entity ids the batch touches (sorted, unique)
    heads: Tensor  # [B] indices into ids
    relations: Tensor  # [B] relation ids
    tails: Tensor  # [B] indices into ids
    candidates: Tensor | None  # [C] indices into ids of the shared negatives; None = all entities
    rows: RowBlock | None = None  # the rows of ids: filled by the load stage, updated by compute
    loss: Tensor | None = None
    timestamp: int = -1  # position in the computation order (OAC's global counter), set at compute
    finished_before: int = -1  # OAC's MFT: every batch with timestamp <= this had been written at read
    safe_to_evict: int = -1  # OAC's STE: cache entries with timestamp <= this may be evicted

    @property
    def size(self) -> int:
        return self.plan.triple_ids.shape[0]


def plan_epoch(num_triples: int, batch_size: int, seed: int, epoch: int) -> list[BatchPlan]:
    generator = torch.Generator().manual_seed(derive_seed(seed, "shuffle", epoch))
    order = torch.randperm(num_triples, generator=generator)
    return [
        BatchPlan(epoch, index, order[start:start + batch_size])
        for index, start in enumerate(range(0, num_triples, batch_size))
    ]
