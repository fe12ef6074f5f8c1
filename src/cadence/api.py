"""The Python API; the CLI is a thin layer over these functions.

    result = cadence.train(cadence.load_config("configs/umls-complex.yaml"))
    result.summary["mrr"]

``train`` validates everything it can (config, registry names, data) before it creates the run
directory, so a user's mistake leaves no partial output behind.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from cadence.config import Config, load_config
from cadence.data.datasets import load_graph
from cadence.data.triples import KnowledgeGraph, with_reciprocals, write_id_maps
from cadence.errors import CadenceError, ConfigError
from cadence.models.kge import KgeModel
from cadence.models.scorers import SCORERS
from cadence.optim import ENTITY_OPTIMIZERS, dense_optimizer
from cadence.pipeline.stages import ComputeStage, LoadStage, Stages, TransferStage, WriteStage
from cadence.store.embedding_store import create_store, derive_seed
from cadence.strategies import STRATEGIES
from cadence.training import checkpoint as ckpt
from cadence.training.batch_order import BatchOrder
from cadence.training.run_directory import RunDirectory, default_run_dir, write_atomic  # noqa: F401  (re-exported)
from cadence.training.trainer import Trainer, TrainerHook

log = logging.getLogger("cadence")

RESUMABLE_KEYS = {"train.epochs", "progress", "threads", "device"}


@dataclass
class TrainResult:
    run_dir: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]


def train(config: Config, overwrite: bool = False, hooks: Iterable[TrainerHook] = ()) -> TrainResult:
    """Train from scratch into ``config.out`` (default: ``runs/<dataset>-<model>-<strategy>-<time>``)."""
    if config.task == "ctr":
        from cadence.api_ctr import train_ctr

        return train_ctr(config, overwrite)
    _check_names(config)
    graph = load_graph(config.data, config.seed)
    if config.batch_order:
        edges = graph.train.shape[0] * (2 if config.train.reciprocal else 1)
        BatchOrder.load(config.batch_order).check(-(-edges // config.train.batch_size), config.train.epochs)
    if config.out is None:
        config.out = default_run_dir(graph.name, config.model.name, config.strategy)
    run = RunDirectory(config.out)
    run.create(config, overwrite=overwrite)
    write_id_maps(graph, run.path)
    trainer = build_trainer(config, graph, run, hooks)
    return _fit(trainer, run)


def resume(run_dir: str | Path, overrides: dict[str, Any] | None = None,
           hooks: Iterable[TrainerHook] = ()) -> TrainResult:
    """Continue the run in ``run_dir`` from its newest valid checkpoint."""
    run = RunDirectory(run_dir)
    config = run.load_config()
    _require_kge(config, run, "--resume", "start a new run from it with --init-from RUN_DIR")
    if overrides:
        unsupported = sorted(set(overrides) - RESUMABLE_KEYS)
        if unsupported:
            raise ConfigError(f"--resume uses the run's config.yaml; {', '.join(unsupported)} cannot be "
                              f"changed (only {', '.join(sorted(RESUMABLE_KEYS))})")
        items = [f"{k}={v}" for k, v in overrides.items()]
        config = load_config(run.config_path, items)
    _check_names(config)
    graph = load_graph(config.data, config.seed)
    trainer = build_trainer(config, graph, run, hooks)
    if not trainer.resume():
        log.warning("%s has no checkpoint yet: training from the start", run.path)
    if overrides:
        write_atomic(run.config_path, config.to_yaml())
    return _fit(trainer, run)


def compare(config: Config, strategies: list[str], out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Train the same config (seed, data, hyperparameters) under each strategy, side by side.

    Writes ``out/<strategy>/`` run directories, ``out/comparison.json`` (each strategy's summary and
    validation curve), ``out/time_to_accuracy.png`` and ``out/accuracy_per_epoch.png``.
    """
    import copy
    import json

    from cadence.report.plots import plot_curves

    if not strategies:
        raise ConfigError("compare needs at least one strategy")
    for name in strategies:
        strategy_registry(config.task).get(name)
    if len(set(strategies)) != len(strategies):
        raise ConfigError(f"a strategy is listed twice: {','.join(strategies)}")
    _check_names(config)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise CadenceError(f"{out}: the comparison directory is not empty; use --overwrite or another --out")
    results: dict[str, Any] = {}
    for name in strategies:
        run_config = copy.deepcopy(config)
        run_config.strategy = name
        run_config.out = str(out / name)
        result = train(run_config, overwrite=overwrite)
        results[name] = {"summary": result.summary,
                         "curve": [r for r in result.metrics if r["split"] == "valid"]}
    comparison = {"config": config.to_dict(), "strategies": results}
    write_atomic(out / "comparison.json", json.dumps(comparison, indent=2) + "\n")
    curves = {name: entry["curve"] for name, entry in results.items()}
    dataset = results[strategies[0]]["summary"]["dataset"]
    title = f"{dataset}, {config.model.name}"
    metric = "auc" if config.task == "ctr" else "mrr"
    plot_curves(curves, metric, "wall_seconds", "training wall seconds", title, out / "time_to_accuracy.png")
    plot_curves(curves, metric, "epoch", "epoch", title, out / "accuracy_per_epoch.png")
    return comparison


def _require_kge(config: Config, run: RunDirectory, verb: str, instead: str) -> None:
    if config.task != "kge":
        raise CadenceError(f"{run.path}: {verb} supports knowledge-graph runs; this is a {config.task} run "
                           f"({instead})")


def _fit(trainer: Trainer, run: RunDirectory) -> TrainResult:
    try:
        summary = trainer.fit()
    finally:
        trainer.strategy.close()
    run.write_summary(summary)
    return TrainResult(run.path, summary, run.read_metrics())


def strategy_registry(task: str):
    """Strategies of the KGE pipeline, or parameter-server modes of the CTR task."""
    if task == "ctr":
        from cadence.strategies.parameter_server import PS_MODES

        return PS_MODES
    return STRATEGIES


def _check_names(config: Config) -> None:
    if config.task == "ctr":
        from cadence.api_ctr import check_ctr_names

        check_ctr_names(config)
        return
    STRATEGIES.get(config.strategy)
    SCORERS.get(config.model.name)(config.model)  # also validates dim parity and model options
    ENTITY_OPTIMIZERS.get(config.optimizer.entity)
    resolve_device(config.device)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device: {name!r} is not a device (auto, cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device: {name!r} was asked for, but no CUDA device is available")
    return device


def build_trainer(config: Config, graph: KnowledgeGraph, run: RunDirectory,
                  hooks: Iterable[TrainerHook] = ()) -> Trainer:
    """Compose store, model, optimizers, stages and strategy for one run."""
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    num_relations = graph.num_relations
    train_triples = graph.train
    if config.train.reciprocal:
        train_triples = with_reciprocals(graph.train, graph.num_relations)
        num_relations *= 2
    optimizer_class = ENTITY_OPTIMIZERS.get(config.optimizer.entity)
    store_path = config.store.path or str(run.path / "store")
    store = create_store(graph.num_entities, config.model.dim, optimizer_class.state_width(config.model.dim),
                         config.store.backend, store_path if config.store.backend == "mmap" else None)
    store.initialize(config.model.init_std, derive_seed(config.seed, "entities"))
    model = KgeModel(config, num_relations).to(device)
    dense = dense_optimizer(config.optimizer, [model.relations])
    negatives = None if config.train.scoring == "all" else config.train.negatives
    stages = Stages(
        load=LoadStage(store, train_triples, config.seed, negatives),
        to_device=TransferStage(device),
        compute=ComputeStage(model, optimizer_class(config.optimizer), dense),
        to_host=TransferStage(torch.device("cpu")),
        write=WriteStage(store),
    )
    strategy = STRATEGIES.get(config.strategy)(config)
    return Trainer(config, graph, train_triples, store, model, dense, stages, strategy, run, device, hooks)


def final_checkpoint(run: RunDirectory) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model a finished run reports on: the best one under early stopping, else the newest."""
    best = ckpt.checkpoint_root(run.path) / "best"
    if best.is_dir():
        return ckpt.load_checkpoint(best)
    found = ckpt.load_latest(run.path)
    if found is None:
        raise CadenceError(f"{run.path}: the run has no checkpoint to load")
    return found[0], found[1]


def evaluate(run_dir: str | Path, split: str = "test") -> dict[str, float]:
    """Filtered ranking metrics of a run's final model on ``split``."""
    if split not in ("train", "valid", "test"):
        raise ConfigError(f"split must be train, valid or test, got {split!r}")
    run = RunDirectory(run_dir)
    config = run.load_config()
    _require_kge(config, run, "eval", "its summary.json and metrics.jsonl hold its AUC and logloss")
    config.store.backend = "memory"  # never touch the run's own table files
    graph = load_graph(config.data, config.seed)
    trainer = build_trainer(config, graph, run)
    tensors, state = final_checkpoint(run)
    trainer.load_state(tensors, state)
    return trainer._evaluate_split(split)


def export(run_dir: str | Path, out: str | Path, format: str = "npy") -> list[Path]:
    """Write entity and relation embeddings (and id maps) of a run's final model."""
    if format != "npy":
        raise ConfigError(f"export format {format!r} is not supported (npy)")
    run = RunDirectory(run_dir)
    _require_kge(run.load_config(), run, "export", "its tables are in checkpoints/final/tensors.safetensors")
    tensors, _ = final_checkpoint(run)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, key in (("entity_embeddings.npy", "store.values"), ("relation_embeddings.npy", "model.relations")):
        np.save(out / name, tensors[key].numpy())
        written.append(out / name)
    for name in ("entity_ids.tsv", "relation_ids.tsv"):
        if (run.path / name).exists():
            shutil.copyfile(run.path / name, out / name)
            written.append(out / name)
    return written
