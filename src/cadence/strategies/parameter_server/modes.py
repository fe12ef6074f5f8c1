"""GBA and its baselines (SPEC section 3) as parameter-server modes, registered in ``PS_MODES``:
``sync``, ``async``, ``bsp``, ``gba``, ``hop_bs``, ``hop_bw``. Each is a few choices over the shared
roles (``cadence.ps``): the aggregation rule on the shards, the gate on the workers, batches per
global step; every hook is the default (``ParameterServerMode``).
"""

from __future__ import annotations

import math

from cadence.core.strategy import Contract
from cadence.ps.aggregation import Buffered, PerStep
from cadence.ps.gates import BoundedStaleness, StepBarrier
from cadence.ps.modes import PS_MODES, ParameterServerMode, apply_each, no_gate, one_batch


MODES: list[str] = []  # this family's, in the order they are listed


def _register(name: str, aggregation, gate, tokens_per_step, description: str, per_worker: bool = False,
              fresh_tokens: bool = False, reads: tuple[str, ...] = (), contract: Contract = Contract(),
              keeps_sync_model: bool = False) -> None:
    PS_MODES.register(name)(ParameterServerMode(name, aggregation, gate, tokens_per_step, description, per_worker,
                                                fresh_tokens, reads, contract, keeps_sync_model))
    MODES.append(name)


_workers = lambda config: config.workers  # noqa: E731  global batch = workers x local batch
_buffer = lambda config: config.buffer or config.workers  # noqa: E731  global batch = M x local batch

_register("sync", lambda c: PerStep(), lambda c, shards: StepBarrier(shards), _workers,
          "a barrier per global step: each worker computes one batch per step, on the same parameters",
          per_worker=True, keeps_sync_model=True)
_register("async", apply_each, no_gate, one_batch, "apply every gradient at once")
_register("bsp", lambda c: Buffered(c.buffer or c.workers, math.inf, c.decay, c.normalizer), no_gate, _buffer,
          "aggregate M gradients whatever their staleness", reads=("ps.buffer", "ps.decay", "ps.normalizer"),
          contract=Contract(("ps.workers=2",), ("ps.workers=1", "ps.buffer=1")))
_register("gba", lambda c: Buffered(c.buffer or c.workers, c.tolerance, c.decay, c.normalizer), no_gate, _buffer,
          "aggregate M gradients, dropping those staler than the tolerance iota",
          reads=("ps.buffer", "ps.tolerance", "ps.decay", "ps.normalizer"),
          contract=Contract(("ps.workers=2", "ps.tolerance=1"), ("ps.workers=1", "ps.buffer=1")), keeps_sync_model=True)
_register("hop_bs", apply_each, lambda c, shards: BoundedStaleness(c.workers, c.staleness), one_batch,
          "apply each gradient; no worker runs more than `staleness` batches ahead of the slowest",
          reads=("ps.staleness",), contract=Contract(("ps.workers=2",), ("ps.workers=1",)))
_register("hop_bw", lambda c: PerStep(quorum=max(1, c.workers - c.backup_workers)), no_gate, _workers,
          "backup workers: per step, apply the first workers - backup_workers gradients and do not wait for "
          "the rest (dropped as late); a late worker's next batch belongs to the current step",
          fresh_tokens=True, reads=("ps.backup_workers",), contract=Contract(("ps.workers=3",), ("ps.workers=1",)))
