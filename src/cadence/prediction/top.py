"""The best answers over a table read a block of rows at a time (as evaluation reads a large entity
table: ``cadence.tasks.kge``'s ``ENTITY_BLOCK_FLOATS``): this process never holds more than a block
of it, wherever the rows live."""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

BLOCK_FLOATS = 1 << 22  # floats of rows read at a time (16 MiB of float32)


def block_rows(width: int) -> int:
    """Rows of ``width`` floats read at a time."""
    return max(1, BLOCK_FLOATS // max(1, width))


def id_blocks(count: int, rows: int) -> Iterator[Tensor]:
    """The ids 0..count-1, ``rows`` at a time, in increasing order."""
    for first in range(0, count, rows):
        yield torch.arange(first, min(first + rows, count))


class RunningTopK:
    """The ``k`` best (score, id) pairs of candidates that arrive a block at a time, in increasing id
    order: each block is merged into the best so far. Ties list the lower id first, as a stable sort of
    every score would; a score of -inf (a candidate left out) or NaN is never listed."""

    def __init__(self, k: int):
        self.k = k
        self.scores = torch.empty(0, dtype=torch.float64)
        self.ids = torch.empty(0, dtype=torch.int64)

    def add(self, scores: Tensor, ids: Tensor) -> None:
        """Merge a block: ``scores`` [n] of candidates ``ids`` [n] (increasing, after every id before)."""
        scores = scores.detach().to(torch.float64).cpu()
        listed = scores > float("-inf")  # (False for NaN too)
        # the best so far come first: their ids are lower, so a stable sort keeps ties in id order
        scores = torch.cat([self.scores, scores[listed]])
        ids = torch.cat([self.ids, ids.cpu()[listed]])
        order = torch.sort(scores, descending=True, stable=True).indices[:self.k]
        self.scores, self.ids = scores[order], ids[order]
