"""Link prediction from a trained knowledge-graph model (``task: kge``), by name.

- ``tails(head, relation)``: the entities that best complete (head, relation, ?), by the model's
  score, best first; ``heads(relation, tail)``: those that best complete (?, relation, tail). A
  reciprocal run asks its inverse relation for heads, as its evaluation does.
- ``scores(triples)``, ``score_file(path)``: the model's score of each (head, relation, tail).

Known triples (train, valid and test: the filter of filtered evaluation) are **kept** by default and
marked in the ``known`` column, as PyKEEN's ``predict_target`` keeps them (its
``add_membership_columns`` marks them); ``filtered=True`` (``--filter``) leaves them out, as filtered
evaluation ranks without them. Every entity is scored a block of rows at a time (``block_rows``),
read through the run's ``ParameterView``: a running top-k, never the whole table at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import Tensor

from cadence.config import Config
from cadence.core.rows import ParameterView
from cadence.data.triples import KnowledgeGraph, read_triple_file
from cadence.errors import DataError, QueryError
from cadence.evaluation.ranking import FilterIndex
from cadence.models.kge import KgeModel
from cadence.prediction.base import Names, Prediction, Predictor, Query, check_top
from cadence.prediction.top import RunningTopK, block_rows, id_blocks

SCORED_AT_ONCE = 65536  # triples of a file scored at a time


class KgePredictor(Predictor):
    task = "kge"

    def __init__(self, config: Config, graph: KnowledgeGraph, model: KgeModel, params: ParameterView,
                 reciprocal: bool):
        entities = Names("entity", "entities", graph.entity_names or range(graph.num_entities))
        relations = Names("relation", "relations", graph.relation_names or range(graph.num_relations))
        super().__init__(config, (entities, relations))
        self.entities, self.relations = entities, relations
        self.graph, self.model, self.params, self.reciprocal = graph, model.eval(), params, reciprocal
        self.block_rows = block_rows(config.model.dim)
        heads, relation_ids, tails = graph.all_triples().unbind(1)
        self.known_tails = FilterIndex(heads, relation_ids, tails, graph.num_relations)
        self.known_heads = FilterIndex(tails, relation_ids, heads, graph.num_relations)

    # ---- top-k ----------------------------------------------------------------------------------------
    def tails(self, head: str, relation: str, top: int = 10, filtered: bool = False) -> Prediction:
        """The ``top`` entities t that score best as (head, relation, t); ``filtered``: known triples left out."""
        h, r = self.entities.id(head), self.relations.id(relation)
        head_row = self.params.values(torch.tensor([h]))
        relation_id = torch.tensor([r])
        return self._ranked("tail", lambda rows: self.model.score_tails_against(head_row, relation_id, rows)[0],
                            self.known_tails.lookup(torch.tensor([h]), relation_id)[1], top, filtered)

    def heads(self, relation: str, tail: str, top: int = 10, filtered: bool = False) -> Prediction:
        """The ``top`` entities h that score best as (h, relation, tail); ``filtered``: known triples left out."""
        r, t = self.relations.id(relation), self.entities.id(tail)
        tail_row = self.params.values(torch.tensor([t]))
        relation_id = torch.tensor([r])
        inverse = relation_id + self.graph.num_relations

        def score(rows: Tensor) -> Tensor:
            if self.reciprocal:  # (?, r, t) is (t, r^-1, ?): the relation a reciprocal run trained for it
                return self.model.score_tails_against(tail_row, inverse, rows)[0]
            return self.model.score_heads_against(rows, relation_id, tail_row)[0]

        return self._ranked("head", score, self.known_heads.lookup(torch.tensor([t]), relation_id)[1], top, filtered)

    def _ranked(self, column: str, score: Callable[[Tensor], Tensor], known: Tensor, top: int,
                filtered: bool) -> Prediction:
        best = RunningTopK(check_top(top))
        with torch.no_grad():
            for ids in id_blocks(len(self.entities), self.block_rows):
                scores = score(self.params.values(ids))
                if filtered:
                    scores = scores.masked_fill(torch.isin(ids, known), float("-inf"))
                best.add(scores, ids)
        marks = torch.isin(best.ids, known).tolist()
        return Prediction((column, "score", "known"),
                          tuple((self.entities[id], score, mark)
                                for id, score, mark in zip(best.ids.tolist(), best.scores.tolist(), marks)))

    # ---- scores of triples ------------------------------------------------------------------------------
    def scores(self, triples: Iterable[tuple[str, str, str]]) -> Prediction:
        """The model's score of each (head, relation, tail), by name, and whether it is a known triple."""
        ids = [(self.entities.id(h), self.relations.id(r), self.entities.id(t)) for h, r, t in triples]
        return self._scored(torch.tensor(ids, dtype=torch.int64).view(-1, 3))

    def score_file(self, path: str | Path) -> Prediction:
        """``scores`` of the triples of a file in the format of a graph's (``head<TAB>relation<TAB>tail``
        per line); a malformed line, or a name the run does not know, is an error naming its line."""
        ids = []
        for head, relation, tail, number in read_triple_file(Path(path)):
            try:
                ids.append((self.entities.id(head), self.relations.id(relation), self.entities.id(tail)))
            except QueryError as err:
                raise DataError(str(err), path, number) from None
        return self._scored(torch.tensor(ids, dtype=torch.int64))

    def _scored(self, triples: Tensor) -> Prediction:
        scores = []
        with torch.no_grad():
            for part in triples.split(SCORED_AT_ONCE):
                h, r, t = (column.contiguous() for column in part.unbind(1))
                scores.append(self.model.scorer.score(self.params.values(h), self.model.relations[r],
                                                      self.params.values(t)))
        scores = torch.cat(scores).tolist() if scores else []
        known = self.known_tails.lookup(triples[:, 0], triples[:, 1])
        marked = torch.zeros(triples.shape[0], dtype=torch.bool)
        marked[known[0][known[1] == triples[known[0], 2]]] = True
        names = self.entities, self.relations, self.entities
        return Prediction(("head", "relation", "tail", "score", "known"),
                          tuple((*(kind[id] for kind, id in zip(names, row)), score, mark)
                                for row, score, mark in zip(triples.tolist(), scores, marked.tolist())))

    queries = (Query("tails", tails, ("HEAD", "RELATION"), ("top", "filtered")),
               Query("heads", heads, ("RELATION", "TAIL"), ("top", "filtered")),
               Query("score", score_file, ("FILE",)))
