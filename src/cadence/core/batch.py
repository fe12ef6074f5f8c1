"""Batch plans and batches.

A ``BatchPlan`` names which training examples form batch ``index`` of ``epoch``. Everything random
about a batch (the epoch's shuffle, its negatives) derives from (seed, epoch, index), so a batch is
the same whichever thread or process builds it, in whatever order, and after a resume.
A ``Batch`` is what flows through the stages (or a parameter-server worker): the task fills ``ids``
and ``inputs``, the load stage ``rows``, compute ``loss``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from cadence import compiled
from cadence.seeding import derive_seed
from cadence.core.rows import RowBlock


@dataclass(frozen=True)
class BatchPlan:
    epoch: int
    index: int
    examples: Tensor  # [B] positions of the batch's examples in the epoch's training data
    part: int = -1  # the data partition it belongs to (MF's strata: AdaPM's node); -1 = none

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(seed, "batch", self.epoch, self.index))

    @property
    def size(self) -> int:
        return self.examples.shape[0]


@dataclass
class Batch:
    plan: BatchPlan
    ids: Tensor  # [U] sorted unique keys of the embedding rows the batch touches
    inputs: dict[str, Tensor] = field(default_factory=dict)  # the task's tensors (indices into ids, labels)
    rows: RowBlock | None = None  # the rows of ids: filled by the load stage, updated by compute
    loss: Tensor | None = None
    timestamp: int = -1  # position in the computation order (OAC's global counter), set at compute
    # on an accelerator (pipeline/transfer.py): the ids on the host, and the events that order streams
    host_ids: Tensor | None = None
    uploaded: object | None = None  # torch.cuda.Event: rows, ids and inputs are on the device
    computed: object | None = None  # torch.cuda.Event: compute (and the validation cache's use) is done
    frozen: Tensor | None = None  # [U] bool: rows that do not train (a grown run's known rows), or None

    @property
    def size(self) -> int:
        return self.plan.size

    @property
    def store_ids(self) -> Tensor:
        """The ids in host memory, as the store takes them (``ids`` may have moved to the device)."""
        return self.ids if self.host_ids is None else self.host_ids


def on_device(batch: Batch, rows: Tensor, device: torch.device) -> Tensor:
    """A batch's ids and inputs moved to ``device`` in place, and its pulled ``rows`` there (nothing
    moves on the CPU). The pipeline's ``DeviceLink`` uploads with streams instead; this is the plain
    move of a worker that computes one batch at a time."""
    if device.type == "cpu":
        return rows
    batch.host_ids = batch.ids
    batch.ids = batch.ids.to(device)
    batch.inputs = {name: value.to(device) for name, value in batch.inputs.items()}
    return rows.to(device)


def finished_batch(plan: BatchPlan, loss: float) -> Batch:
    """A batch that finished in another process, as its worker reports it: the plan and the loss
    (its rows and inputs stayed there). What ``Runtime.run_epoch``'s ``on_batch`` receives for it."""
    return Batch(plan, torch.empty(0, dtype=torch.int64), loss=torch.tensor(loss))


def unique_keys(keys: Tensor, num_keys: int) -> tuple[Tensor, Tensor]:
    """``torch.unique(keys, return_inverse=True)`` for keys in ``[0, num_keys)``: a bitmap and a
    cumulative sum (linear, multi-threaded) when the key space is small next to the batch, else
    ``distinct_keys`` (a hash table, or a sort). Same result either way."""
    if num_keys > 32 * keys.shape[0]:
        return distinct_keys(keys)
    if compiled.AVAILABLE and keys.device.type == "cpu" and keys.dtype == torch.int64:
        return compiled.unique_keys(keys, num_keys)  # the same integers in one compiled pass
    present = torch.zeros(num_keys, dtype=torch.bool)
    present[keys] = True
    position = torch.cumsum(present, 0) - 1
    return present.nonzero().squeeze(1), position.index_select(0, keys)


def distinct_keys(keys: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.unique(keys, return_inverse=True)`` for 1-D int64 keys of any range (a CTR batch's
    feature keys): the compiled hash kernel on the CPU where numba is there (0.15 against 0.58 ms
    for a batch of 1024 ML-100k examples), else torch. Same result either way."""
    if compiled.AVAILABLE and keys.device.type == "cpu" and keys.dtype == torch.int64 and keys.dim() == 1:
        return compiled.unique_any(keys)
    return torch.unique(keys, return_inverse=True)


def plan_epoch(num_examples: int, batch_size: int, seed: int, epoch: int, *scope: object) -> list[BatchPlan]:
    """Shuffle ``num_examples`` by (seed, ``scope``, epoch) and cut them into batches."""
    generator = torch.Generator().manual_seed(derive_seed(seed, *(scope or ("shuffle",)), epoch))
    order = torch.randperm(num_examples, generator=generator)
    return [BatchPlan(epoch, index, chunk) for index, chunk in enumerate(order.split(batch_size))]
