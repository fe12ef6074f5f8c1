"""``DeviceLink``: the identity on the CPU; on a GPU, pinned staging, a stream per direction and
events between them (the CUDA tests skip cleanly on a machine without one)."""

from __future__ import annotations

import os

import pytest
import torch

from cadence.device import use_deterministic_kernels
from cadence.core.batch import Batch, BatchPlan
from cadence.pipeline.transfer import DeviceLink
from cadence.store import create_store
from tests.conftest import needs_cuda



def a_batch(pin: bool = False) -> tuple[Batch, torch.Tensor]:
    store = create_store(50, 4, 1)
    store.initialize(0.1, seed=0)
    ids = torch.tensor([3, 8, 20])
    rows = store.pull(ids, with_versions=True, pin=pin)
    batch = Batch(BatchPlan(0, 0, torch.arange(3)), ids, {"label": torch.tensor([0.0, 1.0, 1.0])}, rows)
    return batch, store.values[ids].clone()


def test_on_the_cpu_the_link_moves_and_orders_nothing() -> None:
    batch, _ = a_batch()
    rows, ids, inputs = batch.rows, batch.ids, batch.inputs
    link = DeviceLink(torch.device("cpu"))
    assert link.upload(batch) is batch and batch.rows is rows and batch.ids is ids and batch.inputs is inputs
    with link.computing(batch):
        batch.loss = batch.rows.values.sum()
    assert link.download(batch) is batch and batch.rows is rows and batch.uploaded is None


def test_deterministic_kernels_are_switched_only_for_an_accelerator(monkeypatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        use_deterministic_kernels(torch.device("cpu"), True)
        assert torch.are_deterministic_algorithms_enabled() == before
        use_deterministic_kernels(torch.device("cuda"), True)  # only flags: no CUDA call is made
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        use_deterministic_kernels(torch.device("cuda"), False)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


@needs_cuda
def test_rows_are_staged_in_pinned_memory_and_come_back_after_the_compute_stream() -> None:
    batch, original = a_batch(pin=True)
    assert batch.rows.values.is_pinned() and batch.rows.versions.is_pinned()
    host_ids = batch.ids
    link = DeviceLink(torch.device("cuda"))
    link.upload(batch)
    assert batch.rows.values.is_cuda and batch.ids.is_cuda and batch.inputs["label"].is_cuda
    assert batch.uploaded is not None
    with link.computing(batch):
        assert torch.cuda.current_stream() == link.compute_stream
        torch.cuda._sleep(50_000_000)  # a long kernel: a download that did not wait would read too early
        batch.rows.values.mul_(2.0)
        batch.loss = batch.rows.values.sum()
    link.download(batch)
    assert batch.ids is host_ids and batch.rows.values.device.type == "cpu" and batch.rows.values.is_pinned()
    assert torch.equal(batch.rows.values, original * 2.0)
    assert float(batch.loss) == pytest.approx(float((original * 2.0).sum()))


@needs_cuda
def test_the_three_stages_run_on_three_streams() -> None:
    link = DeviceLink(torch.device("cuda"))
    streams = {link.upload_stream, link.compute_stream, link.download_stream, torch.cuda.current_stream()}
    assert len(streams) == 4


@needs_cuda
def test_runs_in_one_process_share_the_streams_and_hold_no_more_memory_each(tiny_graph, tmp_path) -> None:
    """Streams made anew for each run kept cuBLAS's workspace and the allocator's cached blocks of the
    old ones: 64 MiB more allocated after every run of a process (H200,
    benchmarks/results/gpu_check_54fe87b.json)."""
    import gc

    from cadence import api
    from tests.conftest import make_config

    first = DeviceLink(torch.device("cuda"))
    second = DeviceLink(torch.device("cuda", torch.cuda.current_device()))
    assert (first.upload_stream, first.compute_stream, first.download_stream) == (
        second.upload_stream, second.compute_stream, second.download_stream)
    assert first.side_stream(0) == second.side_stream(0) != first.side_stream(1)

    held = []
    for run, strategy in enumerate(["sync", "async", "sync", "async", "async"]):
        api.train(make_config(tmp_path / str(run), f"data.dataset={tiny_graph}", f"strategy={strategy}", "device=cuda",
                              "model.dim=64"))
        gc.collect()
        torch.cuda.synchronize()
        held.append(torch.cuda.memory_allocated())
    assert held[2:] == held[1:-1], f"allocated after each run (bytes): {held}"
