"""A knowledge-graph embedding model's training step as one operator (``cadence::bilinear_step``).

The gathers of a batch's rows, its scores against the shared negatives (``kernels.bilinear_scores``),
the loss (``kernels.negative_loss``), both backwards, the gathers' backward and Adagrad's row step,
with no autograd graph: what the compute stage takes where the task offers it (``Task.fused_step``),
autograd's path staying the reference it is tested against. On the CPU the twins of the kernels, in
autograd's order (the same bits); on CUDA the kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cadence import kernels


def bilinear_step_parts(values: Tensor, state: Tensor, positions: Tensor, relation_table: Tensor, relations: Tensor,
                        complex_: bool, both: bool, softmax: bool, lr: float, eps: float, rowwise: bool,
                        kernel: bool) -> tuple[Tensor, Tensor]:
    """``bilinear_step``: its twin in plain torch (``kernel`` false: autograd's path's operations in
    its order, bit for bit) or the kernels in their place."""
    size = relations.shape[0]
    h, t, pool = values.index_select(0, positions).split([size, size, positions.shape[0] - 2 * size])
    r = relation_table.index_select(0, relations)
    scores, positive = (kernels.bilinear_scores_kernel if kernel else kernels.bilinear_scores_twin)(h, r, t, pool, complex_, both)
    loss, d_scores, d_positive = (kernels.negative_loss_kernel if kernel else kernels.negative_loss_twin)(scores, positive, softmax)
    d_h, d_r, d_t, d_pool = (kernels.bilinear_scores_backward_kernel if kernel else kernels.bilinear_scores_backward_twin)(
        d_scores, d_positive, h, r, t, pool, complex_, both)
    d_rows = _scatter_add(values, positions, torch.cat([d_h, d_t, d_pool]), kernel)
    d_relations = _scatter_add(relation_table, relations, d_r, kernel)
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


def _bilinear_step_impl(values: Tensor, state: Tensor, positions: Tensor, relation_table: Tensor, relations: Tensor,
                        complex_: bool, both: bool, softmax: bool, lr: float, eps: float,
                        rowwise: bool) -> tuple[Tensor, Tensor]:
    return bilinear_step_parts(values, state, positions, relation_table, relations, complex_, both, softmax, lr, eps,
                               rowwise, kernel=kernels.in_place_kernels(values, state))


_bilinear_step = kernels.mutating_operator(
    "bilinear_step(Tensor(a!) values, Tensor(b!) state, Tensor positions, Tensor relation_table, Tensor relations, "
    "bool complex_, bool both, bool softmax, float lr, float eps, bool rowwise) -> (Tensor, Tensor)",
    _bilinear_step_impl, lambda values, state, positions, relation_table, *rest: (values.new_empty(()),
                                                                                   torch.empty_like(relation_table)))


def bilinear_step(values: Tensor, state: Tensor, positions: Tensor, relation_table: Tensor, relations: Tensor,
                  complex_: bool, both: bool, softmax: bool, step: kernels.RowStep) -> tuple[Tensor, Tensor]:
    """A DistMult or ComplEx training step on a batch's rows against its shared negatives, as one
    operator: the rows ``values`` [U, D] gathered at ``positions`` [2B + C] (the B heads, the B tails,
    the C candidates), the relations' rows of ``relation_table`` at ``relations`` [B]; scores, the
    loss (``negative_loss``), every gradient, and Adagrad's row step (``step``) on ``values`` and
    ``state`` in place. Returns (the loss, the relation table's gradient). What autograd and the row
    optimizer compute from ``bilinear_scores`` and ``negative_loss``, bit for bit on the CPU; on CUDA
    the kernels of those operators and of ``adagrad_rows``, with torch's gathers, zeros and sorted
    scatters (``_scatter_add``) between them (about 13 launches; folding the gathers into the
    kernels is what is left to fuse)."""
    return _bilinear_step(values, state, positions, relation_table, relations, complex_, both, softmax,
                          step.lr, step.eps, step.rowwise)
