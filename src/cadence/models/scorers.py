"""Knowledge-graph scorers: an interaction function between head, relation and tail rows.

A scorer knows nothing of storage or training: it maps embedding rows to scores. Entity rows are
``dim`` floats; the complex models read them as ``dim/2`` real parts followed by ``dim/2``
imaginary parts. Three shapes of scoring are needed:

- ``score(h, r, t)``: one score per triple, ``[B]``;
- ``score_tails(h, r, candidates)``: each (h, r) against every candidate tail, ``[B, C]``;
- ``score_heads(candidates, r, t)``: each (r, t) against every candidate head, ``[B, C]``;
- ``score_tails_chunked(h, r, pools)`` and ``score_heads_chunked(pools, r, t)``: K chunks of c
  queries each against the chunk's own pool, ``[K, c, D]`` x ``[K, C, D]`` -> ``[K, c, C]``.

Shared-negative training (PyTorch-BigGraph, Marius) and all-entity ranking both use the ``[B, C]``
forms, which are matrix products for the bilinear models; chunked negatives (PyTorch-BigGraph's
layout) the ``[K, c, C]`` forms, one batched matrix product (or one batched distance) per side
instead of K small ones. The base class defines those as the loop over chunks of the ``[B, C]``
forms: the reference each scorer's batched form equals to float rounding (tests/models).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from cadence.config import ModelConfig
from cadence.kernels import complex_product, conjugate
from cadence.errors import ConfigError
from cadence.registry import Registry

SCORERS: Registry[type["Scorer"]] = Registry("model", "model.name")


class Scorer(ABC):
    complex_valued = False  # rows are (real, imaginary) halves

    def __init__(self, config: ModelConfig):
        if self.complex_valued and config.dim % 2:
            raise ConfigError(f"model.dim must be even for {config.name} (real and imaginary halves)")
        self.dim = config.dim

    def relation_dim(self) -> int:
        return self.dim

    def step_scoring(self) -> tuple[str, float] | None:
        """(the name of this scorer's scoring in ``kge_step.SCORINGS``, its margin gamma): the fused
        training step's scores and gradients; None where that step has none (autograd's path then)."""
        return None

    def init_relations(self, relations: Tensor, std: float, generator: torch.Generator) -> None:
        relations.normal_(0.0, std, generator=generator)

    @abstractmethod
    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor: ...

    @abstractmethod
    def score_tails(self, h: Tensor, r: Tensor, candidates: Tensor) -> Tensor: ...

    @abstractmethod
    def score_heads(self, candidates: Tensor, r: Tensor, t: Tensor) -> Tensor: ...

    def score_sides(self, h: Tensor, r: Tensor, t: Tensor, candidates: Tensor) -> Tensor:
        """[2B, C]: ``score_tails``'s rows, then ``score_heads``'s: both sides of a batch against the
        same candidates (a scorer that is a dot of a query with the candidates overrides it with one
        product of both sides' queries: fewer operators a step)."""
        return torch.cat([self.score_tails(h, r, candidates), self.score_heads(candidates, r, t)])

    def score_tails_chunked(self, h: Tensor, r: Tensor, pools: Tensor) -> Tensor:
        """[K, c, D] heads, [K, c, R] relations, [K, C, D] pools -> [K, c, C]: chunk k's queries against
        pool k. This loop is the reference; each scorer overrides it with one batched operation."""
        return torch.stack([self.score_tails(h[k], r[k], pools[k]) for k in range(pools.shape[0])])

    def score_heads_chunked(self, pools: Tensor, r: Tensor, t: Tensor) -> Tensor:
        """[K, C, D] pools, [K, c, R] relations, [K, c, D] tails -> [K, c, C]."""
        return torch.stack([self.score_heads(pools[k], r[k], t[k]) for k in range(pools.shape[0])])

    def magnitudes(self, x: Tensor) -> Tensor:
        """Per-component magnitudes of entity rows for the N3 / L2 regularisers (complex modulus)."""
        if not self.complex_valued:
            return x.abs()
        real, imag = x.chunk(2, dim=-1)
        return torch.sqrt(real * real + imag * imag + 1e-20)

    def relation_magnitudes(self, r: Tensor) -> Tensor:
        return self.magnitudes(r)


@SCORERS.register("distmult")
class DistMultScorer(Scorer):
    """score = sum_k h_k r_k t_k (Yang et al. 2015)."""

    def step_scoring(self):
        return "distmult", 0.0

    def score(self, h, r, t):
        return (h * r * t).sum(-1)

    def score_tails(self, h, r, candidates):
        return (h * r) @ candidates.t()  # [B, D] @ [D, C]

    def score_heads(self, candidates, r, t):
        return (r * t) @ candidates.t()

    def score_sides(self, h, r, t, candidates):
        return torch.cat([h * r, r * t]) @ candidates.t()

    def score_tails_chunked(self, h, r, pools):
        return torch.bmm(h * r, pools.transpose(1, 2))  # [K, c, D] @ [K, D, C]

    def score_heads_chunked(self, pools, r, t):
        return torch.bmm(r * t, pools.transpose(1, 2))


@SCORERS.register("complex")
class ComplExScorer(Scorer):
    """score = Re(sum_k h_k r_k conj(t_k)) (Trouillon et al. 2016)."""

    complex_valued = True
    def step_scoring(self):
        return "complex", 0.0

    def score(self, h, r, t):
        return (complex_product(h, r) * t).sum(-1)

    def score_tails(self, h, r, candidates):
        # Re(<h r, conj(c)>) = [Re(hr), Im(hr)] . [Re(c), Im(c)]
        return complex_product(h, r) @ candidates.t()

    def score_heads(self, candidates, r, t):
        # Re(<c, r conj(t)>) = [Re(c), Im(c)] . [Re(r conj t), -Im(r conj t)] = c . conj(r conj(t))
        return conjugate(complex_product(r, conjugate(t))) @ candidates.t()

    def score_sides(self, h, r, t, candidates):
        return torch.cat([complex_product(h, r), conjugate(complex_product(r, conjugate(t)))]) @ candidates.t()

    def score_tails_chunked(self, h, r, pools):
        return torch.bmm(complex_product(h, r), pools.transpose(1, 2))

    def score_heads_chunked(self, pools, r, t):
        return torch.bmm(conjugate(complex_product(r, conjugate(t))), pools.transpose(1, 2))


class _DistanceScorer(Scorer):
    """score = gamma - distance(query, candidate), for translation-like models."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.gamma = config.gamma

    @abstractmethod
    def distance(self, queries: Tensor, candidates: Tensor) -> Tensor:
        """[B, D] x [C, D] -> [B, C] distances."""

    @abstractmethod
    def pooled_distance(self, queries: Tensor, pools: Tensor) -> Tensor:
        """[K, c, D] x [K, C, D] -> [K, c, C] distances: chunk k's queries to pool k."""

    @abstractmethod
    def tail_query(self, h: Tensor, r: Tensor) -> Tensor: ...

    @abstractmethod
    def head_query(self, r: Tensor, t: Tensor) -> Tensor: ...

    def paired_distance(self, queries: Tensor, targets: Tensor) -> Tensor:
        return self.distance(queries.unsqueeze(1), targets.unsqueeze(1)).squeeze(-1).squeeze(-1)

    def score(self, h, r, t):
        return self.gamma - self.paired_distance(self.tail_query(h, r), t)

    def score_tails(self, h, r, candidates):
        return self.gamma - self.distance(self.tail_query(h, r), candidates)

    def score_heads(self, candidates, r, t):
        return self.gamma - self.distance(self.head_query(r, t), candidates)

    def score_tails_chunked(self, h, r, pools):
        return self.gamma - self.pooled_distance(self.tail_query(h, r), pools)

    def score_heads_chunked(self, pools, r, t):
        return self.gamma - self.pooled_distance(self.head_query(r, t), pools)


@SCORERS.register("transe")
class TransEScorer(_DistanceScorer):
    """score = gamma - ||h + r - t||_p (Bordes et al. 2013)."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        if config.p_norm not in (1, 2):
            raise ConfigError("model.p_norm must be 1 or 2 for transe")
        self.p = config.p_norm

    def step_scoring(self):
        return f"transe-l{self.p}", self.gamma

    def distance(self, queries, candidates):
        if queries.dim() == 3:  # paired: [B, 1, D] and [B, 1, D]
            return (queries - candidates).norm(p=self.p, dim=-1, keepdim=True)
        return torch.cdist(queries, candidates, p=self.p)

    def pooled_distance(self, queries, pools):
        return torch.cdist(queries, pools, p=self.p)  # batched over the leading dimension

    def tail_query(self, h, r):
        return h + r

    def head_query(self, r, t):
        return t - r


@SCORERS.register("rotate")
class RotatEScorer(_DistanceScorer):
    """score = gamma - sum_k |h_k e^{i theta_k} - t_k| (Sun et al. 2019); relations are phases."""

    complex_valued = True
    CANDIDATE_CHUNK = 4096  # bounds the [B, C, D] difference tensor

    def relation_dim(self) -> int:
        return self.dim // 2

    def step_scoring(self):
        return "rotate", self.gamma

    def init_relations(self, relations, std, generator):
        relations.uniform_(-math.pi, math.pi, generator=generator)

    @staticmethod
    def _rotation(theta: Tensor) -> Tensor:
        return torch.cat([torch.cos(theta), torch.sin(theta)], dim=-1)

    def distance(self, queries, candidates):
        if queries.dim() == 3:
            return self._modulus_sum(queries - candidates).unsqueeze(-1)
        parts = []
        for start in range(0, candidates.shape[0], self.CANDIDATE_CHUNK):
            block = candidates[start:start + self.CANDIDATE_CHUNK]
            parts.append(self._modulus_sum(queries.unsqueeze(1) - block.unsqueeze(0)))
        return torch.cat(parts, dim=1)

    def pooled_distance(self, queries, pools):
        # [K, c, 1, D] - [K, 1, C', D], C' bounded as in ``distance``: the [K, c, C', D] difference
        # holds as many elements as the shared form's [B, C', D]
        parts = []
        for start in range(0, pools.shape[1], self.CANDIDATE_CHUNK):
            block = pools[:, start:start + self.CANDIDATE_CHUNK]
            parts.append(self._modulus_sum(queries.unsqueeze(2) - block.unsqueeze(1)))
        return torch.cat(parts, dim=2)

    @staticmethod
    def _modulus_sum(difference: Tensor) -> Tensor:
        real, imag = difference.chunk(2, dim=-1)
        return torch.sqrt(real * real + imag * imag + 1e-20).sum(-1)

    def tail_query(self, h, r):
        return complex_product(h, self._rotation(r))

    def head_query(self, r, t):
        # |h r - t| = |h - t conj(r)| because |r| = 1
        return complex_product(t, conjugate(self._rotation(r)))

    def relation_magnitudes(self, r):
        return torch.zeros_like(r)  # phases have unit modulus: nothing to regularise
