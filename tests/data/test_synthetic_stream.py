"""The streaming synthetic CTR data: example i is a pure function of (seed, i), and it follows the
same planted model as the in-memory data set."""

import numpy as np
import torch

from cadence.task_config import SyntheticCtrConfig
from cadence.data.ctr import VALUE_BITS, field_of
from cadence.data.synthetic_ctr import StreamCtrDataset, planted_logits


def test_an_example_is_the_same_whichever_batch_asks_for_it() -> None:
    config = SyntheticCtrConfig(num_examples=5000, num_fields=3, vocab_per_field=1000, dim=2, holdout=500)
    train, valid, test = StreamCtrDataset(config, seed=4).random_split(0)
    assert (len(train), len(valid), len(test)) == (4000, 500, 500)
    whole = train.subset(torch.arange(4000))
    picked = train.subset(torch.tensor([3999, 17, 2]))
    assert torch.equal(picked.keys, whole.keys[[3999, 17, 2]]) and torch.equal(picked.labels, whole.labels[[3999, 17, 2]])
    again = StreamCtrDataset(config, seed=4).random_split(0)[0].subset(torch.tensor([17]))
    assert torch.equal(again.keys, whole.keys[[17]])
    assert not torch.equal(StreamCtrDataset(config, seed=5).parts[0].subset(torch.arange(50)).keys, whole.keys[:50])
    assert torch.equal(field_of(whole.keys), torch.arange(3).expand(4000, 3))
    values = whole.keys & ((1 << VALUE_BITS) - 1)
    assert int(values.min()) >= 0 and int(values.max()) < 1000
    assert not set(valid.subset(torch.arange(500)).timestamps.tolist()) & set(whole.timestamps.tolist())


def test_the_stream_follows_its_planted_model_and_its_zipf_law() -> None:
    config = SyntheticCtrConfig(num_examples=60_000, num_fields=4, vocab_per_field=5000, dim=2, holdout=100)
    examples = StreamCtrDataset(config, seed=1).parts[0].subset(torch.arange(59_800))
    probability = 1 / (1 + np.exp(-planted_logits(examples.keys.numpy(), 2, 1)))
    assert abs(float(examples.labels.mean()) - probability.mean()) < 0.01  # labels ~ Bernoulli(planted)
    counts = torch.bincount(examples.keys[:, 0] & ((1 << VALUE_BITS) - 1), minlength=5000).sort(descending=True).values
    assert counts[0] > 20 * counts[100]  # skewed: the head value is far more frequent than the 100th
