"""A knowledge-graph embedding model's scores against its sampled negatives as one autograd operator
(``cadence::kge_scores``, what ``KgeModel.loss_at`` differentiates), and its whole training step as one
operator (``cadence::kge_step``).

The step: the gathers of a batch's rows, its scores against its sampled negatives, the loss
(``kernels.negative_loss``), the scores' backward, the gathers' backward and Adagrad's row step, with
no autograd graph: what the compute stage takes where the task offers it (``Task.fused_step``),
autograd's path through ``kge_scores`` staying the reference it is tested against (the same bits on
the CPU: the step repeats autograd's operations in their order).

Each shipped scorer has a **scoring** here (``SCORINGS``: its scores and their gradients written out):

- ``distmult``, ``complex``: the score is the dot of a query with the candidate (``kernels``'
  ``bilinear_queries``); against one shared pool, the twin of ``kernels.bilinear_scores_kernel`` or,
  on CUDA, the Triton kernels; against chunked pools, one batched product a direction;
- ``transe-l1``, ``transe-l2``: gamma - ||q - c||_p with the queries h + r and t - r;
- ``rotate``: gamma - sum_k |q_k - c_k| with the queries h e^{i theta} and t e^{-i theta}.

Negatives are one pool shared by the batch (``chunks`` 1) or ``chunks`` pools, chunk k of the edges
(ceil(B / K) of them, the last padded) scored against pool k, as ``KgeModel.loss_at`` lays them out.
The distances' gradients take blocks of candidates at a time (``ELEMENTS``), as the scorers' own
distances do, so a [queries x candidates x D] difference never outgrows a bound.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from cadence import kernels

# floats of the [K, n, C', D] differences a distance's forward or backward makes at once: 4 MiB blocks
# stay in the allocator's reused memory; 64 MiB ones were mapped anew, page by page, every step (RotatE
# on Kinships, d=128, 1,024 edges x 16 negatives: 1.9x slower than 4 MiB ones)
ELEMENTS = 1 << 20


# ---- the chunked layout ------------------------------------------------------------------------
def to_chunks(x: Tensor, sides: int, size: int, chunks: int) -> Tensor:
    """[S B, W] (S sides of B edges' rows) -> [K, S c, W], c = ceil(B / K): side s's edge i at chunk
    i // c, row s c + i % c; zero rows pad each side up to K c."""
    if chunks == 1:
        return x.unsqueeze(0)
    step = -(-size // chunks)
    x = x.reshape(sides, size, x.shape[-1])
    if chunks * step > size:
        x = torch.cat([x, x.new_zeros(sides, chunks * step - size, x.shape[-1])], dim=1)
    return x.view(sides, chunks, step, -1).transpose(0, 1).reshape(chunks, sides * step, -1)


def from_chunks(x: Tensor, sides: int, size: int) -> Tensor:
    """``to_chunks``' inverse, [K, S c, W] -> [S B, W], the padding rows dropped."""
    chunks = x.shape[0]
    if chunks == 1:
        return x[0]
    step = x.shape[1] // sides
    rows = x.view(chunks, sides, step, -1).transpose(0, 1).reshape(sides, chunks * step, -1)
    return rows[:, :size].reshape(sides * size, -1)


def _blocks(queries: Tensor, pools: Tensor):
    """The candidates' slices of ``pools`` [K, C, D] such that a [K, n, C', D] difference with
    ``queries`` [K, n, D] holds at most ``ELEMENTS`` floats."""
    width = max(1, ELEMENTS // max(1, queries.shape[0] * queries.shape[1] * queries.shape[2]))
    return [slice(start, start + width) for start in range(0, pools.shape[1], width)]


# ---- scorings ----------------------------------------------------------------------------------
class Scoring(ABC):
    """A scorer's scores of a batch against its negatives and their gradients, in plain torch. The
    queries are the rows each side's candidates are scored against: [S B, D], the tail side's, then
    (``both``) the head side's."""

    def __init__(self, gamma: float):
        self.gamma = gamma

    @abstractmethod
    def queries(self, h: Tensor, r: Tensor, t: Tensor, both: bool) -> Tensor: ...

    @abstractmethod
    def positive(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        """[B]: each edge's own score."""

    @abstractmethod
    def against(self, queries: Tensor, pools: Tensor) -> Tensor:
        """[K, n, D] queries, [K, C, D] pools -> [K, n, C] scores."""

    @abstractmethod
    def against_backward(self, d_scores: Tensor, queries: Tensor, pools: Tensor,
                         scores: Tensor) -> tuple[Tensor, Tensor]:
        """The gradients (queries, pools) of ``against`` from its output's (``scores``: that output)."""

    @abstractmethod
    def queries_backward(self, d_queries: Tensor, d_positive: Tensor, h: Tensor, r: Tensor, t: Tensor,
                         both: bool) -> tuple[Tensor, Tensor, Tensor]:
        """The gradients (h, r, t) from the queries' and the positives' scores'."""

    def scores(self, h: Tensor, r: Tensor, t: Tensor, pool: Tensor, both: bool, chunks: int,
               kernel: bool) -> tuple[Tensor, Tensor]:
        """(scores [S B, C], positives' scores [B]) of the edges against ``pool`` [K C, D]."""
        sides, size = (2 if both else 1), h.shape[0]
        queries = to_chunks(self.queries(h, r, t, both), sides, size, chunks)
        scores = self.against(queries, pool.view(chunks, -1, pool.shape[1]))
        return from_chunks(scores, sides, size), self.positive(h, r, t)

    def gradients(self, d_scores: Tensor, d_positive: Tensor, h: Tensor, r: Tensor, t: Tensor, pool: Tensor,
                  scores: Tensor, both: bool, chunks: int, kernel: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The gradients (h, r, t, pool) of ``scores`` from those of its outputs (``scores``: its first)."""
        sides, size = (2 if both else 1), h.shape[0]
        queries = to_chunks(self.queries(h, r, t, both), sides, size, chunks)
        d_queries, d_pools = self.against_backward(to_chunks(d_scores, sides, size, chunks), queries,
                                                   pool.view(chunks, -1, pool.shape[1]),
                                                   to_chunks(scores, sides, size, chunks))
        d_h, d_r, d_t = self.queries_backward(from_chunks(d_queries, sides, size), d_positive, h, r, t, both)
        return d_h, d_r, d_t, d_pools.reshape(pool.shape)


class Bilinear(Scoring):
    """DistMult (real products) and ComplEx (complex ones)."""

    complex_ = False

    def queries(self, h, r, t, both):
        return kernels.bilinear_queries(h, r, t, self.complex_, both)[0]

    def positive(self, h, r, t):
        return (kernels.bilinear_queries(h, r, t, self.complex_, False)[0] * t).sum(-1)

    def against(self, queries, pools):
        return torch.bmm(queries, pools.transpose(1, 2))

    def against_backward(self, d_scores, queries, pools, scores):
        return torch.bmm(d_scores, pools), torch.bmm(d_scores.transpose(1, 2), queries)

    def queries_backward(self, d_queries, d_positive, h, r, t, both):
        tail = kernels.bilinear_queries(h, r, t, self.complex_, False)[0]
        return kernels.bilinear_queries_backward(d_queries, d_positive, h, r, t, tail, self.complex_, both)

    def scores(self, h, r, t, pool, both, chunks, kernel):
        if chunks == 1:  # the kernels' twin (the order autograd's reference had), or the Triton kernels
            compute = kernels.bilinear_scores_kernel if kernel else kernels.bilinear_scores_twin
            return compute(h, r, t, pool, self.complex_, both)
        return super().scores(h, r, t, pool, both, chunks, kernel)

    def gradients(self, d_scores, d_positive, h, r, t, pool, scores, both, chunks, kernel):
        if chunks == 1:
            compute = kernels.bilinear_scores_backward_kernel if kernel else kernels.bilinear_scores_backward_twin
            return compute(d_scores, d_positive, h, r, t, pool, self.complex_, both)
        return super().gradients(d_scores, d_positive, h, r, t, pool, scores, both, chunks, kernel)


class ComplexBilinear(Bilinear):
    complex_ = True


class Distance(Scoring):
    """gamma - distance(query, candidate): the distance's forward (``distance``, ``paired``) and
    its gradient (``difference_gradient``: of a sum of distances, with respect to the differences
    query - candidate, weighted a pair each)."""

    def distance(self, queries: Tensor, pools: Tensor) -> Tensor:
        """[K, n, D] x [K, C, D] -> [K, n, C]."""
        parts = [self.paired(queries.unsqueeze(2) - pools[:, block].unsqueeze(1)) for block in _blocks(queries, pools)]
        return torch.cat(parts, dim=2)

    @abstractmethod
    def paired(self, difference: Tensor) -> Tensor:
        """[..., D] differences -> [...] distances."""

    @abstractmethod
    def difference_gradient(self, weights: Tensor, difference: Tensor) -> Tensor:
        """The gradient of sum(weights * paired(difference)) with respect to ``difference`` [..., D]
        (which it may overwrite: a difference made for it)."""

    def positive(self, h, r, t):
        return self.gamma - self.paired(self.queries(h, r, t, False) - t)

    def against(self, queries, pools):
        return self.gamma - self.distance(queries, pools)

    def against_backward(self, d_scores, queries, pools, scores):
        d_queries, d_pools = torch.zeros_like(queries), torch.empty_like(pools)
        for block in _blocks(queries, pools):
            difference = queries.unsqueeze(2) - pools[:, block].unsqueeze(1)  # [K, n, C', D]
            d_difference = self.difference_gradient(-d_scores[:, :, block], difference)
            d_queries += d_difference.sum(2)
            d_pools[:, block] = -d_difference.sum(1)
        return d_queries, d_pools

    def positive_backward(self, d_positive: Tensor, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        """The gradient of the positives' scores with respect to the tail query - t."""
        return self.difference_gradient(-d_positive, self.queries(h, r, t, False) - t)


class Translation(Distance):
    """TransE: the queries h + r (tail side) and t - r (head side), the distance an L-p norm."""

    p = 2

    def queries(self, h, r, t, both):
        return torch.cat([h + r, t - r]) if both else h + r

    def distance(self, queries, pools):
        return torch.cdist(queries, pools, p=self.p)

    def queries_backward(self, d_queries, d_positive, h, r, t, both):
        size = h.shape[0]
        d_difference = self.positive_backward(d_positive, h, r, t)
        d_tail = d_queries[:size] + d_difference
        d_t = -d_difference
        if not both:  # (h's gradient and r's are the same: two tensors all the same)
            return d_tail, d_tail.clone(), d_t
        d_head = d_queries[size:]
        return d_tail, d_tail - d_head, d_t + d_head


class TranslationL2(Translation):
    def paired(self, difference):
        return difference.norm(p=2, dim=-1)

    def difference_gradient(self, weights, difference):
        norms = difference.norm(p=2, dim=-1, keepdim=True)
        return difference * torch.where(norms > 0, weights.unsqueeze(-1) / norms, 0.0)

    def against_backward(self, d_scores, queries, pools, scores):
        # sum_j w_ij (q_i - c_j) / ||q_i - c_j||: two products, no [n, C, D] difference (the distances
        # made anew: gamma - scores would lose the small ones' digits, which this divides by)
        distances = torch.cdist(queries, pools, p=2)
        weights = torch.where(distances > 0, -d_scores / distances, 0.0)
        d_queries = queries * weights.sum(2, keepdim=True) - torch.bmm(weights, pools)
        d_pools = pools * weights.sum(1).unsqueeze(2) - torch.bmm(weights.transpose(1, 2), queries)
        return d_queries, d_pools


class TranslationL1(Translation):
    p = 1

    def paired(self, difference):
        return difference.abs().sum(-1)

    def difference_gradient(self, weights, difference):
        return difference.sign() * weights.unsqueeze(-1)

    def against_backward(self, d_scores, queries, pools, scores):
        # torch's own backward of cdist (what autograd runs for it): one native pass, no [n, C, D]
        # difference made (ours in blocks took 5x as long at d=128); for L1 it reads the distances
        # for nothing but their shape: the forward's, not made anew
        distances = self.gamma - scores
        d_distances = (-d_scores).contiguous()
        return (torch.ops.aten._cdist_backward(d_distances, queries, pools, 1.0, distances),
                torch.ops.aten._cdist_backward(d_distances.transpose(1, 2).contiguous(), pools, queries, 1.0,
                                               distances.transpose(1, 2).contiguous()))


class Rotation(Distance):
    """RotatE: relations are phases theta; the queries h e^{i theta} and t e^{-i theta} (|h r - t| =
    |h - t conj(r)|), the distance the sum of the complex differences' moduli."""

    @staticmethod
    def rotation(theta: Tensor) -> Tensor:
        return torch.cat([torch.cos(theta), torch.sin(theta)], dim=-1)

    def queries(self, h, r, t, both):
        rotation = self.rotation(r)
        tail = kernels.complex_product(h, rotation)
        return torch.cat([tail, kernels.complex_product(t, kernels.conjugate(rotation))]) if both else tail

    @staticmethod
    def moduli(difference: Tensor) -> Tensor:
        """[..., D] differences of [real | imaginary] halves -> [..., D / 2] moduli (with the scorer's
        epsilon); in few passes over the difference, which is the whole cost at scale."""
        squares = difference.square().unflatten(-1, (2, -1))
        return squares.sum(-2).add_(1e-20).sqrt_()

    def paired(self, difference):
        return self.moduli(difference).sum(-1)

    def difference_gradient(self, weights, difference):
        # w d / |d| component by component, in place of a fresh difference
        scale = weights.unsqueeze(-1) / self.moduli(difference)
        return difference.unflatten(-1, (2, -1)).mul_(scale.unsqueeze(-2)).flatten(-2)

    def queries_backward(self, d_queries, d_positive, h, r, t, both):
        size = h.shape[0]
        rotation = self.rotation(r)
        d_difference = self.positive_backward(d_positive, h, r, t)
        d_tail = d_queries[:size] + d_difference
        d_h = kernels.complex_product(d_tail, kernels.conjugate(rotation))
        d_rotation = kernels.complex_product(d_tail, kernels.conjugate(h))
        d_t = -d_difference
        if both:  # the head query t conj(rotation): d conj(rotation) = d_head conj(t)
            d_head = d_queries[size:]
            d_t = d_t + kernels.complex_product(d_head, rotation)
            d_rotation = d_rotation + kernels.conjugate(kernels.complex_product(d_head, kernels.conjugate(t)))
        d_cos, d_sin = d_rotation.chunk(2, dim=-1)
        return d_h, d_cos * -torch.sin(r) + d_sin * torch.cos(r), d_t


SCORINGS: dict[str, type[Scoring]] = {"distmult": Bilinear, "complex": ComplexBilinear, "transe-l1": TranslationL1,
                                      "transe-l2": TranslationL2, "rotate": Rotation}


# ---- kge_scores: the scores as one autograd operator -----------------------------------------
@torch.library.custom_op("cadence::kge_scores", mutates_args=())
def _kge_scores(h: Tensor, r: Tensor, t: Tensor, pool: Tensor, scoring: str, gamma: float, both: bool,
                chunks: int) -> tuple[Tensor, Tensor]:
    scores, positive = SCORINGS[scoring](gamma).scores(h, r, t, pool, both, chunks, kernels.usable(h))
    return scores, positive


@_kge_scores.register_fake
def _(h, r, t, pool, scoring, gamma, both, chunks):
    return h.new_empty(h.shape[0] * (2 if both else 1), pool.shape[0] // chunks), h.new_empty(h.shape[0])


@torch.library.custom_op("cadence::kge_scores_backward", mutates_args=())
def _kge_scores_backward(d_scores: Tensor, d_positive: Tensor, h: Tensor, r: Tensor, t: Tensor, pool: Tensor,
                         scores: Tensor, scoring: str, gamma: float, both: bool,
                         chunks: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    d_h, d_r, d_t, d_pool = SCORINGS[scoring](gamma).gradients(d_scores, d_positive, h, r, t, pool, scores, both,
                                                               chunks, kernels.usable(h))
    return d_h, d_r, d_t, d_pool


@_kge_scores_backward.register_fake
def _(d_scores, d_positive, h, r, t, pool, scores, scoring, gamma, both, chunks):
    return torch.empty_like(h), torch.empty_like(r), torch.empty_like(t), torch.empty_like(pool)


def _keep_inputs(ctx, inputs, output) -> None:
    h, r, t, pool, *ctx.setting = inputs
    ctx.save_for_backward(h, r, t, pool, output[0])


def _scores_backward(ctx, d_scores: Tensor, d_positive: Tensor):
    h, r, t, pool, scores = ctx.saved_tensors
    scoring, gamma, both, chunks = ctx.setting
    if d_positive is None:  # (an output the loss did not use)
        d_positive = h.new_zeros(h.shape[0])
    if d_scores is None:
        d_scores = h.new_zeros(h.shape[0] * (2 if both else 1), pool.shape[0] // chunks)
    return (*_kge_scores_backward(d_scores.contiguous(), d_positive.contiguous(), h, r, t, pool, scores,
                                  *ctx.setting),
            None, None, None, None)


_kge_scores.register_autograd(_scores_backward, setup_context=_keep_inputs)


def kge_scores(h: Tensor, r: Tensor, t: Tensor, pool: Tensor, scoring: str, gamma: float, both: bool,
               chunks: int) -> tuple[Tensor, Tensor]:
    """(negative scores [S B, C], the positives' scores [B]) of edges (h, r, t) against ``pool`` [K C, D]
    (``chunks`` K pools; see the module's text) by ``scoring`` (a name of ``SCORINGS``), forward and
    backward one operator each: autograd's path through ``KgeModel.loss_at``, whose every operation
    ``kge_step`` repeats without a graph (the same bits on the CPU)."""
    return _kge_scores(h, r, t, pool, scoring, gamma, both, chunks)


# ---- the step ----------------------------------------------------------------------------------
def kge_step_parts(values: Tensor, state: Tensor, positions: Tensor, relation_table: Tensor, relations: Tensor,
                   scoring: str, gamma: float, both: bool, softmax: bool, chunks: int, lr: float, eps: float,
                   rowwise: bool, kernel: bool) -> tuple[Tensor, Tensor]:
    """``kge_step``: in plain torch (``kernel`` false: autograd's path's operations in its order, bit for
    bit) or with the kernels in their place."""
    size = relations.shape[0]
    score = SCORINGS[scoring](gamma)
    h, t, pool = values.index_select(0, positions).split([size, size, positions.shape[0] - 2 * size])
    r = relation_table.index_select(0, relations)
    scores, positive = score.scores(h, r, t, pool, both, chunks, kernel)
    loss, d_scores, d_positive = (kernels.negative_loss_kernel if kernel else kernels.negative_loss_twin)(
        scores, positive, softmax)
    d_h, d_r, d_t, d_pool = score.gradients(d_scores, d_positive, h, r, t, pool, scores, both, chunks, kernel)
    device = values.device.type != "cpu"
    d_rows = _scatter_add(values, positions, torch.cat([d_h, d_t, d_pool]), device)
    d_relations = _scatter_add(relation_table, relations, d_r, device)
    (kernels.adagrad_rows_kernel if kernel else kernels.adagrad_rows_twin)(values, state, d_rows, lr, eps, rowwise)
    return loss, d_relations


def _scatter_add(like: Tensor, index: Tensor, source: Tensor, device: bool) -> Tensor:
    """The gathers' backward: zeros shaped as ``like``, ``source``'s rows added at ``index``. On the CPU
    as autograd computes it (``index_add_``, serial: the same bits as the reference); on a device by
    ``index_put_`` with accumulation, which sorts the index and adds in its order: the same bits on
    every run, where CUDA's ``index_add_`` adds atomically in whatever order the threads come (OAC's
    bit-identity to its sync replay needs the former)."""
    zeros = torch.zeros_like(like)
    if device:
        return zeros.index_put_((index,), source, accumulate=True)
    return zeros.index_add_(0, index, source)


def _kge_step_impl(values: Tensor, state: Tensor, positions: Tensor, relation_table: Tensor, relations: Tensor,
                   scoring: str, gamma: float, both: bool, softmax: bool, chunks: int, lr: float, eps: float,
                   rowwise: bool) -> tuple[Tensor, Tensor]:
    return kge_step_parts(values, state, positions, relation_table, relations, scoring, gamma, both, softmax, chunks,
                          lr, eps, rowwise, kernel=kernels.in_place_kernels(values, state))


_kge_step = kernels.mutating_operator(
    "kge_step(Tensor(a!) values, Tensor(b!) state, Tensor positions, Tensor relation_table, Tensor relations, "
    "str scoring, float gamma, bool both, bool softmax, int chunks, float lr, float eps, bool rowwise) "
    "-> (Tensor, Tensor)",
    _kge_step_impl, lambda values, state, positions, relation_table, *rest: (values.new_empty(()),
                                                                              torch.empty_like(relation_table)))


def kge_step(values: Tensor, state: Tensor, positions: Tensor, relation_table: Tensor, relations: Tensor,
             scoring: str, gamma: float, both: bool, softmax: bool, chunks: int,
             step: kernels.RowStep) -> tuple[Tensor, Tensor]:
    """A KGE training step on a batch's rows against its sampled negatives, as one operator: the rows
    ``values`` [U, D] gathered at ``positions`` [2B + K C] (the B heads, the B tails, the K pools of C
    candidates), the relations' rows of ``relation_table`` at ``relations`` [B]; scores (``scoring``, a
    name of ``SCORINGS``; ``gamma`` the distance scorers' margin), both sides' unless ``both`` is
    false, the loss (``negative_loss``), every gradient, and Adagrad's row step (``step``) on ``values``
    and ``state`` in place. Returns (the loss, the relation table's gradient): what autograd and the
    row optimizer compute from ``KgeModel.loss_at``. On CUDA the Triton kernels where there are some
    (DistMult and ComplEx against one pool: about 13 launches), the rest torch's operations on the
    device, with sorted scatters (``_scatter_add``)."""
    return _kge_step(values, state, positions, relation_table, relations, scoring, gamma, both, softmax, chunks,
                     step.lr, step.eps, step.rowwise)
