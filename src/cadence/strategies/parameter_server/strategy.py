"""GBA's family's entries in the strategy registry (``cadence.strategies.catalog``): a
``ServerStrategy`` per mode of ``modes``."""

from __future__ import annotations

from cadence.ps.modes import PS_MODES
from cadence.ps.strategy import ServerStrategy
from cadence.strategies.parameter_server.modes import MODES

STRATEGIES = tuple(ServerStrategy(PS_MODES.get(name)) for name in MODES)
