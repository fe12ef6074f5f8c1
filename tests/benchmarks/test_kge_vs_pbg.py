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


def test_pbg_complex_queries_score_as_pbgs_right_hand_operator() -> None:
    generator = torch.Generator().manual_seed(1)
    h, r, t = (torch.randn(5, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    # PBG: the operator multiplies the right-hand side; the dot comparator sums both halves' products
    product = as_complex(r) * as_complex(t)
    expected = (h * torch.cat([product.real, product.imag], 1)).sum(1)
    tail_query, head_query = bench.QUERIES[("pbg", "complex")]
    assert torch.allclose((tail_query(h, r) * t).sum(1), expected)
    assert torch.allclose((head_query(r, t) * h).sum(1), expected)
