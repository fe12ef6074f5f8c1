"""A shard's optimizer step against a naive reference, and the token list's hand-out rule."""

import torch
from torch import nn

from cadence.config import OptimizerConfig
from cadence.optim import RowwiseAdagrad
from cadence.runtime.aggregation import Buffered, Gradient, PerStep
from cadence.runtime.embedding_table import DynamicEmbeddingTable
from cadence.runtime.server import DataList, ServerShard


def make_shard(aggregation, dense=None):
    table = DynamicEmbeddingTable(width=3, state_width=1, init_std=0.1, seed=0)
    optimizer = torch.optim.SGD(dense.parameters(), lr=0.5) if dense is not None else None
    return ServerShard(table, RowwiseAdagrad(OptimizerConfig(lr=0.2)), aggregation, dense, optimizer)


def test_a_step_sums_per_key_normalises_and_applies_rowwise_adagrad() -> None:
    dense = nn.Linear(2, 1, bias=False)
    shard = make_shard(Buffered(capacity=2), dense)
    keys = torch.tensor([10, 11, 12])
    before = shard.pull_rows(keys).clone()
    weight_before = dense.weight.detach().clone()
    g1 = Gradient(0, 0, 0, 4, torch.tensor([10, 11]), torch.tensor([[1.0, 2, 3], [4, 5, 6]]), {"weight": torch.ones(1, 2)})
    g2 = Gradient(1, 1, 0, 4, torch.tensor([11, 12]), torch.tensor([[1.0, 1, 1], [2, 2, 2]]), {"weight": torch.full((1, 2), 3.0)})
    shard.push(g1)
    assert torch.equal(shard.pull_rows(keys), before)  # buffered, not applied yet
    shard.push(g2)
    summed = {10: torch.tensor([1.0, 2, 3]) / 2, 11: torch.tensor([5.0, 6, 7]) / 2, 12: torch.tensor([2.0, 2, 2]) / 2}
    after = shard.pull_rows(keys)
    for i, key in enumerate([10, 11, 12]):
        g = summed[key]
        state = (g * g).mean()
        assert torch.allclose(after[i], before[i] - 0.2 * g / (state.sqrt() + 1e-10))
    assert torch.allclose(dense.weight, weight_before - 0.5 * torch.full((1, 2), 2.0))
    stats = shard.stats()
    assert stats["global_steps"] == 1 and stats["gradients_applied"] == 2 and stats["vocabulary_added"] == 3


def test_data_list_hands_out_tokens_and_closes_them() -> None:
    shard = make_shard(PerStep())
    closed = []
    shard.close_token = lambda token, handed: closed.append((token, handed))
    data = DataList([torch.tensor([j]) for j in range(7)], per_token=3, first_token=4, shards=[shard])
    taken = []
    while (item := data.take()) is not None:
        taken.append((item[0], item[2]))
    assert taken == [(0, 4), (1, 4), (2, 4), (3, 5), (4, 5), (5, 5), (6, 6)]
    assert closed == [(4, 3), (5, 3), (6, 1)]
