"""Small synthetic CTR runs shared by the runtime's tests (threads and Ray engines)."""

from pathlib import Path

import torch

from cadence.api_ctr import build_ctr_trainer
from cadence.config import load_config
from cadence.data.synthetic_ctr import synthetic_ctr
from cadence.training.run_directory import RunDirectory

EXAMPLES, BATCH = 960, 64  # 768 training examples: 12 batches per epoch


def small_data():
    dataset = synthetic_ctr(num_examples=EXAMPLES, num_fields=3, vocab_per_field=40, zipf_exponent=1.1, dim=4, seed=5)
    train, valid, test = dataset.random_split(0)
    return dataset, {"train": train, "valid": valid, "test": test}


def make_trainer(tmp_path: Path, *overrides: str):
    """(trainer, config, splits) for FM on the small data; overrides are dotted config items."""
    config = load_config(None, ["task=ctr", "model.name=fm", "model.dim=4", "model.init_std=0.1",
                                f"train.batch_size={BATCH}", "train.epochs=2", "eval.every=1", "progress=false",
                                "optimizer.lr=0.1", "optimizer.dense=adagrad", "threads=1", *overrides])
    dataset, splits = small_data()
    run = RunDirectory(tmp_path / "run")
    run.create(config, overwrite=True)
    fields = len(dataset.field_names) + len(dataset.bag_names)
    return build_ctr_trainer(config, dataset.name, splits, fields, len(dataset.dense_names), run), config, splits


def final_state(trainer) -> tuple[dict[int, torch.Tensor], dict[str, torch.Tensor]]:
    """Every shard's rows by feature key, and the dense parameters."""
    rows = {}
    for shard in trainer.router.shards:
        table = shard.table
        values = table.store.values[: table.size]
        rows.update({int(k): values[int(r)].clone() for k, r in zip(table.keys, table.rows_of_keys)})
    return rows, {name: value.clone() for name, value in trainer.model.state_dict().items()}
