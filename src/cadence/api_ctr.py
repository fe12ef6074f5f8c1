"""``train`` for the click-through-rate task: data, model, server shards and mode composed into a
``CtrTrainer`` (the parameter-server runtime, GBA and its baselines)."""

from __future__ import annotations

from pathlib import Path

import torch

from cadence.config import Config
from cadence.errors import CheckpointError, ConfigError
from cadence.data.ctr import load_ctr_dataset
from cadence.models.ctr import CTR_MODELS
from cadence.optim import ENTITY_OPTIMIZERS, dense_optimizer
from cadence.runtime.embedding_table import DynamicEmbeddingTable
from cadence.runtime.engines import ENGINES
from cadence.runtime.server import ServerShard
from cadence.runtime.worker import Faults
from cadence.store.embedding_store import derive_seed
from cadence.strategies.parameter_server import PS_MODES
from cadence.training.ctr_trainer import CtrTrainer
from cadence.training.run_directory import RunDirectory, default_run_dir


def check_ctr_names(config: Config) -> None:
    PS_MODES.get(config.strategy)
    CTR_MODELS.get(config.model.name)
    ENTITY_OPTIMIZERS.get(config.optimizer.entity)
    ENGINES.get(config.ps.engine)
    Faults.parse(config.ps.stragglers, config.ps.kill_workers, config.ps.workers)


def train_ctr(config: Config, overwrite: bool = False):
    from cadence.api import TrainResult

    check_ctr_names(config)
    dataset = load_ctr_dataset(config.data.dataset, config.seed)
    splits = ctr_splits(config, dataset)
    if config.ctr.init_from and not Path(config.ctr.init_from, "checkpoints", "final").is_dir():
        raise CheckpointError(f"{config.ctr.init_from}: no final checkpoint to start from")
    if config.out is None:
        config.out = default_run_dir(dataset.name, config.model.name, config.strategy)
    run = RunDirectory(config.out)
    run.create(config, overwrite=overwrite)
    if config.threads:
        torch.set_num_threads(config.threads)
    trainer = build_ctr_trainer(config, dataset.name, splits,
                                len(dataset.field_names) + len(dataset.bag_names), len(dataset.dense_names), run)
    if config.ctr.init_from:
        trainer.load_checkpoint(config.ctr.init_from)
    summary = trainer.fit()
    run.write_summary(summary)
    return TrainResult(run.path, summary, run.read_metrics())


def ctr_splits(config: Config, dataset) -> dict:
    """A random 80/10/10 split, or time-ordered periods for continual training."""
    if config.ctr.split == "random":
        train, valid, test = dataset.random_split(config.seed)
        return {"train": train, "valid": valid, "test": test}
    periods = dataset.periods(config.ctr.num_periods)
    last = config.ctr.last_period if config.ctr.last_period >= 0 else len(periods) - 2
    if not 0 <= config.ctr.first_period <= last <= len(periods) - 2:
        raise ConfigError(f"ctr.first_period..ctr.last_period must lie in 0..{len(periods) - 2} (each trained "
                          f"period is evaluated on the next of {len(periods)}); got "
                          f"{config.ctr.first_period}..{config.ctr.last_period}")
    return {"periods": periods}


def build_ctr_trainer(config: Config, name: str, splits, num_fields: int, num_dense: int,
                      run: RunDirectory) -> CtrTrainer:
    mode = PS_MODES.get(config.strategy)
    if config.ps.engine == "ray":  # join (or start) the cluster before the first epoch; imports ray
        from cadence.runtime.ray_engine import connect

        connect(config.ps.ray_address, config.threads)
    torch.manual_seed(derive_seed(config.seed, "ctr-model"))
    model = CTR_MODELS.get(config.model.name)(num_fields, num_dense, config.model.dim,
                                             tuple(config.ctr.hidden), config.ctr.dropout)
    width = config.model.dim + 1  # embedding vector and linear weight
    optimizer_class = ENTITY_OPTIMIZERS.get(config.optimizer.entity)
    shards = []
    for index in range(config.ps.shards):
        table = DynamicEmbeddingTable(width, optimizer_class.state_width(width), config.model.init_std,
                                      derive_seed(config.seed, "ctr-table") & 0xFFFFFFFF)
        dense, dense_opt = (model, dense_optimizer(config.optimizer, list(model.parameters()))) if index == 0 else (None, None)
        shards.append(ServerShard(table, optimizer_class(config.optimizer), mode.aggregation(config.ps), dense, dense_opt))
    return CtrTrainer(config, name, splits, shards, model, mode, run)
