"""Recording and replaying the computation order of batches (OAC's guarantee, made testable).

``record_order: FILE`` writes one JSON line per batch, ``{"epoch", "index", "timestamp"}``, in the
order the batches entered the compute stage. ``batch_order: FILE`` makes the trainer hand each
epoch's batches to the strategy in that recorded order; under the ``sync`` strategy this replays
exactly the recorded run, which OAC's final model must equal bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from cadence.data.text import numbered_lines
from cadence.errors import DataError
from cadence.core.batch import Batch, BatchPlan
from cadence.training.run_directory import write_atomic


class BatchOrder:
    def __init__(self, path: Path, order: dict[int, list[int]]):
        self.path = path
        self.order = order  # epoch -> batch indices in computation order

    @classmethod
    def load(cls, path: str | Path) -> "BatchOrder":
        path = Path(path)
        order: dict[int, list[int]] = {}
        for number, line in numbered_lines(path, "batch order file not found"):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                epoch, index = int(entry["epoch"]), int(entry["index"])
            except (ValueError, KeyError, TypeError):
                raise DataError('expected a JSON object with integer "epoch" and "index"', path, number) from None
            order.setdefault(epoch, []).append(index)
        if not order:
            raise DataError("batch order file is empty", path)
        return cls(path, order)

    def check(self, num_batches: Callable[[int], int], epochs: int) -> None:
        """Fail before training if some epoch is missing or does not list every batch once
        (``num_batches(epoch)``: an epoch's count, which may differ by epoch: word2vec's subsampling)."""
        for epoch in range(epochs):
            self._check_epoch(epoch, num_batches(epoch))

    def _check_epoch(self, epoch: int, num_batches: int) -> list[int]:
        indices = self.order.get(epoch)
        if indices is None or sorted(indices) != list(range(num_batches)):
            raise DataError(f"epoch {epoch} of the recorded order does not list each of its {num_batches} "
                            "batches exactly once (was it recorded with the same data, batch size and seed?)",
                            self.path)
        return indices

    def reorder(self, plans: list[BatchPlan]) -> list[BatchPlan]:
        return [plans[i] for i in self._check_epoch(plans[0].epoch, len(plans))]


class ComputationOrderRecorder:
    """A trainer hook that writes the computation order after every epoch."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: list[dict[str, int]] = []
        self.epoch_batches: list[tuple[int, int, int]] = []

    def on_batch_end(self, trainer, batch: Batch) -> None:
        self.epoch_batches.append((batch.timestamp, batch.plan.epoch, batch.plan.index))

    def on_epoch_end(self, trainer, epoch: int) -> None:
        for timestamp, batch_epoch, index in sorted(self.epoch_batches):
            self.entries.append({"epoch": batch_epoch, "index": index, "timestamp": timestamp})
        self.epoch_batches.clear()
        write_atomic(self.path, "".join(json.dumps(e) + "\n" for e in self.entries))

    def on_evaluation(self, trainer, record) -> None:
        pass
