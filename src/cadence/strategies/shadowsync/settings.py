"""ShadowSync's settings, ``shadow.*`` (SPEC section 5); its trainers are ``ps.workers``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cadence.settings import At, per_worker, section, setting


@section("shadow")
@dataclass
class ShadowConfig:
    """ShadowSync and its baselines (SPEC section 5): ``ps.workers`` trainers, each a dense replica
    trained Hogwild by ``threads`` worker threads and kept in step with the others by a shadow
    thread (``shadow-*``) or in the foreground every ``every`` batches (``fr-*``)."""

    threads: int = setting(1, positive=True, threads=True)  # Hogwild worker threads per trainer
    # elastic parameter a of w_i <- (1 - a) w_i + a w; None: 0.9 / trainers (reconstructed, TF's
    # EASGD moving rate 0.9 / workers with period 1; the paper gives no value)
    alpha: float | None = None
    # fr-*: a sync every k iterations (the paper: 5, 10, 30, 100)
    every: int = setting(5, positive=True, between=(1, 1_000_000_000, "batches between foreground syncs"))
    # fr-*: who syncs every k iterations. thread: each worker thread, inside its own loop, every k
    # of its own iterations (the paper's FR-EASGD: sync traffic grows with the threads); trainer:
    # the trainer's threads pause, drain, and one round runs every k batches of the trainer (the
    # trainer-wide variant). None: thread for EASGD; trainer for MA and BMUF, whose all-reduce needs
    # one member per trainer (thread is an error there)
    fr_sync: Literal["thread", "trainer"] | None = None
    # EASGD: sync parameter servers holding the central copy, each a slice of the dense vector (the
    # paper: 2 to 6 sync PSs; more relieve FR's saturated sync servers, Fig. 5). Processes of their
    # own on the Ray engine, objects of this process on threads
    sync_servers: int = 1
    # engine ray: EASGD's sync servers go only to the nodes offering this Ray custom resource
    # (`ray start --resources '{"NAME": 1}'`), e.g. machines behind their own link; None: dealt
    # over the cluster's nodes with the other roles
    sync_server_resource: str | None = None
    # BMUF's block learning rate eta (fairseq's default)
    block_lr: float = setting(1.0, positive=True, between=(1e-6, 100.0, "BMUF's block learning rate"))
    block_momentum: float = 0.875  # BMUF's block momentum (fairseq's default; 0 = plain averaging)
    nesterov: bool = False  # BMUF: interpolate towards w_g + momentum (Nesterov)
    # shadow-*: a cap on each shadow thread's rounds; 0 = none
    max_syncs_per_second: float = setting(0.0, non_negative=True, between=(1e-4, 1e6, "syncs a second (0: no cap)"), off_at_zero=True)
    # shadow-*: the most of a core each shadow thread may use, as a rate: after a round that took
    # c CPU seconds the thread rests until the round's start is c / cpu_share seconds back. 0 = no
    # cap. The paper's shadow thread is one of 25 threads (24 Hogwild workers) of a trainer on 20
    # cores / 40 hyperthreads: a 25th of its trainer's threads; on few cores a free loop takes
    # half of them from the workers (docs/strategies/shadowsync.md)
    cpu_share: float = setting(0.0, non_negative=True, between=(1e-4, 1024.0, "cores (0: no cap)"), off_at_zero=True)
    # shadow-*: a round waits until the replica took an update since the last one. Off by default:
    # the paper's shadow thread loops freely (Algorithm 1, one of 25 threads on 20 cores) and its
    # sync gap comes from the sync servers' capacity; on a few cores with sync servers in this
    # process a round with nothing new only takes CPU and the interpreter from the worker threads,
    # and this option (or max_syncs_per_second) gives them back
    wait_for_update: bool = False

    def check(self, at: At, root: Any) -> None:
        per_worker(at, "threads", root.ps.workers, self.threads)
        if self.alpha is not None and not 0 <= self.alpha <= 1:
            at.fail("alpha", f"must be in [0, 1], got {self.alpha}")
        if not 0 <= self.block_momentum < 1:
            at.fail("block_momentum", f"must be in [0, 1), got {self.block_momentum}")
