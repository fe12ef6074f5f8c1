"""Threads of this process as a place where code runs: a group of threads in which the first error
stops all, a job's parts run at once on kept threads (``Parts``), the scope of torch's intra-op
threads on one thread, the cores this process may use, and a governor that re-chooses a thread's
intra-op thread count from the throughput it measures.

Every runtime that runs threads (the pipeline's stages, pdASGD's backward threads, the parameter
server's workers, ShadowSync's trainers, AdaPM's nodes, workers and sync threads) starts them through
``ThreadGroup``: an exception on any thread is recorded, ``on_error`` is called at once (so the
others can leave early: set a stop event, abort a barrier), and ``join`` re-raises the first one on
the caller's thread. No strategy is named here.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import torch


class ThreadGroup:
    """Threads started together and joined together; the first error stops all (module docstring).

    ``spawn(run, name)`` starts ``run()`` on a daemon thread; its return value is kept in
    ``results`` under ``key`` (default: the spawn order). ``join()`` waits for every thread;
    ``raise_first()`` re-raises the first error on the caller's thread."""

    def __init__(self, on_error: Callable[[Any, BaseException], None] | None = None):
        self.on_error = on_error  # (key of the failed thread, its exception), called on that thread
        self.errors: list[tuple[Any, BaseException]] = []  # in the order they happened
        self.results: dict[Any, Any] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def spawn(self, run: Callable[[], Any], name: str, key: Any = None) -> threading.Thread:
        key = len(self._threads) if key is None else key
        thread = threading.Thread(target=self._guarded, args=(run, key), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _guarded(self, run: Callable[[], Any], key: Any) -> None:
        self.call(run, key)

    def call(self, run: Callable[[], Any], key: Any) -> None:
        """Run ``run()`` on the calling thread as one of the group's: its result kept under ``key``,
        an error recorded (and ``on_error`` called) instead of raised (a ``Worker``'s job)."""
        try:
            outcome = run()
        except BaseException as err:  # re-raised by the caller, on its thread
            with self._lock:
                self.errors.append((key, err))
            if self.on_error is not None:
                self.on_error(key, err)
            return
        with self._lock:
            self.results[key] = outcome

    def join(self, timeout: float | None = None) -> "ThreadGroup":
        """Wait for every thread; with ``timeout``, at most that many seconds for all of them together
        (a thread still stuck then is left behind: the threads are daemons)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def raise_first(self) -> None:
        if self.errors:
            raise self.errors[0][1]


def run_threads(jobs: dict[Any, Callable[[], Any]], name: Callable[[Any], str],
                on_error: Callable[[Any, BaseException], None] | None = None) -> ThreadGroup:
    """Run each job on a thread of its own (``name(key)``) and join them all; the returned group
    holds each job's result under its key and the errors in the order they happened."""
    group = ThreadGroup(on_error)
    for key, job in jobs.items():
        group.spawn(job, name(key), key)
    return group.join()


class Parts:
    """A job of ``count`` parts run at once: part 0 on the calling thread, the others on ``count - 1``
    helper threads kept for the next job (a job is a batch: a thread started per batch would cost
    what a part of a small batch does). ``run(job)`` returns ``[job(0), ..., job(count - 1)]``
    after every part has ended; the first part's error (in part order) is re-raised on the caller.
    ``share(job, pieces)``: more pieces than threads, each thread taking the next as it is free."""

    def __init__(self, count: int, name: str = "cadence-part"):
        self.count = max(1, count)
        self._helpers = ThreadPoolExecutor(self.count - 1, thread_name_prefix=name) if self.count > 1 else None

    def run(self, job: Callable[[int], Any]) -> list[Any]:
        if self._helpers is None:
            return [job(0)]
        others = [self._helpers.submit(job, part) for part in range(1, self.count)]
        try:
            first = job(0)
        finally:
            outcomes = [future.exception() for future in others]  # (waits for each)
        for error in outcomes:
            if error is not None:
                raise error
        return [first, *(future.result() for future in others)]

    def share(self, job: Callable[[int], Any], pieces: int) -> list[Any]:
        """``[job(0), ..., job(pieces - 1)]``, the pieces shared among the ``count`` threads as they
        become free (each takes the next piece when it finished its last): a thread that another
        process keeps from its core takes fewer pieces instead of holding the others up."""
        results: list[Any] = [None] * pieces
        taken = iter(range(pieces))
        lock = threading.Lock()

        def take(_part: int) -> None:
            while True:
                with lock:
                    piece = next(taken, None)
                if piece is None:
                    return
                results[piece] = job(piece)

        self.run(take)
        return results

    def close(self) -> None:
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)


@contextlib.contextmanager
def intra_op_threads(count: int | None) -> Iterator[None]:
    """Torch's intra-op thread count on this thread (OpenMP's count is per thread) set to ``count``
    inside the block and put back after it; ``None`` or 0 leaves it alone."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        if count:
            torch.set_num_threads(before)


def intra_op_share(threads: int) -> contextlib.AbstractContextManager[None]:
    """Each of ``threads`` threads started inside the block gets an equal share of this thread's
    intra-op threads (one when they outnumber them)."""
    return intra_op_threads(max(1, torch.get_num_threads() // max(1, threads)))


# ---- the cores this process may use ------------------------------------------------------------------------
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_quota_cores(root: Path, proc_cgroup: str) -> float | None:
    """The tightest CPU quota (in cores) on this process's cgroup and its ancestors, cgroup v1
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) or v2 (``cpu.max``); None when unlimited."""
    tightest = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: one unified hierarchy
            base, files = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):
            base, files = root / "cpu", ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        directory = base / path.lstrip("/")
        while True:
            cores = _quota_in(directory, files)
            if cores is not None:
                tightest = cores if tightest is None else min(tightest, cores)
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return tightest


def _quota_in(directory: Path, files: tuple[str, ...]) -> float | None:
    try:
        if len(files) == 1:
            quota, _, period = (directory / files[0]).read_text().strip().partition(" ")
            if quota == "max":
                return None
            return int(quota) / int(period)
        quota = int((directory / files[0]).read_text())
        return None if quota <= 0 else quota / int((directory / files[1]).read_text())
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """How many cores this process may use: its CPU affinity (``taskset``, a cpuset), capped by the
    CPU quota of its cgroup and the cgroups above it (a container's ``--cpus``), at least 1. Not the
    machine's core count: a process pinned to 2 of 64 cores that starts 64 threads gets 2 cores' worth
    of time for 64 threads that wait on each other."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota = _cgroup_quota_cores(CGROUP_ROOT, Path("/proc/self/cgroup").read_text())
    except OSError:
        quota = None
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota - 1e-9)))
    return max(1, cores)


# ---- the intra-op thread count, chosen by measurement -----------------------------------------------------
class ThreadGovernor:
    """Chooses one thread's torch intra-op thread count from the throughput it measures, and again
    when the machine changes under it.

    An intra-op team of N threads meets at a barrier after every op; when another process takes one
    of the cores, the team waits for its descheduled member at each op, and a team of 2 on a machine
    of 2 cores with one busy runs at a tenth of one thread's speed (issue 27's 7.5k vs 146k edges/s).
    What is faster cannot be known in advance (it depends on the load of the moment), so it is
    measured: the work goes on at the current count; every ``interval`` seconds a neighbouring count
    of the ladder ``most, most/2, ..., 1`` is tried for ``probe_s`` seconds (at least ``probe_batches``
    steps, the first after a change not counted); a neighbour faster by ``gain`` is kept, else the
    current count returns and the next probe waits twice as long (up to ``longest_s``). On a quiet
    machine that costs a few percent of a probe's short time at a slower count; on a shared one it
    turns the collapse into one thread's speed within seconds.

    ``step(work)`` is called by the thread whose count is governed, after each unit of work (a
    batch's examples); ``restart()`` forgets the clock across a pause (an evaluation between epochs).
    Which count computes a batch never changes what it computes where the ops split work by rows or
    columns (every kernel cadence's steps use; a test checks a run that changes count every few batches
    against one at a fixed count, bit for bit); a whole-tensor reduction may differ in the last bit.
    """

    INTERVAL_S = 2.0
    LONGEST_S = 32.0
    PROBE_S = 0.3
    PROBE_BATCHES = 4
    GAIN = 1.1
    CHANGE = 1.5  # a window at the current count this much slower or faster than before: probe at once

    def __init__(self, most: int, clock: Callable[[], float] = time.perf_counter):
        self.most = max(1, most)
        ladder, count = [], self.most
        while True:
            ladder.append(count)
            if count == 1:
                break
            count = max(1, count // 2)
        self.ladder = ladder  # descending
        self.clock = clock
        self.current = self.most
        self.probing: int | None = None
        self.interval = self.INTERVAL_S
        self.switches = 0
        self.probes = 0
        self.history: list[tuple[float, int]] = []  # (seconds since the first step, count) at each switch
        self._began: float | None = None
        self._downward = True  # which neighbour the next probe tries first
        self._reference: float | None = None  # the current count's last measured rate
        self._last: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._work = self._time = 0.0  # since the last change or probe
        self._steps = 0
        self._window = [0.0, 0.0, 0]  # the latest short window at the current count: work, seconds, steps
        self._skip = 1

    def restart(self) -> None:
        """Forget the clock (the next step only starts it) and the running sums; keep what was learnt."""
        self._reset()
        self._last = None

    def apply(self) -> None:
        """Put the chosen count on the calling thread (OpenMP's count is per thread)."""
        wanted = self.probing or self.current
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)

    def step(self, work: float) -> None:
        now = self.clock()
        if self._began is None:
            self._began = now
        last, self._last = self._last, now
        if last is None:
            return
        if self._skip:  # the first step after a change warms the new team
            self._skip -= 1
            return
        seconds = now - last
        self._work += work
        self._time += seconds
        self._steps += 1
        if self.probing is None:
            self._exploit(work, seconds)
        elif self._time >= self.PROBE_S and self._steps >= self.PROBE_BATCHES:
            self._judge(now)

    def _exploit(self, work: float, seconds: float) -> None:
        window = self._window
        window[0] += work
        window[1] += seconds
        window[2] += 1
        changed = False
        if window[1] >= self.PROBE_S and window[2] >= self.PROBE_BATCHES:
            rate = window[0] / window[1]
            reference = self._reference
            changed = reference is not None and not reference / self.CHANGE <= rate <= reference * self.CHANGE
            self._window = [0.0, 0.0, 0]
        if changed:  # the machine changed under the current count: look again now
            self.interval = self.INTERVAL_S
            self._probe(rate)
        elif self._time >= self.interval and self._work > 0:
            self._reference = self._work / self._time
            self._probe(self._reference)

    def _probe(self, base_rate: float) -> None:
        neighbour = self._neighbour()
        if neighbour is None:
            self._reference = base_rate
            self._reset()
            self._skip = 0
            return
        self._base_rate = base_rate
        self.probing, self.probes = neighbour, self.probes + 1
        self._reset()

    def _judge(self, now: float) -> None:
        rate = self._work / self._time
        if rate > self._base_rate * self.GAIN:
            self.current, self.interval, self.switches = self.probing, self.INTERVAL_S, self.switches + 1
            self._reference = rate
            self.history.append((round(now - self._began, 3), self.current))
        else:
            self._reference = self._base_rate
            self.interval = min(self.interval * 2, self.LONGEST_S)
            self._downward = not self._downward
        self.probing = None
        self._reset()

    def _neighbour(self) -> int | None:
        at = self.ladder.index(self.current)
        lower = self.ladder[at + 1] if at + 1 < len(self.ladder) else None
        higher = self.ladder[at - 1] if at > 0 else None
        first, second = (lower, higher) if self._downward else (higher, lower)
        return first if first is not None else second

    def stats(self) -> dict[str, Any]:
        return {"intra_op_threads": self.current, "intra_op_switches": self.switches,
                "intra_op_probes": self.probes}
