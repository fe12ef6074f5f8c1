"""``Runtime.run_epoch`` means the same on every runtime: ``on_batch`` (the trainer's
``on_batch_end`` hooks, its progress bar) fires exactly once per finished batch, one call at a time,
before the epoch returns, with the batch's plan and loss; on the threads of this process it fires
while the epoch runs. (The Ray engines' cases are in tests/ps/test_ray_engine.py.)"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from cadence import api
from cadence.training.trainer import TrainerHook
from tests.conftest import make_config


class BatchLog(TrainerHook):
    """Every reported batch: (epoch, plan index, loss, time), and whether two calls overlapped."""

    def __init__(self):
        self.batches: list[tuple[int, int, float, float]] = []
        self.epoch_ends: list[float] = []
        self.inside = threading.Lock()
        self.overlapped = False

    def on_batch_end(self, trainer, batch) -> None:
        if not self.inside.acquire(blocking=False):
            self.overlapped = True
            return
        try:
            self.batches.append((batch.plan.epoch, batch.plan.index, float(batch.loss), time.perf_counter()))
            time.sleep(0.0005)  # widen the window in which an unserialized caller would overlap
        finally:
            self.inside.release()

    def on_epoch_end(self, trainer, epoch: int) -> None:
        self.epoch_ends.append(time.perf_counter())


def batches_reported(config, epochs: int = 2):
    """Train ``config``; (the hook's log, the plan indices of each epoch)."""
    log = BatchLog()
    api.train(config, hooks=[log])
    _, task, _, _ = api.load_model(config.out)
    plans = {epoch: sorted(plan.index for plan in task.plan(epoch)) for epoch in range(epochs)}
    return log, plans


def assert_each_batch_once(log: BatchLog, plans: dict[int, list[int]]) -> None:
    assert not log.overlapped
    for epoch, indices in plans.items():
        assert sorted(index for e, index, _, _ in log.batches if e == epoch) == indices
    assert all(math.isfinite(loss) for _, _, loss, _ in log.batches)
    for epoch, ended in enumerate(log.epoch_ends):  # every batch of an epoch before its end
        assert all(at <= ended for e, _, _, at in log.batches if e == epoch)


RUNTIMES = {  # strategy and settings -> one case per runtime and engine on this process's threads
    "pipeline-sync": ["strategy=sync"],
    "pipeline-oac": ["strategy=oac", "pipeline.staleness_bound=4"],
    "pipeline-pdasgd": ["strategy=pdasgd", "pdasgd.backward_threads=2"],
    "server-gba": ["strategy=gba", "ps.workers=2"],
    "server-sync-dense-on-workers": ["strategy=sync", "ps.workers=2", "ps.dense=workers"],
    "shadowsync-hogwild": ["strategy=hogwild", "ps.workers=2", "shadow.threads=2"],
    "adapm": ["strategy=adapm", "ps.workers=2", "adapm.lookahead=4"],
}


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_on_batch_fires_once_per_finished_batch_on_every_runtime(name: str, task_data, tmp_path: Path) -> None:
    config = make_config(tmp_path / name, *task_data["mf"], *RUNTIMES[name])
    log, plans = batches_reported(config)
    assert_each_batch_once(log, plans)


def test_on_batch_fires_while_the_epoch_runs_on_threads(task_data, tmp_path: Path) -> None:
    """On the thread engine the reports come as the batches finish, not in a burst at the end: the
    first epoch's reports spread over most of the epoch (timestamps, not counts)."""
    config = make_config(tmp_path / "live", *task_data["mf"], "strategy=gba", "ps.workers=2",
                         "ps.emulated_latency=0.01", "train.epochs=1")
    log, plans = batches_reported(config, epochs=1)
    assert_each_batch_once(log, plans)
    times = [at for _, _, _, at in log.batches]
    assert len(times) >= 6
    # each worker spends >= 10 ms a batch: reports as batches finish span at least all but one of a
    # worker's batches (a burst at the end would span ~0.5 ms a report)
    assert times[-1] - times[0] >= 0.8 * 0.01 * (len(times) // 2 - 1)
