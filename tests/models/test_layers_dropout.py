"""``cadence.models.layers.Dropout`` against the definition of inverted dropout (and ``nn.Dropout``'s
statistics): in evaluation the identity; in training every element is 0 or x / (1 - p), kept with
probability 1 - p; the gradient flows through the kept elements scaled alike, and not at all
through the dropped ones; a seeded draw repeats."""

import math

import pytest
import torch
from torch import nn

from cadence.models.layers import Dropout


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_training_keeps_each_element_with_probability_one_minus_p_scaled_by_its_inverse(p: float) -> None:
    torch.manual_seed(0)
    x = torch.rand(400, 500) + 0.5  # no zeros of its own
    layer = Dropout(p).train()
    y = layer(x)
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] / (1 - p), rtol=1e-6, atol=0.0)
    n = x.numel()
    share = kept.float().mean().item()
    assert abs(share - (1 - p)) < 4 * math.sqrt(p * (1 - p) / n)  # four standard errors
    reference = nn.functional.dropout(x, p, True)  # the same law as torch's own
    assert abs((reference != 0).float().mean().item() - share) < 8 * math.sqrt(p * (1 - p) / n)
    assert abs(y.mean().item() - x.mean().item()) < 0.01  # unbiased: E[y] = x


def test_evaluation_and_p_zero_pass_the_input_through() -> None:
    x = torch.randn(8, 16)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0).train()(x) is x


def test_the_gradient_is_the_kept_mask_scaled_and_a_seed_repeats_the_draw() -> None:
    p = 0.25
    x = torch.randn(64, 32, requires_grad=True)
    torch.manual_seed(7)
    y = Dropout(p).train()(x)
    y.sum().backward()
    expected = (y != 0).float() / (1 - p)
    assert torch.equal(x.grad, expected)
    torch.manual_seed(7)
    assert torch.equal(Dropout(p).train()(x.detach()), y.detach())


def test_a_probability_outside_zero_to_one_is_an_error() -> None:
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="dropout probability"):
            Dropout(p)
