"""Each scorer's math against a naive per-element reference written from the papers' formulas."""

import cmath
import math

import pytest
import torch

from cadence.config import ModelConfig
from cadence.models.scorers import SCORERS

DIM = 6


def as_complex(row: list[float]) -> list[complex]:
    half = len(row) // 2
    return [complex(row[k], row[half + k]) for k in range(half)]


def naive_score(name: str, h: list[float], r: list[float], t: list[float], gamma: float) -> float:
    if name == "distmult":
        return sum(a * b * c for a, b, c in zip(h, r, t))
    if name == "complex":
        return sum((a * b * c.conjugate()).real for a, b, c in zip(as_complex(h), as_complex(r), as_complex(t)))
    if name == "transe":
        return gamma - sum(abs(a + b - c) for a, b, c in zip(h, r, t))
    if name == "rotate":
        return gamma - sum(abs(a * cmath.exp(1j * theta) - c) for a, theta, c in zip(as_complex(h), r, as_complex(t)))
    raise AssertionError(f"no reference for {name}; every registered scorer needs one")


@pytest.fixture(params=SCORERS.names())
def scorer(request):
    return SCORERS.get(request.param)(ModelConfig(name=request.param, dim=DIM, gamma=3.0))


def sample(scorer, batch: int, candidates: int):
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(batch, DIM, generator=generator, dtype=torch.float64)
    t = torch.randn(batch, DIM, generator=generator, dtype=torch.float64)
    r = torch.randn(batch, scorer.relation_dim(), generator=generator, dtype=torch.float64)
    c = torch.randn(candidates, DIM, generator=generator, dtype=torch.float64)
    return h, r, t, c


def test_score_matches_reference(scorer) -> None:
    h, r, t, _ = sample(scorer, 4, 1)
    got = scorer.score(h, r, t)
    name = next(n for n in SCORERS.names() if type(scorer) is SCORERS.get(n))
    for i in range(4):
        expected = naive_score(name, h[i].tolist(), r[i].tolist(), t[i].tolist(), 3.0)
        assert math.isclose(float(got[i]), expected, rel_tol=1e-9, abs_tol=1e-9)


def test_tail_and_head_scoring_match_pairwise_scores(scorer) -> None:
    h, r, t, c = sample(scorer, 3, 5)
    tails = scorer.score_tails(h, r, c)
    heads = scorer.score_heads(c, r, t)
    assert tails.shape == heads.shape == (3, 5)
    for i in range(3):
        for j in range(5):
            assert torch.isclose(tails[i, j], scorer.score(h[i:i + 1], r[i:i + 1], c[j:j + 1])[0])
            assert torch.isclose(heads[i, j], scorer.score(c[j:j + 1], r[i:i + 1], t[i:i + 1])[0])


def test_both_sides_at_once_are_each_sides_pairwise_scores(scorer) -> None:
    """``score_sides`` (one product for both sides, where a scorer has one): the tails' rows, then the
    heads', each against the pairwise score."""
    h, r, t, c = sample(scorer, 3, 5)
    both = scorer.score_sides(h, r, t, c)
    assert both.shape == (6, 5)
    for i in range(3):
        for j in range(5):
            assert torch.isclose(both[i, j], scorer.score(h[i:i + 1], r[i:i + 1], c[j:j + 1])[0])
            assert torch.isclose(both[3 + i, j], scorer.score(c[j:j + 1], r[i:i + 1], t[i:i + 1])[0])


def test_complex_models_reject_odd_dims() -> None:
    from cadence.errors import ConfigError

    for name in ("complex", "rotate"):
        with pytest.raises(ConfigError, match="must be even"):
            SCORERS.get(name)(ModelConfig(name=name, dim=5))
