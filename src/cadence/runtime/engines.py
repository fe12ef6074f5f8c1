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
        errors: list[BaseException] = []

        def guarded(worker: Worker) -> None:
            try:
                worker.run(data, gate)
            except BaseException as err:  # re-raised below, on the calling thread
                errors.append(err)

        threads = [threading.Thread(target=guarded, args=(w,), name=f"cadence-worker-{w.index}", daemon=True)
                   for w in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]


@ENGINES.register("ray")
def ray_engine():
    """Workers, server shards and the data list as Ray actors (``pip install cadence[ray]``); Ray is
    imported here, when the engine is used, never by ``import cadence``."""
    from cadence.runtime.ray_engine import RayEngine

    return RayEngine()
