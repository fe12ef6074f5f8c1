"""How a parameter-server shard turns pushed gradients into optimizer steps (GBA, SPEC section 3).

Every mode of the parameter-server family is one ``Aggregation`` over the same shard:

| mode      | rule                                                                              |
|-----------|-----------------------------------------------------------------------------------|
| ``async`` | apply every gradient at once                                                      |
| ``hop_bs``| the same; the bounded staleness is enforced on the workers' side (a clock gate)   |
| ``bsp``   | buffer M gradients, apply them together whatever their staleness (GBA, iota = inf)|
| ``gba``   | buffer M gradients, drop those with step - token > iota (``decay``), apply once    |
| ``hop_bw``| per step, apply the first N - b gradients of that step; later ones are dropped     |
|           | (tokens are handed out fresh: a late worker's next batch belongs to the current step) |
| ``sync``  | per step, apply exactly the gradients of that step's batches (a barrier)          |
| ``hogwild``, ``shadow-*``, ``fr-*`` | apply every gradient at once, without the shard's lock (``Hogwild``) |

Buffered gradients are aggregated in batch order, not arrival order, so a step's result does not
depend on which worker was faster. ``decay`` and ``normalizer`` are pluggable (SPEC: eq. 1 of the
paper is lost; reconstructed as a hard cut-off, the default). A decay's weight multiplies the
gradient (``exponential``: 2^-staleness within the tolerance, 0 beyond), so a decay is more than a
keep-or-drop rule. Staleness here is the paper's *token staleness*: the shard's global step when
the gradient is aggregated minus the token its batch was handed out with.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Protocol

from torch import Tensor

from cadence.registry import Registry


@dataclass
class Gradient:
    """One worker's gradient of one batch, as pushed to one shard."""

    worker: int
    batch: int  # position j in the data list
    token: int  # the global step the batch was handed out at: floor(j / M)
    examples: int
    keys: Tensor  # [U] the feature keys this shard owns
    rows: Tensor  # [U, width] gradients of those rows (mean over the batch's examples)
    dense: dict[str, Tensor] | None = None  # dense gradients, on the shard that owns them
    pulled_step: int | None = None  # the server's global step when the worker pulled (for staleness)
    weight: float = 1.0  # the decay's weight, set when the gradient is aggregated


class StepTarget(Protocol):
    """What an aggregation drives: the shard's one optimizer step, its counters and global step."""

    global_step: int

    def apply(self, gradients: list[Gradient], normalizer: float) -> None: ...

    def record_applied(self, gradient: Gradient) -> None:
        """Counts the gradient's token staleness (and steps applied since its pull)."""

    def record_dropped(self, gradients: list[Gradient]) -> None:
        """Counts gradients the rule excluded (by worker, and their token staleness now)."""

    def apply_unlocked(self, gradient: Gradient) -> None:
        """One gradient's rows stepped without the shard's lock (Hogwild), then counted as a step."""


# decay f(staleness, tolerance) -> weight; 0 drops the gradient
DECAYS: Registry[Callable[[int, float], float]] = Registry("gba decay", "ps.decay")
DECAYS.register("cutoff")(lambda staleness, tolerance: 0.0 if staleness > tolerance else 1.0)
DECAYS.register("exponential")(lambda staleness, tolerance: 0.0 if staleness > tolerance else 0.5 ** max(staleness, 0))
# normalizer(buffer capacity, gradients kept) -> divisor of the summed gradients
NORMALIZERS: Registry[Callable[[int, int], float]] = Registry("gba normalizer")
NORMALIZERS.register("buffer")(lambda capacity, kept: float(capacity))
NORMALIZERS.register("kept")(lambda capacity, kept: float(max(kept, 1)))


class Aggregation(ABC):
    # pushes and pulls reach the rows without the shard's lock (Hogwild: per-row races allowed,
    # ``store.embedding_table``); nothing waits for this shard's step, and no push is buffered
    lock_free = False

    @abstractmethod
    def push(self, shard: StepTarget, gradient: Gradient) -> None: ...

    def drop(self, shard: StepTarget, token: int, batch: int | None = None) -> None:
        """A batch handed out with ``token`` will never be pushed (its worker died); ``batch``, its
        position, when known: a drop of a batch that did arrive is ignored."""

    def close_token(self, shard: StepTarget, token: int, handed_out: int) -> None:
        """No more batches with ``token`` will be handed out; ``handed_out`` were."""

    def flush(self, shard: StepTarget) -> None:
        """End of the data: apply what is still buffered."""


class ApplyEach(Aggregation):
    """``async`` and ``hop_bs``: one optimizer step per gradient."""

    def push(self, shard, gradient):
        shard.record_applied(gradient)
        shard.apply([gradient], 1.0)


class Hogwild(Aggregation):
    """ShadowSync's embedding tables (``hogwild``, ``shadow-*``, ``fr-*``): one step per gradient,
    as ``ApplyEach``, with no lock on the rows (the seed: "there is no lock involved in the
    accesses of the tables")."""

    lock_free = True

    def push(self, shard, gradient):
        shard.apply_unlocked(gradient)


class Buffered(Aggregation):
    """``gba`` (and ``bsp`` with tolerance = inf): M gradients per step, stale ones decayed."""

    def __init__(self, capacity: int, tolerance: float = math.inf, decay: str = "cutoff",
                 normalizer: str = "buffer"):
        self.capacity = capacity
        self.tolerance = tolerance
        self.decay = DECAYS.get(decay)
        self.normalizer = NORMALIZERS.get(normalizer)
        self.buffer: list[Gradient] = []

    def push(self, shard, gradient):
        self.buffer.append(gradient)
        if len(self.buffer) >= self.capacity:
            self._aggregate(shard, self.capacity)

    def flush(self, shard):
        if self.buffer:
            self._aggregate(shard, len(self.buffer))

    def _aggregate(self, shard: StepTarget, capacity: int) -> None:
        kept, dropped = [], []
        for gradient in sorted(self.buffer, key=lambda g: g.batch):
            staleness = shard.global_step - gradient.token  # the paper's token staleness
            weight = self.decay(staleness, self.tolerance)
            if weight > 0.0:
                gradient.weight = weight
                kept.append(gradient)
                shard.record_applied(gradient)
            else:
                dropped.append(gradient)
        shard.record_dropped(dropped)
        self.buffer = []
        shard.apply(kept, self.normalizer(capacity, len(kept)))


class PerStep(Aggregation):
    """Gradients grouped by token. ``sync`` (quorum None) applies all the batches of a step once
    every batch handed out with that token has arrived or been dropped; ``hop_bw`` (quorum N - b)
    applies the first ``quorum`` to arrive and drops the rest, as late."""

    def __init__(self, quorum: int | None = None):
        self.quorum = quorum
        self.pending: dict[int, list[Gradient]] = {}  # token -> gradients, in arrival order
        self.handed_out: dict[int, int] = {}  # token -> batches handed out, once the token is closed
        self.dropped: dict[int, int] = {}  # token -> batches whose worker died

    def push(self, shard, gradient):
        if gradient.token < shard.global_step:  # its step was already applied
            shard.record_dropped([gradient])
            return
        self.pending.setdefault(gradient.token, []).append(gradient)
        self._advance(shard)

    def drop(self, shard, token, batch=None):
        if batch is not None and any(g.batch == batch for g in self.pending.get(token, ())):
            return  # it was pushed before its worker died
        if token >= shard.global_step:
            self.dropped[token] = self.dropped.get(token, 0) + 1
            self._advance(shard)

    def close_token(self, shard, token, handed_out):
        if token >= shard.global_step:  # (a step applied by its quorum needs no closing)
            self.handed_out[token] = handed_out
            self._advance(shard)

    def flush(self, shard):
        for token in sorted(self.pending):
            self._apply(shard, self.pending.pop(token))

    def _ready(self, step: int) -> int | None:
        """How many of this step's gradients to apply now; None to keep waiting."""
        arrived = len(self.pending.get(step, ()))
        if self.quorum is not None and arrived >= self.quorum:
            return self.quorum
        if step in self.handed_out:
            expected = self.handed_out[step] - self.dropped.get(step, 0)
            if arrived >= expected:
                return arrived if self.quorum is None else min(arrived, self.quorum)
        return None

    def _advance(self, shard: StepTarget) -> None:
        while (count := self._ready(shard.global_step)) is not None:
            arrived = self.pending.pop(shard.global_step, [])
            self.handed_out.pop(shard.global_step, None)
            self.dropped.pop(shard.global_step, None)
            self._apply(shard, arrived[:count])
            shard.record_dropped(arrived[count:])

    @staticmethod
    def _apply(shard: StepTarget, gradients: list[Gradient]) -> None:
        for gradient in gradients:
            shard.record_applied(gradient)
        shard.apply(sorted(gradients, key=lambda g: g.batch), float(max(len(gradients), 1)))
