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
- ``unique_any``: the same for int64 keys of any range (a hash table over the batch, then a sort of
  its distinct keys only; CTR's feature keys).
- ``skipgram_loss_and_gradient``: skip-gram with negative sampling's batch loss and its gradient,
  pair by pair as word2vec's inner loop, into a gradient buffer instead of the rows themselves
  (tasks/w2v.py has the formula and the torch reference).
- ``skipgram_in_place``: word2vec's own loop (``w2v.update: pair``): for each centre word, its
  window and its noise words drawn in the kernel from a counter-based generator (``mix``), and each
  pair's SGD step applied to the rows in place as soon as it is computed, as word2vec.c and gensim
  do. Threads may run it at once on the same rows (Hogwild).
- ``biased_mf_in_place``: biased MF's per-rating SGD step (``mf.update: rating``, Surprise's
  ``SVD`` step) applied to the rows in place, rating by rating; Hogwild between threads too.
- ``hash_slots``: the slot of each key in an open-addressing table with linear probing
  (``store.hash_index``'s layout and hash), key by key in one loop; the numpy rounds it replaces
  stay the reference (used whenever numba is there: the slots cannot differ). ``hash_place``: keys
  put into that table key by key (the numpy rounds place a batch's colliding keys in another order:
  either is a valid table).
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
    @numba.njit(nogil=True, cache=True, fastmath=FAST, inline="always")
    def _mf_error(rows, u, i, rating, mean, reg):  # pragma: no cover - compiled
        """(the rating's error ``r - (mean + <p_u, q_i> + b_u + b_i)``, its penalty ``reg (|u|^2 + |i|^2)``),
        the sums in float32."""
        factors = rows.shape[1] - 1
        dot, norm_u, norm_i = np.float32(0.0), np.float32(0.0), np.float32(0.0)
        for k in range(factors):
            x, y = rows[u, k], rows[i, k]
            dot += x * y
            norm_u += x * x
            norm_i += y * y
        bias_u, bias_i = rows[u, factors], rows[i, factors]
        return rating - (mean + dot + bias_u + bias_i), reg * (norm_u + bias_u * bias_u + norm_i + bias_i * bias_i)

    @numba.njit(nogil=True, cache=True, fastmath=FAST)
    def _biased_mf(rows, users, items, ratings, mean, reg, scale, grad):  # pragma: no cover - compiled
        width = rows.shape[1]
        factors = width - 1
        total = 0.0
        for b in range(users.shape[0]):
            u, i = users[b], items[b]
            error, penalty = _mf_error(rows, u, i, ratings[b], mean, reg)
            total += error * error + penalty
            bias_u, bias_i = rows[u, factors], rows[i, factors]
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


# splitmix64 (Steele, Lea and Flood 2014): the counter-based generator of the in-place skip-gram
# kernel. Every draw is a function of (seed, centre position, draw number), so a centre's window
# and noise words are the same whichever thread trains it and however the batch is split.
GOLDEN = 0x9E3779B97F4A7C15
MIX_1, MIX_2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
MASK = (1 << 64) - 1


def mix(value: int) -> int:
    """splitmix64's output function of a 64-bit ``value`` (the reference the kernel is tested against)."""
    value &= MASK
    value = ((value ^ (value >> 30)) * MIX_1) & MASK
    value = ((value ^ (value >> 27)) * MIX_2) & MASK
    return value ^ (value >> 31)


def draw(seed: int, position: int, number: int) -> int:
    """Draw ``number`` (0, 1, ...) of the centre at ``position``: 64 random bits."""
    return mix(seed + position * GOLDEN + (number + 1) * MIX_2)


if AVAILABLE:
    _GOLDEN, _MIX_1, _MIX_2 = np.uint64(GOLDEN), np.uint64(MIX_1), np.uint64(MIX_2)
    _S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)

    @numba.njit(nogil=True, cache=True, inline="always")
    def _draw(seed, position, number):  # pragma: no cover - compiled; ``draw`` in uint64 arithmetic
        value = seed + np.uint64(position) * _GOLDEN + np.uint64(number + 1) * _MIX_2
        value = (value ^ (value >> _S30)) * _MIX_1
        value = (value ^ (value >> _S27)) * _MIX_2
        return value ^ (value >> _S31)

    @numba.njit(nogil=True, cache=True, fastmath=FAST)
    def _skipgram_in_place(table, tokens, sentences, centres, window, shrink, negatives, keep, alias, offset,
                           seed, lr, work):  # pragma: no cover - compiled
        width = table.shape[1]
        length = tokens.shape[0]
        columns = keep.shape[0]
        total = 0.0
        pairs = 0
        unit = 1.0 / 9007199254740992.0  # 2^-53: 53 random bits -> [0, 1)
        for c in range(centres.shape[0]):
            position = centres[c]
            number = 0
            reach = window
            if shrink:
                reach = 1 + np.int64(_draw(seed, position, number) % np.uint64(window))
                number += 1
            target = tokens[position] + offset  # the centre word's output vector: the positive
            sentence = sentences[position]
            for shift in range(-reach, reach + 1):
                context = position + shift
                if shift == 0 or context < 0 or context >= length or sentences[context] != sentence:
                    continue
                i = tokens[context]  # the context word's input vector
                for d in range(width):
                    work[d] = 0.0
                for k in range(negatives + 1):
                    if k == 0:
                        o = target
                    else:
                        bits = _draw(seed, position, number)
                        number += 1
                        column = np.int64(bits % np.uint64(columns))
                        uniform = np.float64(bits >> _S11) * unit
                        # (the column from the low bits, the coin from the high ones: Walker's alias draw)
                        o = (column if uniform < keep[column] else alias[column]) + offset
                        if o == target:  # word2vec.c and gensim skip a noise word equal to the positive
                            continue
                    score = np.float32(0.0)
                    for d in range(width):
                        score += table[o, d] * table[i, d]
                    e = np.exp(-abs(score))
                    sigmoid = 1.0 / (1.0 + e) if score >= 0 else e / (1.0 + e)
                    if k == 0:  # softplus(-s); the step is lr (1 - sigmoid(s))
                        total += max(-score, 0.0) + np.log1p(e)
                        step = np.float32((1.0 - sigmoid) * lr)
                    else:  # softplus(s); the step is -lr sigmoid(s)
                        total += max(score, 0.0) + np.log1p(e)
                        step = np.float32(-sigmoid * lr)
                    for d in range(width):
                        work[d] += step * table[o, d]
                        table[o, d] += step * table[i, d]
                for d in range(width):
                    table[i, d] += work[d]
                pairs += 1
        return total, pairs


def skipgram_in_place(table: Tensor, tokens: Tensor, sentences: Tensor, centres: Tensor, window: int,
                      shrink: bool, negatives: int, keep: Tensor, alias: Tensor, offset: int, seed: int,
                      lr: float) -> tuple[float, int]:
    """Train skip-gram on the windows of ``centres`` (positions in ``tokens``), word2vec's way, in
    place on ``table`` [rows, dim] (float32, contiguous, on the CPU): each centre's reach is
    ``1 + draw % window`` (``shrink``) or ``window``; within its sentence (``sentences``: a sentence
    id per token) each context word's input vector (row ``token``) is trained to predict the centre
    word's output vector (row ``token + offset``) against ``negatives`` noise words, each drawn by
    Walker's alias method (``keep``, ``alias``; rows ``+ offset``) and skipped where it is the
    centre word; every pair's step of size ``lr`` is applied at once. Returns (the sum of the pairs'
    losses ``softplus(-s_0) + sum_k softplus(s_k)``, the number of pairs). ``seed``: every draw is
    ``draw(seed, position, number)``. Threads may call it at once on the same ``table``."""
    work = np.zeros(table.shape[1], np.float32)
    values = table.numpy()  # in place: no copy (the caller passes the rows themselves)
    return _skipgram_in_place(values, _array(tokens), _array(sentences), _array(centres), int(window), bool(shrink),
                              int(negatives), _array(keep), _array(alias), int(offset), np.uint64(seed & MASK),
                              float(lr), work)


if AVAILABLE:
    @numba.njit(nogil=True, cache=True)
    def _unique_hashed(keys, inverse):  # pragma: no cover - compiled
        count_in = keys.shape[0]
        bits = 1
        while (1 << bits) < 2 * count_in:
            bits += 1
        mask = (1 << bits) - 1
        shift = np.uint64(64 - bits)
        golden = np.uint64(0x9E3779B97F4A7C15)
        slots = np.full(1 << bits, -1, np.int64)  # open addressing: the position of a key in ``found``
        found = np.empty(count_in, np.int64)
        count = 0
        for index in range(count_in):
            key = keys[index]
            slot = np.int64((np.uint64(key) * golden) >> shift)
            while True:
                seen = slots[slot]
                if seen < 0:
                    slots[slot] = count
                    found[count] = key
                    inverse[index] = count
                    count += 1
                    break
                if found[seen] == key:
                    inverse[index] = seen
                    break
                slot = (slot + 1) & mask
        distinct = found[:count]
        order = np.argsort(distinct)
        rank = np.empty(count, np.int64)
        for position in range(count):
            rank[order[position]] = position
        for index in range(count_in):
            inverse[index] = rank[inverse[index]]
        return distinct[order]


def unique_any(keys: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.unique(keys, return_inverse=True)`` for 1-D int64 keys of any range (a CTR batch's
    feature keys, ``field << 40 | value``) on the CPU: a hash table over the batch, then a sort of
    its distinct keys only, where torch sorts every key (0.48 ms for a batch of 1024 ML-100k
    examples). The same integers."""
    inverse = torch.empty(keys.shape, dtype=torch.int64)
    ids = _unique_hashed(_array(keys), inverse.numpy())
    return torch.from_numpy(ids), inverse


def unique_keys(keys: Tensor, num_keys: int) -> tuple[Tensor, Tensor]:
    """``torch.unique(keys, return_inverse=True)`` for int64 keys in ``[0, num_keys)`` on the CPU,
    in three linear passes (mark, number, map); a key outside the range is an ``IndexError``."""
    inverse = torch.empty(keys.shape, dtype=torch.int64)
    ids, valid = _unique_small(_array(keys), num_keys, inverse.numpy())
    if not valid:
        raise IndexError(f"unique_keys: a key outside [0, {num_keys})")
    return torch.from_numpy(ids), inverse


if AVAILABLE:
    @numba.njit(nogil=True, cache=True)
    def _hash_slots(wanted, slot_keys, mix, empty, result):  # pragma: no cover - compiled
        mask = slot_keys.shape[0] - 1
        for i in range(wanted.shape[0]):
            key = wanted[i]
            mixed = key * mix  # (wraps modulo 2^64, as numpy's)
            slot = (mixed ^ (mixed >> 29)) & mask
            while True:
                probed = slot_keys[slot]
                if probed == key:
                    result[i] = slot
                    break
                if probed == empty:
                    result[i] = -1
                    break
                slot = (slot + 1) & mask


if AVAILABLE:
    @numba.njit(nogil=True, cache=True)
    def _hash_place(keys, rows, slot_keys, slot_rows, mix, empty, removed):  # pragma: no cover - compiled
        mask = slot_keys.shape[0] - 1
        reused = 0
        for i in range(keys.shape[0]):
            key = keys[i]
            mixed = key * mix
            slot = (mixed ^ (mixed >> 29)) & mask
            while slot_keys[slot] != empty and slot_keys[slot] != removed:
                slot = (slot + 1) & mask
            if slot_keys[slot] == removed:
                reused += 1
            slot_rows[slot] = rows[i]  # the row first, then the key that reveals it
            slot_keys[slot] = key
        return reused


def hash_place(keys: np.ndarray, rows: np.ndarray, slot_keys: np.ndarray, slot_rows: np.ndarray, mix: int,
               empty: int, removed: int) -> int:
    """Put ``keys`` (distinct, none present) with their ``rows`` into the first free slot (``empty`` or
    ``removed``) of each one's probe sequence (``hash_slots``' layout), in order; returns how many
    ``removed`` slots were reused."""
    return int(_hash_place(keys, rows, slot_keys, slot_rows, np.int64(mix), np.int64(empty), np.int64(removed)))


def hash_slots(wanted: np.ndarray, slot_keys: np.ndarray, mix: int, empty: int) -> np.ndarray:
    """The slot of each of ``wanted`` (int64) in ``slot_keys`` (a power-of-two table, probed linearly
    from the key's home ``(k * mix) ^ ((k * mix) >> 29)``, empty slots ``empty``), -1 where absent."""
    result = np.empty(wanted.shape[0], dtype=np.int64)
    _hash_slots(wanted, slot_keys, np.int64(mix), np.int64(empty), result)
    return result


def warm_up(*kernels: str) -> None:
    """Load (or compile) these kernels (``biased_mf``, ``skipgram``, ``unique_keys``, ``unique_any``,
    ``skipgram_in_place``, ``biased_mf_in_place``, ``hash_slots``) now, on tiny inputs: the first call of a kernel in a process costs 0.3 s (machine code from the cache) to 1-2 s
    (compiled), which a task pays when it is built rather than inside its first timed batch."""
    if not AVAILABLE:
        return
    rows, first, second = torch.zeros(2, 3), torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    for kernel in kernels:
        if kernel == "biased_mf":
            biased_mf_loss_and_gradient(rows, first, second, torch.zeros(1), 0.0, 0.0)
        elif kernel == "skipgram":
            skipgram_loss_and_gradient(rows, first, second.view(1, 1), 1.0)
        elif kernel == "unique_keys":  # (a large key space takes unique_any: core.batch.unique_keys)
            unique_keys(second, 2)
            unique_any(second)
        elif kernel == "unique_any":
            unique_any(second)
        elif kernel == "biased_mf_in_place":
            biased_mf_in_place(torch.zeros(2, 3), first, second, torch.zeros(1), 0.0, 0.0, 0.0)
        elif kernel == "hash_slots":
            hash_slots(np.zeros(1, dtype=np.int64), np.zeros(16, dtype=np.int64), 1, -1)
            hash_place(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.full(16, -1, dtype=np.int64),
                       np.zeros(16, dtype=np.int64), 1, -1, -2)
        elif kernel == "skipgram_in_place":
            skipgram_in_place(torch.zeros(2, 3), first, first, first, 1, True, 1, torch.ones(1, dtype=torch.float64),
                              first, 1, 0, 0.0)
        else:
            raise ValueError(f"no kernel {kernel!r}")


if AVAILABLE:
    @numba.njit(nogil=True, cache=True, fastmath=FAST)
    def _biased_mf_in_place(table, users, items, ratings, mean, reg, lr):  # pragma: no cover - compiled
        factors = table.shape[1] - 1
        total = 0.0
        for b in range(users.shape[0]):
            u, i = users[b], items[b]
            error, penalty = _mf_error(table, u, i, ratings[b], mean, reg)
            total += error * error + penalty
            bias_u, bias_i = table[u, factors], table[i, factors]
            step, decay = np.float32(lr * error), np.float32(lr * reg)
            for k in range(factors):
                x, y = table[u, k], table[i, k]
                table[u, k] = x + step * y - decay * x
                table[i, k] = y + step * x - decay * y
            table[u, factors] = bias_u + step - decay * bias_u
            table[i, factors] = bias_i + step - decay * bias_i
        return total


def biased_mf_in_place(table: Tensor, users: Tensor, items: Tensor, ratings: Tensor, mean: float, reg: float,
                       lr: float) -> float:
    """Biased MF's SGD, rating by rating, in place on ``table`` [rows, dim + 1] (``[p | b]`` rows;
    ``users`` and ``items`` are rows of it): ``e = r - (mean + <p_u, q_i> + b_u + b_i)``, then
    ``p_u += lr (e q_i - reg p_u)``, ``q_i += lr (e p_u - reg q_i)`` (both from the values before the
    step), ``b_u += lr (e - reg b_u)``, ``b_i += lr (e - reg b_i)``: Surprise's ``SVD`` step, an SGD
    step on half the rating's loss. Returns the ratings' summed loss ``e^2 + reg (|u|^2 + |i|^2)``
    at the values each rating met. Threads may call it at once on the same ``table``."""
    return _biased_mf_in_place(table.numpy(), _array(users), _array(items), _array(ratings), float(mean), float(reg),
                               float(lr))


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
