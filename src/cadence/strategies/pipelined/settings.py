"""The pipelined family's own settings: ``pdasgd.*`` (``pipeline.*``, the stages' threads and queues,
is a root section: ``cadence.pipeline``, below the strategies, reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cadence.settings import At, section, setting


@section("pdasgd")
@dataclass
class PdasgdConfig:
    """pdASGD (SPEC section 4): one forward thread hands each batch's graph to one of
    ``backward_threads`` backward threads and starts the next batch."""

    # K (the seed: 2, since a backward pass costs about two forwards)
    backward_threads: int = setting(2, positive=True, threads=True)
    # torch intra-op threads of each pdASGD thread (forward and backward): 1 keeps K + 1 threads
    # from oversubscribing the cores with OpenMP teams of their own; 0: torch's default
    intra_op_threads: int = setting(1, non_negative=True, threads=True)
    # each batch's backward and updates finish before the next forward starts: the sequential twin
    # (with one backward thread, bit for bit ``sync``); for tests and ablations
    barrier: bool = False
    # a delayed backward thread (the paper's robustness to delayed threads): backward thread
    # ``slow_thread`` runs at its own measured CPU rate over ``slowdown``, held there by a cgroup CPU
    # quota on that thread alone (``engines.cgroups``, cgroup v1's cpu controller; needs root), never by
    # a sleep; -1: none
    slow_thread: int = -1
    slowdown: float = setting(1.0, positive=True)

    def check(self, at: At, root: Any) -> None:
        if not -1 <= self.slow_thread < self.backward_threads:
            at.fail("slow_thread", f"must be -1 (none) or a backward thread, 0 to {self.backward_threads - 1}; "
                                   f"got {self.slow_thread}")
        if self.slow_thread >= 0 and self.slowdown <= 1:
            at.fail("slowdown", f"must exceed 1 to slow backward thread {self.slow_thread}; got {self.slowdown}")

    def slowed(self, index: int) -> float | None:
        """The slowdown of backward thread ``index``, or None where it runs free."""
        return self.slowdown if index == self.slow_thread and self.slowdown > 1 else None
