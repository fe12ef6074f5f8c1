"""Word-vector benchmarks: Spearman against a naive implementation, 3CosAdd on a hand-made space."""

import math
import random
from pathlib import Path

import pytest
import torch

from cadence.evaluation.word_vectors import (analogy_accuracy, average_ranks, evaluate_word_vectors,
                                             similarity_correlation, spearman)


def naive_ranks(values: list[float]) -> list[float]:
    ranks = []
    for v in values:
        below = sum(1 for w in values if w < v)
        equal = sum(1 for w in values if w == v)
        ranks.append(below + (equal + 1) / 2)
    return ranks


def naive_spearman(x: list[float], y: list[float]) -> float:
    rx, ry = naive_ranks(x), naive_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def test_average_ranks_share_ties() -> None:
    assert average_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0, 3.0])).tolist() == [4.0, 1.0, 4.0, 2.0, 4.0]


def test_spearman_matches_the_naive_definition_with_ties() -> None:
    rng = random.Random(3)
    for _ in range(20):
        n = rng.randrange(3, 60)
        x = [float(rng.randrange(8)) for _ in range(n)]  # many ties
        y = [rng.random() if rng.random() < 0.7 else 0.5 for _ in range(n)]
        got = spearman(torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64))
        assert got == pytest.approx(naive_spearman(x, y), abs=1e-12)


def test_similarity_correlation_skips_comments_invalid_and_unknown_pairs(tmp_path: Path) -> None:
    words = ["cat", "dog", "car", "Cat", "tree", "bus"]
    index = {w: i for i, w in enumerate(words)}
    vectors = torch.randn(len(words), 5, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "pairs.tsv"
    path.write_text("# Word 1\tWord 2\tHuman (mean)\n"
                    "CAT\tdog\t7.5\n"      # upper case: matches cat (the first variant)
                    "car\tbus\t6.0\n"
                    "tree\tcat\t1.0\n"
                    "cat\tunicorn\t3.0\n"  # out of the vocabulary: skipped
                    "dog\tcar\tmany\n"     # invalid score: ignored
                    "dog bus 2.0\n"         # not tab-separated: ignored
                    "bus\tdog\t2.5\n", encoding="utf-8")
    result = similarity_correlation(vectors, index, path)
    assert (result.pairs, result.skipped) == (4, 1)
    unit = vectors / vectors.norm(dim=1, keepdim=True)
    pairs = [("cat", "dog"), ("car", "bus"), ("tree", "cat"), ("bus", "dog")]
    model = [float(unit[index[a]] @ unit[index[b]]) for a, b in pairs]
    assert result.spearman == pytest.approx(naive_spearman([7.5, 6.0, 1.0, 2.5], model), abs=1e-12)
    assert similarity_correlation(vectors, index, path, restrict_vocab=3).pairs == 1  # only cat, dog, car
    assert math.isnan(similarity_correlation(vectors, {"zebra": 0}, path).spearman)


def hand_made_space() -> tuple[torch.Tensor, list[str]]:
    """Axes: 0 = person, 1 = female, 2 = royal, 3 = city, 4 = country-ness."""
    rows = {
        "man": [1, 0, 0, 0, 0], "woman": [1, 1, 0, 0, 0], "king": [1, 0, 1, 0, 0], "queen": [1, 1, 1, 0, 0],
        "paris": [0, 0, 0, 1, 0], "france": [0, 0, 0, 0, 1], "rome": [0, 0, 0, 1, 0.1], "italy": [0, 0, 0, 0.1, 1],
        "apple": [0, 0, -1, 0, 0],
    }
    return torch.tensor(list(rows.values()), dtype=torch.float32), list(rows)


def test_analogies_on_a_hand_made_space(tmp_path: Path) -> None:
    vectors, words = hand_made_space()
    index = {w: i for i, w in enumerate(words)}
    path = tmp_path / "questions.txt"
    path.write_text(": family\n"
                    "man woman king queen\n"      # woman + king - man = queen
                    "Man Woman King Queen\n"      # case-insensitive
                    "man woman king apple\n"      # wrong expected answer: counted, incorrect
                    "man woman king prince\n"     # out of the vocabulary: skipped
                    "man woman\n"                 # invalid: ignored
                    ": capitals\n"
                    "paris france rome italy\n"
                    "france paris italy rome\n", encoding="utf-8")
    result = analogy_accuracy(vectors, words, index, path)
    assert (result.correct, result.questions, result.skipped) == (4, 5, 1)
    assert result.accuracy == pytest.approx(4 / 5)
    assert result.sections == {"family": (2, 3), "capitals": (2, 2)}
    # restricted to the first four words, the capitals questions do not count
    restricted = analogy_accuracy(vectors, words, index, path, restrict_vocab=4)
    assert (restricted.questions, restricted.skipped) == (2, 4)  # apple, prince, the capitals
    # the question's words are never the answer: here b + c - a = man (= c); the next best is woman
    excluded = tmp_path / "excluded.txt"
    excluded.write_text(": x\nking king man woman\n")
    assert analogy_accuracy(vectors, words, index, excluded).correct == 1


def test_evaluate_word_vectors_on_the_gensim_files() -> None:
    words = "tiger cat dog car automobile money cash bank king queen man woman".split()
    vectors = torch.randn(len(words), 8, generator=torch.Generator().manual_seed(1))
    metrics = evaluate_word_vectors(vectors, words)
    assert set(metrics) == {"wordsim353", "wordsim353_pairs", "simlex999", "simlex999_pairs",
                            "analogy", "analogy_questions"}
    assert metrics["wordsim353_pairs"] >= 5 and -1 <= metrics["wordsim353"] <= 1
    assert metrics["analogy_questions"] >= 1 and 0 <= metrics["analogy"] <= 1
