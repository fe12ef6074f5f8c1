"""Small synthetic CTR runs shared by the runtime's tests (threads and Ray engines)."""

from pathlib import Path

import torch

from cadence.api import build_trainer, prepare_config
from cadence.config import load_config
from cadence.data.synthetic_ctr import synthetic_ctr
from cadence.tasks.ctr import CtrTask
from cadence.training.run_directory import RunDirectory

EXAMPLES, BATCH = 960, 64  # 768 training examples: 12 batches per epoch


def small_data():
    dataset = synthetic_ctr(num_examples=EXAMPLES, num_fields=3, vocab_per_field=40, zipf_exponent=1.1, dim=4, seed=5)
    train, valid, test = dataset.random_split(0)
    return dataset, {"train": train, "valid": valid, "test": test}


def make_trainer(tmp_path: Path, *overrides: str):
    """(trainer, config, splits) for FM on the small data; overrides are dotted config items."""
    config = prepare_config(load_config(None, [
        "task=ctr", "model.name=fm", "model.dim=4", "model.init_std=0.1", f"train.batch_size={BATCH}",
        "train.epochs=2", "eval.every=1", "progress=false", "optimizer.lr=0.1", "optimizer.dense=adagrad",
        "threads=1", *overrides]))
    dataset, splits = small_data()
    task = CtrTask(config, dataset=dataset)
    run = RunDirectory(tmp_path / "run")
    run.create(config, overwrite=True)
    return build_trainer(config, task, run), config, task.splits or splits


def final_state(trainer) -> tuple[dict[int, torch.Tensor], dict[str, torch.Tensor]]:
    """Every row by feature key, and the dense parameters (whichever runtime trained them)."""
    tensors = trainer.runtime.table_tensors()
    rows = {int(k): v.clone() for k, v in zip(tensors["table.keys"], tensors["table.values"])}
    return rows, {name: value.clone() for name, value in trainer.runtime.dense().state_dict().items()}
