"""cadence: synchronous-quality training of embedding-heavy models at asynchronous throughput.

The public API is imported lazily so that ``import cadence`` stays fast.
"""

from __future__ import annotations

from typing import Any

import cadence.strategies  # noqa: F401  (the strategy families' config sections; no training code)

__version__ = "0.1.0"
__all__ = ["Config", "TrainResult", "compare", "evaluate", "export", "load", "load_config", "resume", "train"]

_LOCATIONS = {
    "Config": "cadence.config", "load_config": "cadence.config",
    "TrainResult": "cadence.api", "train": "cadence.api", "resume": "cadence.api",
    "evaluate": "cadence.api", "export": "cadence.api", "compare": "cadence.api", "load": "cadence.api",
}


def __getattr__(name: str) -> Any:
    if name in _LOCATIONS:
        import importlib

        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    raise AttributeError(f"module 'cadence' has no attribute {name!r}")
