"""Initial rows, as pure functions of (seed, key): every backend, shard and runtime that holds a row
starts it from the same value, whichever order rows are created in.

- Fixed tables (keys 0..N-1): seeded normal draws, one generator per chunk of ``INIT_CHUNK_ROWS``
  rows (``EmbeddingStore.initialize``; ``initial_rows`` computes any subset, e.g. the rows one
  parameter-server shard owns).
- Growing vocabularies (arbitrary int64 keys): ``hashed_normal``, a Box-Muller transform of a
  splitmix64 hash of (seed, key, column), so a key's row never depends on when it is first seen.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cadence.seeding import derive_seed

INIT_CHUNK_ROWS = 1 << 16  # rows initialised per generator: keeps init identical across backends


def initial_chunk(chunk: int, num_rows: int, dim: int, std: float, seed: int) -> Tensor:
    start = chunk * INIT_CHUNK_ROWS
    stop = min(start + INIT_CHUNK_ROWS, num_rows)
    generator = torch.Generator().manual_seed(derive_seed(seed, "store-init", chunk))
    return torch.randn(stop - start, dim, generator=generator).mul_(std)


def initial_rows(rows: Tensor, num_rows: int, dim: int, std: float, seed: int) -> Tensor:
    """The values ``initialize(std, seed)`` gives ``rows`` of a ``num_rows``-row table, computing only
    the chunks they fall in (a parameter-server shard initialises just the rows it owns)."""
    values = torch.empty(rows.shape[0], dim)
    chunks = rows.div(INIT_CHUNK_ROWS, rounding_mode="floor")
    for chunk in torch.unique(chunks).tolist():
        mine = (chunks == chunk).nonzero().squeeze(1)
        block = initial_chunk(chunk, num_rows, dim, std, seed)
        values[mine] = block.index_select(0, rows[mine] - chunk * INIT_CHUNK_ROWS)
    return values


_MASK = (1 << 63) - 1


def _mix(x: Tensor) -> Tensor:
    """A 63-bit integer hash (splitmix64's finaliser, kept non-negative), elementwise."""
    x = (x ^ (x >> 31)) * 0x7FB5D329728EA185 & _MASK
    x = (x ^ (x >> 27)) * 0x01B69B4BA5A5B7D7 & _MASK  # multipliers below 2^63: int64 wraps, masked
    return (x ^ (x >> 33)) & _MASK


def hashed_normal(keys: Tensor, width: int, std: float, seed: int) -> Tensor:
    """[n, width] N(0, std^2) values that depend only on (seed, key, column)."""
    cells = keys.unsqueeze(1) * (2 * width) + torch.arange(2 * width) + seed * 0x9E3779B1
    uniform = (_mix(cells & _MASK) >> 11).double() / float(1 << 52)  # [n, 2w] in [0, 1)
    u1, u2 = uniform[:, :width].clamp_min(1e-12), uniform[:, width:]
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2 * math.pi * u2) * std).float()
