"""pdASGD (SPEC section 4): the sequential twin equals sync bit for bit (the task matrix), layer-wise
updates happen during the backward pass and touch each layer once per batch, and K = 4 backward
threads under real concurrency lose no batch and count their staleness."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
import torch

from cadence import api
from cadence.optim import InPlaceDense
from cadence.strategies.pipelined import pdasgd as pdasgd_module
from tests.conftest import make_config, needs_cuda


def train(task_data, tmp_path, task: str, name: str, *overrides: str):
    config = make_config(tmp_path / name, *task_data[task], *overrides)
    return api.train(config)


def record_updates(monkeypatch) -> list[tuple[int, bool]]:
    """(parameter index, whether its batch's backward pass had returned) of every update."""
    calls: list[tuple[int, bool]] = []
    returned = threading.local()
    original_step, original_backward = InPlaceDense.step_one, torch.Tensor.backward

    def step_one(self, index, grad):
        calls.append((index, getattr(returned, "value", False)))
        return original_step(self, index, grad)

    def backward(self, *args, **kwargs):
        returned.value = False
        try:
            return original_backward(self, *args, **kwargs)
        finally:
            returned.value = True

    monkeypatch.setattr(InPlaceDense, "step_one", step_one)
    monkeypatch.setattr(torch.Tensor, "backward", backward)
    return calls


@pytest.mark.parametrize("strategy, during_backward", [("pdasgd", True), ("pdasgd-bu", False)])
def test_layer_wise_updates_happen_during_the_backward_pass_once_per_layer_and_batch(
        strategy, during_backward, task_data, tmp_path, monkeypatch) -> None:
    calls = record_updates(monkeypatch)
    result = train(task_data, tmp_path, "image", strategy, f"strategy={strategy}", "pdasgd.backward_threads=1",
                   "pdasgd.barrier=true", "image.hidden=[16,8]")
    summary = result.summary
    batches = summary["examples_seen"] // 32 + 2  # 200 training images in batches of 32: 7 per epoch
    layers = len(summary["layer_updates"])
    assert layers == 6 and len(calls) == layers * batches
    for start in range(0, len(calls), layers):  # batch by batch (one batch at a time: the barrier)
        chunk = calls[start:start + layers]
        assert sorted(index for index, _ in chunk) == list(range(layers)), "each layer once per batch"
        assert all(inside == (not during_backward) for _, inside in chunk)
        if during_backward:  # the output layer's gradient exists first: it is updated first
            assert [index for index, _ in chunk][:2] in ([4, 5], [5, 4])
    assert set(summary["layer_updates"].values()) == {batches}
    assert summary["staleness_max"] == 0  # one graph in flight: no update between a forward and its own


@pytest.mark.parametrize("task", ["image", "ctr"])
def test_four_backward_threads_lose_no_batch_and_count_staleness(task, task_data, tmp_path) -> None:
    """Real concurrency: the forward thread keeps 4 graphs in flight whose updates interleave; every
    batch is trained exactly once, every layer updated once per batch, and the forwards that read
    weights other batches updated meanwhile are counted."""
    epochs = 3
    result = train(task_data, tmp_path, task, "stress", "strategy=pdasgd", "pdasgd.backward_threads=4",
                   f"train.epochs={epochs}", "train.batch_size=8")
    summary = result.summary
    train_size = {"image": 200, "ctr": 320}[task]
    assert summary["examples_seen"] == epochs * train_size
    batches = epochs * -(-train_size // 8)
    assert set(summary["layer_updates"].values()) == {batches}
    assert summary["staleness_max"] >= 1 and summary["staleness_mean"] > 0
    metric = summary["primary_metric"]
    assert summary[metric] == summary[metric]  # finite (not NaN)


def test_a_failing_backward_pass_stops_the_epoch_with_its_error(task_data, tmp_path, monkeypatch) -> None:
    def broken(self, item, stages, rule, stream=None):
        raise RuntimeError("backward exploded")

    monkeypatch.setattr(pdasgd_module.Pdasgd, "_backward", broken)
    with pytest.raises(RuntimeError, match="backward exploded"):
        train(task_data, tmp_path, "image", "broken", "strategy=pdasgd")
    alive = [t.name for t in threading.enumerate() if t.name.startswith("cadence-pdasgd")]
    assert not alive


@pytest.mark.parametrize("barrier", [False, True])
def test_a_forward_runs_while_another_batchs_backward_is_running(barrier, task_data, tmp_path, monkeypatch) -> None:
    """The claim pdASGD rests on, in time: the forward pass of a later batch runs while an earlier
    batch's backward pass is still running (intervals of wall-clock time that intersect), and the
    sequential twin (``pdasgd.barrier``) never lets them meet."""
    intervals: dict[str, list[tuple[float, float]]] = {"forward": [], "backward": []}
    lock = threading.Lock()

    def timed(name, original):
        def run(self, *args, **kwargs):
            began = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                with lock:
                    intervals[name].append((began, time.perf_counter()))
        return run

    monkeypatch.setattr(pdasgd_module.Pdasgd, "_forward", timed("forward", pdasgd_module.Pdasgd._forward))
    monkeypatch.setattr(pdasgd_module.Pdasgd, "_backward", timed("backward", pdasgd_module.Pdasgd._backward))
    train(task_data, tmp_path, "image", f"overlap-{barrier}", "strategy=pdasgd", "pdasgd.backward_threads=2",
          f"pdasgd.barrier={str(barrier).lower()}", "image.hidden=[256,256]", "train.epochs=6")
    # (6 epochs: under the suite's load on 2 cores, one run of 3 once saw no overlap at all)
    overlaps = sum(1 for f0, f1 in intervals["forward"] for b0, b1 in intervals["backward"] if f0 < b1 and b0 < f1)
    assert len(intervals["forward"]) == len(intervals["backward"]) > 20
    if barrier:
        assert overlaps == 0  # (the guard works: no overlap is counted where none can happen)
    else:
        assert overlaps > 0, f"no forward ever ran during a backward ({len(intervals['forward'])} batches)"




@needs_cuda
def test_on_cuda_each_backward_thread_computes_on_its_own_stream(task_data, tmp_path, monkeypatch) -> None:
    """Each backward thread owns a CUDA stream, none the pipeline's compute stream or the default;
    the forward of every batch runs on the stream of the thread that takes its graph (autograd runs
    a backward op on its forward op's stream), so forwards use every backward thread's stream."""
    from cadence.pipeline.transfer import DeviceLink

    used: list[tuple[str, object]] = []
    lock = threading.Lock()
    original = DeviceLink.computing

    def computing(self, batch, stream=None):
        with lock:
            used.append((threading.current_thread().name, stream, self.compute_stream))
        return original(self, batch, stream)

    monkeypatch.setattr(DeviceLink, "computing", computing)
    train(task_data, tmp_path, "image", "streams", "strategy=pdasgd", "pdasgd.backward_threads=2", "device=cuda")
    backward = {}
    for name, stream, compute in used:
        assert stream is not None and stream != compute and stream != torch.cuda.default_stream()
        if name.startswith("cadence-pdasgd-backward"):
            backward.setdefault(name, set()).add(stream)
    assert len(backward) == 2 and all(len(streams) == 1 for streams in backward.values())
    theirs = {next(iter(streams)) for streams in backward.values()}
    assert len(theirs) == 2
    forward = {stream for name, stream, _ in used if not name.startswith("cadence-pdasgd-backward")}
    assert forward == theirs


@pytest.mark.parametrize("overrides, message", [
    (["pdasgd.slow_thread=2"], "pdasgd.slow_thread must be -1 (none) or a backward thread, 0 to 1; got 2"),
    (["pdasgd.slow_thread=0"], "pdasgd.slowdown must exceed 1 to slow backward thread 0; got 1.0"),
])
def test_a_slowed_backward_thread_must_exist_and_be_slowed(overrides, message, task_data, tmp_path) -> None:
    from cadence.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_config(tmp_path / "bad", *task_data["image"], "strategy=pdasgd", *overrides)


@pytest.mark.skipif(pdasgd_module.cgroups.unavailable() is not None, reason=str(pdasgd_module.cgroups.unavailable()))
def test_the_slowed_backward_thread_alone_runs_at_its_rate_over_the_slowdown() -> None:
    """``pdasgd.slow_thread``: the thread's own CPU quota (never a sleep), measured in time: backward
    thread 0 and 1 spin side by side; after the quota's probe, 0 gets well under half of 1's CPU."""
    from cadence.strategies.pipelined.settings import PdasgdConfig

    schedule = pdasgd_module.Pdasgd(PdasgdConfig(slow_thread=0, slowdown=4.0))
    rates: dict[int, float] = {}

    block = bytes(1 << 20)

    def busy(seconds: float) -> float:
        """This thread's CPU rate while hashing for ``seconds`` (hashlib lets go of the interpreter
        lock, as a backward pass's kernels do: two threads' rates are not the lock's share)."""
        cpu, began = time.thread_time(), time.perf_counter()
        while time.perf_counter() - began < seconds:
            hashlib.sha256(block).digest()
        return (time.thread_time() - cpu) / (time.perf_counter() - began)

    def spin(index: int) -> None:
        with schedule._slowed(index):
            busy(0.8)  # the probe's 0.5 s and some
            rates[index] = busy(1.0)

    threads = [threading.Thread(target=spin, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert rates[0] < rates[1] / 2.0, rates
    assert schedule.throttled_seconds > 0 and schedule.slow_quota.measured_cores is not None
    assert schedule.stats()["slowed_thread_throttled_seconds"] > 0
