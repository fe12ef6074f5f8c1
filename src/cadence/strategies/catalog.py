"""The one strategy registry: every strategy family's entries (``<family>.strategy``) by name.

One package per family, each owning the runtime it builds (``cadence.core.strategy``):

| family                | strategies                                              | runtime                    |
|-----------------------|---------------------------------------------------------|----------------------------|
| ``pipelined``         | ``sync``, ``async``, ``oac``, ``pdasgd``, ``pdasgd-bu`` | the one-process pipeline   |
| ``parameter_server``  | ``sync``, ``async``, ``bsp``, ``gba``, ``hop_bs``, ``hop_bw`` | the parameter server (threads or Ray actors) |
| ``shadowsync``        | ``shadow-*``, ``fr-*``, ``hogwild``                     | the parameter server's roles, trainers with dense replicas |
| ``adapm``             | ``adapm``                                               | AdaPM's nodes (threads or Ray actors) |

``STRATEGIES`` holds one entry per name. A name two families define (``sync``, ``async``) is one
entry that takes the first family whose runtime fits the config: the pipeline with ``ps.workers: 1``
on threads, the parameter server otherwise (the same math with one worker: tested bit for bit).
A strategy defined elsewhere registers the same way: ``STRATEGIES.register(name)(entry)``.
"""

from __future__ import annotations

from cadence.config import Config
from cadence.core.runtime import Runtime
from cadence.core.strategy import BuildContext, RuntimeKind, Strategy
from cadence.errors import ConfigError
from cadence.registry import Registry
from cadence.strategies.adapm import strategy as adapm
from cadence.strategies.parameter_server import strategy as parameter_server
from cadence.strategies.pipelined import strategy as pipelined
from cadence.strategies.shadowsync import strategy as shadowsync

STRATEGIES: Registry[Strategy] = Registry("strategy", "strategy")


class FirstThatFits(Strategy):
    """One name over several families' entries (in order of preference): the first whose runtime
    fits the config runs it."""

    def __init__(self, entries: list[Strategy]):
        self.entries = entries
        self.name = entries[0].name
        # (the contract tests' settings of the preferred entry; sync's model kept where every entry keeps it)
        self.contract = entries[0].contract
        self.keeps_sync_model = all(entry.keeps_sync_model for entry in entries)
        self.description = "; ".join(f"{kind.name}: {entry.description}" for entry in entries
                                     for kind in entry.runtimes)

    @property
    def runtimes(self) -> tuple[RuntimeKind, ...]:
        return tuple(kind for entry in self.entries for kind in entry.runtimes)

    @property
    def reads(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(key for entry in self.entries for key in entry.reads)

    def reads_for(self, config: Config) -> tuple[str, ...]:
        return self._entry(config).reads_for(config)

    def unread(self, config: Config) -> dict[str, str]:
        return self._entry(config).unread(config)

    def _entry(self, config: Config) -> Strategy:
        for entry in self.entries[:-1]:
            try:
                entry.runtime(config)
            except ConfigError:
                continue
            return entry
        return self.entries[-1]

    def runtime(self, config: Config) -> RuntimeKind:
        return self._entry(config).runtime(config)

    def check(self, config: Config) -> None:
        self._entry(config).check(config)

    def in_place(self, config: Config) -> bool:
        return self._entry(config).in_place(config)

    def node_parts(self, config: Config) -> tuple[int, int]:
        return self._entry(config).node_parts(config)

    def build(self, config: Config, task, context: BuildContext) -> Runtime:
        return self._entry(config).build(config, task, context)


def _register_families() -> None:
    by_name: dict[str, list[Strategy]] = {}
    for family in (pipelined, parameter_server, shadowsync, adapm):  # order of preference for a shared name
        for entry in family.STRATEGIES:
            by_name.setdefault(entry.name, []).append(entry)
    for name, entries in sorted(by_name.items()):
        STRATEGIES.register(name)(entries[0] if len(entries) == 1 else FirstThatFits(entries))


_register_families()


def strategy_names() -> list[str]:
    return STRATEGIES.names()


def runtime_kinds() -> list[RuntimeKind]:
    """Every runtime a registered strategy can build (each once)."""
    kinds: dict[str, RuntimeKind] = {}
    for name in STRATEGIES.names():
        for kind in STRATEGIES.get(name).runtimes:
            kinds.setdefault(kind.name, kind)
    return list(kinds.values())


__all__ = ["STRATEGIES", "FirstThatFits", "runtime_kinds", "strategy_names"]
