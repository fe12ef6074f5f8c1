"""Binary-classification metrics for click-through-rate models: ROC AUC, log loss and normalised entropy.

``auc`` is exact: it is the Mann-Whitney U statistic divided by (#positives x #negatives), i.e. the
probability that a random positive scores above a random negative, a tie counting one half (the
average-rank convention). It sorts once and counts in integers, so it is O(n log n) and carries no
rounding until the final division.

With a single class (or no examples) AUC is undefined; ``auc`` then returns ``nan`` rather than
raising, so that a stream of per-day or per-shard metrics keeps flowing and the gap is visible.

``logloss`` takes logits, not probabilities: ``log(sigmoid(z))`` computed from ``z`` stays finite
where a probability would have rounded to 0 or 1.

``normalized_entropy`` (NE, He et al. 2014) is the log loss divided by the entropy of the background
CTR: 1 for a model that predicts the base rate everywhere, lower is better. With a base rate of 0 or 1
that entropy is 0 and NE is undefined: ``nan``, like AUC of a single class.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def _check(name: str, values: Tensor, labels: Tensor) -> None:
    if values.shape != labels.shape:
        raise ValueError(f"{name} and labels differ in shape: {list(values.shape)} vs {list(labels.shape)}")
    if not ((labels == 0) | (labels == 1)).all():
        raise ValueError("labels must be 0 or 1")


def auc(scores: Tensor, labels: Tensor) -> float:
    """ROC AUC of ``scores`` against 0/1 ``labels`` (same shape); ties count half; nan if one class."""
    _check("scores", scores, labels)
    scores, positive = scores.detach().flatten(), labels.detach().flatten().bool()
    num_positive = int(positive.sum())
    num_negative = positive.numel() - num_positive
    if num_positive == 0 or num_negative == 0:
        return float("nan")
    order = torch.argsort(scores)
    _, group_sizes = torch.unique_consecutive(scores[order], return_counts=True)  # tie groups
    group_ends = torch.cumsum(group_sizes, 0) - 1  # [G] last index of each group
    positives_through = torch.cumsum(positive[order].long(), 0)[group_ends]  # [G]
    group_positives = torch.diff(positives_through, prepend=positives_through.new_zeros(1))
    group_negatives = group_sizes - group_positives
    negatives_below = torch.cumsum(group_negatives, 0) - group_negatives  # [G] strictly lower scores
    # twice U: each positive beats the negatives below its group and ties with those inside it
    twice_u = int((2 * negatives_below * group_positives + group_negatives * group_positives).sum())
    return twice_u / (2 * num_positive * num_negative)


def logloss(logits: Tensor, labels: Tensor) -> float:
    """Mean binary cross-entropy of ``logits`` against 0/1 ``labels`` (same shape), in float64."""
    _check("logits", logits, labels)
    return float(F.binary_cross_entropy_with_logits(logits.detach().double(), labels.detach().double()))


def normalized_entropy(logits: Tensor, labels: Tensor, base_rate: float) -> float:
    """Normalised entropy of ``logits`` against 0/1 ``labels`` (same shape): ``logloss / H(p)``.

    ``p = base_rate`` is the background CTR, the mean label of the examples the model was trained
    on (not of ``labels``), and ``H(p) = -(p log p + (1 - p) log(1 - p))`` the log loss of predicting
    ``p`` for every example of a set whose mean label is ``p`` (He et al. 2014, "Practical lessons
    from predicting clicks on ads at Facebook"). Lower is better; below 1 the model beats that
    constant prediction. ``nan`` (undefined, reported as null) when ``p`` is 0 or 1, where ``H(p)``
    is 0, or when ``p`` is nan (no training examples); a ``p`` outside [0, 1] is a ``ValueError``.
    """
    if not (math.isnan(base_rate) or 0.0 <= base_rate <= 1.0):
        raise ValueError(f"base_rate must lie in [0, 1]; got {base_rate}")
    loss = logloss(logits, labels)  # checks the shapes and labels even when NE is undefined
    if math.isnan(base_rate) or base_rate in (0.0, 1.0):
        return float("nan")
    entropy = -(base_rate * math.log(base_rate) + (1.0 - base_rate) * math.log1p(-base_rate))
    return loss / entropy
