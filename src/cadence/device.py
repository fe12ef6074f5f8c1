"""The compute device a run asks for (``device: auto | cpu | cuda[:N]``)."""

from __future__ import annotations

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
