"""PyTorch-BigGraph-style chunked negatives (``train.negative_chunk``): each chunk of edges of a batch
draws its own negatives; the loss against a naive per-edge reference, and the shared default unchanged."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cadence.config import load_config
from cadence.core.batch import BatchPlan
from cadence.data.triples import KnowledgeGraph
from cadence.models.kge import KgeModel
from cadence.tasks.kge import KgeTask


def graph() -> KnowledgeGraph:
    g = torch.Generator().manual_seed(0)
    triples = torch.stack([torch.randint(0, 500, (400,), generator=g), torch.randint(0, 3, (400,), generator=g),
                           torch.randint(0, 500, (400,), generator=g)], 1)
    return KnowledgeGraph("tiny", 500, 3, triples[:300], triples[300:350], triples[350:])


def task(*overrides: str) -> KgeTask:
    config = load_config(None, ["model.name=distmult", "model.dim=4", "train.negatives=8", "train.batch_size=25",
                                "train.loss=logistic", *overrides])
    return KgeTask(config, graph())


def naive_loss(model: KgeModel, rows: torch.Tensor, batch) -> float:
    """Per edge: softplus(-positive) + (mean over its chunk's negatives of softplus(tail score) and of
    softplus(head score)) / 2, averaged over the edges; a chunk is ceil(B / K) consecutive edges."""
    inputs = batch.inputs
    candidates = inputs["candidates"]
    chunks = candidates.shape[0]
    size = inputs["heads"].shape[0]
    step = math.ceil(size / chunks)
    total = 0.0
    for edge in range(size):
        h, t = rows[inputs["heads"][edge]], rows[inputs["tails"][edge]]
        r = model.relations[inputs["relations"][edge]]
        own = candidates[edge // step]
        tail_side = sum(F.softplus((h * r * rows[c]).sum()) for c in own) / len(own)
        head_side = sum(F.softplus((rows[c] * r * t).sum()) for c in own) / len(own)
        total += float(F.softplus(-(h * r * t).sum()) + (tail_side + head_side) / 2)
    return total / size


@pytest.mark.parametrize("chunk", [5, 7])
def test_each_chunk_draws_its_own_negatives_and_the_loss_matches_a_naive_reference(chunk: int) -> None:
    kge = task(f"train.negative_chunk={chunk}")
    plan = kge.plan(0)[0]
    batch = kge.prepare(plan)
    candidates = batch.inputs["candidates"]
    assert candidates.shape == (math.ceil(25 / chunk), 8)
    assert len({tuple(row.tolist()) for row in candidates}) == candidates.shape[0]  # not one draw repeated
    model = kge.dense_module().double()
    rows = torch.randn(batch.ids.shape[0], 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = float(kge.loss(batch, rows, model).detach())
    assert got == pytest.approx(naive_loss(model, rows, batch), rel=1e-9)


@pytest.mark.parametrize("chunk", [0, 25, 1000])
def test_one_chunk_is_the_shared_default_bit_for_bit(chunk: int) -> None:
    """0 (the default) or a chunk at least the batch: the batch shares one draw, as before the option."""
    shared, chunked = task(), task(f"train.negative_chunk={chunk}")
    plan: BatchPlan = shared.plan(0)[0]
    first, second = shared.prepare(plan), chunked.prepare(plan)
    assert torch.equal(first.ids, second.ids)
    assert first.inputs["candidates"].dim() == 1
    assert torch.equal(first.inputs["candidates"], second.inputs["candidates"])
