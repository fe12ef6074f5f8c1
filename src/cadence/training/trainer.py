"""The training loop, visible top to bottom, for every task on every runtime.

    for each epoch:
        plans = task.plan(epoch)                 a pure function of seed and epoch
        runtime.run_epoch(plans)                 <- the only place strategies differ
        validate when task.validation(epoch) says (metrics.jsonl, early stopping on the primary metric)
        checkpoint every checkpoint.every epochs
    restore the best model (early stopping), test, summary.json

Hooks (``TrainerHook``) observe batches (pipeline runtime), epochs and evaluations without copying
the loop.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

import torch
from tqdm.auto import tqdm

from cadence.config import Config
from cadence.data import fingerprint
from cadence.device import module_on
from cadence.errors import CheckpointError
from cadence.core.batch import Batch
from cadence.tasks.base import Task, Validation
from cadence.core import checkpoint as ckpt
from cadence.training.batch_order import BatchOrder, ComputationOrderRecorder
from cadence.training.grow import Growth
from cadence.training.run_directory import RunDirectory
from cadence.core.runtime import Runtime, ShardLost

log = logging.getLogger("cadence")

MAX_RECOVERIES = 3  # shard restarts per run before the run fails


class TrainerHook:
    """Named hook points; override the ones you need."""

    def on_batch_end(self, trainer: "Trainer", batch: Batch) -> None: ...

    def on_epoch_end(self, trainer: "Trainer", epoch: int) -> None: ...

    def on_evaluation(self, trainer: "Trainer", record: dict[str, Any]) -> None: ...


@dataclass
class Progress:
    """What the trainer has done so far: saved in every checkpoint, restored on resume."""

    epoch: int = 0  # epochs completed
    batch_examples: int = 0  # training examples processed (KGE's reciprocal copies included)
    train_seconds: float = 0.0  # wall seconds inside run_epoch (evaluation, checkpoints excluded)
    best_value: float | None = None  # best validation value of the task's primary metric
    best_epoch: int = 0
    stale_validations: int = 0  # validations since the best one (early stopping)
    history: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl records

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Progress":
        state = dict(state)
        if "triples_seen" in state:  # checkpoints of cadence 0.1 (knowledge graphs only)
            state["batch_examples"] = state.pop("triples_seen")
            best = state.pop("best_mrr")
            state["best_value"] = best if best >= 0 else None
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in state.items() if k in known})


class Trainer:
    def __init__(self, config: Config, task: Task, runtime: Runtime, run: RunDirectory, device: torch.device,
                 hooks: Iterable[TrainerHook] = ()):
        self.config = config
        self.task = task
        self.runtime = runtime
        self.run = run
        self.device = device
        self.hooks = list(hooks)
        self.batch_order = BatchOrder.load(config.batch_order) if config.batch_order else None
        if config.record_order:
            self.hooks.append(ComputationOrderRecorder(Path(config.record_order)))
        self.progress = Progress()
        self.last_loss = math.nan  # the last epoch's mean training loss
        # summary.json entries of how the run began: ``init_from`` (what it grew from), ``auto`` (its trials)
        self.notes: dict[str, Any] = {}

    # ---- the loop -------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        cfg, epochs = self.config, self.task.num_epochs()
        recoveries = 0
        while self.progress.epoch < epochs:
            try:
                stop = self._epoch(epochs)
            except ShardLost as err:  # a server shard's process died: continue from the last checkpoint
                recoveries += 1
                if recoveries > MAX_RECOVERIES:
                    raise
                self._recover(err)
                continue
            if stop:
                log.info("early stopping: valid %s has not improved for %d validations",
                         self.task.primary_metric, cfg.eval.patience)
                break
        if cfg.eval.patience and self.progress.best_epoch:
            self._restore_best()
        if cfg.checkpoint.every:
            self.save_checkpoint(name="final")  # the model the run reports on (``--init-from``, eval, export)
        test, extra = self.task.final_metrics(self.evaluate, self.progress.history)
        if test:
            self._record("test", test, loss=None)
        self.run.write_metrics(self.progress.history)
        return self.summary(test, extra)

    def _epoch(self, epochs: int) -> bool:
        """Train one epoch, validate, checkpoint; whether to stop early."""
        cfg, epoch = self.config, self.progress.epoch
        plans = self.task.plan(epoch)
        if self.batch_order is not None:
            plans = self.batch_order.reorder(plans)
        self.last_loss = self._run_epoch(epoch, plans, epochs)
        self.progress.epoch = epoch + 1
        for hook in self.hooks:
            hook.on_epoch_end(self, self.progress.epoch)
        validation = self.task.validation(self.progress.epoch)
        stop = self._validate(validation, self.last_loss) if validation is not None else False
        last = stop or self.progress.epoch == epochs
        if cfg.checkpoint.every and (self.progress.epoch % cfg.checkpoint.every == 0 or last):
            self.save_checkpoint()
        return stop

    def _run_epoch(self, epoch: int, plans, epochs: int) -> float:
        bar = tqdm(total=len(plans), desc=f"epoch {epoch + 1}/{epochs}", unit="batch", leave=False,
                   disable=self._bar_disabled())

        def on_batch(batch: Batch) -> None:
            bar.update(1)
            for hook in self.hooks:
                hook.on_batch_end(self, batch)

        started = time.perf_counter()
        total_loss, examples = self.runtime.run_epoch(plans, on_batch)
        self.progress.train_seconds += time.perf_counter() - started
        self.progress.batch_examples += examples
        bar.update(len(plans) - bar.n)
        bar.close()
        return total_loss / max(1, examples)

    # ---- evaluation -----------------------------------------------------------------------------
    def _validate(self, validation: Validation, loss: float) -> bool:
        metrics = self.evaluate(validation.split)
        record = self._record(validation.record, {**dict(validation.extra), **metrics, "counters": self.counters()}, loss)
        name = self.task.primary_metric
        value = metrics.get(name)
        measured = value is not None and math.isfinite(value)  # (none measured: nothing acts on it)
        log.info("epoch %d/%d  loss %.4f  %s %s %s  (%.1f s training)", self.progress.epoch,
                 self.task.num_epochs(), loss, validation.split, name, f"{value:.4f}" if measured else "n/a",
                 record["wall_seconds"])
        if not validation.early_stopping or not measured:
            return False
        if self.task.better(metrics[name], self.progress.best_value):
            self.progress.best_value, self.progress.best_epoch = metrics[name], self.progress.epoch
            self.progress.stale_validations = 0
            if self.config.eval.patience:
                self.save_checkpoint(name="best")
        else:
            self.progress.stale_validations += 1
        return bool(self.config.eval.patience) and self.progress.stale_validations >= self.config.eval.patience

    def evaluate(self, split: str) -> dict[str, float]:
        def progress(steps: Iterable) -> Iterable:
            return tqdm(steps, desc=f"eval {split}", unit="batch", leave=False, disable=self._bar_disabled())

        dense = module_on(self.runtime.dense(), self.device)
        return self.task.evaluate(self.runtime.parameters(), dense, split, self.device, progress)

    def _record(self, split: str, metrics: dict[str, Any], loss: float | None) -> dict[str, Any]:
        record = {
            "epoch": self.progress.epoch,
            "split": split,
            "wall_seconds": round(self.progress.train_seconds, 4),
            "examples_seen": self.examples_seen,
            **({"loss": loss} if loss is not None and math.isfinite(loss) else {}),
            **metrics,
        }
        self.progress.history.append(record)
        self.run.write_metrics(self.progress.history)
        for hook in self.hooks:
            hook.on_evaluation(self, record)
        return record

    def counters(self) -> dict[str, float]:
        """The strategy's own numeric counters so far (staleness, drops, repairs, bytes, sync gap):
        each validation record keeps them, so a report draws them over time."""
        return {key: value for key, value in self.runtime.stats().items()
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}

    # ---- results --------------------------------------------------------------------------------
    @property
    def examples_seen(self) -> int:
        return self.task.examples_of(self.progress.batch_examples)

    def summary(self, test: dict[str, float], extra: dict[str, Any] | None = None) -> dict[str, Any]:
        seconds = self.progress.train_seconds
        metric = self.task.primary_metric
        best = self.progress.best_value if self.progress.best_epoch else None
        return {
            **self.task.summary_fields(),
            "strategy": self.runtime.strategy,
            "runtime": self.runtime.name,
            "epochs": self.progress.epoch,
            "train_seconds": round(seconds, 4),
            "examples_seen": self.examples_seen,
            "examples_per_second": self.examples_seen / seconds if seconds > 0 else 0.0,
            # the last epoch's mean training loss (None where this process trained no epoch: resumed at the end)
            "train_loss": self.last_loss if math.isfinite(self.last_loss) else None,
            "primary_metric": metric,
            f"best_valid_{metric}": best,
            "best_epoch": self.progress.best_epoch or None,
            **self.runtime.stats(),
            **test,
            **(extra or {}),
            **self.notes,
        }

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, name: str | None = None) -> None:
        tensors, meta = self.runtime.state()
        state = {"progress": self.progress.__dict__, "runtime": self.runtime.name,
                 fingerprint.KEY: self.task.data_fingerprint(), **meta}
        keep = self.config.checkpoint.keep if name is None else None
        with self.runtime.sweeping():
            ckpt.save_checkpoint(self.run.path, name or ckpt.epoch_name(self.progress.epoch), tensors, state,
                                 keep=keep, parts=self.runtime.write_parts)

    def load_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        # data that changed is no reason to try an older checkpoint: the error reaches the user
        fingerprint.check(state.get(fingerprint.KEY), self.task.data_fingerprint(), self.run.path,
                          self.config.data.dataset)
        self.runtime.load_state(tensors, state)
        self.progress = Progress.from_state(state["progress"])

    def resume(self) -> bool:
        """Continue from the newest valid checkpoint, if any; returns whether one was loaded."""
        # server shards read their own rows; a checkpoint that does not fit is skipped for the previous
        found = ckpt.load_latest(self.run.path, tables=False, apply=self.load_state)
        if found is None:
            return False
        _, _, path = found
        self.run.write_metrics(self.progress.history)  # drop records written after the checkpoint
        log.info("resumed from %s (epoch %d)", path, self.progress.epoch)
        return True

    def _recover(self, err: ShardLost) -> None:
        """A server shard's process died: restart the shards and continue from the last checkpoint
        (every shard reloads its part, so the model is consistent), or from the start without one."""
        log.warning("%s: restarting the server shards from the last checkpoint", err)
        self.runtime.recover()
        if not self.resume():
            self.progress = Progress()
            log.warning("no checkpoint yet: training again from the start")

    def init_from(self, run_dir: str | Path, tensors: dict[str, torch.Tensor], state: dict[str, Any],
                  growth: Growth | None = None) -> None:
        """Start from another run's final parameters (a job switching strategy between periods), laid
        out on this run's data by ``cadence.training.grow`` (``growth``: what it matched and added)."""
        try:
            self.runtime.load_state(tensors, state, counters=False)
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"{run_dir}: its model does not match this run's ({err})") from None
        if growth is None:
            log.info("initialised from %s (%s)", run_dir, state.get("runtime", "?"))
            return
        self.notes["init_from"] = growth.summary()
        log.info("%s", growth.line())

    def _restore_best(self) -> None:
        tensors, state = ckpt.load_checkpoint(ckpt.checkpoint_root(self.run.path) / "best", tables=False)
        self.runtime.load_state(tensors, state, counters=False)
        log.info("restored the best model (epoch %d, valid %s %.4f)", self.progress.best_epoch,
                 self.task.primary_metric, self.progress.best_value)

    def _bar_disabled(self) -> bool | None:
        return None if self.config.progress else True  # None: tqdm shows bars only on a terminal
