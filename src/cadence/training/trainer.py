"""The training loop, visible top to bottom.

    for each epoch:
        plan the epoch's batches (a pure function of seed and epoch)
        strategy.run_epoch(plans, stages)     <- the only place strategies differ
        validate every eval.every epochs      -> metrics.jsonl, early stopping
        checkpoint every checkpoint.every epochs
    test, summary.json

Hooks (``TrainerHook``) observe batches, epochs and evaluations without copying the loop.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
from tqdm.auto import tqdm

from cadence.config import Config
from cadence.data.triples import KnowledgeGraph
from cadence.evaluation.ranking import FilteredRankingMetric
from cadence.models.kge import KgeModel
from cadence.pipeline.batch import Batch, plan_epoch
from cadence.pipeline.stages import Stages
from cadence.store.embedding_store import EmbeddingStore, derive_seed
from cadence.strategies.base import Strategy
from cadence.training import checkpoint as ckpt
from cadence.training.batch_order import BatchOrder, ComputationOrderRecorder
from cadence.training.run_directory import RunDirectory

log = logging.getLogger("cadence")


class TrainerHook:
    """Named hook points; override the ones you need."""

    def on_batch_end(self, trainer: "Trainer", batch: Batch) -> None: ...

    def on_epoch_end(self, trainer: "Trainer", epoch: int) -> None: ...

    def on_evaluation(self, trainer: "Trainer", record: dict[str, Any]) -> None: ...


@dataclass
class Progress:
    """What the trainer has done so far: saved in every checkpoint, restored on resume."""

    epoch: int = 0  # epochs completed
    triples_seen: int = 0  # training triples processed (reciprocal copies included)
    train_seconds: float = 0.0  # wall seconds inside run_epoch (evaluation, checkpoints excluded)
    best_mrr: float = -1.0
    best_epoch: int = 0
    stale_validations: int = 0  # validations since the best one (early stopping)
    history: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl records


class Trainer:
    def __init__(self, config: Config, graph: KnowledgeGraph, train_triples: torch.Tensor,
                 store: EmbeddingStore, model: KgeModel, dense_optimizer: torch.optim.Optimizer,
                 stages: Stages, strategy: Strategy, run: RunDirectory, device: torch.device,
                 hooks: Iterable[TrainerHook] = ()):
        self.config = config
        self.graph = graph
        self.train_triples = train_triples
        self.store = store
        self.model = model
        self.dense_optimizer = dense_optimizer
        self.stages = stages
        self.strategy = strategy
        self.run = run
        self.device = device
        self.hooks = list(hooks)
        self.batch_order = BatchOrder.load(config.batch_order) if config.batch_order else None
        if config.record_order:
            self.hooks.append(ComputationOrderRecorder(Path(config.record_order)))
        self.progress = Progress()
        self.metric = FilteredRankingMetric(graph, config.train.reciprocal)
        # a reciprocal run trains each edge twice per epoch; examples count edges, not copies
        self.copies_per_edge = train_triples.shape[0] // max(1, graph.train.shape[0])

    # ---- the loop -------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        cfg = self.config
        for epoch in range(self.progress.epoch, cfg.train.epochs):
            plans = plan_epoch(self.train_triples.shape[0], cfg.train.batch_size, cfg.seed, epoch)
            if self.batch_order is not None:
                plans = self.batch_order.reorder(plans)
            loss = self._run_epoch(epoch, plans)
            self.progress.epoch = epoch + 1
            for hook in self.hooks:
                hook.on_epoch_end(self, self.progress.epoch)
            stop = False
            if cfg.eval.every and self.progress.epoch % cfg.eval.every == 0:
                stop = self._validate(loss)
            last = stop or self.progress.epoch == cfg.train.epochs
            if cfg.checkpoint.every and (self.progress.epoch % cfg.checkpoint.every == 0 or last):
                self.save_checkpoint()
            if stop:
                log.info("early stopping: valid MRR has not improved for %d validations", cfg.eval.patience)
                break
        if cfg.eval.patience and self.progress.best_epoch:
            self._restore_best()
        test = self._evaluate_split("test") if cfg.eval.test else {}
        if test:
            self._record("test", test, loss=None)
        self.run.write_metrics(self.progress.history)
        return self.summary(test)

    def _run_epoch(self, epoch: int, plans) -> float:
        total_loss = torch.zeros(())
        bar = tqdm(total=len(plans), desc=f"epoch {epoch + 1}/{self.config.train.epochs}",
                   unit="batch", leave=False, disable=self._bar_disabled())

        def on_batch(batch: Batch) -> None:
            nonlocal total_loss
            self.progress.triples_seen += batch.size
            total_loss += batch.loss.cpu() * batch.size
            bar.update(1)
            for hook in self.hooks:
                hook.on_batch_end(self, batch)

        started = time.perf_counter()
        self.strategy.run_epoch(plans, self.stages, on_batch)
        self.progress.train_seconds += time.perf_counter() - started
        bar.close()
        return float(total_loss) / max(1, sum(p.triple_ids.shape[0] for p in plans))

    # ---- evaluation -----------------------------------------------------------------------------
    def _validate(self, loss: float) -> bool:
        metrics = self._evaluate_split("valid")
        record = self._record("valid", metrics, loss)
        mrr = metrics["mrr"]
        if mrr > self.progress.best_mrr:
            self.progress.best_mrr, self.progress.best_epoch = mrr, self.progress.epoch
            self.progress.stale_validations = 0
            if self.config.eval.patience:
                self.save_checkpoint(name="best")
        else:
            self.progress.stale_validations += 1
        log.info("epoch %d/%d  loss %.4f  valid mrr %.4f  hits@10 %.4f  (%.1f s training)",
                 self.progress.epoch, self.config.train.epochs, loss, mrr, metrics["hits@10"],
                 record["wall_seconds"])
        return bool(self.config.eval.patience) and self.progress.stale_validations >= self.config.eval.patience

    def _evaluate_split(self, split: str) -> dict[str, float]:
        triples = self.graph.split(split)
        limit = self.config.eval.max_triples
        if limit and triples.shape[0] > limit:
            generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "eval-subset", split))
            triples = triples[torch.randperm(triples.shape[0], generator=generator)[:limit]]
        self.model.eval()
        entities = self.store.values.to(self.device)

        def progress(steps: Iterable) -> Iterable:
            return tqdm(steps, desc=f"eval {split}", unit="batch", leave=False, disable=self._bar_disabled())

        metrics = self.metric(self.model, entities, triples.to(self.device), progress)
        self.model.train()
        return metrics

    def _record(self, split: str, metrics: dict[str, float], loss: float | None) -> dict[str, Any]:
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

    # ---- results --------------------------------------------------------------------------------
    @property
    def examples_seen(self) -> int:
        return self.progress.triples_seen // self.copies_per_edge

    def summary(self, test: dict[str, float]) -> dict[str, Any]:
        seconds = self.progress.train_seconds
        return {
            "strategy": self.config.strategy,
            "dataset": self.graph.name,
            "model": self.config.model.name,
            "epochs": self.progress.epoch,
            "train_seconds": round(seconds, 4),
            "examples_seen": self.examples_seen,
            "examples_per_second": self.examples_seen / seconds if seconds > 0 else 0.0,
            "best_valid_mrr": self.progress.best_mrr if self.progress.best_epoch else None,
            "best_epoch": self.progress.best_epoch or None,
            **self.strategy.stats(),
            **test,
        }

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, name: str | None = None) -> None:
        optimizer_tensors, optimizer_meta = ckpt.flatten_optimizer(self.dense_optimizer)
        tensors = {f"store.{k}": v for k, v in self.store.tensors().items()}
        tensors["model.relations"] = self.model.relations.detach()
        tensors.update(optimizer_tensors)
        state = {"progress": self.progress.__dict__, "dense_optimizer": optimizer_meta}
        keep = self.config.checkpoint.keep if name is None else None
        ckpt.save_checkpoint(self.run.path, name or ckpt.epoch_name(self.progress.epoch), tensors, state, keep=keep)

    def load_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        self.store.load_tensors({k[len("store."):]: v for k, v in tensors.items() if k.startswith("store.")})
        with torch.no_grad():
            self.model.relations.copy_(tensors["model.relations"])
        ckpt.restore_optimizer(self.dense_optimizer, tensors, state["dense_optimizer"])
        self.progress = Progress(**state["progress"])

    def resume(self) -> bool:
        """Continue from the newest valid checkpoint, if any; returns whether one was loaded."""
        found = ckpt.load_latest(self.run.path)
        if found is None:
            return False
        tensors, state, path = found
        self.load_state(tensors, state)
        self.run.write_metrics(self.progress.history)  # drop records written after the checkpoint
        log.info("resumed from %s (epoch %d)", path, self.progress.epoch)
        return True

    def _restore_best(self) -> None:
        tensors, state = ckpt.load_checkpoint(ckpt.checkpoint_root(self.run.path) / "best")
        progress = self.progress
        self.load_state(tensors, state)
        self.progress = progress  # keep the full history and counters of the run
        log.info("restored the best model (epoch %d, valid mrr %.4f)", progress.best_epoch, progress.best_mrr)

    def _bar_disabled(self) -> bool | None:
        return None if self.config.progress else True  # None: tqdm shows bars only on a terminal

