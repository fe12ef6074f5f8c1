"""A shard's optimizer step against a naive reference, and the token list's hand-out rule."""

import pytest
import torch
from torch import nn

from cadence.config import OptimizerConfig
from cadence.optim import RowwiseAdagrad
from cadence.ps.aggregation import Buffered, Gradient, PerStep
from cadence.store.embedding_table import DynamicEmbeddingTable
from cadence.ps.server import DataList, ServerShard


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


def test_a_decay_weight_scales_the_gradient_it_applies() -> None:
    from cadence.config import OptimizerConfig as Opt
    from cadence.optim import Sgd

    results = []
    for weight, rows in ((0.5, torch.tensor([[2.0, 2, 2]])), (1.0, torch.tensor([[1.0, 1, 1]]))):
        table = DynamicEmbeddingTable(width=3, state_width=0, init_std=0.1, seed=0)
        torch.manual_seed(0)
        dense = nn.Linear(1, 1, bias=False)
        shard = ServerShard(table, Sgd(Opt(lr=0.1)), Buffered(capacity=1),
                            dense, torch.optim.SGD(dense.parameters(), lr=0.1))
        g = Gradient(0, 0, 0, 1, torch.tensor([7]), rows, {"weight": rows[:, :1].clone()})
        g.weight = weight
        with shard.changed:
            shard.apply([g], 1.0)
        results.append((shard.pull_rows(torch.tensor([7])).clone(), dense.weight.detach().clone()))
    assert torch.allclose(results[0][0], results[1][0]) and torch.allclose(results[0][1], results[1][1])


class SteppingShard:
    """What a fresh-token data list reads of a shard: its global step; close_token recorded."""

    def __init__(self):
        self.global_step = 0
        self.closed = []

    def get_global_step(self):
        return self.global_step

    def wait_for_step(self, step):
        assert self.global_step >= step, "would block"

    def close_token(self, token, handed_out):
        self.closed.append((token, handed_out))

    def drop(self, token):
        pass


def test_fresh_tokens_give_each_worker_one_batch_of_the_current_step() -> None:
    shard = SteppingShard()
    data = DataList(list(range(8)), per_token=3, first_token=0, shards=[shard], workers=3, fresh_tokens=True)
    assert [data.take(w)[2] for w in range(3)] == [0, 0, 0]
    assert shard.closed == [(0, 3)]  # every live worker holds a batch of step 0
    with pytest.raises(AssertionError, match="would block"):
        data.take(0)  # its next batch waits until step 0 is applied
    shard.global_step = 1  # step 0 applied with the first two gradients; worker 2 is late
    assert data.take(0)[2] == 1 and data.take(1)[2] == 1
    shard.global_step = 2  # step 1 applied: the late worker 2 takes a batch of step 2, not of step 1
    assert data.take(2)[2] == 2
    data.abandon(1)  # worker 1 dies holding nothing: step 2 waits for workers 0 and 2 only
    assert data.take(0)[2] == 2 and shard.closed[-1] == (2, 2)
    shard.global_step = 3
    assert data.take(0)[2] == 3  # the last batch
    assert data.take(2) is None and shard.closed[-1] == (3, 1)  # the data ran out: close with what was handed out


@pytest.mark.parametrize("rows", [0, 2])
def test_a_fixed_table_with_fewer_keys_than_shards_gives_the_extra_shards_none(rows: int) -> None:
    """(The image task has 0 rows; a tiny key space on many shards has shards that own nothing.)"""
    from cadence.store.embedding_table import FixedTable
    from cadence.tasks.base import TableSpec

    spec = TableSpec(rows, 3, 0.1, 0)
    tables = [FixedTable(spec, 1, shard, 4) for shard in range(4)]
    keys = torch.cat([table.export_rows()[0] for table in tables])
    assert sorted(keys.tolist()) == list(range(rows))
    assert [len(table) for table in tables] == [1 if shard < rows else 0 for shard in range(4)]


@pytest.mark.parametrize("rule", ["gba", "hop_bw"])
def test_the_summary_says_whose_gradients_were_dropped_and_how_stale(rule: str) -> None:
    # tokens pushed at global step 0, 1, 2 ... ; worker 3 pushes late (token 0 while the step is 2)
    shard = make_shard(Buffered(capacity=2, tolerance=1) if rule == "gba" else PerStep(quorum=2))
    pushes = [(0, 0, 0), (1, 1, 0), (0, 2, 1), (1, 3, 1), (3, 4, 0), (0, 5, 2)]
    for worker, batch, token in pushes:
        shard.push(Gradient(worker, batch, token, 1, torch.tensor([batch]), torch.ones(1, 3)))
    stats = shard.stats()
    # gba: steps (0,1) at 0, (2,3) at 1; then (4: token 0, 5: token 2) at step 2: 4 is 2 stale > 1, dropped
    # hop_bw: steps 0 and 1 by quorum; token 0 at step 2 was applied without it: dropped as late
    assert stats["dropped_by_worker"] == {"3": 1} and stats["token_staleness_dropped"] == {"2": 1}
    assert stats["applied_by_worker"] == ({"0": 3, "1": 2} if rule == "gba" else {"0": 2, "1": 2})
    assert stats["token_staleness_kept"] == ({"0": 5} if rule == "gba" else {"0": 4})
    assert stats["gradients_dropped"] == 1
