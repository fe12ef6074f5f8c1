"""Similar words from trained word vectors (``task: w2v``), as gensim's ``KeyedVectors`` answers
(gensim 4.4.0): cosine similarity of the unit-normalised input vectors (the vectors exported and
evaluated).

- ``most_similar(positive, negative)``: the words closest to the mean of the unit vectors of
  ``positive`` minus those of ``negative``, itself normalised; the query's own words are never listed.
- ``analogy(a, b, c)``: a is to b as c is to ? (3CosAdd): ``most_similar([b, c], [a])``.
- ``similarity(first, second)``: the cosine of two words' vectors.

A zero vector has similarity 0 to every word (gensim divides by its norm of 0, as the benchmarks of
``cadence.evaluation.word_vectors`` do not). Similarities are computed in float64 over every word, a
block of rows at a time (``block_rows``), read through the run's ``ParameterView``.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from cadence.config import Config
from cadence.core.rows import ParameterView
from cadence.errors import QueryError
from cadence.prediction.base import Names, Prediction, Predictor, Query, check_top
from cadence.prediction.top import RunningTopK, block_rows, id_blocks


class W2vPredictor(Predictor):
    task = "w2v"

    def __init__(self, config: Config, words: Sequence[str], params: ParameterView):
        self.words = Names("word", "words", words)
        super().__init__(config, (self.words,))
        self.params = params
        self.block_rows = block_rows(config.model.dim)

    def unit_vectors(self, ids: Tensor) -> Tensor:
        """[n, dim] float64 unit vectors of word ids (keys 0..V-1: the input vectors)."""
        return F.normalize(self.params.values(ids).to(torch.float64), dim=1)

    def most_similar(self, positive: str | Sequence[str] = (), negative: str | Sequence[str] = (),
                     top: int = 10) -> Prediction:
        """The ``top`` words most similar to ``positive`` and least to ``negative``, as gensim's
        ``most_similar(positive, negative, topn=top)``: columns ``word``, ``similarity``."""
        positive = [positive] if isinstance(positive, str) else list(positive)
        negative = [negative] if isinstance(negative, str) else list(negative)
        if not positive and not negative:
            raise QueryError("most_similar needs at least one word (positive or negative)")
        best = RunningTopK(check_top(top))
        asked = torch.tensor(self.words.ids(positive + negative))
        signs = torch.tensor([1.0] * len(positive) + [-1.0] * len(negative), dtype=torch.float64)
        mean = F.normalize((self.unit_vectors(asked) * signs.unsqueeze(1)).mean(0), dim=0)
        for ids in id_blocks(len(self.words), self.block_rows):
            similarities = self.unit_vectors(ids) @ mean
            best.add(similarities.masked_fill(torch.isin(ids, asked), float("-inf")), ids)
        return Prediction(("word", "similarity"),
                          tuple((self.words[id], score) for id, score in zip(best.ids.tolist(), best.scores.tolist())))

    def analogy(self, a: str, b: str, c: str, top: int = 10) -> Prediction:
        """a is to b as c is to ...: ``most_similar(positive=[b, c], negative=[a])`` (3CosAdd)."""
        return self.most_similar([b, c], [a], top)

    def similarity(self, first: str, second: str) -> float:
        """The cosine similarity of two words' vectors."""
        vectors = self.unit_vectors(torch.tensor(self.words.ids([first, second])))
        return float(vectors[0] @ vectors[1])

    queries = (Query("similar", most_similar, ("WORD...",), ("top", "negative")),
               Query("analogy", analogy, ("A", "B", "C"), ("top",)),
               Query("similarity", similarity, ("WORD1", "WORD2"), value="similarity"))
