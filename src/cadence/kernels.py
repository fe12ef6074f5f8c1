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
- ``adagrad_rows(values, state, grad, lr, eps, rowwise)``: Adagrad's step on a batch's rows, in place:
  row-wise (``state`` [n, 1] += the mean square of the row's gradient; PyTorch-BigGraph's rule) or
  element-wise (``state`` [n, D] += the squared gradient), then ``values -= lr grad / (sqrt(state) +
  eps)``: one pass over the rows where torch takes six operators.
"""

from __future__ import annotations

import os

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
    rows, width = values.shape
    if rows:
        _adagrad_rows_kernel[(rows,)](values, state, grad.contiguous(), width, 1 if rowwise else width, lr, eps,
                                      BLOCK=ROW_BLOCK)


@torch.library.custom_op("cadence::adagrad_rows", mutates_args=("values", "state"))
def _adagrad_rows(values: Tensor, state: Tensor, grad: Tensor, lr: float, eps: float, rowwise: bool) -> None:
    step = adagrad_rows_kernel if usable(values) and values.is_contiguous() and state.is_contiguous() else adagrad_rows_twin
    step(values, state, grad, lr, eps, rowwise)


def adagrad_rows(values: Tensor, state: Tensor, grad: Tensor, lr: float, eps: float, rowwise: bool) -> None:
    """Adagrad's step on rows [n, D] and their state ([n, 1] row-wise, [n, D] element-wise), in place;
    see the module's text."""
    _adagrad_rows(values, state, grad, lr, eps, rowwise)
