"""The parameter-server runtime: server shards that own the rows (``key % shards``) and, on shard 0,
the dense module; workers pull, compute and push (gradient, token); a parameter-server mode chooses
the shards' aggregation and the workers' gate; an engine (threads or Ray actors) runs the workers."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from cadence.config import Config
from cadence.core import checkpoint as ckpt
from cadence.core.batch import BatchPlan
from cadence.core.runtime import OnBatch, Runtime
from cadence.optim import set_lr
from cadence.engines import PLACEMENTS
from cadence.ps.engines import EpochPlan, ServerSettings, build_engine
from cadence.ps.server import ServerShard
from cadence.ps.worker import PHASES, Faults, ShardRouter
from cadence.tasks.base import Task

log = logging.getLogger("cadence")


class ParameterServerRuntime(Runtime):
    name = "parameter_server"

    def __init__(self, config: Config, task: Task, mode):
        super().__init__(config, task)
        self.mode = mode
        ps = config.ps
        self.faults = Faults.parse(ps.stragglers, ps.kill_workers, ps.workers)
        self.model = task.dense_module()  # shard 0's dense module (threads), or the driver's copy of it (ray)
        self.settings = ServerSettings.of(config, self.entity_optimizer_class, mode)  # the sections its engine, mode and actors read
        placement = PLACEMENTS.get(ps.engine)(ps.ray_address, self.settings.threads)  # (ps.engine's one registry)
        self.engine = build_engine(placement, self.settings, task, mode, self.model)
        self.router = ShardRouter(self.engine.shards)
        self.dead: set[int] = set()
        self.replaced = 0  # worker processes that died unexpectedly and were replaced
        self.worker_examples = [0] * ps.workers
        self.worker_throttled = [0.0] * ps.workers  # ps.straggler_cause: cpu_quota: seconds each was held back
        self.shadow_cpu_seconds = 0.0  # ShadowSync: CPU seconds the trainers' shadow threads ran
        self.bytes_moved = 0
        self.train_seconds = 0.0
        self.worker_seconds = dict.fromkeys(PHASES, 0.0)  # summed over the workers (``worker.PHASES``)

    @property
    def shards(self) -> list:
        return self.engine.shards

    def run_epoch(self, plans: list[BatchPlan], on_batch: OnBatch) -> tuple[float, int]:
        ps = self.settings.ps
        for shard in self.shards:
            shard.resume()  # (a failed epoch left them aborted)
        if self.mode.dense_on_workers(self.settings.ps):  # the replicas start from the run's optimizer state, its rate included
            set_lr(self.engine.dense_optimizer, self.epoch_lr(plans))
        elif list(self.model.parameters()):
            self.shards[0].set_dense_lr(self.epoch_lr(plans))
        live = [index for index in range(ps.workers) if index not in self.dead]
        kill_after = {}
        for index, after in self.faults.kill_after.items():
            kill_after[index] = max(0, after - self.worker_examples[index] // self.settings.batch_size)
        epoch = EpochPlan(plans[0].epoch if plans else 0, len(plans), self.shards[0].get_global_step(), live,
                          sorted(self.dead), self.faults, kill_after)
        started = time.perf_counter()
        reports = self.engine.run_workers(epoch, plans, on_batch)
        for shard in self.shards:
            shard.flush()
        self.train_seconds += time.perf_counter() - started
        loss, examples = 0.0, 0
        for report in reports:
            loss += report.loss_total
            examples += report.examples
            self.worker_examples[report.index] += report.examples
            self.worker_throttled[report.index] += report.throttled_seconds
            self.shadow_cpu_seconds += report.shadow_cpu_seconds
            self.bytes_moved += report.bytes_moved
            for phase, seconds in report.seconds.items():
                self.worker_seconds[phase] += seconds
            if report.died:
                self.dead.add(report.index)
                log.warning("worker %d was killed after %d batches (fault injection); its batch was dropped",
                            report.index, report.pushed)
            if report.lost:
                self.replaced += 1
        return loss, examples

    def parameters(self) -> "RouterView":
        return RouterView(self.router)

    def dense(self) -> nn.Module:
        if self.mode.dense_on_workers(self.settings.ps):  # the engine keeps the workers' (identical) replica here
            return self.model
        state, _ = self.shards[0].pull_dense()  # (ray: the driver's copy is refreshed from shard 0)
        self.model.load_state_dict(state)
        return self.model

    def stats(self) -> dict[str, Any]:
        seconds = self.train_seconds
        per_shard = [shard.stats() for shard in self.shards]
        return {
            "workers": self.settings.ps.workers,
            "engine": self.settings.ps.engine,
            # building the engine's processes before training (ray: actors import torch, read the data)
            "engine_start_seconds": round(self.engine.start_seconds, 3),
            "worker_examples_per_second": [round(e / seconds, 1) if seconds > 0 else 0.0 for e in self.worker_examples],
            # ps.straggler_cause: cpu_quota: seconds the kernel throttled each worker's process (0: no quota)
            "worker_throttled_seconds": [round(t, 3) for t in self.worker_throttled],
            "vocabulary_added": sum(s["vocabulary_added"] for s in per_shard),
            # every batch's gradient reaches every shard: shard 0's counts count each batch once
            **{k: v for k, v in per_shard[0].items() if k != "vocabulary_added"},
            "shards": per_shard,
            "workers_killed": sorted(self.dead),
            "workers_replaced": self.replaced,
            # tensor bytes between workers and shards (keys, rows, gradients, dense), per example
            "bytes_moved_per_example": round(self.bytes_moved / max(1, sum(self.worker_examples)), 1),
            # where the workers' time went (this process's run), by phase, summed over the workers: take,
            # gate, pull, compute, push, reduce, report, sync (docs/outputs.md)
            "worker_seconds": {phase: round(seconds, 3) for phase, seconds in self.worker_seconds.items()},
            **self.mode.summary_fields(self.settings, self.train_seconds, sum(self.worker_examples), self.engine.syncs,
                                       self.shadow_cpu_seconds),
        }

    # ---- checkpoints: every shard writes and reads its own part ---------------------------------
    def part_names(self) -> list[str]:
        count = len(self.shards)
        return [f"shard-{index:03d}-of-{count:03d}.safetensors" for index in range(count)]

    def write_parts(self, directory: Path) -> dict[str, str]:
        """Each shard writes its rows into ``directory`` itself (in parallel); {file: sha256}."""
        names = self.part_names()
        calls = [shard.submit(ServerShard.save_part, str(directory / name)) for shard, name in zip(self.shards, names)]
        return {name: call.result() for name, call in zip(names, calls)}

    def state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        if self.mode.dense_on_workers(self.settings.ps):
            tensors, meta = self._dense_state(self.engine.dense_optimizer)
            optimizer_meta = meta["dense_optimizer"]
        else:
            tensors, optimizer_meta = self.shards[0].dense_checkpoint()
        meta = {"dense_optimizer": optimizer_meta, "global_steps": [s.get_global_step() for s in self.shards],
                "dead": sorted(self.dead), "worker_examples": self.worker_examples, "ps_seconds": self.train_seconds,
                "bytes_moved": self.bytes_moved, "dense_syncs": self.engine.syncs, "worker_seconds": self.worker_seconds,
                "shadow_cpu_seconds": self.shadow_cpu_seconds}
        return tensors, meta

    def load_state(self, tensors: dict[str, Tensor], meta: dict[str, Any], counters: bool = True) -> None:
        parts = meta.get(ckpt.PARTS)
        if "table.keys" not in tensors and parts is not None and sorted(parts) == self.part_names():
            directory = Path(meta[ckpt.PARTS_DIR])  # each shard reads its own part: no row passes through here
            calls = [shard.submit(ServerShard.load_part, str(directory / name), parts[name])
                     for shard, name in zip(self.shards, self.part_names())]
            for call in calls:
                call.result()
        else:
            if "table.keys" not in tensors:
                tensors = {**tensors, **ckpt.read_tables(meta)}
            self._import_rows(tensors["table.keys"], tensors["table.values"], tensors["table.state"])
        dense = {k: v for k, v in tensors.items() if not k.startswith("table.")}
        if self.mode.dense_on_workers(self.settings.ps):
            optimizer = self.engine.dense_optimizer
            self._load_dense(dense, meta, optimizer if meta.get("dense_optimizer") else None)
        else:
            self.shards[0].load_dense_checkpoint(dense, meta.get("dense_optimizer"))
        steps = meta.get("global_steps")
        if steps is not None and len(steps) == len(self.shards):  # a switched job continues the step count
            for shard, step in zip(self.shards, steps):
                shard.set_global_step(step)
        if counters:
            self.dead = set(meta.get("dead", []))
            self.worker_examples = list(meta.get("worker_examples", self.worker_examples))
            self.train_seconds = meta.get("ps_seconds", 0.0)
            self.bytes_moved = meta.get("bytes_moved", 0)
            self.engine.syncs = meta.get("dense_syncs", 0)
            self.shadow_cpu_seconds = meta.get("shadow_cpu_seconds", 0.0)
            self.worker_seconds = {**dict.fromkeys(PHASES, 0.0), **meta.get("worker_seconds", {})}

    def table_tensors(self) -> dict[str, Tensor]:
        """Every row, gathered here (tests, small tables): ``table.keys/values/state``, sorted by key."""
        return ckpt.merge_tables([shard.export_rows() for shard in self.shards])

    def _import_rows(self, keys: Tensor, values: Tensor, state: Tensor) -> None:
        owner = keys.remainder(len(self.shards))
        for index, shard in enumerate(self.shards):
            mine = (owner == index).nonzero().squeeze(1)
            if self.spec.fixed:
                mine = mine[keys[mine] < self.spec.rows]
            shard.import_rows(keys[mine], values[mine], state[mine])

    def recover(self) -> None:
        """A shard's process died (``ShardLost``): restart it empty; the trainer then reloads every
        shard from the last checkpoint."""
        self.engine.recover()
        self.router = ShardRouter(self.engine.shards)

    def close(self) -> None:
        self.engine.close()


class RouterView:
    """``ParameterView`` of the server shards (unseen keys read their initial rows, none is added)."""

    def __init__(self, router: ShardRouter):
        self.router = router

    def values(self, keys: Tensor) -> Tensor:
        return self.router.pull_rows(keys, create=False)
