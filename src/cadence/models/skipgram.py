"""The skip-gram negative-sampling step's inner loops, compiled with numba: the scores of a batch's
pairs, and the gradient of its rows, each loop over the rows of a batch instead of ~30 torch ops a
batch (word2vec spent two thirds of its time in those ops: docs/benchmarks.md, issue 27).

``scores(rows, inputs, outputs)`` -> [P, 1 + K]: ``<rows[outputs[p, k]], rows[inputs[p]]>``.
``gradient(rows, inputs, outputs, coefficients)`` -> [U, D]: the gradient of ``sum_pk c_pk s_pk``
with respect to ``rows``: each output row gets ``c_pk * rows[inputs[p]]`` and each input row
``sum_k c_pk * rows[outputs[p, k]]``.

Deterministic whatever the thread count: the pairs (scores) and the rows (gradient) are cut into
ranges computed on ``torch.get_num_threads()`` threads, but every value is computed whole by one
call, and each row's contributions are summed in one fixed order (a stable counting sort of the
entries by row: output columns in order, then the inputs) whichever thread computes it. The kernels
release the GIL (``nogil``), so several Python threads (a parameter server's workers) may run them
at once. Without numba, ``AVAILABLE`` is False and the task uses torch ops instead.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; a broken install falls back to torch ops
    numba = None

AVAILABLE = numba is not None
SPLIT_BELOW = 2048  # pairs or rows under which one thread does all (a hand-off costs more)

if AVAILABLE:
    @numba.njit(nogil=True, cache=True)
    def _scores(rows, inputs, outputs, first, last, out):  # pragma: no cover - compiled
        width = rows.shape[1]
        for p in range(first, last):
            i = inputs[p]
            for k in range(outputs.shape[1]):
                o = outputs[p, k]
                total = rows[o, 0] * rows[i, 0]
                for d in range(1, width):
                    total += rows[o, d] * rows[i, d]
                out[p, k] = total

    @numba.njit(nogil=True, cache=True)
    def _input_gradients(rows, outputs, coefficients, first, last, out):  # pragma: no cover - compiled
        width = rows.shape[1]
        for p in range(first, last):
            for d in range(width):
                out[p, d] = 0.0
            for k in range(outputs.shape[1]):
                c = coefficients[p, k]
                o = outputs[p, k]
                for d in range(width):
                    out[p, d] += c * rows[o, d]

    @numba.njit(nogil=True, cache=True)
    def _by_row(targets, num_rows):  # pragma: no cover - compiled
        """A stable counting sort of entry indices by their row: (starts [U + 1], order [N])."""
        starts = np.zeros(num_rows + 1, np.int64)
        for t in targets:
            starts[t + 1] += 1
        for r in range(num_rows):
            starts[r + 1] += starts[r]
        fill = starts[:-1].copy()
        order = np.empty(targets.shape[0], np.int64)
        for j in range(targets.shape[0]):
            t = targets[j]
            order[fill[t]] = j
            fill[t] += 1
        return starts, order

    @numba.njit(nogil=True, cache=True)
    def _row_gradients(rows, inputs, coefficients, grad_inputs, pairs, starts, order, first,
                       last, out):  # pragma: no cover - compiled
        width = rows.shape[1]
        columns = coefficients.shape[1]
        outputs_total = pairs * columns
        for r in range(first, last):
            for d in range(width):
                out[r, d] = 0.0
            for j in range(starts[r], starts[r + 1]):
                entry = order[j]
                if entry < outputs_total:  # output column k = entry // pairs, pair p = entry % pairs
                    p = entry % pairs
                    c = coefficients[p, entry // pairs]
                    i = inputs[p]
                    for d in range(width):
                        out[r, d] += c * rows[i, d]
                else:
                    p = entry - outputs_total
                    for d in range(width):
                        out[r, d] += grad_inputs[p, d]

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()


def _in_ranges(kernel, total: int, *args) -> None:
    """``kernel(*args[:-1], first, last, out)`` over ``[0, total)`` in ranges, one per thread."""
    threads = max(1, torch.get_num_threads()) if total >= SPLIT_BELOW else 1
    *inputs, out = args
    if threads == 1:
        kernel(*inputs, 0, total, out)
        return
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE < threads:
            _POOL, _POOL_SIZE = ThreadPoolExecutor(threads, thread_name_prefix="cadence-skipgram"), threads
        pool = _POOL
    bounds = np.linspace(0, total, threads + 1).astype(np.int64)
    futures = [pool.submit(kernel, *inputs, int(a), int(b), out) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    for future in futures:
        future.result()


def scores(rows: Tensor, inputs: Tensor, outputs: Tensor) -> Tensor:
    out = torch.empty(outputs.shape, dtype=rows.dtype)
    _in_ranges(_scores, outputs.shape[0], rows.numpy(), inputs.numpy(), outputs.numpy(), out.numpy())
    return out


def gradient(rows: Tensor, inputs: Tensor, outputs: Tensor, coefficients: Tensor) -> Tensor:
    pairs, columns = outputs.shape
    r, i, o, c = rows.numpy(), inputs.numpy(), outputs.numpy(), coefficients.contiguous().numpy()
    grad_inputs = np.empty((pairs, rows.shape[1]), dtype=r.dtype)
    _in_ranges(_input_gradients, pairs, r, o, c, grad_inputs)
    targets = np.concatenate([o.T.reshape(-1), i])  # output columns in order, then the inputs
    starts, order = _by_row(targets, rows.shape[0])
    out = torch.empty_like(rows)
    _in_ranges(_row_gradients, rows.shape[0], r, i, c, grad_inputs, pairs, starts, order, out.numpy())
    return out
