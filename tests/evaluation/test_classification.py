"""AUC against a brute-force pair count, log loss against the textbook formula, normalised entropy
against a hand computation."""

import math

import pytest
import torch

from cadence.evaluation.classification import auc, logloss, normalized_entropy


def brute_force_auc(scores: list[float], labels: list[int]) -> float:
    """Fraction of (positive, negative) pairs ranked correctly, a tie counting half: O(n^2)."""
    positives = [s for s, y in zip(scores, labels) if y == 1]
    negatives = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


@pytest.mark.parametrize("levels", [3, 10, 1000])  # few levels: many ties
@pytest.mark.parametrize("seed", range(3))
def test_auc_matches_brute_force_pair_count(levels: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(levels, (300,), generator=generator).float() / levels
    labels = (torch.rand(300, generator=generator) < 0.3 + 0.4 * scores).long()
    expected = brute_force_auc(scores.tolist(), labels.tolist())
    assert math.isclose(auc(scores, labels), expected, rel_tol=1e-12)


def test_auc_of_perfect_inverted_and_constant_rankings() -> None:
    labels = torch.tensor([0, 0, 1, 0, 1, 1])
    scores = labels.double() + torch.linspace(0, 0.5, 6)
    assert auc(scores, labels) == 1.0
    assert auc(-scores, labels) == 0.0
    assert auc(torch.zeros(6), labels) == 0.5


def test_auc_is_rank_based_and_accepts_any_label_dtype() -> None:
    generator = torch.Generator().manual_seed(4)
    scores = torch.randn(200, generator=generator)
    labels = torch.rand(200, generator=generator) < torch.sigmoid(scores)
    reference = auc(scores, labels)
    assert auc(torch.sigmoid(3 * scores), labels.float()) == reference
    assert auc(scores.view(20, 10), labels.view(20, 10).long()) == reference


def test_auc_is_nan_for_a_single_class_or_no_examples() -> None:
    assert math.isnan(auc(torch.randn(5), torch.ones(5)))
    assert math.isnan(auc(torch.randn(5), torch.zeros(5)))
    assert math.isnan(auc(torch.empty(0), torch.empty(0)))


def ne_of_base_rate_03(logits, labels):
    return normalized_entropy(logits, labels, 0.3)


@pytest.mark.parametrize("metric", [auc, logloss, ne_of_base_rate_03])
def test_bad_inputs_are_rejected(metric) -> None:
    with pytest.raises(ValueError, match="0 or 1"):
        metric(torch.randn(3), torch.tensor([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        metric(torch.randn(3), torch.tensor([0, 1]))


def test_logloss_matches_naive_formula() -> None:
    generator = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(50, generator=generator)
    labels = (torch.rand(50, generator=generator) < 0.4).float()
    probabilities = [1 / (1 + math.exp(-z)) for z in logits.tolist()]
    expected = -sum(y * math.log(p) + (1 - y) * math.log(1 - p)
                    for p, y in zip(probabilities, labels.tolist())) / 50
    assert math.isclose(logloss(logits, labels), expected, rel_tol=1e-6)


def test_logloss_is_finite_for_confident_mistakes() -> None:
    # sigmoid(100) rounds to 1 in float32 and float64; computed from the logit, the loss is 100
    assert math.isclose(logloss(torch.tensor([100.0, -100.0]), torch.tensor([0, 1])), 100.0, rel_tol=1e-12)
    assert logloss(torch.tensor([100.0]), torch.tensor([1.0])) < 1e-40


def test_normalized_entropy_matches_a_hand_computation() -> None:
    logits = [2.0, -1.0, 0.5, -3.0, 0.0, 1.5]
    labels = [1, 0, 0, 0, 1, 1]
    base_rate = 0.25  # of some training set, not of these labels
    probabilities = [1 / (1 + math.exp(-z)) for z in logits]
    loss = -sum(y * math.log(p) + (1 - y) * math.log(1 - p) for p, y in zip(probabilities, labels)) / len(labels)
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    got = normalized_entropy(torch.tensor(logits), torch.tensor(labels), base_rate)
    assert math.isclose(got, loss / entropy, rel_tol=1e-12)


@pytest.mark.parametrize("base_rate", [0.5, 0.1, 0.03])
def test_predicting_the_base_rate_everywhere_has_ne_one(base_rate: float) -> None:
    positives = round(200 * base_rate)  # 200 labels whose mean is the base rate, each predicted as it
    labels = torch.tensor([1.0] * positives + [0.0] * (200 - positives))
    logits = torch.full((200,), math.log(base_rate / (1 - base_rate)), dtype=torch.float64)
    assert math.isclose(normalized_entropy(logits, labels, base_rate), 1.0, rel_tol=1e-9)
    assert normalized_entropy(8 * (2 * labels - 1), labels, base_rate) < 0.01  # a near-perfect model
    assert normalized_entropy(-8 * (2 * labels - 1), labels, base_rate) > 1  # an inverted one


def test_normalized_entropy_is_nan_for_a_base_rate_of_zero_or_one_and_rejects_other_rates() -> None:
    logits, labels = torch.tensor([0.3, -0.2]), torch.tensor([1, 0])
    for base_rate in (0.0, 1.0, float("nan")):
        assert math.isnan(normalized_entropy(logits, labels, base_rate))
    for base_rate in (-0.1, 1.5):
        with pytest.raises(ValueError, match="base_rate"):
            normalized_entropy(logits, labels, base_rate)
