"""PyTorch-BigGraph-style chunked negatives (``train.negative_chunk``): each chunk of edges of a batch
draws its own negatives; the loss against a naive per-edge reference, the shared layout unchanged, the
batched chunk scores against the per-chunk loop, and the default (``auto``: by the loss) resolved once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from cadence import api
from cadence.config import load_config
from cadence.errors import ConfigError
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


def naive_loss(model: KgeModel, rows: torch.Tensor, inputs: dict) -> float:
    """Per edge: softplus(-positive) + (mean over its chunk's negatives of softplus(tail score) and of
    softplus(head score)) / 2, averaged over the edges; a chunk is ceil(B / K) consecutive edges."""
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
    candidates = kge.edge_positions(batch)["candidates"]
    assert candidates.shape == (math.ceil(25 / chunk), 8)
    assert len({tuple(row.tolist()) for row in candidates}) == candidates.shape[0]  # not one draw repeated
    model = kge.dense_module().double()
    rows = torch.randn(batch.ids.shape[0], 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = float(kge.loss(batch, rows, model).detach())
    assert got == pytest.approx(naive_loss(model, rows, kge.edge_positions(batch)), rel=1e-9)


@pytest.mark.parametrize("chunk", [0, 25, 1000, "auto"])
def test_one_chunk_is_the_shared_default_bit_for_bit(chunk: int) -> None:
    """0 (and auto, under logistic loss) or a chunk at least the batch: the batch shares one draw, as
    before the option."""
    shared, chunked = task(), task(f"train.negative_chunk={chunk}")
    plan: BatchPlan = shared.plan(0)[0]
    first, second = shared.prepare(plan), chunked.prepare(plan)
    assert torch.equal(first.ids, second.ids)
    assert shared.edge_positions(first)["candidates"].dim() == 1
    assert torch.equal(first.inputs["positions"], second.inputs["positions"])


# ---- the batched chunk forms: each scorer's one batched operation against the per-chunk loop --------------
SCORER_NAMES = ("distmult", "complex", "transe", "rotate")


@pytest.mark.parametrize("name", SCORER_NAMES)
def test_each_scorers_batched_chunk_scores_equal_the_per_chunk_loop_and_pairwise_scores(name: str) -> None:
    from cadence.config import ModelConfig
    from cadence.models.scorers import SCORERS, Scorer

    scorer = SCORERS.get(name)(ModelConfig(name=name, dim=6, gamma=3.0))
    assert type(scorer).score_tails_chunked is not Scorer.score_tails_chunked  # a batched form of its own
    assert type(scorer).score_heads_chunked is not Scorer.score_heads_chunked
    g = torch.Generator().manual_seed(0)
    h, t = (torch.randn(3, 4, 6, generator=g, dtype=torch.float64) for _ in range(2))
    r = torch.randn(3, 4, scorer.relation_dim(), generator=g, dtype=torch.float64)
    pools = torch.randn(3, 5, 6, generator=g, dtype=torch.float64)
    tails, heads = scorer.score_tails_chunked(h, r, pools), scorer.score_heads_chunked(pools, r, t)
    assert tails.shape == heads.shape == (3, 4, 5)
    torch.testing.assert_close(tails, Scorer.score_tails_chunked(scorer, h, r, pools), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(heads, Scorer.score_heads_chunked(scorer, pools, r, t), rtol=1e-12, atol=1e-12)
    for k, i, j in ((0, 0, 0), (1, 3, 2), (2, 1, 4)):  # and the one-triple score, from the papers' formulas
        torch.testing.assert_close(tails[k, i, j], scorer.score(h[k, i:i + 1], r[k, i:i + 1], pools[k, j:j + 1])[0])
        torch.testing.assert_close(heads[k, i, j], scorer.score(pools[k, j:j + 1], r[k, i:i + 1], t[k, i:i + 1])[0])


def looped_loss(model: KgeModel, rows: torch.Tensor, inputs: dict, both: bool) -> torch.Tensor:
    """The chunked loss as first written: a loop over the chunks, each chunk's pool gathered and
    scored by the scorer's [B, C] forms, the scores concatenated (the reference for the batched path)."""
    heads, relations, tails, candidates = (inputs[k] for k in ("heads", "relations", "tails", "candidates"))
    h, t, r = rows[heads], rows[tails], model.relations[relations]
    step = -(-h.shape[0] // candidates.shape[0])
    tail_scores, head_scores = [], []
    for index, start in enumerate(range(0, h.shape[0], step)):
        pool, edges = rows[candidates[index]], slice(start, start + step)
        tail_scores.append(model.scorer.score_tails(h[edges], r[edges], pool))
        head_scores.append(model.scorer.score_heads(pool, r[edges], t[edges]))
    positive = model.scorer.score(h, r, t)
    sides = [torch.cat(tail_scores)] + ([torch.cat(head_scores)] if both else [])
    if model.train_config.loss == "softmax":
        losses = [F.cross_entropy(torch.cat([positive.unsqueeze(1), s], 1), torch.zeros_like(heads)) for s in sides]
        return sum(losses) / len(losses)
    return sum(F.softplus(s).mean() for s in sides) / len(sides) + F.softplus(-positive).mean()


@pytest.mark.parametrize("name", SCORER_NAMES)
@pytest.mark.parametrize("loss,chunk,reciprocal", [("softmax", 5, False), ("logistic", 7, False),
                                                   ("softmax", 7, True)])
def test_the_batched_chunked_loss_and_gradients_equal_the_per_chunk_loop(name: str, loss: str, chunk: int,
                                                                         reciprocal: bool) -> None:
    """5 divides the batch of 25; 7 leaves a last chunk of 4 edges (padded in the batched path)."""
    kge = task(f"model.name={name}", f"train.loss={loss}", f"train.negative_chunk={chunk}",
               f"train.reciprocal={str(reciprocal).lower()}")
    batch = kge.prepare(kge.plan(0)[0])
    assert kge.edge_positions(batch)["candidates"].dim() == 2
    grads = []
    for compute in (lambda m, rows: kge.loss(batch, rows, m),
                    lambda m, rows: looped_loss(m, rows, kge.edge_positions(batch), not reciprocal)):
        model = kge.dense_module().double()
        rows = torch.randn(batch.ids.shape[0], 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        rows.requires_grad_()
        value = compute(model, rows)
        value.backward()
        grads.append((value.detach(), rows.grad, model.relations.grad))
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert grads[0][1].abs().sum() > 0 and grads[0][2].abs().sum() > 0


# ---- the default: auto, the layout by the loss, resolved once ------------------------------------------------
@pytest.mark.parametrize("settings,resolved", [
    ([], 8),  # softmax (the default loss): chunks of train.negatives edges, PyTorch-BigGraph's layout
    (["train.loss=logistic"], 0),  # shared by the batch
    (["train.scoring=all"], 0),  # no sampled negatives
    (["train.negative_chunk=0"], 0), (["train.negative_chunk=5"], 5),  # a number stays as given
    (["train.loss=logistic", "train.negative_chunk=3"], 3),
])
def test_auto_resolves_by_the_loss_once_and_a_number_stays(settings: list[str], resolved: int) -> None:
    config = load_config(None, ["train.negatives=8", *settings])
    api.prepare_config(config)
    assert config.train.negative_chunk == resolved
    assert yaml.safe_load(config.to_yaml())["train"]["negative_chunk"] == resolved  # what config.yaml records
    assert KgeTask(config, graph()).negative_chunk == resolved


def test_a_task_built_without_prepare_config_resolves_auto_the_same_way() -> None:
    softmax = task("train.loss=softmax")  # train.negative_chunk left at auto
    assert softmax.config.train.negative_chunk == "auto" and softmax.negative_chunk == 8
    assert softmax.edge_positions(softmax.prepare(softmax.plan(0)[0]))["candidates"].shape == (math.ceil(25 / 8), 8)


def test_other_tasks_leave_auto_alone() -> None:
    config = load_config(None, ["task=mf"])
    api.prepare_config(config)  # (a resolved number would be a kge key set on an mf run: an error)
    assert config.train.negative_chunk == "auto"


@pytest.mark.parametrize("value,message", [
    ("foo", "train.negative_chunk must be of type int or one of auto; got str 'foo'"),
    ("1.5", "train.negative_chunk must be of type int or one of auto; got float 1.5"),
    ("-1", "train.negative_chunk must not be negative, got -1"),
])
def test_a_bad_negative_chunk_is_a_one_line_error_naming_the_key(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, [f"train.negative_chunk={value}"])
    assert str(raised.value) == f"--set train.negative_chunk={value}: {message}"


def test_a_runs_config_yaml_records_the_resolved_number(task_data, tmp_path) -> None:
    from tests.conftest import make_config

    config = make_config(tmp_path / "run", *task_data["kge"], "train.epochs=1", "eval.every=0", "eval.test=false")
    assert config.train.negative_chunk == "auto"
    result = api.train(config)
    assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["train"]["negative_chunk"] == 8
