"""Pipelined strategies over ``PipelineRunner``: ``async`` and ``oac`` (SPEC section 1, seed 000).

Both run the same stages in loader / compute / writer threads; they differ only in their
``ConcurrencyControl``:

- ``async`` (``LastWriterWins``): rows are read and written with no control. A batch may read a row
  that an earlier batch in the computation order has already updated (a *stale read*), and a writer
  may overwrite a row that a later batch already wrote (a *lost update*): both are counted.
- ``oac`` (``OptimisticAsynchronyControl``): per-row timestamps, lock-free reads and conditional
  writes (a row is overwritten only by a larger timestamp), the validation cache on the compute
  device, and MFT / outstanding-batches / STE eviction. The final model equals the synchronous run
  of the batches in their computation order, bit for bit.

Why OAC's reads take no lock. A loader reads a batch's row *versions first*, then the rows'
values and optimizer state (``EmbeddingStore.pull`` keeps that order), with nothing held: loaders
fault their rows in from disk side by side, and beside the writers (out of core, that is where the
time goes). A writer may be writing one of those rows meanwhile, so the values read may be newer
than the version read (even a mix of two writes). That is harmless: every write that was not
finished when the batch began (``begin``, before the read) belongs to a batch that was computed
before it and whose rows the validation cache still holds (eviction stops at the oldest
outstanding batch's MFT), with a timestamp larger than the version read, so validation replaces
the row whole by the cached one; every write finished before the batch began is in storage before
the read starts. Reading the versions *after* the data would break this (a new version over old
data is never repaired): the order is the guarantee (tested with injected read latency). Writes
are conditional and atomic per row (``store.write_if_newer``: rows claimed under a short lock,
copied outside it), so writers too fault pages in side by side.
"""

from __future__ import annotations

import operator
import threading
import time

import torch
from torch import Tensor

from cadence.config import PipelineConfig
from cadence.core.batch import Batch
from cadence.core.strategy import Contract
from cadence.pipeline.runner import ConcurrencyControl, PipelineRunner
from cadence.pipeline.transfer import accelerated
from cadence.strategies.pipelined.validation_cache import ValidationCache
from cadence.store.embedding_store import EmbeddingStore
from cadence.strategies.pipelined.base import SCHEDULES, Schedule


class InOrder(ConcurrencyControl):
    """Batches run one at a time (``PipelineRunner.run_inline``): rows read and written as they are,
    each row stamped with the timestamp of its last batch, as the controls stamp it."""

    def __init__(self, store: EmbeddingStore, device: torch.device):
        super().__init__(store, pin=accelerated(device))

    def stamp(self, batch: Batch) -> None:
        batch.rows.versions.fill_(batch.timestamp)


class LastWriterWins(ConcurrencyControl):
    def __init__(self, store: EmbeddingStore, device: torch.device):
        super().__init__(store, pin=accelerated(device))
        self.newest = store.versions.to(device, copy=True)  # timestamp of each row's newest compute
        self.stale_reads = 0
        self.lost_updates = 0

    def validate(self, batch: Batch) -> None:
        self.stale_reads += int((batch.rows.versions < self.newest.index_select(0, batch.ids)).sum())

    def stamp(self, batch: Batch) -> None:
        batch.rows.versions.fill_(batch.timestamp)
        self.newest.index_fill_(0, batch.ids, batch.timestamp)

    def write(self, batch: Batch) -> None:
        self.lost_updates += int((self.store.versions.index_select(0, batch.ids) > batch.timestamp).sum())
        self.store.set(batch.ids, batch.rows)

    def stats(self) -> dict[str, int]:
        return {"stale_reads": self.stale_reads, "lost_updates": self.lost_updates}


class OptimisticAsynchronyControl(ConcurrencyControl):
    def __init__(self, store: EmbeddingStore, device: torch.device, first_timestamp: int, coalesce: bool = True):
        super().__init__(store, pin=accelerated(device))
        self.cache = ValidationCache(store.num_rows, device)
        # timestamp of each row's newest compute in this epoch, less the epoch's first (-1: none yet;
        # every stored version is older), on the host: written by the compute thread, read by
        # writers; it only grows, so a writer that reads an older value merely writes a row it could
        # have left. int32: half the memory (out of core, page cache the table keeps). None when
        # writes are not coalesced
        self.first_timestamp = first_timestamp
        self.newest = torch.full((store.num_rows,), -1, dtype=torch.int32) if coalesce else None
        self.coalesced_writes = 0
        self.meta_lock = threading.Lock()  # guards the MFT and the outstanding-batches map
        self.finished_upto = first_timestamp - 1  # MFT: every batch stamped <= this has been written
        self.finished_ahead: set[int] = set()  # written batches beyond the MFT
        # batches read but not yet validated, (epoch, index) -> its MFT at creation (every batch stamped
        # <= it had been written when it read): the only ones that can still need a cache entry (the
        # paper keeps a batch here until it is written)
        self.outstanding: dict[tuple[int, int], int] = {}
        self.safe_to_evict = first_timestamp - 1  # STE at the last validation: entries stamped <= it went
        self.repaired_rows = 0
        self.skipped_writes = 0
        self.write_lock_wait = 0.0  # seconds writers waited for the store's lock
        self.write_lock_held = 0.0  # seconds they held it
        self.validation_seconds = 0.0  # the compute thread's: eviction, repair, the stamp into the cache
        # how many batches read but not yet validated read each row (under meta_lock): what a landed
        # batch's cache entries are cut down to (``ValidationCache.compact``). Where the cache is in
        # host memory only: there a held block is page cache the table loses
        self.readers = torch.zeros(store.num_rows, dtype=torch.int32) if device.type == "cpu" else None

    def begin(self, batch: Batch) -> None:
        with self.meta_lock:
            self.outstanding[(batch.plan.epoch, batch.plan.index)] = self.finished_upto
            self._count_readers(batch.ids, 1)

    def validate(self, batch: Batch) -> None:
        """Evict what no batch read but not yet validated can need (its own entry included, then
        dropped: once repaired, a batch never reads the cache again), then repair the batch."""
        began = time.perf_counter()
        with self.meta_lock:
            self.safe_to_evict = min(self.outstanding.values())
            del self.outstanding[(batch.plan.epoch, batch.plan.index)]
            landed = self.finished_upto
        self.cache.evict_upto(self.safe_to_evict)
        if self.readers is not None:
            # a batch whose write has landed (<= the MFT) is needed only by the batches already read,
            # and only for the rows they read (this one's among them, until its repair below)
            for stamp in self.cache.landed(landed):
                with self.meta_lock:
                    needed = self.readers.index_select(0, self.cache.block_ids[stamp]) > 0
                self.cache.compact(stamp, needed)
        self.repaired_rows += self.cache.repair(batch.ids, batch.rows)
        with self.meta_lock:
            self._count_readers(batch.store_ids, -1)
        self.validation_seconds += time.perf_counter() - began

    def _count_readers(self, ids: Tensor, change: int) -> None:
        """Add ``change`` to the readers of rows ``ids`` (a batch's: unique), under ``meta_lock``."""
        if self.readers is not None:
            self.readers.index_copy_(0, ids, self.readers.index_select(0, ids) + change)

    def stamp(self, batch: Batch) -> None:
        began = time.perf_counter()
        batch.rows.versions.fill_(batch.timestamp)
        self.cache.insert(batch.ids, batch.rows)
        if self.newest is not None:
            self.newest.index_fill_(0, batch.store_ids, batch.timestamp - self.first_timestamp)
        self.validation_seconds += time.perf_counter() - began

    def write(self, batch: Batch) -> None:
        """A conditional write of the batch's rows, less those a later batch has computed since
        (coalescing): that batch writes them, and until it has, the validation cache holds its
        version (its entry outlives it: eviction stops at the MFT, which it has not passed), so any
        batch reading such a row meanwhile is repaired as if it had been written."""
        mine, coalesced = None, 0
        if self.newest is not None:
            later = self.newest.index_select(0, batch.ids) > batch.timestamp - self.first_timestamp
            mine = (~later).nonzero().squeeze(1)
            coalesced = batch.ids.shape[0] - mine.shape[0]
        skipped, waited, held = self.store.write_if_newer(batch.ids, batch.rows, mine)
        with self.meta_lock:
            self.coalesced_writes += coalesced
            self.skipped_writes += skipped
            self.write_lock_wait += waited
            self.write_lock_held += held

    def finish(self, batch: Batch) -> None:
        with self.meta_lock:
            self.finished_ahead.add(batch.timestamp)
            while self.finished_upto + 1 in self.finished_ahead:
                self.finished_upto += 1
                self.finished_ahead.remove(self.finished_upto)

    def stats(self) -> dict[str, int]:
        return {"repaired_rows": self.repaired_rows, "skipped_writes": self.skipped_writes,
                "coalesced_writes": self.coalesced_writes,
                "peak_cache_rows": self.cache.peak_rows, "evicted_rows": self.cache.evicted_rows,
                "write_lock_wait_seconds": round(self.write_lock_wait, 4),
                "write_lock_held_seconds": round(self.write_lock_held, 4),
                "validation_seconds": round(self.validation_seconds, 4)}


PEAK_COUNTERS = {"peak_cache_rows"}


class PipelinedStrategy(Schedule):
    """Runs each epoch through a ``PipelineRunner``; subclasses choose the concurrency control."""

    section = "pipeline"  # PipelineConfig
    reads = ("pipeline.staleness_bound", "pipeline.loader_threads", "pipeline.writer_threads", "pipeline.queue_size",
             "pipeline.stall_timeout", "pipeline.overlap")
    # batches in flight; a bound of one is one batch end to end at a time: sync's computation
    contract = Contract(("pipeline.staleness_bound=4",), ("pipeline.staleness_bound=1",))

    # overlap: auto: the share of compute time that reads and writes must reach for an epoch to run in
    # the threads (a pipelined epoch below INLINE_BELOW makes the next inline; an inline one above
    # PIPELINE_ABOVE makes the next pipelined: apart, so that noise does not flip every epoch). And a
    # pipelined epoch that ran fewer batches a second than the last inline one sends every later
    # epoch inline: the threads cost more than they hid (Python between small ops holds the GIL:
    # mf's compiled loss, issue 27)
    INLINE_BELOW = 0.1
    PIPELINE_ABOVE = 0.5

    def __init__(self, settings: PipelineConfig):
        super().__init__(settings)
        self.totals: dict[str, int] = {}
        self.next_timestamp = 0
        self.inline_next: bool | None = None  # auto's choice for the next epoch (None: not measured yet)
        self.inline_rate: float | None = None  # batches a second of the last epoch run inline
        self.threads_lost = False  # a pipelined epoch was slower than the inline one before it

    def _inline(self, stages) -> bool:
        overlap = self.settings.overlap
        if overlap != "auto":
            return overlap == "never"
        if stages.link.accelerated or stages.write.store.backend != "memory":
            return False  # transfers to hide, or reads that wait on storage: the pipeline's own settings
        # rows in memory, computed on the CPU: nothing waits that the threads could hide, until an
        # epoch measures otherwise
        return True if self.inline_next is None else self.inline_next

    def choose_next(self, inline: bool, busy: dict[str, float], rate: float | None = None) -> None:
        """Auto's choice for the next epoch from this one's busy seconds per stage and, given,
        its batches a second."""
        if rate is not None:
            if inline:
                self.inline_rate = rate
            elif self.inline_rate is not None and rate < self.inline_rate:
                self.threads_lost = True
        if self.threads_lost:
            self.inline_next = True
            return
        hidden = busy.get("load_busy_seconds", 0.0) + busy.get("write_busy_seconds", 0.0)
        compute = busy.get("compute_busy_seconds", 0.0)
        if inline:
            self.inline_next = hidden <= self.PIPELINE_ABOVE * compute
        else:
            self.inline_next = hidden < self.INLINE_BELOW * compute

    counters: tuple[str, ...] = ()  # the control's counters (``stats``): zero in an epoch run inline

    def make_control(self, store: EmbeddingStore, device: torch.device, first_timestamp: int) -> ConcurrencyControl:
        raise NotImplementedError

    def run_epoch(self, plans, stages, on_batch):
        store = stages.write.store
        device = stages.link.device
        newest = int(store.versions.max()) if store.versions.numel() else -1  # (a task with no rows)
        first = max(self.next_timestamp, newest + 1)
        inline = self._inline(stages)
        # one batch at a time, every read after the last write: nothing is stale and nothing needs
        # repair, so no control beyond the versions (the same rows a control would give, bit for bit)
        control = InOrder(store, device) if inline else self.make_control(store, device, first)
        runner = PipelineRunner(self.settings, control)
        started = time.monotonic()
        if inline:
            self.next_timestamp = runner.run_inline(plans, stages, on_batch, first)
        else:
            self.next_timestamp = runner.run(plans, stages, on_batch, first)
        busy = runner.busy_seconds()
        self.choose_next(inline, busy, len(plans) / max(time.monotonic() - started, 1e-9))
        # counters add up over epochs; peaks take the max
        counters = {**dict.fromkeys(self.counters, 0), **control.stats(), **busy, "inline_epochs": int(inline),
                    "pipelined_epochs": int(not inline)}
        for key, value in counters.items():
            merge = max if key in PEAK_COUNTERS else operator.add
            self.totals[key] = merge(self.totals.get(key, 0), value)

    def stats(self) -> dict[str, int]:
        return dict(self.totals)


@SCHEDULES.register("async")
class AsyncStrategy(PipelinedStrategy):
    counters = ("stale_reads", "lost_updates")
    in_place = True  # (the compute stage still takes one batch at a time, in order)

    def make_control(self, store, device, first_timestamp):
        return LastWriterWins(store, device)


@SCHEDULES.register("oac")
class OacStrategy(PipelinedStrategy):
    reads = (*PipelinedStrategy.reads, "pipeline.coalesce_writes")
    keeps_sync_model = True  # (the sync run of its computation order, bit for bit)
    counters = ("repaired_rows", "skipped_writes", "coalesced_writes", "peak_cache_rows", "evicted_rows",
                "write_lock_wait_seconds", "write_lock_held_seconds", "validation_seconds")

    def make_control(self, store, device, first_timestamp):
        return OptimisticAsynchronyControl(store, device, first_timestamp, self.settings.coalesce_writes)
