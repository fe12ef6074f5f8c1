"""Compiled CPU kernels (numba): one pass over a batch where torch needs a dozen ops, each op a
pass over memory. A task uses a kernel only for CPU tensors and when ``train.compiled`` is on; the
torch formulation it replaces stays the reference (tests compare the two) and the path on an
accelerator or where numba cannot be imported (``AVAILABLE`` is then False).

Every kernel is single-threaded, compiled with ``fastmath`` (reductions vectorised: 2.4x on the
MF kernel; the order of a sum's terms is then the compiler's, fixed for a given machine), releases
the GIL (``nogil``: a parameter server's worker threads run theirs at once), and visits its entries in one fixed order, so its result is the same bits
whatever the thread count or the strategy that calls it. ``cache=True`` keeps the machine code
next to this file (or in numba's user cache where that is read-only): only the first run on a
machine compiles (about a second per kernel).

Kernels:

- ``biased_mf_loss_and_gradient``: biased matrix factorisation's batch loss and its gradient with
  respect to the batch's rows (tasks/mf.py has the formula and the torch reference).
- ``unique_keys``: the sorted distinct keys of a batch in a small key space and each key's position
  among them (``torch.unique(keys, return_inverse=True)``, the same integers; used whenever numba is
  there, whatever ``train.compiled`` says, since the result cannot differ).
- ``skipgram_loss_and_gradient``: skip-gram with negative sampling's batch loss and its gradient,
  pair by pair as word2vec's inner loop, into a gradient buffer instead of the rows themselves
  (tasks/w2v.py has the formula and the torch reference).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; a broken install falls back to torch ops
    numba = None

AVAILABLE = numba is not None


def usable(rows: Tensor) -> bool:
    """Whether a kernel can run on a batch's rows: numba is there, and they are float32 on the CPU
    (the kernels compute in float32, as the store keeps rows)."""
    return AVAILABLE and rows.device.type == "cpu" and rows.dtype == torch.float32


def _array(tensor: Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (no copy where it is contiguous), outside autograd."""
    return tensor.detach().contiguous().numpy()


class KernelLoss(torch.autograd.Function):
    """A loss whose kernel returns its gradient with it: a subclass's ``forward`` calls a kernel and
    returns ``KernelLoss.keep(ctx, rows, loss, gradient)``; the backward scales the kept gradient
    (rows are the first input; the other inputs get no gradient)."""

    @staticmethod
    def keep(ctx, rows: Tensor, loss: float, gradient: Tensor) -> Tensor:
        ctx.save_for_backward(gradient)
        return torch.tensor(loss, dtype=rows.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (gradient,) = ctx.saved_tensors
        return (gradient if bool(grad == 1) else gradient * grad), *(None,) * (len(ctx.needs_input_grad) - 1)


# LLVM's fast-math flags that let a sum be reordered (and so vectorised), without the ones that
# assume no infinity or NaN ever occurs
FAST = {"reassoc", "contract", "nsz", "arcp"}

if AVAILABLE:
    @numba.njit(nogil=True, cache=True, fastmath=FAST)
    def _biased_mf(rows, users, items, ratings, mean, reg, scale, grad):  # pragma: no cover - compiled
        width = rows.shape[1]
        factors = width - 1
        total = 0.0
        for b in range(users.shape[0]):
            u, i = users[b], items[b]
            dot, norm_u, norm_i = np.float32(0.0), np.float32(0.0), np.float32(0.0)
            for k in range(factors):
                x, y = rows[u, k], rows[i, k]
                dot += x * y
                norm_u += x * x
                norm_i += y * y
            bias_u, bias_i = rows[u, factors], rows[i, factors]
            error = ratings[b] - (mean + dot + bias_u + bias_i)
            total += error * error + reg * (norm_u + bias_u * bias_u + norm_i + bias_i * bias_i)
            residual = np.float32(-2.0 * error * scale)
            decay = np.float32(2.0 * reg * scale)
            for k in range(factors):
                x, y = rows[u, k], rows[i, k]
                grad[u, k] += residual * y + decay * x
                grad[i, k] += residual * x + decay * y
            grad[u, factors] += residual + decay * bias_u
            grad[i, factors] += residual + decay * bias_i
        return total


if AVAILABLE:
    @numba.njit(nogil=True, cache=True, fastmath=FAST)
    def _skipgram(rows, inputs, outputs, rate, grad, context):  # pragma: no cover - compiled
        width = rows.shape[1]
        total = 0.0
        for p in range(inputs.shape[0]):
            i = inputs[p]
            for d in range(width):
                context[d] = 0.0
            for k in range(outputs.shape[1]):
                o = outputs[p, k]
                score = np.float32(0.0)
                for d in range(width):
                    score += rows[o, d] * rows[i, d]
                # sigmoid and softplus from one exp of a non-positive number (no overflow):
                # softplus(x) = max(x, 0) + log1p(exp(-|x|))
                e = np.exp(-abs(score))
                sigmoid = 1.0 / (1.0 + e) if score >= 0 else e / (1.0 + e)
                tail = np.log1p(e)
                if k == 0:  # the positive: softplus(-s), d/ds = sigmoid(s) - 1
                    total += max(-score, 0.0) + tail
                    weight = np.float32((sigmoid - 1.0) * rate)
                else:  # a noise word: softplus(s), d/ds = sigmoid(s)
                    total += max(score, 0.0) + tail
                    weight = np.float32(sigmoid * rate)
                for d in range(width):
                    context[d] += weight * rows[o, d]
                    grad[o, d] += weight * rows[i, d]
            for d in range(width):
                grad[i, d] += context[d]
        return total * rate


def skipgram_loss_and_gradient(rows: Tensor, inputs: Tensor, outputs: Tensor, rate: float) -> tuple[float, Tensor]:
    """(the batch's loss, its gradient [n, dim] with respect to ``rows``) of
    ``rate * sum_p (softplus(-s_p0) + sum_k softplus(s_pk))``, ``s_pk = <rows[outputs[p, k]],
    rows[inputs[p]]>``: each pair's scores in float32 (as torch), the batch's total in float64."""
    gradient = torch.zeros(rows.shape, dtype=torch.float32)
    context = np.zeros(rows.shape[1], np.float32)
    total = _skipgram(_array(rows), _array(inputs), _array(outputs), float(rate), gradient.numpy(), context)
    return total, gradient


if AVAILABLE:
    @numba.njit(nogil=True, cache=True)
    def _unique_small(keys, num_keys, inverse):  # pragma: no cover - compiled
        present = np.zeros(num_keys, np.bool_)
        for key in keys:
            if key < 0 or key >= num_keys:
                return np.empty(0, np.int64), False
            present[key] = True
        position = np.empty(num_keys, np.int64)
        count = 0
        for key in range(num_keys):
            if present[key]:
                position[key] = count
                count += 1
        ids = np.empty(count, np.int64)
        for key in range(num_keys):
            if present[key]:
                ids[position[key]] = key
        for index in range(keys.shape[0]):
            inverse[index] = position[keys[index]]
        return ids, True


def unique_keys(keys: Tensor, num_keys: int) -> tuple[Tensor, Tensor]:
    """``torch.unique(keys, return_inverse=True)`` for int64 keys in ``[0, num_keys)`` on the CPU,
    in three linear passes (mark, number, map); a key outside the range is an ``IndexError``."""
    inverse = torch.empty(keys.shape, dtype=torch.int64)
    ids, valid = _unique_small(_array(keys), num_keys, inverse.numpy())
    if not valid:
        raise IndexError(f"unique_keys: a key outside [0, {num_keys})")
    return torch.from_numpy(ids), inverse


def warm_up(*kernels: str) -> None:
    """Load (or compile) these kernels (``biased_mf``, ``skipgram``, ``unique_keys``) now, on tiny
    inputs: the first call of a kernel in a process costs 0.3 s (machine code from the cache) to 1-2 s
    (compiled), which a task pays when it is built rather than inside its first timed batch."""
    if not AVAILABLE:
        return
    rows, first, second = torch.zeros(2, 3), torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    for kernel in kernels:
        if kernel == "biased_mf":
            biased_mf_loss_and_gradient(rows, first, second, torch.zeros(1), 0.0, 0.0)
        elif kernel == "skipgram":
            skipgram_loss_and_gradient(rows, first, second.view(1, 1), 1.0)
        elif kernel == "unique_keys":
            unique_keys(second, 2)
        else:
            raise ValueError(f"no kernel {kernel!r}")


def biased_mf_loss_and_gradient(rows: Tensor, users: Tensor, items: Tensor, ratings: Tensor, mean: float,
                                reg: float) -> tuple[float, Tensor]:
    """(the batch's mean loss, its gradient [n, dim + 1] with respect to ``rows``) of
    ``mean_b (e_b^2 + reg (|u_b|^2 + |i_b|^2))``, ``e_b = r_b - (mean + <p_u, q_i> + b_u + b_i)``;
    each rating's sums in float32 (as torch), the batch's total in float64."""
    gradient = torch.zeros(rows.shape, dtype=torch.float32)
    count = users.shape[0]
    total = _biased_mf(_array(rows), _array(users), _array(items), _array(ratings), float(mean), float(reg),
                       1.0 / max(1, count), gradient.numpy())
    return total / max(1, count), gradient
