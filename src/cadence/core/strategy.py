"""The strategy contract: what a name in ``strategy:`` resolves to, once, at the edge.

A ``Strategy`` is one entry of the one strategy registry (``cadence.strategies.STRATEGIES``). It
declares the runtimes it can run on (``RuntimeKind``: the runtime's name in summary.json and the
config keys only that runtime reads), picks the one a config needs (``runtime``: ``sync`` and
``async`` pick the pipeline with one worker on threads and the parameter server otherwise), checks
what only it can check before a run directory exists (``check``), and builds the runtime
(``build``). The API calls these and nothing else, so adding a strategy is one module that defines
an entry and registers it; nothing below the strategies learns its name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from cadence.config import Config
from cadence.core.runtime import Runtime


@dataclass(frozen=True)
class RuntimeKind:
    """A runtime a strategy can build, as the config sees it.

    ``keys``: config keys (or whole sections) only this runtime reads; a run on another runtime
    that sets one is an error naming it. ``owns_message``: how an error names this runtime as the
    owner of a key; ``runs_on``: how an error names this runtime as the one a run uses;
    ``foreign_message``: when set, the whole message for a key this runtime does not read
    (``{key}`` is filled in). ``engine``: whether ``ps.engine`` places its parts (threads or Ray)."""

    name: str
    keys: tuple[str, ...]
    owns_message: str
    runs_on: str
    foreign_message: str | None = None
    engine: bool = False

    def owns(self, key: str) -> bool:
        return any(key == own or key.startswith(own + ".") for own in self.keys)

    def refuse(self, key: str, owner: RuntimeKind, where: str) -> str:
        """The error for ``key`` (read only by ``owner``) set on a run of this runtime."""
        if self.foreign_message is not None:
            return self.foreign_message.format(key=key)
        return f"{key} applies to {owner.owns_message.format(where=where)}; this run {where} runs on {self.runs_on}"


@dataclass(frozen=True)
class Contract:
    """How a strategy is held to its guarantee, in ``key=value`` settings the contract tests train
    every task with (``tests/test_task_matrix.py``): ``exercised``, a short run that shows how it
    differs from sync (several workers, batches in flight); ``twin``, the setting under which it
    computes exactly what sync computes (its degenerate setting: one worker, a staleness bound of 1),
    its model then equal to sync's bit for bit; None: it declares none (a strategy without one fails
    the meta-test)."""

    exercised: tuple[str, ...] = ()
    twin: tuple[str, ...] | None = None


@dataclass(frozen=True)
class BuildContext:
    """What the API resolved for a run before its runtime is built."""

    device: torch.device
    store_path: str  # where a memory-mapped store keeps its files (in the run directory by default)


class Strategy(ABC):
    """One registered strategy (module docstring). ``name`` is its registry key."""

    name: str = ""
    description: str = ""
    # the config keys (or sections) of the strategies' sections this strategy reads: a key another
    # strategy declares and this one does not is an error naming who reads it (api.prepare_config)
    reads: tuple[str, ...] = ()
    contract: Contract = Contract()
    # whether its guarantee is sync's model (sync, OAC's validated order, GBA's global batch): a
    # candidate of ``strategy: auto`` where its runtime is the one sync takes for the config
    keeps_sync_model: bool = False

    def reads_for(self, config: Config) -> tuple[str, ...]:
        """The keys this config's run of the strategy reads (a name over several families: the entry's)."""
        return self.reads

    def unread(self, config: Config) -> dict[str, str]:
        """Keys of this config's runtime that this strategy leaves unread, each with why (ShadowSync's
        ``ps.dense``: its trainers hold the dense parameters whatever it says). Default: none."""
        return {}

    @property
    @abstractmethod
    def runtimes(self) -> tuple[RuntimeKind, ...]:
        """Every runtime this strategy can run on (for the foreign-key check)."""

    @abstractmethod
    def runtime(self, config: Config) -> RuntimeKind:
        """The runtime this config needs; a ``ConfigError`` when none fits (OAC with 4 workers)."""

    def check(self, config: Config) -> None:
        """Reject what this strategy's runtime would refuse later (an unknown engine, a bad fault
        spec), before a run directory exists. Default: nothing more to check."""

    def node_parts(self, config: Config) -> tuple[int, int]:
        """(nodes, worker threads a node) where each node of this config's run trains its own part
        of the data with the rows it holds, so a task may partition its data to match (MF's App. C
        blocks, ``mf.row_blocks: auto``); (1, 1), the default: no such nodes."""
        return 1, 1

    def in_place(self, config: Config) -> bool:
        """Whether this config's runtime runs a task that updates its rows in place
        (``Task.in_place_setting``): the rows in one process, batches computed one at a time in
        order. Default: no."""
        return False

    @abstractmethod
    def build(self, config: Config, task, context: BuildContext) -> Runtime:
        """The runtime of one run, ready to train (its ``strategy`` attribute set to ``name``)."""
