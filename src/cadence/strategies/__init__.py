"""Training strategies: how the pipeline stages are scheduled. One module per strategy."""

from cadence.strategies.base import STRATEGIES, Strategy
from cadence.strategies import sync  # noqa: F401  (registers "sync")

__all__ = ["STRATEGIES", "Strategy"]
