"""AdaPM's settings: ``adapm.*`` (its nodes are ``ps.workers``, placed by ``ps.engine``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cadence.settings import At, per_worker, section, setting


@section("adapm")
@dataclass
class AdapmConfig:
    """AdaPM (SPEC section 2): ``ps.workers`` nodes, each with ``threads`` worker threads sharing a
    node-local store; parameters are relocated or replicated between nodes from the workers' intent
    signals. Defaults are the paper's, never tuned per task."""

    # adaptive: relocate when one node has intent, replicate when several do; replication: only
    # replicate; relocation: only relocate; static: a classic parameter server (keys stay on their
    # home node, every other access remote); full: every key replicated on every node, all synced
    # each round
    technique: Literal["adaptive", "replication", "relocation", "static", "full"] = "adaptive"
    timing: Literal["adaptive", "immediate"] = "adaptive"  # Algorithm 1, or act on every intent at once
    # a worker signals a batch's intent this many batches before it computes it
    lookahead: int = setting(64, positive=True, between=(1, 100_000, "batches of intent signalled ahead"))
    alpha: float = 0.1  # Algorithm 1's smoothing factor
    quantile: float = 0.9999  # Algorithm 1's p
    # Algorithm 1's lambda_0 (clocks per round)
    initial_rate: float = setting(10.0, positive=True, between=(1e-3, 1e6, "clocks per round, the rate estimate's start"))
    threads: int = setting(1, positive=True, threads=True)  # worker threads per node
    # seconds a sync thread rests between communication rounds (at least)
    round_interval: float = setting(0.001, non_negative=True, between=(1e-5, 60.0, "seconds between communication rounds"))
    # the share of one core a node's sync thread takes: after a round of c CPU seconds it rests
    # c * (1 / sync_share - 1) (at least round_interval, at most the time the workers take for a
    # quarter of the look-ahead); 1 (default): the paper's, a round as soon as the last one ended.
    # Lower trades replica freshness for CPU: 0.25 on 4 nodes sharing 2 cores is 1.4x the examples/s,
    # MF's RMSE unchanged, a small KG's MRR lower (docs/strategies/adapm.md)
    sync_share: float = setting(1.0, between=(1e-3, 1.0, "the share of a core a node's sync thread takes"))
    # at an epoch's start a worker waits for rounds (wait_sync) until its first batch's rows are held
    # on its node, at most this many (every node signals its first intents at once: an owner may
    # hand a key to one node before another's intent arrives, and that one's comes a round later)
    start_rounds: int = setting(10, non_negative=True, between=(0, 100_000, "rounds a worker waits for its first rows"))

    def check(self, at: At, root: Any) -> None:
        per_worker(at, "threads", root.ps.workers, self.threads)
        if not 0 < self.alpha <= 1:
            at.fail("alpha", f"must be in (0, 1], got {self.alpha}")
        if not 0 < self.quantile < 1:
            at.fail("quantile", f"must be in (0, 1), got {self.quantile}")
