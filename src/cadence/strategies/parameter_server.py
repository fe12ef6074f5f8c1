"""The parameter-server modes (GBA paper and its baselines, SPEC section 3), selected by
``strategy`` when ``task: ctr``. A mode is two small choices over the shared runtime: the
aggregation rule on the servers and the gate on the workers; neither copies the training loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from cadence.config import ParameterServerConfig
from cadence.registry import Registry
from cadence.runtime.aggregation import Aggregation, ApplyEach, Buffered, PerStep
from cadence.runtime.gates import BoundedStaleness, NoGate, StepBarrier
from cadence.runtime.server import ServerShard


@dataclass(frozen=True)
class ParameterServerMode:
    name: str
    aggregation: Callable[[ParameterServerConfig], Aggregation]
    gate: Callable[[ParameterServerConfig, list[ServerShard]], NoGate]
    tokens_per_step: Callable[[ParameterServerConfig], int]  # batches per token: one global step's worth
    description: str
    per_worker_batches: bool = False  # each worker computes exactly one local batch per step
    fresh_tokens: bool = False  # a batch's token is the current step when it is taken (backup workers)


PS_MODES: Registry[ParameterServerMode] = Registry("parameter-server strategy")


def _register(name: str, aggregation, gate, tokens_per_step, description: str, per_worker: bool = False,
              fresh_tokens: bool = False) -> None:
    PS_MODES.register(name)(ParameterServerMode(name, aggregation, gate, tokens_per_step, description, per_worker,
                                                fresh_tokens))


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
