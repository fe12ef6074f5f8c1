"""The parameter server's settings, ``ps.*``: its roles and engines (``cadence.ps``), GBA's family's
choices (``cadence.strategies.parameter_server``) and the trainers' count of ShadowSync's
(``cadence.strategies.shadowsync``); ``ps.workers`` and ``ps.engine`` are read by AdaPM's nodes too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cadence.settings import section, setting


@section("ps")
@dataclass
class ParameterServerConfig:
    """The parameter-server runtime and its modes (GBA paper, SPEC section 3). With workers = 1 and the
    threads engine, sync and async run as the one-process pipeline instead (see README)."""

    workers: int = setting(1, positive=True, threads=True)
    engine: Literal["threads", "ray"] = "threads"  # ray: servers and workers as Ray actors (pip install cadence[ray])
    # server shards; feature keys are routed by key % shards, dense parameters live on shard 0
    shards: int = setting(1, positive=True, threads=True)
    # GBA / BSP gradient buffer M (global batch = M x train.batch_size); 0 = workers
    buffer: int = setting(0, non_negative=True)
    # GBA's staleness tolerance iota: gradients with step - token > iota are dropped. The paper gives
    # no value. 2: a worker 3x slower than the rest or more has every gradient dropped (its token
    # staleness is ~3-12 steps); keeping them (iota 11, which the paper's Table 5.3 may suggest)
    # cost 0.002 test AUC under a 4x CPU-quota straggler over 5 seeds, where 2 stays within 0.0005
    # of sync (benchmarks/results/gba_stragglers_quota*.json, docs/strategies/parameter_server.md)
    tolerance: int = setting(2, non_negative=True)
    decay: str = "cutoff"  # GBA's decay f(staleness): cutoff (the reconstructed default)
    normalizer: Literal["buffer", "kept"] = "buffer"  # divide an aggregate by M, or by gradients kept
    # hop_bs: a worker may run at most this many batches ahead of the slowest
    staleness: int = setting(2, non_negative=True)
    # hop_bw: aggregate the first workers - backup_workers gradients of a step
    backup_workers: int = setting(1, non_negative=True)
    stragglers: list[str] = field(default_factory=list)  # "WORKER:SLOWDOWN[@FIRST-LAST epochs]": fault injection
    # how a straggler is slowed: sleep (its batch takes SLOWDOWN x its compute time: a sleep in the
    # worker loop, for tests and any engine) or cpu_quota (its Ray worker process runs in a cgroup-v1
    # CPU quota of threads / SLOWDOWN cores for its slowed epochs: a really slow process; root, ps.engine: ray)
    straggler_cause: Literal["sleep", "cpu_quota"] = "sleep"
    # cpu_quota: relative (default: the process's own CPU rate, measured unthrottled in its first
    # second, over SLOWDOWN: slow by that factor against the load it meets) or absolute (threads /
    # SLOWDOWN cores: on a machine with more busy processes than cores, about its fair share anyway)
    straggler_quota: Literal["relative", "absolute"] = "relative"
    kill_workers: list[str] = field(default_factory=list)  # "WORKER:AFTER_STEPS": fault injection
    # seconds each batch spends off this machine (emulates one machine per worker)
    emulated_latency: float = setting(0.0, non_negative=True, between=(0.0, 60.0, "seconds of emulated latency per message"))
    ray_address: str | None = None  # engine ray: the cluster to join ("HOST:PORT"); None = ray.init()'s default
    # engine ray: actor processes a finished run leaves idle, for the next run of the same driver
    # process to build its roles in (torch and cadence already imported); 0: a run's processes end with it
    ray_idle_processes: int = setting(8, non_negative=True, threads=True)
    # where the dense parameters live: on shard 0 (updated from pushed gradients), or a replica on
    # every worker, its gradients all-reduced each round (PERSIA's split; embeddings stay on the servers)
    dense: Literal["server", "workers"] = "server"

    def unread(self) -> dict[str, tuple[str, str]]:
        """The keys these values leave unread, each with the setting under which it is read."""
        unread = {}
        if not self.stragglers:
            unread["straggler_cause"] = ("a straggler in ps.stragglers", "ps.stragglers: none")
        if self.straggler_cause != "cpu_quota":
            unread["straggler_quota"] = ("ps.straggler_cause: cpu_quota", f"ps.straggler_cause: {self.straggler_cause}")
        if self.engine != "ray":
            unread.update(dict.fromkeys(("ray_address", "ray_idle_processes"),
                                        ("ps.engine: ray", f"ps.engine: {self.engine}")))
        return unread
