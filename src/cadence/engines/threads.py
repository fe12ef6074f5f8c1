"""Threads of this process as a place where code runs: a group of threads in which the first error
stops all, and the scope of torch's intra-op threads on one thread.

Every runtime that runs threads (the pipeline's stages, pdASGD's backward threads, the parameter
server's workers, ShadowSync's trainers, AdaPM's nodes, workers and sync threads) starts them through
``ThreadGroup``: an exception on any thread is recorded, ``on_error`` is called at once (so the
others can leave early: set a stop event, abort a barrier), and ``join`` re-raises the first one on
the caller's thread. No strategy is named here.
"""

from __future__ import annotations

import contextlib
import threading
import time
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
