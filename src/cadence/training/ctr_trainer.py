"""The click-through-rate training loop over the parameter-server runtime, visible top to bottom.

    random split:                         continual (split: periods), as the GBA paper evaluates:
    for each epoch:                       for each period d:
        train one epoch                       train ctr epochs on period d
        validate: AUC, logloss                evaluate on period d + 1 ("next_period")
    test, summary.json, final checkpoint  summary.json (mean next-period AUC), final checkpoint

One epoch: shuffle the examples into local batches (a pure function of seed, period and epoch),
hand them out through a DataList (token = global step), run the workers, flush the servers.
``ctr.init_from`` starts from another run's final checkpoint, so a job can switch modes (sync ->
gba, gba -> sync) between periods with the same hyperparameters.

The parameter-server mode (sync, async, bsp, hop_bs, hop_bw, gba) only chooses the servers'
aggregation rule and the workers' gate; this loop is the same for all of them.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadence.config import Config
from cadence.data.ctr import CtrExamples
from cadence.evaluation.classification import auc, logloss
from cadence.runtime.engines import ENGINES
from cadence.runtime.server import DataList, ServerShard
from cadence.runtime.worker import CtrWorker, Faults, ShardRouter, batch_keys, forward
from cadence.store.embedding_store import derive_seed
from cadence.strategies.parameter_server import ParameterServerMode
from cadence.errors import CheckpointError
from cadence.training import checkpoint as ckpt
from cadence.training.run_directory import RunDirectory

log = logging.getLogger("cadence")
EVAL_BATCH = 4096


class CtrTrainer:
    def __init__(self, config: Config, dataset_name: str, splits: dict[str, CtrExamples],
                 shards: list[ServerShard], model: nn.Module, mode: ParameterServerMode, run: RunDirectory):
        self.config = config
        self.dataset_name = dataset_name
        self.splits = splits
        self.router = ShardRouter(shards)
        self.model = model  # the dense parameters, held by shard 0
        self.mode = mode
        self.run = run
        self.faults = Faults.parse(config.ps.stragglers, config.ps.kill_workers, config.ps.workers)
        self.dead: set[int] = set()
        self.history: list[dict[str, Any]] = []
        self.train_seconds = 0.0
        self.examples_seen = 0
        self.worker_examples = [0] * config.ps.workers
        self.epoch = 0

    def fit(self) -> dict[str, Any]:
        summary = self._fit_periods() if "periods" in self.splits else self._fit_random_split()
        self.save_checkpoint()
        return summary

    def _fit_random_split(self) -> dict[str, Any]:
        cfg = self.config
        for epoch in range(cfg.train.epochs):
            self._run_epoch(epoch, self.splits["train"])
            self.epoch = epoch + 1
            if cfg.eval.every and self.epoch % cfg.eval.every == 0:
                metrics = self.evaluate(self.splits["valid"])
                self._record("valid", metrics)
                log.info("epoch %d/%d  valid auc %.4f  logloss %.4f  (%.1f s training)", self.epoch,
                         cfg.train.epochs, metrics["auc"], metrics["logloss"], self.train_seconds)
        test = self.evaluate(self.splits["test"]) if cfg.eval.test else {}
        if test:
            self._record("test", test)
        return self.summary(test)

    def _fit_periods(self) -> dict[str, Any]:
        periods = self.splits["periods"]
        last = self.config.ctr.last_period if self.config.ctr.last_period >= 0 else len(periods) - 2
        next_aucs = []
        for period in range(self.config.ctr.first_period, last + 1):
            for epoch in range(self.config.train.epochs):
                self._run_epoch(epoch, periods[period], period)
            self.epoch += self.config.train.epochs
            metrics = self.evaluate(periods[period + 1])
            self._record("next_period", {"period": period, **metrics})
            next_aucs.append(metrics["auc"])
            log.info("period %d: trained; AUC on period %d %.4f  logloss %.4f", period, period + 1,
                     metrics["auc"], metrics["logloss"])
        summary = self.summary({"auc": sum(next_aucs) / len(next_aucs)})
        summary["next_period_auc"] = next_aucs
        return summary

    def _run_epoch(self, epoch: int, train: CtrExamples, period: int = -1) -> None:
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "ctr-shuffle", period, epoch))
        order = torch.randperm(len(train), generator=generator)
        batches = list(order.split(self.config.train.batch_size))
        shard = self.router.shards[0]
        data = DataList(batches, self.mode.tokens_per_step(self.config.ps), shard.global_step, self.router.shards,
                        self.config.ps.workers, self.mode.per_worker_batches)
        workers = [self._worker(index, train) for index in range(self.config.ps.workers) if index not in self.dead]
        gate = self.mode.gate(self.config.ps, self.router.shards)
        for index in self.dead:
            gate.leave(index)
            data.abandon(index)
        started = time.perf_counter()
        ENGINES.get(self.config.ps.engine)().run(workers, data, gate)
        for server in self.router.shards:
            server.flush()
        self.train_seconds += time.perf_counter() - started
        for worker in workers:
            self.examples_seen += worker.examples_done
            self.worker_examples[worker.index] += worker.examples_done
            if worker.died:
                self.dead.add(worker.index)
                log.warning("worker %d was killed after %d batches (fault injection); its batch was dropped",
                            worker.index, worker.pushed)

    def _worker(self, index: int, train: CtrExamples) -> CtrWorker:
        kill_after = self.faults.kill_after.get(index)
        if kill_after is not None:
            kill_after = max(0, kill_after - self.worker_examples[index] // self.config.train.batch_size)
        return CtrWorker(index, self.router, copy.deepcopy(self.model), train,
                         self.faults.slowdown.get(index, 1.0), kill_after, self.config.ps.emulated_latency)

    @torch.no_grad()
    def evaluate(self, examples: CtrExamples) -> dict[str, float]:
        self.model.load_state_dict(self.router.shards[0].pull_dense()[0])
        self.model.eval()
        logits = []
        for start in range(0, len(examples), EVAL_BATCH):
            batch = examples.subset(torch.arange(start, min(start + EVAL_BATCH, len(examples))))
            keys, inverse = batch_keys(batch)
            logits.append(forward(self.model, batch, self.router.pull_rows(keys, create=False), inverse))
        self.model.train()
        scores = torch.cat(logits)
        return {"auc": auc(scores, examples.labels), "logloss": logloss(scores, examples.labels)}

    def _record(self, split: str, metrics: dict[str, float]) -> None:
        self.history.append({"epoch": self.epoch, "split": split, "wall_seconds": round(self.train_seconds, 4),
                             "examples_seen": self.examples_seen, **metrics})
        self.run.write_metrics(self.history)

    # ---- checkpoints (the model a later run can --init-from) ------------------------------------
    def save_checkpoint(self, name: str = "final") -> None:
        tensors: dict[str, torch.Tensor] = {}
        for index, shard in enumerate(self.router.shards):
            tensors.update({f"shard{index}.{k}": v for k, v in shard.table.tensors().items()})
        tensors.update({f"dense.{k}": v for k, v in self.model.state_dict().items()})
        optimizer_tensors, optimizer_meta = ckpt.flatten_optimizer(self.router.shards[0].dense_optimizer)
        tensors.update(optimizer_tensors)
        state = {"global_steps": [s.global_step for s in self.router.shards], "dense_optimizer": optimizer_meta,
                 "strategy": self.config.strategy, "epochs": self.epoch}
        ckpt.save_checkpoint(self.run.path, name, tensors, state)

    def load_checkpoint(self, run_dir: str | Path) -> None:
        """Start from another run's final model: tables, dense parameters, optimizer state, steps."""
        path = Path(run_dir) / "checkpoints" / "final"
        if not path.is_dir():
            raise CheckpointError(f"{run_dir}: no final checkpoint to start from (is it a finished ctr run?)")
        tensors, state = ckpt.load_checkpoint(path)
        if len(state["global_steps"]) != len(self.router.shards):
            raise CheckpointError(f"{run_dir}: saved with {len(state['global_steps'])} shards, this run has "
                                  f"{len(self.router.shards)}")
        for index, shard in enumerate(self.router.shards):
            prefix = f"shard{index}."
            shard.table.load_tensors({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
            shard.global_step = state["global_steps"][index]
        try:
            self.model.load_state_dict({k[len("dense."):]: v for k, v in tensors.items() if k.startswith("dense.")})
            ckpt.restore_optimizer(self.router.shards[0].dense_optimizer, tensors, state["dense_optimizer"])
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"{run_dir}: its model does not match this run's ({err})") from None
        log.info("initialised from %s (%s, global step %d)", run_dir, state["strategy"], state["global_steps"][0])

    def summary(self, test: dict[str, float]) -> dict[str, Any]:
        seconds = self.train_seconds
        shard_stats = self.router.shards[0].stats()
        per_worker = [round(e / seconds, 1) if seconds > 0 else 0.0 for e in self.worker_examples]
        return {
            "task": "ctr", "strategy": self.config.strategy, "dataset": self.dataset_name,
            "model": self.config.model.name, "epochs": self.epoch, "workers": self.config.ps.workers,
            "train_seconds": round(seconds, 4), "examples_seen": self.examples_seen,
            "examples_per_second": self.examples_seen / seconds if seconds > 0 else 0.0,
            "worker_examples_per_second": per_worker,
            "vocabulary_added": sum(s.table.added for s in self.router.shards),
            **{k: v for k, v in shard_stats.items() if k != "vocabulary_added"},
            "workers_killed": sorted(self.dead),
            **test,
        }
