"""``train.negative_pool``: sampled negatives come from the entities on a training edge (``edges``, as
PyTorch-BigGraph's importer keeps only those), or from every entity (``all``); ``auto`` (the default)
picks by the loss, once, and config.yaml records it."""

from __future__ import annotations

import pytest
import torch
import yaml

from cadence import api
from tests.conftest import make_config

from cadence.config import load_config
from cadence.errors import ConfigError
from cadence.data.triples import KnowledgeGraph
from cadence.tasks.kge import KgeTask


def graph(entities: int) -> KnowledgeGraph:
    """300 training edges among ``entities`` entities (of 500 ids: the rest on no edge)."""
    g = torch.Generator().manual_seed(0)
    triples = torch.stack([torch.randint(0, entities, (400,), generator=g), torch.randint(0, 3, (400,), generator=g),
                           torch.randint(0, entities, (400,), generator=g)], 1)
    return KnowledgeGraph("tiny", 500, 3, triples[:300], triples[300:350], triples[350:])


def negatives(task: KgeTask, epochs: int = 3) -> torch.Tensor:
    """Every sampled negative's entity id over ``epochs`` epochs."""
    drawn = []
    for epoch in range(epochs):
        for plan in task.plan(epoch):
            batch = task.prepare(plan)
            drawn.append(batch.ids[task.edge_positions(batch)["candidates"].reshape(-1)])
    return torch.cat(drawn)


def task(g: KnowledgeGraph, *overrides: str) -> KgeTask:
    config = load_config(None, ["model.name=distmult", "model.dim=4", "train.negatives=16", "train.batch_size=25",
                                *overrides])
    return KgeTask(config, g)


@pytest.mark.parametrize("chunk", ["0", "5"])
def test_negatives_come_from_the_entities_on_training_edges(chunk: str) -> None:
    g = graph(500)
    on_edges = set(torch.unique(g.train[:, [0, 2]]).tolist())  # (the reference: a set, by hand)
    assert len(on_edges) < 500
    drawn = negatives(task(g, f"train.negative_chunk={chunk}", "train.negative_pool=edges"), epochs=20)
    assert set(drawn.tolist()) == on_edges  # only those, and (over 20 epochs of draws) every one of them
    everywhere = set(negatives(task(g, f"train.negative_chunk={chunk}", "train.negative_pool=all")).tolist())
    assert everywhere - on_edges  # all: entities on no edge are drawn too


def test_the_pool_is_drawn_uniformly() -> None:
    g = graph(500)
    drawn = negatives(task(g, "train.negative_pool=edges"), epochs=20)
    counts = torch.bincount(drawn, minlength=500)
    pool = torch.unique(g.train[:, [0, 2]])
    expected = drawn.shape[0] / pool.shape[0]
    # each entity's count within 5 standard deviations of a uniform draw's (binomial), none outside the pool
    assert (counts[pool].double() - expected).abs().max() < 5 * expected ** 0.5
    assert counts.sum() == counts[pool].sum()


def test_where_every_entity_is_on_an_edge_the_draws_are_those_of_all_bit_for_bit() -> None:
    g = graph(60)  # 300 edges among 60 of 500 ids would leave some out: relabel to every id on an edge
    ids, compact = torch.unique(g.train[:, [0, 2]], return_inverse=True)
    train = torch.stack([compact[:, 0], g.train[:, 1], compact[:, 1]], 1)
    dense = KnowledgeGraph("dense", int(ids.shape[0]), 3, train, train[:10], train[10:20])
    for plan in task(dense).plan(0):
        edges = task(dense, "train.negative_pool=edges").prepare(plan)
        every = task(dense, "train.negative_pool=all").prepare(plan)
        assert edges.ids.equal(every.ids) and edges.inputs["positions"].equal(every.inputs["positions"])


def test_a_bad_pool_is_a_one_line_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="train.negative_pool") as raised:
        load_config(None, ["train.negative_pool=seen"])
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("loss, pool", [("logistic", "edges"), ("softmax", "all")])
def test_auto_picks_the_pool_by_the_loss_once_and_config_yaml_records_it(task_data, tmp_path, loss, pool) -> None:
    g = graph(500)
    on_edges = set(torch.unique(g.train[:, [0, 2]]).tolist())
    drawn = set(negatives(task(g, f"train.loss={loss}")).tolist())
    assert (drawn <= on_edges) == (pool == "edges")
    result = api.train(make_config(tmp_path / loss, *task_data["kge"], f"train.loss={loss}", "train.epochs=1",
                                   "eval.every=0", "eval.test=false"))
    assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["train"]["negative_pool"] == pool
