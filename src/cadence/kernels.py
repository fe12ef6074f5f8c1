"""Fused device kernels (Triton) behind operators of their own, each with a torch twin.

A training step on an accelerator is as fast as its count of kernel launches allows (issue 46: a KGE
step was ~156 launches, the GPU 7% busy). Each operator here does in one kernel what torch does in
many, and is registered with ``torch.library`` as one operator (``cadence::...``), so that:

- on a CUDA device with Triton, it is one launch (plus the few reductions named below);
- anywhere else it runs its **twin**: the same result from plain torch operations (the reference
  the tests compare the kernel with), still dispatched as one operator, so a dispatch-mode count on
  the CPU (``benchmarks/step_operators.py``) counts what the device will launch;
- the kernel itself runs on CPU tensors in Triton's interpreter where ``TRITON_INTERPRET=1`` was set
  before Triton was imported (``tests/conftest.py`` sets it where there is no CUDA device), when
  called by name (``negative_loss_kernel``): the tests compare it with the twin where no GPU is.
  Training on the CPU never takes the interpreter (it is a test device, far slower than the twin).

Operators:

- ``negative_loss(scores, positive, softmax)``: a KGE batch's loss over its sampled negatives'
  scores [N, C] (N = S B: S sides of B edges, row i the edge i mod B) and its positives' [B], and
  its gradient, in one pass over the scores: logistic, ``mean softplus(scores) + mean
  softplus(-positive)``; softmax, the mean over rows of the cross entropy of ``[positive[i mod B],
  scores[i]]`` with class 0. The backward scales the kept gradients. Deterministic: per-row and
  per-block partial sums reduced by torch in a fixed order, no atomics.
- ``bilinear_scores_kernel(h, r, t, pool, complex_, both)`` and its backward: DistMult's or ComplEx's
  scores of a batch's edges against one shared pool of negatives, tail queries' rows then (``both``)
  head queries', and the positives' scores; and their gradients (the edges', the pool's): tiled
  products (``tl.dot`` in full float32) with the queries made in the tiles' prologue. The operator
  that calls them (or their twins) is ``kge_step.kge_scores``.
- ``adagrad_rows(values, state, grad, lr, eps, rowwise)``: Adagrad's step on a batch's rows, in place:
  row-wise (``state`` [n, 1] += the mean square of the row's gradient; PyTorch-BigGraph's rule) or
  element-wise (``state`` [n, D] += the squared gradient), then ``values -= lr grad / (sqrt(state) +
  eps)``: one pass over the rows where torch takes six operators; ``adagrad_dense``, the same step as
  ``torch.optim.Adagrad`` takes it on a dense parameter, its step count included.

A whole training step built from them is ``cadence.kge_step``.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheel of torch comes without Triton: the twins run
    triton = None

AVAILABLE = triton is not None
INTERPRETED = AVAILABLE and os.environ.get("TRITON_INTERPRET") == "1"
# CADENCE_KERNELS=0: the twins everywhere (a device where a kernel misbehaves keeps training, and the
# two can be compared on it)
ENABLED = os.environ.get("CADENCE_KERNELS", "1") != "0"
BLOCK = 1024  # elements a program of the elementwise kernels takes
ROW_BLOCK = 256  # columns a softmax program reads at a time


# The operators that only mutate their inputs (no autograd formula) are defined on the dispatcher
# directly: ``torch.library.custom_op``'s Python layers (its in-place-or-view step fills every
# argument's default) cost ~45 us a call, a step's worth of work at d=8; a plain definition ~5 us.
_LIBRARY = torch.library.Library("cadence", "FRAGMENT")


def mutating_operator(schema: str, implementation, fake=lambda *args: None):
    """Define ``cadence::<schema>`` with ``implementation`` for every device and ``fake`` (its outputs'
    shapes: none by default) for tracing; return the operator."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema)
    _LIBRARY.impl(name, implementation, "CompositeExplicitAutograd")
    torch.library.register_fake(f"cadence::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.cadence, name).default


def usable(tensor: Tensor) -> bool:
    """Whether an operator runs its kernel on ``tensor``: Triton is there, the tensor is float32 (the
    kernels compute in it) on a CUDA device, and ``CADENCE_KERNELS`` is not ``0``."""
    return ENABLED and AVAILABLE and not INTERPRETED and tensor.dtype == torch.float32 and tensor.is_cuda


# ---- negative_loss -----------------------------------------------------------------------------
def negative_loss_twin(scores: Tensor, positive: Tensor, softmax: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(loss [], its gradient with respect to ``scores`` [N, C] and to ``positive`` [B]) in plain torch."""
    rows, size = scores.shape[0], positive.shape[0]
    if softmax:
        sides = rows // size
        logits = torch.cat([positive.repeat(sides).unsqueeze(1), scores], dim=1)
        top = logits.logsumexp(dim=1, keepdim=True)
        chance = (logits - top).exp_().div_(rows)  # softmax / rows: d loss / d logits but class 0's -1 / rows
        loss = (top.squeeze(1) - logits[:, 0]).mean()
        d_positive = (chance[:, 0] - 1.0 / rows).view(sides, size).sum(0)
        return loss, chance[:, 1:].contiguous(), d_positive
    count = scores.numel()
    loss = torch.nn.functional.softplus(scores).sum() / count + torch.nn.functional.softplus(-positive).mean()
    return loss, torch.sigmoid(scores).div_(count), torch.sigmoid(-positive).div_(-size)


if AVAILABLE:
    @triton.jit
    def _softplus(x):
        e = tl.exp(-tl.abs(x))
        return tl.maximum(x, 0.0) + tl.log(1.0 + e), tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    @triton.jit
    def _logistic_kernel(scores, count, positive, size, d_scores, d_positive, partial, scale_n, scale_b,
                         BLOCK: tl.constexpr):
        """Programs [0, ceil(count / BLOCK)) take the scores, the rest the positives (negated)."""
        pid = tl.program_id(0)
        score_programs = tl.cdiv(count, BLOCK)
        if pid < score_programs:
            offsets = pid * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < count
            x = tl.load(scores + offsets, mask=mask, other=0.0)
            value, slope = _softplus(x)
            tl.store(d_scores + offsets, slope * scale_n, mask=mask)
            tl.store(partial + pid, tl.sum(tl.where(mask, value, 0.0), axis=0) * scale_n)
        else:
            offsets = (pid - score_programs) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < size
            x = -tl.load(positive + offsets, mask=mask, other=0.0)
            value, slope = _softplus(x)
            tl.store(d_positive + offsets, -slope * scale_b, mask=mask)
            tl.store(partial + pid, tl.sum(tl.where(mask, value, 0.0), axis=0) * scale_b)

    @triton.jit
    def _softmax_kernel(scores, columns, positive, size, d_scores, d_positive_rows, row_loss, scale,
                        BLOCK: tl.constexpr):
        """One program a row: class 0 is positive[row mod size]; two passes over the row's columns
        (an online max and sum, then the gradient)."""
        row = tl.program_id(0)
        p = tl.load(positive + row % size)
        top = p
        total = 1.0  # exp(p - top) with top = p
        for start in range(0, columns, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            x = tl.load(scores + row * columns + offsets, mask=offsets < columns, other=float("-inf"))
            new_top = tl.maximum(top, tl.max(x, axis=0))
            total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), axis=0)
            top = new_top
        lse = top + tl.log(total)
        for start in range(0, columns, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            mask = offsets < columns
            x = tl.load(scores + row * columns + offsets, mask=mask, other=0.0)
            tl.store(d_scores + row * columns + offsets, tl.exp(x - lse) * scale, mask=mask)
        tl.store(d_positive_rows + row, (tl.exp(p - lse) - 1.0) * scale)
        tl.store(row_loss + row, lse - p)


def negative_loss_kernel(scores: Tensor, positive: Tensor, softmax: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``negative_loss_twin``'s result from the Triton kernels (``usable`` tensors): one launch, then
    torch's fixed-order sums of the partial losses (and, under softmax, of the sides' positive
    gradients)."""
    scores, positive = scores.contiguous(), positive.contiguous()
    rows, columns = scores.shape
    size = positive.shape[0]
    d_scores = torch.empty_like(scores)
    if softmax:
        d_rows, row_loss = scores.new_empty(rows), scores.new_empty(rows)
        _softmax_kernel[(rows,)](scores, columns, positive, size, d_scores, d_rows, row_loss, 1.0 / rows,
                                 BLOCK=ROW_BLOCK)
        return row_loss.sum() / rows, d_scores, d_rows.view(rows // size, size).sum(0)
    count = scores.numel()
    programs = triton.cdiv(count, BLOCK) + triton.cdiv(size, BLOCK)
    d_positive, partial = torch.empty_like(positive), scores.new_empty(programs)
    _logistic_kernel[(programs,)](scores, count, positive, size, d_scores, d_positive, partial, 1.0 / count,
                                  1.0 / size, BLOCK=BLOCK)
    return partial.sum(), d_scores, d_positive


@torch.library.custom_op("cadence::negative_loss", mutates_args=())
def _negative_loss(scores: Tensor, positive: Tensor, softmax: bool) -> tuple[Tensor, Tensor, Tensor]:
    compute = negative_loss_kernel if usable(scores) else negative_loss_twin
    loss, d_scores, d_positive = compute(scores, positive, softmax)
    return loss, d_scores, d_positive


@_negative_loss.register_fake
def _(scores: Tensor, positive: Tensor, softmax: bool) -> tuple[Tensor, Tensor, Tensor]:
    return scores.new_empty(()), torch.empty_like(scores), torch.empty_like(positive)


def _keep(ctx, inputs, output) -> None:
    ctx.set_materialize_grads(False)  # the gradients' own outputs get none: no zeros made for them
    ctx.save_for_backward(output[1], output[2])


def _backward(ctx, grad_loss: Tensor, _grad_d_scores, _grad_d_positive):
    d_scores, d_positive = ctx.saved_tensors
    return d_scores * grad_loss, d_positive * grad_loss, None


_negative_loss.register_autograd(_backward, setup_context=_keep)


def negative_loss(scores: Tensor, positive: Tensor, softmax: bool) -> Tensor:
    """The loss (a scalar with a gradient for ``scores`` and ``positive``); see the module's text."""
    return _negative_loss(scores, positive, softmax)[0]


# ---- adagrad_rows ------------------------------------------------------------------------------
def adagrad_rows_twin(values: Tensor, state: Tensor, grad: Tensor, lr: float, eps: float, rowwise: bool) -> None:
    """Adagrad's row step in plain torch, in place (the rule ``cadence.optim`` always applied)."""
    if rowwise:
        state.add_(grad.square().mean(dim=1, keepdim=True))
    else:
        state.addcmul_(grad, grad)
    values.addcdiv_(grad, state.sqrt().add_(eps), value=-lr)


if AVAILABLE:
    @triton.jit
    def _adagrad_rows_kernel(values, state, grad, width, state_width, lr, eps, BLOCK: tl.constexpr):
        """One program a row: (row-wise) the mean square of its gradient first, then the update."""
        row = tl.program_id(0)
        if state_width == 1:
            squares = 0.0
            for start in range(0, width, BLOCK):
                offsets = start + tl.arange(0, BLOCK)
                g = tl.load(grad + row * width + offsets, mask=offsets < width, other=0.0)
                squares += tl.sum(g * g, axis=0)
            total = tl.load(state + row) + squares / width
            tl.store(state + row, total)
            scale = lr / (tl.sqrt(total) + eps)
            for start in range(0, width, BLOCK):
                offsets = start + tl.arange(0, BLOCK)
                mask = offsets < width
                g = tl.load(grad + row * width + offsets, mask=mask, other=0.0)
                v = tl.load(values + row * width + offsets, mask=mask, other=0.0)
                tl.store(values + row * width + offsets, v - scale * g, mask=mask)
        else:
            for start in range(0, width, BLOCK):
                offsets = start + tl.arange(0, BLOCK)
                mask = offsets < width
                g = tl.load(grad + row * width + offsets, mask=mask, other=0.0)
                total = tl.load(state + row * width + offsets, mask=mask, other=0.0) + g * g
                tl.store(state + row * width + offsets, total, mask=mask)
                v = tl.load(values + row * width + offsets, mask=mask, other=0.0)
                tl.store(values + row * width + offsets, v - lr * g / (tl.sqrt(total) + eps), mask=mask)


def adagrad_rows_kernel(values: Tensor, state: Tensor, grad: Tensor, lr: float, eps: float, rowwise: bool) -> None:
    """``adagrad_rows_twin``'s step from the Triton kernel, in place (contiguous rows)."""
    assert values.is_contiguous() and state.is_contiguous(), "the kernel steps contiguous rows in place"
    if values.dim() != 2:  # a dense parameter of any shape (a bias, a conv weight), element-wise: as rows
        assert not rowwise, "a row-wise step takes rows [n, D]"
        values, state, grad = (t.reshape(-1, values.shape[-1] if values.dim() else 1) for t in (values, state, grad))
    rows, width = values.shape
    if rows:
        _adagrad_rows_kernel[(rows,)](values, state, grad.contiguous(), width, 1 if rowwise else width, lr, eps,
                                      BLOCK=ROW_BLOCK)


def in_place_kernels(values: Tensor, state: Tensor) -> bool:
    """Whether the kernels that step rows in place run on ``values`` and ``state`` (contiguous ones)."""
    return usable(values) and values.is_contiguous() and state.is_contiguous()


def _adagrad(values: Tensor, state: Tensor, grad: Tensor, lr: float, eps: float, rowwise: bool) -> None:
    """``adagrad_rows``'s step where it is already inside an operator: the kernel where usable."""
    step = adagrad_rows_kernel if in_place_kernels(values, state) else adagrad_rows_twin
    step(values, state, grad, lr, eps, rowwise)


_adagrad_rows = mutating_operator(
    "adagrad_rows(Tensor(a!) values, Tensor(b!) state, Tensor grad, float lr, float eps, bool rowwise) -> ()",
    _adagrad)


def adagrad_rows(values: Tensor, state: Tensor, grad: Tensor, lr: float, eps: float, rowwise: bool) -> None:
    """Adagrad's step on rows [n, D] and their state ([n, 1] row-wise, [n, D] element-wise), in place;
    see the module's text."""
    _adagrad_rows(values, state, grad, lr, eps, rowwise)


def _adagrad_dense_impl(param: Tensor, total: Tensor, steps: Tensor, grad: Tensor, lr: float, eps: float) -> None:
    steps.add_(1)  # (a host-side count: torch.optim.Adagrad keeps its step on the CPU)
    _adagrad(param, total, grad, lr, eps, rowwise=False)


_adagrad_dense = mutating_operator(
    "adagrad_dense(Tensor(a!) param, Tensor(b!) total, Tensor(c!) steps, Tensor grad, float lr, float eps) -> ()",
    _adagrad_dense_impl)


def adagrad_dense(param: Tensor, total: Tensor, steps: Tensor, grad: Tensor, lr: float, eps: float) -> None:
    """``torch.optim.Adagrad``'s step of one parameter (its state's ``sum`` and ``step``; no rate decay),
    in place, as one operator: the element-wise row step over the whole parameter."""
    _adagrad_dense(param, total, steps, grad, lr, eps)


class RowStep(NamedTuple):
    """Adagrad's row step as a fused training step applies it (``kge_step.kge_step``): a rate, an epsilon,
    row-wise or element-wise state."""
    lr: float
    eps: float
    rowwise: bool


# ---- bilinear_scores ---------------------------------------------------------------------------
# DistMult and ComplEx score a candidate c as the dot of a query with it: the tail query of (h, r) is
# h r, the head query of (r, t) is conj(r) t (complex products of [real | imaginary] halves for
# ComplEx; plain products, conj the identity, for DistMult), and the positive score is (h r) . t.
def complex_product(a: Tensor, b: Tensor) -> Tensor:
    """The complex products of rows of ``[real | imaginary]`` halves (the scorers' too)."""
    ar, ai = a.chunk(2, dim=-1)
    br, bi = b.chunk(2, dim=-1)
    return torch.cat([ar * br - ai * bi, ar * bi + ai * br], dim=-1)


def conjugate(a: Tensor) -> Tensor:
    """The complex conjugates of rows of ``[real | imaginary]`` halves."""
    real, imag = a.chunk(2, dim=-1)
    return torch.cat([real, -imag], dim=-1)


def _product(a: Tensor, b: Tensor, complex_: bool) -> Tensor:
    return complex_product(a, b) if complex_ else a * b


def _conj(a: Tensor, complex_: bool) -> Tensor:
    return conjugate(a) if complex_ else a


def bilinear_queries(h: Tensor, r: Tensor, t: Tensor, complex_: bool, both: bool) -> tuple[Tensor, Tensor]:
    """(the queries [S B, D]: the tail queries h r, then the head queries conj(r) t when ``both``; the
    tail queries [B, D], whose dot with t is the positive's score)."""
    tail = _product(h, r, complex_)
    return (torch.cat([tail, _product(_conj(r, complex_), t, complex_)]) if both else tail), tail


def bilinear_scores_twin(h: Tensor, r: Tensor, t: Tensor, pool: Tensor, complex_: bool,
                         both: bool) -> tuple[Tensor, Tensor]:
    """(scores [S B, C]: the tail queries' rows against ``pool``, then the head queries' when ``both``;
    the positives' scores [B]) in plain torch."""
    queries, tail = bilinear_queries(h, r, t, complex_, both)
    return queries @ pool.t(), (tail * t).sum(-1)


NARROW = 16  # columns of a product below which the CPU's GEMM is faster computing its transpose


def times(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``; for a narrow ``b`` (a few columns: d=8 embeddings) as ``(b^T a^T)^T``, which the
    CPU's GEMM computes ~4x faster ([2000 x 100] @ [100 x 8]: 225 us against 59 us on one thread;
    no faster from 128 columns on)."""
    return torch.mm(b.t(), a.t()).t() if b.shape[1] <= NARROW else a @ b


def bilinear_queries_backward(d_queries: Tensor, d_positive: Tensor, h: Tensor, r: Tensor, t: Tensor, tail: Tensor,
                              complex_: bool, both: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients (h, r, t) from those of ``bilinear_queries``' queries and of the positives' scores
    (``tail``: the tail queries): a product's gradient to one factor is the product's gradient times
    the other's conjugate."""
    size = h.shape[0]
    d_tail = d_queries[:size] + d_positive.unsqueeze(1) * t
    d_h = _product(d_tail, _conj(r, complex_), complex_)
    d_r = _product(d_tail, _conj(h, complex_), complex_)
    d_t = d_positive.unsqueeze(1) * tail
    if both:
        d_head = d_queries[size:]
        d_t = d_t + _product(d_head, r, complex_)
        d_r = d_r + _product(_conj(d_head, complex_), t, complex_)
    return d_h, d_r, d_t


def bilinear_scores_backward_twin(d_scores: Tensor, d_positive: Tensor, h: Tensor, r: Tensor, t: Tensor,
                                  pool: Tensor, complex_: bool, both: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients (h, r, t, pool) of ``bilinear_scores_twin`` from those of its outputs: the queries'
    gradient is d_scores pool, the pool's d_scores^T queries."""
    queries, tail = bilinear_queries(h, r, t, complex_, both)
    d_h, d_r, d_t = bilinear_queries_backward(times(d_scores, pool), d_positive, h, r, t, tail, complex_, both)
    return d_h, d_r, d_t, times(d_scores.t(), queries)


TILE = 32  # rows, columns and depth of a GEMM tile (tl.dot wants at least 16)

if AVAILABLE:
    @triton.jit
    def _queries(h, r, t, rows, is_tail, cols, mask, D, HALF, COMPLEX: tl.constexpr):
        """The query tiles (real, imaginary; imaginary zero for DistMult) of rows ``rows`` (edge ids),
        tail queries where ``is_tail``, head queries elsewhere, at depth ``cols``."""
        if COMPLEX:
            hr = tl.load(h + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
            hi = tl.load(h + rows[:, None] * D + HALF + cols[None, :], mask=mask, other=0.0)
            rr = tl.load(r + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
            ri = tl.load(r + rows[:, None] * D + HALF + cols[None, :], mask=mask, other=0.0)
            tr = tl.load(t + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
            ti = tl.load(t + rows[:, None] * D + HALF + cols[None, :], mask=mask, other=0.0)
            real = tl.where(is_tail[:, None], hr * rr - hi * ri, rr * tr + ri * ti)
            imag = tl.where(is_tail[:, None], hr * ri + hi * rr, rr * ti - ri * tr)
            return real, imag
        hv = tl.load(h + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
        rv = tl.load(r + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
        tv = tl.load(t + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
        return tl.where(is_tail[:, None], hv * rv, rv * tv), tl.zeros_like(hv)

    @triton.jit
    def _bilinear_forward_kernel(h, r, t, pool, scores, positive, B, M, C, D, HALF,
                                 COMPLEX: tl.constexpr, TILE: tl.constexpr):
        """Scores [M, C] (M = S B) tile by tile; the programs of the first column tile also write the
        positive scores of their tail rows."""
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        m = pid_m * TILE + tl.arange(0, TILE)
        n = pid_n * TILE + tl.arange(0, TILE)
        rows, is_tail = m % B, m < B
        depth = HALF if COMPLEX else D
        acc = tl.zeros((TILE, TILE), dtype=tl.float32)
        pos = tl.zeros((TILE,), dtype=tl.float32)
        for k in range(0, depth, TILE):
            cols = k + tl.arange(0, TILE)
            qmask = (m[:, None] < M) & (cols[None, :] < depth)
            pmask = (n[:, None] < C) & (cols[None, :] < depth)
            qr, qi = _queries(h, r, t, rows, is_tail, cols, qmask, D, HALF, COMPLEX)
            pr = tl.load(pool + n[:, None] * D + cols[None, :], mask=pmask, other=0.0)
            acc += tl.dot(qr, tl.trans(pr), input_precision="ieee")
            tr = tl.load(t + rows[:, None] * D + cols[None, :], mask=qmask, other=0.0)
            pos += tl.sum(tl.where(is_tail[:, None], qr * tr, 0.0), axis=1)
            if COMPLEX:
                pi = tl.load(pool + n[:, None] * D + HALF + cols[None, :], mask=pmask, other=0.0)
                acc += tl.dot(qi, tl.trans(pi), input_precision="ieee")
                ti = tl.load(t + rows[:, None] * D + HALF + cols[None, :], mask=qmask, other=0.0)
                pos += tl.sum(tl.where(is_tail[:, None], qi * ti, 0.0), axis=1)
        tl.store(scores + m[:, None] * C + n[None, :], acc, mask=(m[:, None] < M) & (n[None, :] < C))
        if pid_n == 0:
            tl.store(positive + m, pos, mask=is_tail & (m < M))

    @triton.jit
    def _bilinear_rows_kernel(d_scores, d_positive, h, r, t, pool, d_h, d_r, d_t, B, C, D, HALF,
                              BOTH: tl.constexpr, COMPLEX: tl.constexpr, TILE: tl.constexpr):
        """The edges' gradients: the queries' (d_scores pool, tail rows and head rows of the same
        edges in one program) carried to h, r and t."""
        pid_b, pid_k = tl.program_id(0), tl.program_id(1)
        b = pid_b * TILE + tl.arange(0, TILE)
        cols = pid_k * TILE + tl.arange(0, TILE)
        depth = HALF if COMPLEX else D
        tr_re = tl.zeros((TILE, TILE), dtype=tl.float32)
        tr_im = tl.zeros((TILE, TILE), dtype=tl.float32)
        hd_re = tl.zeros((TILE, TILE), dtype=tl.float32)
        hd_im = tl.zeros((TILE, TILE), dtype=tl.float32)
        for start in range(0, C, TILE):
            n = start + tl.arange(0, TILE)
            pmask = (n[:, None] < C) & (cols[None, :] < depth)
            pr = tl.load(pool + n[:, None] * D + cols[None, :], mask=pmask, other=0.0)
            smask = (b[:, None] < B) & (n[None, :] < C)
            st = tl.load(d_scores + b[:, None] * C + n[None, :], mask=smask, other=0.0)
            tr_re += tl.dot(st, pr, input_precision="ieee")
            if BOTH:
                sh = tl.load(d_scores + (B + b)[:, None] * C + n[None, :], mask=smask, other=0.0)
                hd_re += tl.dot(sh, pr, input_precision="ieee")
            if COMPLEX:
                pi = tl.load(pool + n[:, None] * D + HALF + cols[None, :], mask=pmask, other=0.0)
                tr_im += tl.dot(st, pi, input_precision="ieee")
                if BOTH:
                    hd_im += tl.dot(sh, pi, input_precision="ieee")
        mask = (b[:, None] < B) & (cols[None, :] < depth)
        at = b[:, None] * D + cols[None, :]
        dp = tl.load(d_positive + b, mask=b < B, other=0.0)[:, None]
        if COMPLEX:
            hr, hi = tl.load(h + at, mask=mask, other=0.0), tl.load(h + at + HALF, mask=mask, other=0.0)
            rr, ri = tl.load(r + at, mask=mask, other=0.0), tl.load(r + at + HALF, mask=mask, other=0.0)
            t_r, t_i = tl.load(t + at, mask=mask, other=0.0), tl.load(t + at + HALF, mask=mask, other=0.0)
            g_re, g_im = tr_re + dp * t_r, tr_im + dp * t_i  # the tail query's gradient, the positive's with it
            tl.store(d_h + at, g_re * rr + g_im * ri, mask=mask)
            tl.store(d_h + at + HALF, g_im * rr - g_re * ri, mask=mask)
            # d r = g conj(h) + conj(d head) t;  d t = d head r + dp (h r)
            tl.store(d_r + at, g_re * hr + g_im * hi + hd_re * t_r + hd_im * t_i, mask=mask)
            tl.store(d_r + at + HALF, g_im * hr - g_re * hi + hd_re * t_i - hd_im * t_r, mask=mask)
            tl.store(d_t + at, hd_re * rr - hd_im * ri + dp * (hr * rr - hi * ri), mask=mask)
            tl.store(d_t + at + HALF, hd_re * ri + hd_im * rr + dp * (hr * ri + hi * rr), mask=mask)
        else:
            hv, rv, tv = tl.load(h + at, mask=mask, other=0.0), tl.load(r + at, mask=mask, other=0.0), \
                tl.load(t + at, mask=mask, other=0.0)
            g = tr_re + dp * tv
            tl.store(d_h + at, g * rv, mask=mask)
            tl.store(d_r + at, g * hv + hd_re * tv, mask=mask)
            tl.store(d_t + at, hd_re * rv + dp * hv * rv, mask=mask)

    @triton.jit
    def _bilinear_pool_kernel(d_scores, h, r, t, d_pool, B, M, C, D, HALF, COMPLEX: tl.constexpr,
                              TILE: tl.constexpr):
        """The pool's gradient, d_scores^T queries, the queries made again tile by tile."""
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        n = pid_n * TILE + tl.arange(0, TILE)
        cols = pid_k * TILE + tl.arange(0, TILE)
        depth = HALF if COMPLEX else D
        acc_re = tl.zeros((TILE, TILE), dtype=tl.float32)
        acc_im = tl.zeros((TILE, TILE), dtype=tl.float32)
        for start in range(0, M, TILE):
            m = start + tl.arange(0, TILE)
            qr, qi = _queries(h, r, t, m % B, m < B, cols, (m[:, None] < M) & (cols[None, :] < depth), D, HALF, COMPLEX)
            s = tl.load(d_scores + m[None, :] * C + n[:, None], mask=(m[None, :] < M) & (n[:, None] < C), other=0.0)
            acc_re += tl.dot(s, qr, input_precision="ieee")
            if COMPLEX:
                acc_im += tl.dot(s, qi, input_precision="ieee")
        mask = (n[:, None] < C) & (cols[None, :] < depth)
        tl.store(d_pool + n[:, None] * D + cols[None, :], acc_re, mask=mask)
        if COMPLEX:
            tl.store(d_pool + n[:, None] * D + HALF + cols[None, :], acc_im, mask=mask)


def bilinear_scores_kernel(h: Tensor, r: Tensor, t: Tensor, pool: Tensor, complex_: bool,
                           both: bool) -> tuple[Tensor, Tensor]:
    """``bilinear_scores_twin``'s result from one Triton kernel."""
    h, r, t, pool = (x.contiguous() for x in (h, r, t, pool))
    size, width = h.shape
    rows, count = size * (2 if both else 1), pool.shape[0]
    scores, positive = h.new_empty(rows, count), h.new_empty(size)
    grid = (triton.cdiv(rows, TILE), triton.cdiv(count, TILE))
    _bilinear_forward_kernel[grid](h, r, t, pool, scores, positive, size, rows, count, width, width // 2,
                                   COMPLEX=complex_, TILE=TILE)
    return scores, positive


def bilinear_scores_backward_kernel(d_scores: Tensor, d_positive: Tensor, h: Tensor, r: Tensor, t: Tensor,
                                    pool: Tensor, complex_: bool, both: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``bilinear_scores_backward_twin``'s gradients from two Triton kernels (the edges', the pool's)."""
    d_scores, d_positive, h, r, t, pool = (x.contiguous() for x in (d_scores, d_positive, h, r, t, pool))
    size, width = h.shape
    count, depth = pool.shape[0], width // 2 if complex_ else width
    d_h, d_r, d_t, d_pool = (torch.empty_like(x) for x in (h, r, t, pool))
    _bilinear_rows_kernel[(triton.cdiv(size, TILE), triton.cdiv(depth, TILE))](
        d_scores, d_positive, h, r, t, pool, d_h, d_r, d_t, size, count, width, width // 2,
        BOTH=both, COMPLEX=complex_, TILE=TILE)
    _bilinear_pool_kernel[(triton.cdiv(count, TILE), triton.cdiv(depth, TILE))](
        d_scores, h, r, t, d_pool, size, d_scores.shape[0], count, width, width // 2, COMPLEX=complex_, TILE=TILE)
    return d_h, d_r, d_t, d_pool
