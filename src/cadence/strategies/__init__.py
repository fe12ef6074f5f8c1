"""Training strategies: *how* batches flow and when updates are applied. One module per strategy.

Every strategy runs every task. Which runtime a run uses follows from the strategy, ``ps.workers``
and ``ps.engine`` (``runtime_of``):

| strategy                      | ps.workers = 1, engine threads        | more workers, or engine ray        |
|-------------------------------|---------------------------------------|------------------------------------|
| ``sync``, ``async``           | the pipeline (one process)            | the parameter server               |
| ``oac``                       | the pipeline                          | an error: OAC is a one-process pipeline |
| ``pdasgd``, ``pdasgd-bu``     | the pipeline (forward and backward threads) | an error: threads of one process |
| ``bsp``, ``gba``, ``hop_bs``, ``hop_bw`` | the parameter server (one worker) | the parameter server          |
| ``shadow-*``, ``fr-*``, ``hogwild`` | the parameter server (one trainer)  | the parameter server (trainers: threads or Ray actors) |
| ``adapm``                     | AdaPM's nodes (one node)              | AdaPM's nodes (``ps.workers`` nodes: threads or Ray actors) |

With one worker ``sync`` means the same math on both runtimes (tested bit for bit).
"""

from __future__ import annotations

import difflib

from cadence.config import Config
from cadence.errors import ConfigError
from cadence.strategies import pdasgd, pipelined, sync  # noqa: F401  (register sync, async, oac, pdasgd, pdasgd-bu)
from cadence.strategies.base import STRATEGIES, Strategy
from cadence.strategies.parameter_server import PS_MODES

PIPELINE, PARAMETER_SERVER, ADAPM = "pipeline", "parameter_server", "adapm"
# strategies that are a runtime of their own (AdaPM's nodes: runtime/adapm/)
RUNTIME_STRATEGIES = (ADAPM,)


def strategy_names() -> list[str]:
    return sorted(set(STRATEGIES.names()) | set(PS_MODES.names()) | set(RUNTIME_STRATEGIES))


def check_strategy(name: str) -> None:
    if name not in STRATEGIES and name not in PS_MODES and name not in RUNTIME_STRATEGIES:
        close = difflib.get_close_matches(name, strategy_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"strategy: unknown strategy {name!r}{hint}; choose one of: {', '.join(strategy_names())}")


def runtime_of(config: Config) -> str:
    """``pipeline`` or ``parameter_server`` for this config's strategy, workers and engine."""
    name, ps = config.strategy, config.ps
    check_strategy(name)
    if name == ADAPM:  # nodes as threads of this process, or as Ray actors
        return ADAPM
    one_process = ps.workers == 1 and ps.engine == "threads"
    if name not in PS_MODES:
        if not one_process:
            raise ConfigError(f"strategy {name} runs in one process (the pipeline): it needs ps.workers=1 and "
                              f"ps.engine=threads (got ps.workers={ps.workers}, ps.engine={ps.engine}); use "
                              "--workers 1, or a parameter-server strategy (sync, async, bsp, gba, hop_bs, hop_bw)")
        return PIPELINE
    if name in STRATEGIES and one_process:
        return PIPELINE
    return PARAMETER_SERVER


__all__ = ["ADAPM", "PARAMETER_SERVER", "RUNTIME_STRATEGIES", "PIPELINE", "PS_MODES", "STRATEGIES", "Strategy", "check_strategy",
           "runtime_of", "strategy_names"]
