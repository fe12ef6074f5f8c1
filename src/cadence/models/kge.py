"""The knowledge-graph embedding model: a scorer, dense relation parameters, a loss, a regulariser.

Entity rows are not parameters of this module: they live in an ``EmbeddingStore`` and arrive per
batch as a leaf tensor (``rows``), so the same model serves every strategy and every store backend.
Relation parameters are dense and stay on the compute device; a grown run may freeze some of them
(``frozen_relations``: their rows get no gradient).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cadence import kernels, kge_step
from cadence.config import Config
from cadence.models.scorers import SCORERS
from cadence.seeding import derive_seed


class KgeModel(nn.Module):
    def __init__(self, config: Config, num_relations: int, frozen_relations: Tensor | None = None):
        """``frozen_relations``: [num_relations] bool, the relations whose rows get no gradient (a grown
        run's known relations under ``train.freeze: known``)."""
        super().__init__()
        self.scorer = SCORERS.get(config.model.name)(config.model)
        self.train_config = config.train
        self.relations = nn.Parameter(torch.empty(num_relations, self.scorer.relation_dim()))
        generator = torch.Generator().manual_seed(derive_seed(config.seed, "relations"))
        with torch.no_grad():
            self.scorer.init_relations(self.relations, config.model.init_std, generator)
        frozen = frozen_relations.bool().clone() if frozen_relations is not None and bool(frozen_relations.any()) else None
        self.register_buffer("frozen_relations", frozen, persistent=False)  # (not in the state dict)

    def loss(self, rows: Tensor, heads: Tensor, relations: Tensor, tails: Tensor,
             candidates: Tensor | None) -> Tensor:
        """Mean loss of a batch.

        rows: [U, D] the batch's entity rows; heads, tails: [B] indices into rows; relations: [B]
        relation ids; candidates: [C] indices into rows of the shared negatives, [K, C] those of K
        consecutive chunks of the batch's edges (chunked negatives: chunk k of ceil(B / K) edges scores
        against row k), or None to score against every row (rows then hold all entities, in id order).
        """
        # index_select, not rows[ids]: its backward (index_add_) is deterministic whichever thread
        # runs it, which the bit-identity of asynchronous and synchronous runs relies on; and faster
        h, t = rows.index_select(0, heads), rows.index_select(0, tails)
        if candidates is None:
            both = torch.cat([tails, heads]) if not self.train_config.reciprocal else tails
            return self._loss(h, relations, t, rows, 0, both)
        pool = rows.index_select(0, candidates.reshape(-1))
        return self._loss(h, relations, t, pool, 1 if candidates.dim() == 1 else candidates.shape[0], None)

    def loss_at(self, rows: Tensor, positions: Tensor, relations: Tensor) -> Tensor:
        """``loss`` with sampled negatives, the batch's rows gathered at once (one gather, one scatter
        of its gradient: fewer operators a step): positions [2B + C] index rows, the B heads, the B
        tails, then the candidates (``train.negatives`` of them per chunk of edges, as ``loss``'s)."""
        size = relations.shape[0]
        h, t, pool = rows.index_select(0, positions).split([size, size, positions.shape[0] - 2 * size])
        return self._loss(h, relations, t, pool, pool.shape[0] // self.train_config.negatives, None)

    def fused_step(self, values: Tensor, state: Tensor, positions: Tensor, relations: Tensor,
                   step: kernels.RowStep) -> tuple[Tensor, list[Tensor | None]] | None:
        """``loss_at``'s training step in one operator (``kge_step.kge_step``: the rows updated in place
        by ``step``), returning (the loss, [the relations' gradient]); None where that operator does
        not compute this loss: a scorer without a scoring there, a regulariser, frozen relations."""
        scoring = self.scorer.step_scoring()
        config = self.train_config
        if (scoring is None or self.frozen_relations is not None
                or (config.regularizer != "none" and config.reg_weight > 0)):
            return None
        chunks = (positions.shape[0] - 2 * relations.shape[0]) // config.negatives
        with torch.no_grad():  # (no graph: the operator computes the gradients itself)
            loss, d_relations = kge_step.kge_step(values, state, positions, self.relations, relations, *scoring,
                                                  not config.reciprocal, config.loss == "softmax", chunks, step)
        return loss, [d_relations]

    def _loss(self, h: Tensor, relations: Tensor, t: Tensor, pool: Tensor, chunks: int,
              targets: Tensor | None) -> Tensor:
        """The loss of edges (h, relations, t) against ``pool`` [C, D]: sampled negatives shared by the
        batch (``chunks`` 1) or ``chunks`` consecutive pools of C / chunks rows, or every entity
        (``chunks`` 0; ``targets`` [S B]: the true tails, then heads, among them)."""
        r = self.relations.index_select(0, relations)
        if self.frozen_relations is not None:
            r = torch.where(self.frozen_relations.index_select(0, relations).unsqueeze(1), r.detach(), r)
        # both sides in one [2B, C] block (tails' rows, then heads'): a mean over its rows is the mean
        # of the two sides' losses; sampled negatives: the positive triple's score is shared by both
        # sides, computed once
        scoring = self.scorer.step_scoring() if chunks else None
        if scoring is not None:  # one operator forward, one backward (cadence.kge_step)
            scores, positive = kge_step.kge_scores(h, r, t, pool, *scoring, not self.train_config.reciprocal, chunks)
        else:
            positive = None if chunks == 0 else self.scorer.score(h, r, t)  # [B]
            scores = self._negative_scores(h, r, t, pool, chunks)
        if positive is None:
            loss = self._every_entity_loss(scores, targets)
        else:  # one operator: one kernel on a device (cadence.kernels), its torch twin elsewhere
            loss = kernels.negative_loss(scores, positive, self.train_config.loss == "softmax")
        if self.train_config.regularizer != "none" and self.train_config.reg_weight > 0:
            loss = loss + self._regularization(h, r, t)
        return loss

    def _negative_scores(self, h: Tensor, r: Tensor, t: Tensor, pool: Tensor, chunks: int) -> Tensor:
        """[B, C] scores of each edge's tail side against its negatives, and below them, [2B, C], its
        head side's (unless reciprocal)."""
        both = not self.train_config.reciprocal
        if chunks <= 1:
            return self.scorer.score_sides(h, r, t, pool) if both else self.scorer.score_tails(h, r, pool)
        # chunked: the edges viewed as K chunks of ceil(B / K) (the last padded with zero rows, whose
        # scores are cut off), one batched product per side
        size = h.shape[0]
        step = -(-size // chunks)
        pools = pool.view(chunks, pool.shape[0] // chunks, pool.shape[1])
        h, r, t = (self._as_chunks(x, chunks, step) for x in (h, r, t))
        tails = self.scorer.score_tails_chunked(h, r, pools).reshape(chunks * step, -1)[:size]
        if not both:
            return tails
        return torch.cat([tails, self.scorer.score_heads_chunked(pools, r, t).reshape(chunks * step, -1)[:size]])

    @staticmethod
    def _as_chunks(x: Tensor, chunks: int, step: int) -> Tensor:
        """[B, D] -> [K, step, D], zero rows appended up to K * step."""
        missing = chunks * step - x.shape[0]
        if missing:
            x = torch.cat([x, x.new_zeros(missing, x.shape[1])])
        return x.view(chunks, step, x.shape[1])

    def _every_entity_loss(self, scores: Tensor, targets: Tensor) -> Tensor:
        """The sides' mean loss when every entity is a candidate: scores [S B, E], ``targets`` [S B]
        the true one's index in each row."""
        if self.train_config.loss == "softmax":
            return F.cross_entropy(scores, targets)
        labels = torch.zeros_like(scores).scatter_(1, targets.unsqueeze(1), 1.0)
        return F.binary_cross_entropy_with_logits(scores, labels)

    def _regularization(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        kind, weight = self.train_config.regularizer, self.train_config.reg_weight
        power = 3 if kind == "n3" else 2
        total = (self.scorer.magnitudes(h).pow(power).sum() + self.scorer.magnitudes(t).pow(power).sum()
                 + self.scorer.relation_magnitudes(r).pow(power).sum())
        return weight * total / h.shape[0]

    @torch.no_grad()
    def score_all_tails(self, entities: Tensor, heads: Tensor, relations: Tensor) -> Tensor:
        """[B] head ids, [B] relation ids -> [B, E] scores against the entity table."""
        return self.score_tails_against(entities[heads], relations, entities)

    @torch.no_grad()
    def score_all_heads(self, entities: Tensor, relations: Tensor, tails: Tensor) -> Tensor:
        return self.score_heads_against(entities, relations, entities[tails])

    @torch.no_grad()
    def score_tails_against(self, head_rows: Tensor, relations: Tensor, candidates: Tensor) -> Tensor:
        """[B, D] head rows, [B] relation ids, [C, D] candidate rows -> [B, C] scores."""
        return self.scorer.score_tails(head_rows, self.relations[relations], candidates)

    @torch.no_grad()
    def score_heads_against(self, candidates: Tensor, relations: Tensor, tail_rows: Tensor) -> Tensor:
        """[C, D] candidate rows, [B] relation ids, [B, D] tail rows -> [B, C] scores."""
        return self.scorer.score_heads(candidates, self.relations[relations], tail_rows)
