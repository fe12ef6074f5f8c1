"""The pipelined runner: Marius-style threads and bounded queues around the same stages.

    loader threads ──compute queue──▶ one compute thread ──write queue──▶ writer threads
    (plan, read rows, upload)          (validate, compute, stamp:        (download, write rows,
                                         the critical section)             finish)

At most ``staleness_bound`` batches are in flight (a slot is taken before a batch is read and given
back after it is written). The order in which batches enter the compute thread is the
*computation order*; ``batch.timestamp`` is a batch's position in it.

What happens at the edges of the critical section is a ``ConcurrencyControl``: last-writer-wins for
the ``async`` strategy, Optimistic Asynchrony Control for ``oac``. The runner itself knows neither.

A watchdog on the calling thread stops the run with a ``PipelineStall`` naming the stage that holds
the oldest unfinished work when no batch finishes for ``stall_timeout`` seconds; an exception in any
stage thread stops all threads and is re-raised on the calling thread.
"""

from __future__ import annotations

import queue
import functools
import threading
import time
from typing import Callable

import torch

from cadence.config import PipelineConfig
from cadence.engines.threads import ThreadGroup
from cadence.errors import CadenceError
from cadence.core.batch import Batch, BatchPlan
from cadence.pipeline.stages import Stages
from cadence.store.embedding_store import EmbeddingStore

_DONE = object()  # end-of-stream marker in a queue
_POLL = 0.05  # seconds between checks of the stop flag while blocked
STOP_GRACE = 5.0  # seconds the stage threads get to leave after a stop


class PipelineStall(CadenceError):
    """No batch finished for longer than ``pipeline.stall_timeout``."""

    exit_code = 3


class ConcurrencyControl:
    """Hooks around the stages; the default reads and writes rows with no control at all."""

    def __init__(self, store: EmbeddingStore, pin: bool = False):
        self.store = store
        self.pin = pin  # read rows into pinned memory (the compute device is an accelerator)

    def stats(self) -> dict[str, int]:
        return {}

    def begin(self, batch: Batch) -> None:
        """Loader thread, before the batch reads storage."""

    def read(self, batch: Batch) -> None:
        """Loader thread: versions first, then values and state (``EmbeddingStore.pull``)."""
        batch.rows = self.store.pull(batch.ids, with_versions=True, pin=self.pin)

    def validate(self, batch: Batch) -> None:
        """Compute thread, before compute."""

    def stamp(self, batch: Batch) -> None:
        """Compute thread, after compute: ``batch.timestamp`` is already set."""

    def write(self, batch: Batch) -> None:
        self.store.set(batch.ids, batch.rows)

    def finish(self, batch: Batch) -> None:
        """Writer thread, after the write."""


class _Stage:
    """What one thread of a stage is doing, for the watchdog."""

    def __init__(self, name: str):
        self.name = name
        self.batch: Batch | None = None
        self.since = time.monotonic()
        self.busy = 0.0  # seconds spent working on batches (the rest: waiting on queues and slots)

    def start(self, batch: Batch, since: float | None = None) -> None:
        self.batch, self.since = batch, time.monotonic() if since is None else since

    def idle(self) -> None:
        now = time.monotonic()
        if self.batch is not None:
            self.busy += now - self.since
        self.batch, self.since = None, now


class PipelineRunner:
    def __init__(self, config: PipelineConfig, control: ConcurrencyControl):
        self.config = config
        self.control = control

    def run(self, plans: list[BatchPlan], stages: Stages, on_batch: Callable[[Batch], None],
            next_timestamp: int = 0) -> int:
        """Train on ``plans``; return the next free timestamp."""
        self._setup(plans, stages, on_batch, next_timestamp)
        self._spawn("load", self.config.loader_threads, self._load)
        self._spawn("compute", 1, self._compute)
        self._spawn("write", self.config.writer_threads, self._write)
        self._watch()
        return self._timestamp

    def _setup(self, plans: list[BatchPlan], stages: Stages, on_batch: Callable[[Batch], None],
               next_timestamp: int) -> None:
        self._plans = iter(plans)
        self._plans_lock = threading.Lock()
        self._slots = threading.Semaphore(self.config.staleness_bound)
        self._compute_queue: queue.Queue = queue.Queue(self.config.queue_size)
        self._write_queue: queue.Queue = queue.Queue(self.config.queue_size)
        self._stop = threading.Event()
        self._group = ThreadGroup()  # the stage threads; the first error stops all
        self._finished_lock = threading.Lock()
        self._on_batch = on_batch
        self._stages = stages
        self._timestamp = next_timestamp
        self._last_progress = time.monotonic()
        self._remaining = len(plans)
        self._epoch = plans[0].epoch if plans else 0
        self._total = len(plans)
        self._states: list[_Stage] = []
        self._loaders_left = self.config.loader_threads
        self._writers_left = self.config.writer_threads
        self._exit_lock = threading.Lock()
        self._finished = threading.Event()  # set when the last writer exits, or on an error
        self._intra_op_threads = torch.get_num_threads()

    def run_inline(self, plans: list[BatchPlan], stages: Stages, on_batch: Callable[[Batch], None],
                   next_timestamp: int = 0) -> int:
        """The same stages and hooks, one batch after another on the calling thread (no batch in flight
        beside another: the schedule the threads give with ``staleness_bound: 1``); each stage's time is
        kept as ``busy_seconds`` as the threads' is. Returns the next free timestamp.

        On the calling thread, not one of its own: torch's CPU ops run on an OpenMP team per thread
        that calls them, and a second thread's team beside the calling thread's idle one ran the same
        batches 13-25% slower (docs/strategies/pipelined.md, "When the pipeline runs"). A watchdog
        thread watches it as the calling thread watches the stage threads: when no batch finishes for
        ``stall_timeout`` seconds it stops the epoch, which raises a ``PipelineStall`` naming the stage
        that held the batch as soon as that stage returns (a stage that never returns holds the run,
        as it holds a ``sync`` run)."""
        self._setup(plans, stages, on_batch, next_timestamp)
        load, compute, write = _Stage("load"), _Stage("compute"), _Stage("write")
        self._states.extend([load, compute, write])
        stalls: list[PipelineStall] = []
        watchdog = threading.Thread(target=self._watch_inline, args=(stalls,), name="cadence-watchdog", daemon=True)
        watchdog.start()
        try:
            for plan in plans:
                if self._stop.is_set():
                    break
                batch = self._read_one(plan, load)
                if self._stop.is_set():
                    break
                batch = self._compute_one(batch, compute)
                if self._stop.is_set():
                    break
                self._write_one(batch, write)
        finally:
            self._finished.set()
            watchdog.join()
        if stalls:
            raise stalls[0]
        return self._timestamp

    def busy_seconds(self) -> dict[str, float]:
        """Where the time went: seconds each stage's threads spent on batches, summed over its
        threads (``load_busy_seconds`` of 4 loaders busy all of a 10 s epoch is 40)."""
        busy: dict[str, float] = {}
        for state in self._states:
            key = f"{state.name}_busy_seconds"
            busy[key] = busy.get(key, 0.0) + state.busy
        return {key: round(value, 4) for key, value in busy.items()}

    # ---- threads --------------------------------------------------------------------------------
    def _spawn(self, name: str, count: int, body: Callable[[_Stage], None]) -> None:
        for index in range(count):
            state = _Stage(name)
            self._states.append(state)
            self._group.spawn(functools.partial(self._guard, body, state), f"cadence-{name}-{index}")

    def _guard(self, body: Callable[[_Stage], None], state: _Stage) -> None:
        try:
            body(state)
        except BaseException:  # kept by the group, surfaced on the calling thread by _watch
            self._stop.set()  # (before this thread's exit counts: no end marker goes downstream)
            self._finished.set()
            raise
        finally:
            self._exited(state.name)

    def _exited(self, stage: str) -> None:
        """The last loader out sends the end marker downstream; the last writer out ends the run."""
        with self._exit_lock:
            if stage == "load":
                self._loaders_left -= 1
                last = self._loaders_left == 0
            elif stage == "write":
                self._writers_left -= 1
                last = self._writers_left == 0
            else:
                return
        if last and stage == "load":
            self._put(self._compute_queue, _DONE)  # after every loaded batch: the queue is FIFO
        elif last:
            self._finished.set()

    def _load(self, state: _Stage) -> None:
        torch.set_num_threads(1)  # row copies: a team per loader beside the compute thread's is more threads than cores
        while not self._stop.is_set():
            if not self._acquire_slot():
                return
            with self._plans_lock:
                plan = next(self._plans, None)
            if plan is None:
                self._slots.release()
                return
            batch = self._read_one(plan, state)
            if not self._put(self._compute_queue, batch):
                return

    def _compute(self, state: _Stage) -> None:
        torch.set_num_threads(self._intra_op_threads)  # OpenMP's thread count is per thread (the caller's)
        while True:
            batch = self._get(self._compute_queue)
            if batch is None:
                return
            if batch is _DONE:
                break
            batch = self._compute_one(batch, state)
            if not self._put(self._write_queue, batch):
                return
        for _ in range(self.config.writer_threads):
            if not self._put(self._write_queue, _DONE):
                return

    def _write(self, state: _Stage) -> None:
        torch.set_num_threads(1)  # (as the loaders)
        while True:
            batch = self._get(self._write_queue)
            if batch is None or batch is _DONE:
                return
            self._write_one(batch, state)
            self._slots.release()

    # ---- one batch through each stage (the stage threads', and an inline epoch's) -------------
    def _read_one(self, plan: BatchPlan, state: _Stage) -> Batch:
        began = time.monotonic()
        batch = self._stages.load.prepare(plan)
        state.start(batch, since=began)
        self.control.begin(batch)
        self.control.read(batch)
        batch = self._stages.link.upload(batch)
        state.idle()
        return batch

    def _compute_one(self, batch: Batch, state: _Stage) -> Batch:
        state.start(batch)
        with self._stages.link.computing(batch):
            self.control.validate(batch)
            batch.timestamp = self._timestamp
            self._timestamp += 1
            batch = self._stages.compute(batch)
            self.control.stamp(batch)
        state.idle()
        return batch

    def _write_one(self, batch: Batch, state: _Stage) -> None:
        state.start(batch)
        batch = self._stages.link.download(batch)
        self.control.write(batch)
        self.control.finish(batch)
        state.idle()
        with self._finished_lock:
            self._on_batch(batch)
            self._remaining -= 1
            self._last_progress = time.monotonic()

    # ---- blocking with a way out ----------------------------------------------------------------
    def _acquire_slot(self) -> bool:
        while not self._stop.is_set():
            if self._slots.acquire(timeout=_POLL):
                return True
        return False

    def _put(self, target: queue.Queue, item: object) -> bool:
        while not self._stop.is_set():
            try:
                target.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, source: queue.Queue) -> object | None:
        while not self._stop.is_set():
            try:
                return source.get(timeout=_POLL)
            except queue.Empty:
                continue
        return None

    # ---- the calling thread ---------------------------------------------------------------------
    def _watch(self) -> None:
        try:
            while not self._finished.wait(timeout=self._check_every()):
                if self._stalled():
                    raise PipelineStall(self._stall_report())
        except BaseException:  # a stall, or Ctrl-C on this thread: every stage thread stops first
            self._stop.set()
            self._join_all()
            raise
        self._join_all()
        self._group.raise_first()

    def _watch_inline(self, stalls: list[PipelineStall]) -> None:
        """The watchdog thread of an inline epoch: a stall is reported in ``stalls`` and stops the epoch."""
        while not self._finished.wait(timeout=self._check_every()):
            if self._stalled():
                stalls.append(PipelineStall(self._stall_report()))
                self._stop.set()
                return

    def _check_every(self) -> float:
        return min(1.0, self.config.stall_timeout / 4)

    def _stalled(self) -> bool:
        return bool(self._remaining) and time.monotonic() - self._last_progress > self.config.stall_timeout

    def _join_all(self) -> None:
        """Wait for the stage threads to leave (at their next queue poll, or when the stage call
        they are in returns); one truly stuck stays behind, and the ``cadence`` command exits
        without tearing the interpreter down under it (cli.entry)."""
        if self._group.failed:
            self._stop.set()
        self._group.join(timeout=STOP_GRACE)

    def _stall_report(self) -> str:
        busy = [s for s in self._states if s.batch is not None]
        queues = f"compute queue {self._compute_queue.qsize()}/{self.config.queue_size}, " \
                 f"write queue {self._write_queue.qsize()}/{self.config.queue_size}"
        if busy:
            oldest = min(busy, key=lambda s: s.since)
            plan = oldest.batch.plan
            where = (f"the {oldest.name} stage has held batch {plan.index} of epoch {plan.epoch} "
                     f"for {time.monotonic() - oldest.since:.1f} s")
        else:
            waiting = max(self._states, key=lambda s: time.monotonic() - s.since)
            where = (f"every stage is waiting (longest: {waiting.name}) with {self._total - self._remaining} of "
                     f"{self._total} batches of epoch {self._epoch} finished")
        return (f"pipeline stalled: no batch finished for {self.config.stall_timeout:g} s; {where}; {queues}. "
                "Training stopped; the last checkpoint is kept (resume with --resume).")
