"""The pipelined family's own settings: ``pdasgd.*`` (``pipeline.*``, the stages' threads and queues,
is a root section: ``cadence.pipeline``, below the strategies, reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from cadence.settings import section, setting


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
