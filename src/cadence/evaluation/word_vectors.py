"""Word-vector benchmarks, computed as gensim 4.4.0's ``KeyedVectors`` computes them.

- Similarity (WordSim353, SimLex-999): ``evaluate_word_pairs``. Lines ``word1<TAB>word2<TAB>score``;
  lines starting with ``#`` and lines that do not split into three fields with a numeric score
  are skipped. A pair counts when both words are among the first ``restrict_vocab`` words of the
  vocabulary (compared in upper case; of several case variants the most frequent one is used).
  The result is Spearman's rank correlation between the human scores and the cosine
  similarities: the Pearson correlation of their ranks, tied values sharing their average rank
  (scipy's ``spearmanr``).
- Analogies (``questions-words.txt``): ``evaluate_word_analogies`` with 3CosAdd. ``: name`` lines
  open a section; a question ``a b c d`` counts when its four words are among the first
  ``restrict_vocab`` words; the words are ranked by ``cos(w, unit(b^ + c^ - a^))`` (x^ = x / |x|)
  over those words, the question's three words removed; the prediction is the first of the best
  5 that is no case variant of a question word (if all are, the fifth). It is correct when equal
  to ``d`` (in upper case). Accuracy = correct / counted questions, over all sections. Questions
  are scored in batches, by one matrix product each.

The three files ship in the gensim wheel's test data (``cadence.data.corpus.gensim_test_data``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from cadence.data.corpus import gensim_test_data

RESTRICT_VOCAB = 300_000  # gensim's default for both evaluations
QUESTION_BATCH = 256
TOP_N = 5  # gensim looks for the answer among the 5 best words other than the question's


@dataclass
class SimilarityResult:
    spearman: float  # NaN with fewer than two pairs
    pairs: int       # pairs whose two words are in the vocabulary
    skipped: int     # pairs with an out-of-vocabulary word


@dataclass
class AnalogyResult:
    accuracy: float  # 0 when no question counts (as gensim)
    correct: int
    questions: int   # questions whose four words are in the vocabulary
    skipped: int     # questions with an out-of-vocabulary word
    sections: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (correct, questions)


def evaluate_word_vectors(vectors: Tensor, words: list[str]) -> dict[str, float]:
    """WordSim353 and SimLex-999 Spearman correlations and analogy accuracy, with their counts."""
    directory = gensim_test_data()
    index = {word: i for i, word in enumerate(words)}
    metrics: dict[str, float] = {}
    for name, filename in (("wordsim353", "wordsim353.tsv"), ("simlex999", "simlex999.txt")):
        result = similarity_correlation(vectors, index, directory / filename)
        metrics[name], metrics[f"{name}_pairs"] = result.spearman, result.pairs
    analogies = analogy_accuracy(vectors, words, index, directory / "questions-words.txt")
    # (no question answered: no accuracy, null; gensim's 0.0 would be a made-up one)
    metrics["analogy"] = analogies.accuracy if analogies.questions else None
    metrics["analogy_questions"] = analogies.questions
    return metrics


def similarity_correlation(vectors: Tensor, index: dict[str, int], path: str | Path,
                           restrict_vocab: int = RESTRICT_VOCAB, case_insensitive: bool = True) -> SimilarityResult:
    """Spearman correlation between a word-pair file's scores and cosine similarity (see above)."""
    known = _known_words(index, restrict_vocab, case_insensitive)
    firsts, seconds, gold, skipped = [], [], [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line or line.startswith("#"):
                continue
            parts = line.split("\t")
            try:
                score = float(parts[2]) if len(parts) == 3 else None
            except ValueError:
                score = None
            if score is None:
                continue
            a, b = (part.upper() for part in parts[:2]) if case_insensitive else parts[:2]
            if a not in known or b not in known:
                skipped += 1
                continue
            firsts.append(known[a])
            seconds.append(known[b])
            gold.append(score)
    if len(gold) < 2:
        return SimilarityResult(float("nan"), len(gold), skipped)
    unit = F.normalize(vectors.to(torch.float64), dim=1)  # a zero vector stays zero (gensim: similarity 0)
    model = (unit[torch.tensor(firsts)] * unit[torch.tensor(seconds)]).sum(1)
    return SimilarityResult(spearman(torch.tensor(gold, dtype=torch.float64), model), len(gold), skipped)


def spearman(x: Tensor, y: Tensor) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks (NaN if constant)."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()))


def average_ranks(x: Tensor) -> Tensor:
    """[n] float64 ranks 1..n of ``x``; tied values share the mean of their ranks."""
    values, order = torch.sort(x, stable=True)
    n = values.shape[0]
    starts_group = torch.ones(n, dtype=torch.bool)
    starts_group[1:] = values[1:] != values[:-1]
    group = torch.cumsum(starts_group, 0) - 1
    first = torch.nonzero(starts_group).squeeze(1)
    last = torch.cat([first[1:], torch.tensor([n])]) - 1
    ranks = torch.empty(n, dtype=torch.float64)
    ranks[order] = ((first + last).to(torch.float64) / 2 + 1)[group]
    return ranks


def analogy_accuracy(vectors: Tensor, words: list[str], index: dict[str, int], path: str | Path,
                     restrict_vocab: int = RESTRICT_VOCAB, case_insensitive: bool = True) -> AnalogyResult:
    """3CosAdd accuracy on an analogy file in ``questions-words.txt`` format (see above)."""
    known = _known_words(index, restrict_vocab, case_insensitive)
    questions, section_of, names, skipped = _read_questions(path, known, case_insensitive)
    result = AnalogyResult(0.0, 0, len(questions), skipped, {name: (0, 0) for name in names})
    if not questions:
        return result
    rows = min(restrict_vocab, len(words))
    key = (lambda w: w.upper()) if case_insensitive else (lambda w: w)
    group_of_row = torch.tensor([known[key(word)] for word in words[:rows]])  # [R] id of the row's key
    unit = F.normalize(vectors[:rows].to(torch.float64), dim=1)  # [R, D]
    unit_t = unit.T.to(torch.float32).contiguous()  # [D, R]: gensim ranks in float32 too
    asked = torch.tensor(questions)  # [Q, 4] key ids of a, b, c, expected
    hits = torch.zeros(len(questions), dtype=torch.bool)
    buffer = torch.empty(min(QUESTION_BATCH, len(questions)), rows)  # reused: no page faults per batch
    for start in range(0, len(questions), QUESTION_BATCH):
        batch = asked[start:start + QUESTION_BATCH]  # [B, 4]
        a, b, c, expected = batch.unbind(1)
        target = F.normalize(unit[b] + unit[c] - unit[a], dim=1).float()  # [B, D]
        scores = torch.mm(target, unit_t, out=buffer[:batch.shape[0]])  # [B, R]
        scores.scatter_(1, batch[:, :3], float("-inf"))  # without a, b, c
        best, rows_ = scores.topk(min(TOP_N, rows), dim=1)  # [B, N]
        groups = group_of_row[rows_]
        valid = best > float("-inf")
        allowed = valid & (groups != a.unsqueeze(1)) & (groups != b.unsqueeze(1)) & (groups != c.unsqueeze(1))
        # gensim: the first allowed of the top N; if none, the last one listed; nothing listed: wrong
        pick = torch.where(allowed.any(1), allowed.int().argmax(1), valid.sum(1) - 1)
        predicted = torch.where(pick >= 0, groups.gather(1, pick.clamp(min=0).unsqueeze(1)).squeeze(1), -1)
        hits[start:start + QUESTION_BATCH] = predicted == expected
    sections = torch.tensor(section_of)
    for number, name in enumerate(names):
        mine = sections == number
        result.sections[name] = (int(hits[mine].sum()), int(mine.sum()))
    result.correct = int(hits.sum())
    result.accuracy = result.correct / len(questions)
    return result


def _read_questions(path: str | Path, known: dict[str, int], case_insensitive: bool
                    ) -> tuple[list[list[int]], list[int], list[str], int]:
    questions, section_of, names, skipped = [], [], [], 0
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if line.startswith(": "):
                names.append(line.lstrip(": ").strip())
                continue
            if not names:
                raise ValueError(f"{path}:{number}: a question before the first section header")
            four = [w.upper() for w in line.split()] if case_insensitive else line.split()
            if len(four) != 4:
                continue
            if not all(w in known for w in four):
                skipped += 1
                continue
            questions.append([known[w] for w in four])
            section_of.append(len(names) - 1)
    return questions, section_of, names, skipped


def _known_words(index: dict[str, int], restrict_vocab: int, case_insensitive: bool) -> dict[str, int]:
    """word (upper case if ``case_insensitive``) -> id of its most frequent variant, ids < restrict_vocab."""
    known: dict[str, int] = {}
    for word, i in sorted(index.items(), key=lambda item: item[1]):
        if i < restrict_vocab:
            known.setdefault(word.upper() if case_insensitive else word, i)
    return known
