"""A sorted set of keys as row positions: a growing vocabulary's keys in a store sized once from
the data, or a checkpoint's ``table.keys``."""

from __future__ import annotations

import torch
from torch import Tensor


class KeyIndex:
    """Maps a growing vocabulary's keys to the rows of a store sized from the keys in the data (the
    pipeline's view of a ``TableSpec`` with ``rows=None``). Immutable, so threads share it."""

    def __init__(self, keys: Tensor):
        self.keys = keys  # sorted, unique

    def locate(self, keys: Tensor) -> tuple[Tensor, Tensor]:
        """(row of each key, whether it is known); the row of an unknown key is meaningless."""
        if not self.keys.numel():
            return torch.zeros_like(keys), torch.zeros_like(keys, dtype=torch.bool)
        position = torch.searchsorted(self.keys, keys).clamp(max=self.keys.shape[0] - 1)
        return position, self.keys[position] == keys

    def rows(self, keys: Tensor) -> Tensor:
        position, found = self.locate(keys)
        if not bool(found.all()):
            raise KeyError(f"{int((~found).sum())} keys are not in the data this store was sized from")
        return position
