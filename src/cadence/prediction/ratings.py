"""Recommendations from a trained matrix factorisation (``task: mf``), by raw user and item id.

- ``top_items(user)``: the items the model rates highest for ``user``, leaving out the items the
  user rated in the training data; ranked by the model's unclipped rating (``score``: mu + b_u + b_i +
  <p_u, q_i>), each shown with its predicted ``rating`` as evaluation computes it (clipped to the
  training ratings' range: ``cadence.models.mf.predicted_ratings``). Every item is scored a block of
  rows at a time (``block_rows``), read through the run's ``ParameterView``.
- ``rating(user, item)``: the predicted rating of one pair, exactly as evaluation predicts it.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from cadence.config import Config
from cadence.core.rows import ParameterView
from cadence.data.ratings import Ratings
from cadence.models.mf import predicted_ratings, unclipped_ratings
from cadence.prediction.base import Names, Prediction, Predictor, Query, check_top
from cadence.prediction.top import RunningTopK, block_rows, id_blocks


class MfPredictor(Predictor):
    task = "mf"

    def __init__(self, config: Config, user_ids: Sequence[str], item_ids: Sequence[str], params: ParameterView,
                 dense: nn.Module, rated: Ratings):
        """``rated``: the training ratings (their items are left out of a user's recommendations)."""
        self.users, self.items = Names("user", "users", user_ids), Names("item", "items", item_ids)
        super().__init__(config, (self.users, self.items))
        self.params, self.dense, self.rated = params, dense.eval(), rated
        self.block_rows = block_rows(config.model.dim + 1)

    def item_rows(self, items: Tensor) -> Tensor:
        return self.params.values(items + len(self.users))  # (items' keys follow the users')

    def top_items(self, user: str, top: int = 10) -> Prediction:
        """The ``top`` items not rated by ``user`` in training, best first: columns ``item``, ``rating``
        (predicted, clipped as evaluation clips) and ``score`` (unclipped: the ranking)."""
        u = self.users.id(user)
        user_row = self.params.values(torch.tensor([u]))
        rated = self.rated.items[self.rated.users == u]
        best = RunningTopK(check_top(top))
        with torch.no_grad():
            for ids in id_blocks(len(self.items), self.block_rows):
                scores = unclipped_ratings(user_row, self.item_rows(ids), self.dense)
                best.add(scores.masked_fill(torch.isin(ids, rated), float("-inf")), ids)
        low, high = self.dense.range.tolist()
        return Prediction(("item", "rating", "score"),
                          tuple((self.items[id], min(max(score, low), high), score)
                                for id, score in zip(best.ids.tolist(), best.scores.tolist())))

    def rating(self, user: str, item: str) -> float:
        """The predicted rating of (user, item), as evaluation predicts it (clipped to the training range)."""
        u, i = self.users.id(user), self.items.id(item)
        with torch.no_grad():
            return float(predicted_ratings(self.params.values(torch.tensor([u])), self.item_rows(torch.tensor([i])),
                                           self.dense)[0])

    queries = (Query("items", top_items, ("USER",), ("top",)),
               Query("rating", rating, ("USER", "ITEM"), value="rating"))
