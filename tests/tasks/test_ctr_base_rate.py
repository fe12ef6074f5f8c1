"""NE's background CTR (``CtrTask.base_rate``): the mean label of the trained examples, computed at
the first evaluation and never by materialising a streamed data set."""

import pytest
import torch

from cadence.api import prepare_config
from cadence.config import load_config
from cadence.task_config import SyntheticCtrConfig
from cadence.data.synthetic_ctr import StreamCtrDataset
from cadence.tasks import ctr as ctr_task
from cadence.tasks.ctr import CtrTask

from tests.ps.ctr_helpers import small_data


def config():
    return prepare_config(load_config(None, ["task=ctr", "model.name=fm", "progress=false"]))


def test_the_base_rate_is_the_mean_training_label() -> None:
    dataset, _ = small_data()
    task = CtrTask(config(), dataset=dataset)
    assert task.base_rate == pytest.approx(float(task.splits["train"].labels.double().mean()), abs=1e-12)


def test_a_streamed_training_split_is_sampled_not_materialised(monkeypatch) -> None:
    stream = StreamCtrDataset(SyntheticCtrConfig(num_examples=42_000, num_fields=3, vocab_per_field=500, dim=2,
                                                 holdout=1000), seed=3)
    asked: list[int] = []
    subset = type(stream.parts[0]).subset

    def counted(self, index):
        asked.append(len(index))
        return subset(self, index)

    monkeypatch.setattr(type(stream.parts[0]), "subset", counted)
    monkeypatch.setattr(ctr_task, "BASE_RATE_SAMPLE", 4000)
    task = CtrTask(config(), dataset=stream)
    assert asked == []  # building the task (every Ray worker does) reads no example
    sampled = task.base_rate
    assert asked == [4000]  # 4,000 of the 40,000 training examples, evenly spaced
    exact = float(subset(stream.parts[0], torch.arange(40_000)).labels.double().mean())
    assert sampled == pytest.approx(exact, abs=0.03)
    assert task.base_rate == sampled and asked == [4000]  # once
