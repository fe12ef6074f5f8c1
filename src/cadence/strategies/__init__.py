"""Training strategies: how the pipeline stages are scheduled. One module per strategy."""

from cadence.strategies import pipelined, sync  # noqa: F401  (register "sync", "async", "oac")
from cadence.strategies.base import STRATEGIES, Strategy

__all__ = ["STRATEGIES", "Strategy"]
