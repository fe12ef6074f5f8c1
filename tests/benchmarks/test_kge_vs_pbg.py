"""benchmarks/kge_vs_pbg.py's one evaluator scores each side's vectors by that side's own model:
cadence's by its scorers (the reference: cadence.models.scorers), PBG's by its formula written with
torch's complex numbers (the operator applied to the right-hand side, the dot of the halves)."""

from __future__ import annotations

import pytest
import torch

from cadence.config import ModelConfig
from cadence.models.scorers import SCORERS
from tests.benchmarks import benchmark_script

bench = benchmark_script("kge_vs_pbg")


def as_complex(x: torch.Tensor) -> torch.Tensor:
    real, imag = x.chunk(2, dim=-1)
    return torch.complex(real, imag)


@pytest.mark.parametrize("model", ["distmult", "complex"])
def test_cadence_queries_score_as_cadences_scorer(model: str) -> None:
    generator = torch.Generator().manual_seed(0)
    h, r, t = (torch.randn(5, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    scorer = SCORERS.get(model)(ModelConfig(name=model, dim=8))
    tail_query, head_query = bench.QUERIES[("cadence", model)]
    expected = scorer.score(h, r, t)
    assert torch.allclose((tail_query(h, r) * t).sum(1), expected)
    assert torch.allclose((head_query(r, t) * h).sum(1), expected)


def test_pbg_complex_queries_score_with_pbgs_operator_of_each_side() -> None:
    """Dynamic relations: tail corruptions are scored c(g_r(h), t'), the left-hand operator applied to
    the head; head corruptions c(h', h_r(t)), the right-hand one applied to the tail."""
    generator = torch.Generator().manual_seed(1)
    h, r, t = (torch.randn(5, 8, generator=generator, dtype=torch.float64) for _ in range(3))

    def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # PBG's dot comparator on [real | imaginary]
        return (torch.cat([a.real, a.imag], 1) * b).sum(1)

    tail_query, head_query = bench.QUERIES[("pbg", "complex")]
    assert torch.allclose((tail_query(h, r) * t).sum(1), dot(as_complex(r) * as_complex(h), t))
    assert torch.allclose((head_query(r, t) * h).sum(1), dot(as_complex(r) * as_complex(t), h))


@pytest.mark.parametrize("model", ["distmult", "complex"])
def test_reciprocal_head_queries_score_the_inverse_relations_tail_query(model: str) -> None:
    """A reciprocal run predicts the head of (h, r, t) as the tail of (t, r^-1, ?): cadence's scorer on
    the inverse row."""
    generator = torch.Generator().manual_seed(3)
    h, inverse, t = (torch.randn(5, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    scorer = SCORERS.get(model)(ModelConfig(name=model, dim=8))
    _, head_query = bench.QUERIES[("cadence-reciprocal", model)]
    assert torch.allclose((head_query(inverse, t) * h).sum(1), scorer.score(t, inverse, h))
    tails, heads = bench.by_direction(torch.arange(6.0).view(6, 1).numpy(), True)
    assert tails.ravel().tolist() == [0, 1, 2] and heads.ravel().tolist() == [3, 4, 5]


def test_torchkge_complex_scores_as_cadences_queries_on_its_halves_side_by_side() -> None:
    """torchkge's ComplEx keeps real and imaginary tables apart; the contender saves them side by side
    (``[real | imaginary]``), which cadence's queries score as torchkge's own formula does."""
    generator = torch.Generator().manual_seed(2)
    (re_h, im_h), (re_r, im_r), (re_t, im_t) = (
        (torch.randn(5, 4, generator=generator, dtype=torch.float64),
         torch.randn(5, 4, generator=generator, dtype=torch.float64)) for _ in range(3))
    # torchkge 0.17.7, ComplExModel.scoring_function: Re(h^T diag(r) conj(t))
    expected = (re_h * (re_r * re_t + im_r * im_t) + im_h * (re_r * im_t - im_r * re_t)).sum(1)
    h, r, t = torch.cat([re_h, im_h], 1), torch.cat([re_r, im_r], 1), torch.cat([re_t, im_t], 1)
    tail_query, head_query = bench.QUERIES[("cadence", "complex")]
    assert torch.allclose((tail_query(h, r) * t).sum(1), expected)
    assert torch.allclose((head_query(r, t) * h).sum(1), expected)


def test_every_cadence_contender_is_compared_with_every_peer_that_ran() -> None:
    def run(contender: str, rep: int, rate: float) -> dict:
        return {"condition": "quiet", "contender": contender, "rep": rep, "edges_per_second": rate,
                "peak_pss_mib": 100.0, "sampled_mrr": 0.5}

    records = [run("cadence", 0, 300.0), run("pbg", 0, 200.0), run("torchkge", 0, 50.0),
               run("cadence", 1, 330.0), run("pbg", 1, 300.0), run("torchkge", 1, 30.0)]
    rows = bench.summarize(records, ["quiet"], ["cadence", "pbg", "torchkge"])["quiet"]
    assert rows["cadence/pbg"]["edges_per_second"]["per_rep"] == [1.5, 1.1]
    assert rows["cadence/torchkge"]["edges_per_second"]["per_rep"] == [6.0, 11.0]
    assert "torchkge/pbg" not in rows and "pbg/torchkge" not in rows


def test_time_to_target_is_the_first_epoch_that_reaches_each_peer_epochs_mrr() -> None:
    def epochs(*points: tuple[float, float]) -> list[dict]:
        return [{"epoch": e, "train_seconds": s, "sampled_mrr": m} for e, (s, m) in enumerate(points, 1)]

    # mine passes 0.50 at its 2nd epoch (after a dip it does not count twice), never reaches 0.70
    mine = epochs((10.0, 0.40), (20.0, 0.55), (30.0, 0.52))
    peer = epochs((15.0, 0.50), (30.0, 0.70), (45.0, 0.40))
    assert bench.time_to_targets(mine, peer) == [15.0 / 20.0, None, 45.0 / 10.0]


def test_an_epoch_checkpoint_holds_the_rows_the_run_trained_and_its_seconds(tmp_path) -> None:
    from cadence import api
    from cadence.config import load_config

    overrides = ["task=kge", "strategy=sync", "data.dataset=synthetic", "data.synthetic.num_entities=300",
                 "data.synthetic.num_relations=3", "data.synthetic.num_edges=3000", "data.synthetic.holdout=50",
                 "model.name=distmult", "model.dim=8", "train.epochs=2", "train.batch_size=200", "eval.every=0",
                 "eval.test=false", "checkpoint.every=1", "checkpoint.keep=2", "progress=false", "threads=1",
                 f"out={tmp_path / 'run'}"]
    api.train(load_config(None, overrides))
    paths = bench.ckpt.epoch_checkpoints(tmp_path / "run")
    assert [p.name for p in paths] == ["epoch-000001", "epoch-000002"]
    (first_seconds, first), (last_seconds, last) = (bench.epoch_vectors(p, 300) for p in paths)
    _, _, view, dense = api.load_model(tmp_path / "run")  # the library's own reading of the final model
    assert torch.equal(torch.from_numpy(last[0]), view.values(torch.arange(300)))
    assert torch.equal(torch.from_numpy(last[1]), dense.relations.detach())
    assert torch.equal(torch.from_numpy(last[2]), dense.relations.detach())  # both directions: not reciprocal
    assert not torch.equal(torch.from_numpy(first[0]), torch.from_numpy(last[0]))
    assert 0 < first_seconds < last_seconds
