"""Biased matrix factorisation's prediction (Koren, Bell, Volinsky 2009, eq. 4; Surprise's ``SVD``):

    rating(u, i) = mu + b_u + b_i + <p_u, q_i>

from rows ``[p | b]`` of ``dim + 1`` floats (factors, then the bias) and the dense part, the training
ratings' mean ``mu`` (``GlobalMean``). A predicted rating is that value clipped to the training
ratings' range, as Surprise clips to its rating scale: what evaluation measures and what prediction
answers (``predicted_ratings``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class GlobalMean(nn.Module):
    """The dense part of biased MF: the training ratings' mean (and range, for clipping)."""

    def __init__(self, mean: float, low: float, high: float):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("range", torch.tensor([low, high], dtype=torch.float32))


def unclipped_ratings(user: Tensor, item: Tensor, dense: nn.Module) -> Tensor:
    """[n] ratings as the model computes them, unclipped, of user rows [n, dim + 1] and item rows
    [n, dim + 1] (or one user row [1, dim + 1] against n item rows)."""
    return dense.mean + user[:, -1] + item[:, -1] + (user[:, :-1] * item[:, :-1]).sum(1)


def predicted_ratings(user: Tensor, item: Tensor, dense: nn.Module) -> Tensor:
    """[n] predicted ratings: ``unclipped_ratings`` clipped to the training ratings' range."""
    low, high = dense.range.tolist()
    return unclipped_ratings(user, item, dense).clamp(low, high)
