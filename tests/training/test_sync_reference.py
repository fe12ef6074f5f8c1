"""The synchronous pipeline (store pull -> unique rows -> compute -> store set) against a naive
reference that trains a full table with per-row Python updates and no store at all."""

from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.data.datasets import load_graph
from cadence.data.triples import with_reciprocals
from cadence.models.kge import KgeModel
from cadence.core.batch import plan_epoch
from cadence.seeding import derive_seed
from cadence.tasks.kge import negative_chunk
from tests.conftest import make_config


def naive_training(config, graph, initial_entities: torch.Tensor):
    train = with_reciprocals(graph.train, graph.num_relations) if config.train.reciprocal else graph.train
    num_relations = graph.num_relations * (2 if config.train.reciprocal else 1)
    model = KgeModel(config, num_relations)  # same seeded relation init as the run
    if config.optimizer.dense == "adam":
        relation_optimizer = torch.optim.Adam([model.relations], lr=config.optimizer.lr)
    else:
        relation_optimizer = torch.optim.Adagrad([model.relations], lr=config.optimizer.lr, eps=config.optimizer.eps)
    entities = initial_entities.clone()
    width = 1 if config.optimizer.entity == "rowwise_adagrad" else entities.shape[1]
    state = torch.zeros(entities.shape[0], width)
    for epoch in range(config.train.epochs):
        for plan in plan_epoch(train.shape[0], config.train.batch_size, config.seed, epoch):
            h, r, t = train[plan.examples].unbind(1)
            negatives = None
            if config.train.scoring == "sampled":  # shared by the batch, or per chunk of edges (softmax's auto)
                chunks = -(-plan.size // (negative_chunk(config.train) or plan.size))
                negatives = torch.randint(graph.num_entities, (chunks * config.train.negatives,),
                                          generator=plan.generator(config.seed))
            table = entities.clone().requires_grad_(True)
            loss = model.loss(table, h, r, t, negatives if negatives is None or chunks == 1
                              else negatives.view(chunks, config.train.negatives))
            relation_optimizer.zero_grad()
            loss.backward()
            relation_optimizer.step()
            if negatives is None:  # every entity is a candidate, so every row has a gradient
                touched = list(range(graph.num_entities))
            else:
                touched = torch.cat([h, t, negatives]).unique().tolist()
            for row in touched:  # one row at a time, as the definition reads
                g = table.grad[row]
                state[row] += (g * g).mean() if width == 1 else g * g
                entities[row] -= config.optimizer.lr * g / (state[row].sqrt() + config.optimizer.eps)
    return entities, model.relations.detach()


@pytest.mark.parametrize("overrides", [
    ["model.name=distmult", "train.loss=logistic"],
    ["model.name=complex", "train.reciprocal=true", "train.regularizer=n3", "train.reg_weight=0.01"],
    ["model.name=transe", "train.scoring=all", "optimizer.entity=adagrad"],
    ["model.name=rotate", "train.loss=softmax", "train.regularizer=l2", "train.reg_weight=0.01",
     "optimizer.dense=adam"],
])
def test_sync_pipeline_equals_naive_full_table_training(tiny_graph: Path, tmp_path: Path, overrides) -> None:
    config = make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "eval.every=0", "eval.test=false",
                         "model.init_std=0.3", *overrides)
    graph = load_graph(config.data, config.seed)
    result = api.train(config)
    tensors, _ = api.final_checkpoint(api.RunDirectory(result.run_dir))
    initial = torch.empty(graph.num_entities, config.model.dim)
    generator = torch.Generator().manual_seed(derive_seed(derive_seed(config.seed, "entities"), "store-init", 0))
    initial.copy_(torch.randn(graph.num_entities, config.model.dim, generator=generator) * config.model.init_std)
    expected_entities, expected_relations = naive_training(config, graph, initial)
    assert torch.allclose(tensors["table.values"], expected_entities, atol=1e-5, rtol=1e-4)
    assert torch.allclose(tensors["dense.relations"], expected_relations, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(initial, expected_entities), "training moved the embeddings"
