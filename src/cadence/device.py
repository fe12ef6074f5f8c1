"""The compute device a run asks for (``device: auto | cpu | cuda[:N]``), and its kernels
(``deterministic``)."""

from __future__ import annotations

import copy
import os

import torch

from cadence.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: {name!r} is not a device (auto, cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {name!r} was asked for, but no CUDA device is available")
    return device


def module_on(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module`` itself where every parameter and buffer is on ``device``, else a copy moved there:
    a parameter-server run's dense module lives in host memory (the servers', assembled for the
    trainer), and evaluation computes on the run's device beside the rows it moved there."""
    tensors = [*module.parameters(), *module.buffers()]
    if all(tensor.device == device for tensor in tensors):
        return module
    return copy.deepcopy(module).to(device)


def use_deterministic_kernels(device: torch.device, enabled: bool) -> None:
    """On an accelerator, ``deterministic: true`` (the default) selects deterministic kernels, so a
    run and its replay (OAC's guarantee, every degenerate-setting equality) are bit-identical there
    too: CUDA's backward of an index (``index_add_``/``index_put_`` with atomics) otherwise sums a
    row's gradients in a different order each run, and cuBLAS needs a fixed workspace. They cost
    speed where many gradients meet one row (a hub entity); ``deterministic: false`` trades the
    bit-identity for it. Ops with no deterministic kernel warn instead of failing. On the CPU this
    changes nothing: the kernels cadence uses there are deterministic already (the replay tests
    check it)."""
    if device.type == "cpu":
        return
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled, warn_only=True)
