"""``EmbeddingStore``: a table of embedding rows with per-row optimizer state and versions.

Every strategy reads and writes entity rows only through these verbs:

- ``pull(ids)``: a ``RowBlock`` copy of the rows (values, optimizer state, versions);
- ``set(ids, block)``: overwrite those rows (value and state, and versions when the block has them);
- ``push(ids, delta)``: add a delta to the values (additive, Hogwild/parameter-server style);
- ``set_if_newer(ids, block)``: overwrite only rows whose stored version is older than the block's
  (OAC's rule: a row is overwritten only by a larger timestamp); ``write_if_newer`` does the same
  under ``lock`` for concurrent writers, its rows faulted in before the lock is taken.

The verbs take no lock themselves; strategies that need a read or write of (value, state, version)
to be atomic hold ``store.lock`` around one vectorised call (one short lock per operation, acquired
alone, so no deadlock is possible).

Rows are gathered and scattered with vectorised ``index_select`` / ``index_copy_`` (no per-row
Python). ``versions`` start at -1; OAC (SPEC section 1) uses them as row timestamps. Where the rows
live is the backend's business: ``memory`` allocates tensors in RAM, ``mmap`` maps files on disk so
tables may exceed RAM (the page cache holds the hot rows). Backends register by name in
``STORE_BACKENDS`` and only allocate; all verbs are shared.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from cadence.errors import ConfigError
from cadence.registry import Registry
from cadence.store.initial import INIT_CHUNK_ROWS, initial_chunk


@dataclass
class RowBlock:
    """A copy of some rows of a store, in the order of the ids that were pulled."""

    values: Tensor  # [n, dim] float32
    state: Tensor  # [n, state_width] float32
    versions: Tensor | None = None  # [n] int64

    def to(self, device: torch.device | str) -> "RowBlock":
        asynchronous = overlaps(device)
        versions = None if self.versions is None else self.versions.to(device, non_blocking=asynchronous)
        return RowBlock(self.values.to(device, non_blocking=asynchronous),
                        self.state.to(device, non_blocking=asynchronous), versions)


def overlaps(device: torch.device | str) -> bool:
    """Whether a copy *to* ``device`` may be asynchronous: only towards an accelerator, whose stream
    orders the copy before any kernel that reads it. A copy back to the host must be synchronous:
    the host reads it at once (a writer thread's ``index_copy_``), and a non-blocking device-to-host
    copy may not have landed yet."""
    return torch.device(device).type != "cpu"


# An allocator returns (values, state, versions, mapped arrays to flush) for a table's shape.
Allocator = Callable[[int, int, int, "str | None"], tuple[Tensor, Tensor, Tensor, list]]
STORE_BACKENDS: Registry[Allocator] = Registry("store backend")


@STORE_BACKENDS.register("memory")
def _allocate_memory(num_rows: int, dim: int, state_width: int, path: str | None):
    return (
        torch.empty(num_rows, dim, dtype=torch.float32),
        torch.zeros(num_rows, state_width, dtype=torch.float32),
        torch.full((num_rows,), -1, dtype=torch.int64),
        [],
    )


@STORE_BACKENDS.register("mmap")
def _allocate_mmap(num_rows: int, dim: int, state_width: int, path: str | None):
    if path is None:
        raise ConfigError("store.path must name a directory for the mmap store backend")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    layout = {"num_rows": num_rows, "dim": dim, "state_width": state_width}
    (directory / "layout.json").write_text(json.dumps(layout))

    arrays: list[np.memmap] = []

    def mapped(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Tensor:
        array = np.lib.format.open_memmap(directory / name, mode="w+", dtype=dtype, shape=shape)
        arrays.append(array)
        return torch.from_numpy(array)

    values = mapped("values.npy", np.float32, (num_rows, dim))
    state = mapped("state.npy", np.float32, (num_rows, state_width))
    versions = mapped("versions.npy", np.int64, (num_rows,))
    state.zero_()
    versions.fill_(-1)
    return values, state, versions, arrays


class EmbeddingStore:
    def __init__(
        self, values: Tensor, state: Tensor, versions: Tensor, backend: str = "memory", mapped=()
    ):
        if values.shape[0] != state.shape[0] or values.shape[0] != versions.shape[0]:
            raise ValueError("values, state and versions must have one row per entity")
        self.values = values
        self.state = state
        self.versions = versions
        self.backend = backend
        self._mapped = list(mapped)  # memory-mapped arrays behind the tensors, flushed to disk
        self.lock = threading.Lock()

    @property
    def num_rows(self) -> int:
        return self.values.shape[0]

    @property
    def dim(self) -> int:
        return self.values.shape[1]

    @property
    def state_width(self) -> int:
        return self.state.shape[1]

    def pull(self, ids: Tensor, with_versions: bool = False) -> RowBlock:
        versions = self.versions.index_select(0, ids) if with_versions else None
        return RowBlock(self.values.index_select(0, ids), self.state.index_select(0, ids), versions)

    def set(self, ids: Tensor, block: RowBlock) -> None:
        self.values.index_copy_(0, ids, block.values)
        self.state.index_copy_(0, ids, block.state)
        if block.versions is not None:
            self.versions.index_copy_(0, ids, block.versions)

    def prefetch(self, ids: Tensor) -> None:
        """Bring the rows' pages into memory (memory-mapped tables: a read of each row; in memory,
        nothing), so that a write under a lock copies memory instead of waiting for the disk."""
        if self._mapped:
            self.values.index_select(0, ids)
            self.state.index_select(0, ids)
            self.versions.index_select(0, ids)

    def push(self, ids: Tensor, delta: Tensor) -> None:
        self.values.index_add_(0, ids, delta)

    def set_if_newer(self, ids: Tensor, block: RowBlock) -> int:
        """Overwrite the rows whose stored version is smaller than the block's; return rows skipped."""
        assert block.versions is not None, "a conditional write needs the block's versions"
        newer = block.versions > self.versions.index_select(0, ids)
        if bool(newer.all()):
            self.set(ids, block)
            return 0
        keep = newer.nonzero().squeeze(1)
        self.set(ids[keep], RowBlock(block.values[keep], block.state[keep], block.versions[keep]))
        return ids.shape[0] - keep.shape[0]

    def write_if_newer(self, ids: Tensor, block: RowBlock) -> tuple[int, float, float]:
        """``set_if_newer`` for concurrent writers: the rows are faulted in first (``prefetch``), then
        compared and written under ``lock``, so the lock is held for a memory copy rather than a
        disk read. Returns (rows skipped, seconds waited for the lock, seconds it was held).

        One lock, not one per stripe of rows: striped locks let four writers fault pages in side by
        side, and under a memory cap that working set thrashed the page cache (a 2 GiB table, 900 MiB
        cap: the first batch's write took 118 s) where one lock runs the same epoch in 60 s."""
        self.prefetch(ids)
        asked = time.perf_counter()
        with self.lock:
            got = time.perf_counter()
            skipped = self.set_if_newer(ids, block)
            held = time.perf_counter() - got
        return skipped, got - asked, held

    def initialize(self, std: float, seed: int) -> None:
        """Fill values with N(0, std^2), chunk by chunk, identically for every backend."""
        for chunk, start in enumerate(range(0, self.num_rows, INIT_CHUNK_ROWS)):
            stop = min(start + INIT_CHUNK_ROWS, self.num_rows)
            self.values[start:stop] = initial_chunk(chunk, self.num_rows, self.dim, std, seed)
        self.state.zero_()
        self.versions.fill_(-1)

    def tensors(self) -> dict[str, Tensor]:
        return {"values": self.values, "state": self.state, "versions": self.versions}

    def load_tensors(self, tensors: dict[str, Tensor]) -> None:
        for name, target in self.tensors().items():
            source = tensors[name]
            if source.shape != target.shape or source.dtype != target.dtype:
                raise ValueError(
                    f"store {name}: checkpoint has {tuple(source.shape)} {source.dtype}, "
                    f"the run has {tuple(target.shape)} {target.dtype}"
                )
            target.copy_(source)

    def flush(self) -> None:
        """Write mapped pages to disk (a no-op in memory)."""
        for array in self._mapped:
            array.flush()


def create_store(
    num_rows: int, dim: int, state_width: int, backend: str = "memory", path: str | None = None
) -> EmbeddingStore:
    allocate = STORE_BACKENDS.get(backend)
    values, state, versions, mapped = allocate(num_rows, dim, state_width, path)
    return EmbeddingStore(values, state, versions, backend, mapped)
