"""The parameter-server modes, selected by ``strategy``: GBA and its baselines (SPEC section 3)
and ShadowSync and its baselines (SPEC section 5). A mode is a few small choices over the shared
runtime: the aggregation rule on the servers, the gate on the workers, and for ShadowSync where the
dense parameters live (a replica per trainer) and how the replicas are kept in step (the dense sync
rule, on a shadow thread or in the foreground); none copies the training loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from cadence.config import ParameterServerConfig
from cadence.registry import Registry
from cadence.strategies.parameter_server.aggregation import Aggregation, ApplyEach, Buffered, PerStep
from cadence.strategies.parameter_server.gates import BoundedStaleness, NoGate, StepBarrier
from cadence.strategies.parameter_server.server import ServerShard


@dataclass(frozen=True)
class ParameterServerMode:
    name: str
    aggregation: Callable[[ParameterServerConfig], Aggregation]
    gate: Callable[[ParameterServerConfig, list[ServerShard]], NoGate]
    tokens_per_step: Callable[[ParameterServerConfig], int]  # batches per token: one global step's worth
    description: str
    per_worker_batches: bool = False  # each worker computes exactly one local batch per step
    fresh_tokens: bool = False  # a batch's token is the current step when it is taken (backup workers)
    # ShadowSync (cadence.strategies.parameter_server.shadow): each of ps.workers trainers holds a dense replica trained
    # Hogwild by shadow.threads threads; rows are applied on arrival
    replicas: bool = False
    dense_sync: str | None = None  # the replicas' sync rule (dense_sync.RULES); None: never synced
    foreground: bool = False  # fr-*: the sync runs every shadow.every batches with the workers paused

    def dense_on_workers(self, ps: ParameterServerConfig) -> bool:
        """Whether the dense parameters live on the workers: ``ps.dense: workers`` (PERSIA's split), or a
        mode whose trainers hold replicas (ShadowSync and its baselines)."""
        return ps.dense == "workers" or self.replicas


PS_MODES: Registry[ParameterServerMode] = Registry("parameter-server strategy")


def _register(name: str, aggregation, gate, tokens_per_step, description: str, per_worker: bool = False,
              fresh_tokens: bool = False, **shadow) -> None:
    PS_MODES.register(name)(ParameterServerMode(name, aggregation, gate, tokens_per_step, description, per_worker,
                                                fresh_tokens, **shadow))


_no_gate = lambda config, shards: NoGate()  # noqa: E731
_one_batch = lambda config: 1  # noqa: E731  every gradient is a step of its own
_workers = lambda config: config.workers  # noqa: E731  global batch = workers x local batch
_buffer = lambda config: config.buffer or config.workers  # noqa: E731  global batch = M x local batch

_register("sync", lambda c: PerStep(), lambda c, shards: StepBarrier(shards), _workers,
          "a barrier per global step: each worker computes one batch per step, on the same parameters",
          per_worker=True)
_register("async", lambda c: ApplyEach(), _no_gate, _one_batch, "apply every gradient at once")
_register("bsp", lambda c: Buffered(c.buffer or c.workers, math.inf, c.decay, c.normalizer), _no_gate, _buffer,
          "aggregate M gradients whatever their staleness")
_register("gba", lambda c: Buffered(c.buffer or c.workers, c.tolerance, c.decay, c.normalizer), _no_gate, _buffer,
          "aggregate M gradients, dropping those staler than the tolerance iota")
_register("hop_bs", lambda c: ApplyEach(), lambda c, shards: BoundedStaleness(c.workers, c.staleness), _one_batch,
          "apply each gradient; no worker runs more than `staleness` batches ahead of the slowest")
_register("hop_bw", lambda c: PerStep(quorum=max(1, c.workers - c.backup_workers)), _no_gate, _workers,
          "backup workers: per step, apply the first workers - backup_workers gradients and do not wait for "
          "the rest (dropped as late); a late worker's next batch belongs to the current step",
          fresh_tokens=True)

# ---- ShadowSync (SPEC section 5) ---------------------------------------------------------------
_RULE_TEXT = {
    "easgd": "EASGD with a central copy on the sync parameter server",
    "ma": "model averaging over an all-reduce of the trainers",
    "bmuf": "BMUF: an all-reduce, then a block update with block momentum",
}
for _rule, _text in _RULE_TEXT.items():
    _register(f"shadow-{_rule}", lambda c: ApplyEach(), _no_gate, _one_batch,
              f"ShadowSync: {_text}, on a shadow thread in the background; embeddings Hogwild",
              replicas=True, dense_sync=_rule)
    _register(f"fr-{_rule}", lambda c: ApplyEach(), _no_gate, _one_batch,
              f"{_text} in the foreground every shadow.every batches of a trainer; embeddings Hogwild",
              replicas=True, dense_sync=_rule, foreground=True)
_register("hogwild", lambda c: ApplyEach(), _no_gate, _one_batch,
          "trainers' dense replicas never synced (averaged at the end of each epoch); embeddings Hogwild",
          replicas=True)
