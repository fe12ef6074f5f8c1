"""``EmbeddingStore``: a table of embedding rows with per-row optimizer state and versions.

Every strategy reads and writes entity rows only through these verbs:

- ``pull(ids)``: a ``RowBlock`` copy of the rows (values, optimizer state, versions);
- ``set(ids, block)``: overwrite those rows (value and state, and versions when the block has them);
- ``push(ids, delta)``: add a delta to the values (additive, Hogwild/parameter-server style);
- ``set_if_newer(ids, block)``: overwrite only rows whose stored version is older than the block's
  (OAC's rule: a row is overwritten only by a larger timestamp); ``write_if_newer`` does the same
  for concurrent writers, atomically per row, the copies of different writers side by side.

The other verbs take no lock: ``write_if_newer`` is the one verb made for writers running side by
side; everything else is called by one thread at a time, or tolerates races by design (Hogwild).

Rows are gathered and scattered with vectorised ``index_select`` / ``index_copy_`` (no per-row
Python). ``versions`` start at -1; OAC (SPEC section 1) uses them as row timestamps. Where the rows
live is the backend's business: ``memory`` allocates tensors in RAM, ``mmap`` maps files on disk so
tables may exceed RAM (the page cache holds the hot rows). Backends register by name in
``STORE_BACKENDS`` and only allocate; all verbs are shared.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from cadence.core.rows import RowBlock
from cadence.errors import ConfigError
from cadence.resources import check_memory
from cadence.registry import Registry
from cadence.core.initial import INIT_CHUNK_ROWS, initial_chunk


# An allocator returns (values, state, versions, mapped arrays to flush) for a table's shape.
Allocator = Callable[[int, int, int, "str | None"], tuple[Tensor, Tensor, Tensor, list]]
STORE_BACKENDS: Registry[Allocator] = Registry("store backend", "store.backend")


@STORE_BACKENDS.register("memory")
def _allocate_memory(num_rows: int, dim: int, state_width: int, path: str | None):
    # (known before anything is allocated: a table past this machine's memory is one line, not a kill)
    check_memory(f"model.dim {dim}: a table of {num_rows:,} rows x {dim} floats (and {state_width} of optimizer "
                 "state each)", num_rows * (dim + state_width) * 4 + num_rows * 8)
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
        self.readahead = True  # the kernel's default, until ``advise``
        self.lock = threading.Lock()
        # write_if_newer's state, under ``lock``: the timestamp of the writer copying each row (-1:
        # none; allocated on first use), and the rows newer writers handed over to a claimant
        # the rows each writer is copying now, by its stamp (a few writers, each a batch's rows: no
        # per-row array of the table's length, which out of core is page cache the table loses)
        self._claims: dict[int, Tensor] = {}
        self._handed: dict[int, list[tuple[Tensor, RowBlock]]] = {}

    @property
    def num_rows(self) -> int:
        return self.values.shape[0]

    @property
    def dim(self) -> int:
        return self.values.shape[1]

    @property
    def state_width(self) -> int:
        return self.state.shape[1]

    def pull(self, ids: Tensor, with_versions: bool = False, pin: bool = False) -> RowBlock:
        """A copy of the rows; with ``pin``, in pinned (page-locked) host memory, ready for an
        asynchronous copy to an accelerator. The versions are read *before* the values and state:
        OAC's lock-free read relies on this order (strategies/pipelined.py)."""
        versions = _gather(self.versions, ids, pin) if with_versions else None
        return RowBlock(_gather(self.values, ids, pin), _gather(self.state, ids, pin), versions)

    def set(self, ids: Tensor, block: RowBlock) -> None:
        self.values.index_copy_(0, ids, block.values)
        self.state.index_copy_(0, ids, block.state)
        if block.versions is not None:
            self.versions.index_copy_(0, ids, block.versions)

    def set_at(self, ids: Tensor, block: RowBlock, positions: Tensor) -> None:
        """``set`` of the block's rows at ``positions`` (ascending) only, without a copy of them where
        they are a few runs of consecutive rows (a write that skips a few rows: slices of the block,
        views), else through gathers of ``GATHER_ROWS`` rows at a time. Out of core, a buffer a writer
        keeps, or a large one it passes through, is page cache the table loses."""
        if not positions.numel():
            return
        breaks = ((positions[1:] - positions[:-1]) != 1).nonzero().squeeze(1) + 1
        if breaks.numel() >= self.MAX_RUNS:  # gathers of GATHER_ROWS rows at a time: ~1 MiB passing
            for part in positions.split(self.GATHER_ROWS):
                self.set(ids.index_select(0, part), RowBlock(
                    block.values.index_select(0, part), block.state.index_select(0, part),
                    None if block.versions is None else block.versions.index_select(0, part)))
            return
        starts = [0, *breaks.tolist()]
        ends = [*starts[1:], positions.shape[0]]
        for start, end in zip(starts, ends):
            first, last = int(positions[start]), int(positions[end - 1]) + 1
            self.set(ids[first:last], RowBlock(block.values[first:last], block.state[first:last],
                                               None if block.versions is None else block.versions[first:last]))

    MAX_RUNS = 64  # runs of a partial write taken as slices; more: gathers of GATHER_ROWS rows
    GATHER_ROWS = 1024

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

    def write_if_newer(self, ids: Tensor, block: RowBlock, positions: Tensor | None = None
                       ) -> tuple[int, float, float]:
        """``set_if_newer`` for concurrent writers, atomic per row and never waiting for another
        writer (the OAC paper's per-row locks, vectorised and without their waits). ``positions``:
        write only these rows of the block (default: all). The block's versions must all be one
        timestamp (a batch's).

        Under ``lock`` a writer *claims* the rows it will copy, recording its timestamp as their
        claimant: those nobody is copying and whose stored version is older than its own. It copies
        them with the lock released. A row another writer is copying is never copied by two:
        if that claimant is newer, this write would lose anyway and is skipped; if it is older,
        this writer *hands the row over* (a copy of its value, state and version) to the claimant,
        which applies it once its own copy is done, before it frees its claims. So no writer
        waits, a row is overwritten only by a larger timestamp, and a write finished (the call
        returned) has landed whole: handed-over rows of a newer batch land before the *older*
        claimant returns, and OAC counts a batch finished only after every older batch has (its
        MFT), so a reader never trusts storage for them early.

        A part of a block is written as slices of it where it can (``set_at``): no copy of it kept.

        Returns (rows skipped, seconds spent waiting for the lock, seconds holding it)."""
        assert block.versions is not None, "a conditional write needs the block's versions"
        wanted = torch.arange(ids.shape[0]) if positions is None else positions
        if not wanted.numel():
            return 0, 0.0, 0.0
        stamp = int(block.versions[wanted[0]])
        # read the rows' stored versions once before the lock: out of core, the pages they sit on
        # fault in here, not in the critical section every writer waits on
        self.versions.index_select(0, ids.index_select(0, wanted))
        asked = time.perf_counter()
        with self.lock:
            got = time.perf_counter()
            rows = ids.index_select(0, wanted)
            claimant = torch.full_like(rows, -1)
            for owner, copying in self._claims.items():
                claimant.masked_fill_(torch.isin(rows, copying), owner)
            free = claimant < 0
            newer = block.versions.index_select(0, wanted) > self.versions.index_select(0, rows)
            mine = wanted[free & newer]
            older = (claimant >= 0) & (claimant < stamp)
            skipped = int(wanted.shape[0] - mine.shape[0] - older.sum())
            if bool(older.any()):  # hand these over (copies) to the older writers copying them
                handed, owners = wanted[older], claimant[older]
                for owner in owners.unique().tolist():
                    part = handed[owners == owner]
                    self._handed.setdefault(owner, []).append((ids.index_select(0, part), RowBlock(
                        block.values.index_select(0, part), block.state.index_select(0, part),
                        block.versions.index_select(0, part))))
            claimed = ids.index_select(0, mine)
            self._claims[stamp] = claimed
            held = time.perf_counter() - got
        waited = got - asked
        if mine.numel():
            if mine.shape[0] == ids.shape[0]:  # the whole block at once: no copy of it
                self.set(ids, block)
            else:
                self.set_at(ids, block, mine)
        while True:  # apply what newer writers handed over, until none is left; then free the rows
            asked = time.perf_counter()
            with self.lock:
                got = time.perf_counter()
                handed_over = self._handed.pop(stamp, [])
                if not handed_over:
                    del self._claims[stamp]
                held += time.perf_counter() - got
            waited += got - asked
            if not handed_over:
                return skipped, waited, held
            for rows, part in sorted(handed_over, key=lambda item: int(item[1].versions[0])):
                self.set_if_newer(rows, part)  # rows this writer still claims: nobody else writes them

    def advise(self, readahead: bool) -> None:
        """How the kernel pages a memory-mapped table in (``store.readahead``; in memory, nothing).
        Training reads rows at random, a row far smaller than the kernel's read-around window
        (128 KiB: 128 rows of dim 256): with readahead each fault reads a row's neighbours too,
        which fills the page cache with rows nobody asked for. Off (``MADV_RANDOM``) by default;
        sweeps over the whole table (``initialize``, ``load_tensors``) read ahead regardless."""
        self.readahead = readahead
        self._advise(mmap.MADV_NORMAL if readahead else mmap.MADV_RANDOM)

    def _advise(self, advice: int) -> None:
        for array in self._mapped:
            if getattr(array, "_mmap", None) is not None:
                array._mmap.madvise(advice)

    @contextmanager
    def sweeping(self) -> Iterator[None]:
        """Around a read or write of every row, in order: the kernel reads ahead meanwhile."""
        self._advise(mmap.MADV_SEQUENTIAL)
        try:
            yield
        finally:
            self._advise(mmap.MADV_NORMAL if self.readahead else mmap.MADV_RANDOM)

    def initialize(self, std: float, seed: int) -> None:
        """Fill values with N(0, std^2), chunk by chunk, identically for every backend."""
        with self.sweeping():
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
        with self.sweeping():
            for name, target in self.tensors().items():
                target.copy_(tensors[name])

    def flush(self) -> None:
        """Write mapped pages to disk (a no-op in memory)."""
        for array in self._mapped:
            array.flush()

    @property
    def disk_bytes(self) -> int:
        """Bytes of the table's files (0 in memory): what the page cache would hold to keep it all."""
        return sum(array.nbytes for array in self._mapped)

    def evict(self) -> int:
        """Drop the table's pages from memory, as a table larger than memory is after its hot rows
        moved on: dirty pages written to disk (``flush``), this process's mappings of them dropped
        (``MADV_DONTNEED``: a shared file mapping reads them back from the file), then the kernel's
        page cache of each file (``POSIX_FADV_DONTNEED``). Called between epochs, no thread reading
        or writing rows. Returns the bytes of the files advised (0 in memory). ``strategy: auto``'s
        trial of an out-of-core table measures from here (docs/auto.md)."""
        self.flush()
        dropped = 0
        for array in self._mapped:
            if getattr(array, "_mmap", None) is not None:
                array._mmap.madvise(mmap.MADV_DONTNEED)
            with open(array.filename, "rb") as file:
                os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            dropped += array.nbytes
        return dropped


def _gather(table: Tensor, ids: Tensor, pin: bool) -> Tensor:
    if not pin:
        return table.index_select(0, ids)
    out = torch.empty((ids.shape[0], *table.shape[1:]), dtype=table.dtype, pin_memory=True)
    return torch.index_select(table, 0, ids, out=out)


def create_store(
    num_rows: int, dim: int, state_width: int, backend: str = "memory", path: str | None = None
) -> EmbeddingStore:
    allocate = STORE_BACKENDS.get(backend)
    values, state, versions, mapped = allocate(num_rows, dim, state_width, path)
    return EmbeddingStore(values, state, versions, backend, mapped)
