"""AdaPM's adaptive action timing (seed 001, Algorithm 1; SPEC section 2), and the pace of a node's
communication rounds (``RoundPace``).

Each worker's intents are acted on (signalled to the owner, which relocates or replicates) one
communication round ahead of when they are needed. The number of clocks a worker advances in a
round is assumed Poisson; its rate is estimated by exponential smoothing of the clocks per round
(``alpha``), not updated in rounds where the worker did not advance (an evaluation pause), and the
round acts on every intent that starts before the clock plus the ``p`` quantile of
Poisson(2 max(rate, last delta)) (two rounds: this one, and the one in which the action lands).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist


# past this rate the quantile is the normal approximation's (the pmf's sum would take ~rate steps;
# adapm.initial_rate allows 1e6; a rate that high made the loop hang): equal to the exact sum at
# 9,000-10,000 for p in {0.5, 0.9, 0.9999} (tests/strategies/test_adapm_timing.py)
NORMAL_ABOVE = 1e4


@lru_cache(maxsize=4096)
def _quantile(rate: float, p: float) -> int:
    if rate <= 0.0:
        return 0
    if rate > NORMAL_ABOVE:
        z = NormalDist().inv_cdf(p)  # (Cornish-Fisher: the normal quantile, corrected for Poisson's skew)
        return max(0, math.ceil(rate + z * math.sqrt(rate) + (z * z - 1) / 6 - 0.5))
    # the pmf summed from k = 0 in log space (exp(-rate) underflows past rate ~ 745)
    log_rate, total, k = math.log(rate), 0.0, 0
    while True:
        term = math.exp(k * log_rate - rate - math.lgamma(k + 1))
        total += term
        if total >= p or (k > rate and term < 1e-300):
            return k
        k += 1


def poisson_quantile(rate: float, p: float) -> int:
    """The smallest k with P(X <= k) >= p for X ~ Poisson(rate) (``scipy.stats.poisson.ppf``)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    return _quantile(round(float(rate), 6), float(p))  # (rounded: the cache sees few distinct rates)


@dataclass
class ActionTimer:
    """One worker's rate estimate: ``horizon(clock)`` once per communication round returns the clock
    before which intents are acted on this round (Algorithm 1)."""

    alpha: float = 0.1
    p: float = 0.9999
    rate: float = 10.0  # lambda_0
    last_clock: int = 0
    immediate: bool = False  # the ablation: act on every intent at once

    def horizon(self, clock: int) -> float:
        if self.immediate:
            return math.inf
        delta = clock - self.last_clock
        self.last_clock = clock
        if delta > 0:
            self.rate = (1.0 - self.alpha) * self.rate + self.alpha * delta
        return clock + poisson_quantile(2.0 * max(self.rate, delta), self.p)


@dataclass
class RoundPace:
    """How long a node's sync thread rests after a round. The paper starts the next round as soon
    as the last one ended, and allows a cap on rounds per second; here the cap is a CPU share: after
    a round that took ``spent`` CPU seconds the thread rests ``spent * (1 / share - 1)``, so it takes
    at most ``share`` of a core (1: the paper's default, no rest), at least ``interval`` seconds, and
    never longer than the node's workers take for ``reach`` clocks (a quarter of the look-ahead:
    Algorithm 1 can only act on intents signalled, so a round must come before the workers reach
    them); a worker that waits for a round ends the rest at once (``Node.wait_sync``)."""

    share: float = 1.0
    interval: float = 0.001
    reach: int = 16
    clock: int = 0  # the workers' furthest clock at the last round's end ...
    at: float | None = None  # ... and when (perf_counter seconds)

    def rest(self, spent: float, clock: int, now: float) -> float:
        rest = spent * (1.0 / self.share - 1.0)
        if self.at is not None and clock > self.clock:
            rest = min(rest, self.reach * (now - self.at) / (clock - self.clock))
        self.clock, self.at = clock, now
        return max(self.interval, rest)
