"""Engines run the workers of one epoch. ``threads`` (the default) runs each worker in a thread of
this process; torch releases the GIL inside its kernels, so workers overlap their compute. ``ray``
(``cadence.runtime.ray_engine``) runs the workers and the server shards as Ray actors."""

from __future__ import annotations

import threading

from cadence.registry import Registry
from cadence.runtime.gates import NoGate
from cadence.runtime.server import DataList
from cadence.runtime.worker import Worker

ENGINES: Registry[type["ThreadEngine"]] = Registry("engine")


@ENGINES.register("threads")
class ThreadEngine:
    def run(self, workers: list[Worker], data: DataList, gate: NoGate) -> None:
        errors: list[tuple[int, BaseException]] = []

        def guarded(worker: Worker) -> None:
            try:
                worker.run(data, gate)
            except BaseException as err:  # re-raised below, on the calling thread
                errors.append((worker.index, err))
                abandon(data, f"worker {worker.index} failed: {err!r}")

        threads = [threading.Thread(target=guarded, args=(w,), name=f"cadence-worker-{w.index}", daemon=True)
                   for w in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            index, err = errors[0]
            raise WorkerFailed(f"worker {index} failed: {err!r}; the epoch is abandoned") from err


class WorkerFailed(RuntimeError):
    """A worker raised: every other worker was released and the epoch abandoned."""


def abandon(data: DataList, reason: str) -> None:
    """A worker failed: hand out no more batches and release everyone waiting on a shard (sync's
    barrier, backup workers' next step), so the epoch ends within a batch instead of hanging."""
    data.stop()
    for shard in data.shards:
        shard.abort(reason)


@ENGINES.register("ray")
def ray_engine():
    """Workers, server shards and the data list as Ray actors (``pip install cadence[ray]``); Ray is
    imported here, when the engine is used, never by ``import cadence``."""
    from cadence.runtime.ray_engine import RayEngine

    return RayEngine()
