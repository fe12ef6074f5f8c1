"""Moving batches between the host and the compute device, and ordering the device's work.

On the CPU all of this is the identity: rows stay where the load stage put them.

On an accelerator (CUDA) three threads touch the device, each on a stream of its own, ordered by
events (a batch carries them):

    loader thread     gathers the rows into pinned host memory (``pull(..., pin=True)``), copies
                      rows, ids and inputs on the *upload* stream with ``non_blocking``, records
                      ``batch.uploaded``
    compute thread    on the *compute* stream: waits for ``uploaded``, validates, computes, stamps,
                      records ``batch.computed``
    writer thread     on the *download* stream: waits for ``computed``, copies the rows and the loss
                      into pinned host memory, waits for that copy to land (an event's
                      ``synchronize``) before the store write reads it

So a host-to-device copy comes from pinned memory (truly asynchronous, and the caching host
allocator keeps the pinned block until the copy is done), the device-to-host copy runs in the
writer threads beside the next batch's compute, and no thread reads a copy that has not landed.
A tensor made on one stream and used on another is ``record_stream``-ed, so the caching allocator
does not hand its memory out again while the other stream may still use it. The batch keeps its
host ids (``host_ids``) for the store write: they never travel back.

The streams are the process's, one per device and role (``stream_for``), not each run's: the caching
allocator keeps a freed block for the stream it was made on, and cuBLAS keeps a workspace for each
stream it ran on, so streams made anew for every run held 64 MiB more allocated memory per run of a
process (an H200: the peak run by run in benchmarks/results/gpu_check_54fe87b.json; guarded by the
stream test in tests/pipeline/test_transfer.py).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor

from cadence.core.batch import Batch
from cadence.core.rows import RowBlock


def accelerated(device: torch.device) -> bool:
    return device.type == "cuda"


_STREAMS: dict[tuple[torch.device, str], "torch.cuda.Stream"] = {}
_STREAMS_LOCK = threading.Lock()


def stream_for(device: torch.device, role: str) -> "torch.cuda.Stream":
    """The process's CUDA stream on ``device`` for ``role`` (``upload``, ``compute``, ``download``,
    ``side-0``, ...): made on first use, the same one for every later run (module docstring)."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    key = (device, role)
    with _STREAMS_LOCK:
        if key not in _STREAMS:
            _STREAMS[key] = torch.cuda.Stream(device)
        return _STREAMS[key]


class DeviceLink:
    """The streams between the host and one device, shared by the upload, compute and download
    stages of a run; on the CPU it holds none and every method passes the batch through."""

    def __init__(self, device: torch.device):
        self.device = device
        self.accelerated = accelerated(device)
        if self.accelerated:
            self.upload_stream = stream_for(device, "upload")
            self.compute_stream = stream_for(device, "compute")
            self.download_stream = stream_for(device, "download")

    # ---- loader threads ---------------------------------------------------------------------------
    def upload(self, batch: Batch) -> Batch:
        if not self.accelerated or batch.rows is None:
            return batch
        with torch.cuda.stream(self.upload_stream):
            batch.host_ids = batch.ids
            batch.rows = _block_to(batch.rows, self.device)
            batch.ids = batch.ids.to(self.device, non_blocking=True)
            batch.inputs = {name: value.to(self.device, non_blocking=True) for name, value in batch.inputs.items()}
            batch.uploaded = torch.cuda.Event()
            batch.uploaded.record(self.upload_stream)
        return batch

    # ---- the compute thread -----------------------------------------------------------------------
    def side_stream(self, index: int):
        """The compute stream of the ``index``-th thread that computes beside the compute thread
        (pdASGD's backward threads), its own among them; None on the CPU."""
        return stream_for(self.device, f"side-{index}") if self.accelerated else None

    @contextmanager
    def computing(self, batch: Batch, stream=None) -> Iterator[None]:
        """Everything the compute thread does to a batch on the device (validation, compute, the
        stamp into the validation cache) runs inside this, on the compute stream (or ``stream``: a
        thread's own, ``side_stream``), after its upload."""
        if not self.accelerated:
            yield
            return
        stream = stream if stream is not None else self.compute_stream
        with torch.cuda.stream(stream):
            # after what the main thread queued on the default stream (the dense module moved to the
            # device, the validation cache allocated): PyTorch's side streams do not wait for it
            stream.wait_stream(torch.cuda.default_stream(self.device))
            if batch.uploaded is not None:
                stream.wait_event(batch.uploaded)
            for tensor in _device_tensors(batch):
                tensor.record_stream(stream)
            yield
            batch.computed = torch.cuda.Event()
            batch.computed.record(stream)

    # ---- writer threads ---------------------------------------------------------------------------
    def download(self, batch: Batch) -> Batch:
        if not self.accelerated or batch.rows is None or batch.rows.values.device.type == "cpu":
            return batch
        with torch.cuda.stream(self.download_stream):
            if batch.computed is not None:
                self.download_stream.wait_event(batch.computed)
            for tensor in _device_tensors(batch):
                tensor.record_stream(self.download_stream)
            rows = _block_to_host(batch.rows)
            loss = None if batch.loss is None else _to_host(batch.loss)
            landed = torch.cuda.Event()
            landed.record(self.download_stream)
        landed.synchronize()  # the store write reads these at once
        batch.rows, batch.loss, batch.ids = rows, loss, batch.host_ids
        batch.inputs = {}  # the writer needs none of them; the device copies are freed with the batch
        return batch


def _device_tensors(batch: Batch) -> list[Tensor]:
    tensors = [batch.ids, *batch.inputs.values()]
    if batch.rows is not None:
        tensors += [batch.rows.values, batch.rows.state]
        if batch.rows.versions is not None:
            tensors.append(batch.rows.versions)
    if batch.loss is not None:
        tensors.append(batch.loss)
    return [tensor for tensor in tensors if tensor.device.type != "cpu"]


def _block_to(block: RowBlock, device: torch.device) -> RowBlock:
    versions = None if block.versions is None else block.versions.to(device, non_blocking=True)
    return RowBlock(block.values.to(device, non_blocking=True), block.state.to(device, non_blocking=True), versions)


def _to_host(tensor: Tensor) -> Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor.detach(), non_blocking=True)


def _block_to_host(block: RowBlock) -> RowBlock:
    versions = None if block.versions is None else _to_host(block.versions)
    return RowBlock(_to_host(block.values), _to_host(block.state), versions)
