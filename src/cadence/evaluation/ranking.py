"""Filtered link-prediction ranking (Bordes et al. 2013), both directions, vectorised.

For a test triple (h, r, t) the tail query (h, r, ?) ranks t among all entities after removing every
other known true tail of (h, r) (the filter: train + valid + test); the head query (?, r, t) does the
same for h. Ties count half ("realistic" rank = 1 + #better + #equal / 2), so a constant scorer gets
the middle rank rather than rank 1. MRR and Hits@k average over both directions.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor

from cadence.data.triples import KnowledgeGraph
from cadence.models.kge import KgeModel

SCORE_BUDGET = 1 << 24  # floats in one [queries, entities] score block (64 MiB)
HITS_AT = (1, 3, 10)


class FilterIndex:
    """The known answers of queries (anchor, relation, ?), as a sorted key array: no Python sets."""

    def __init__(self, anchors: Tensor, relations: Tensor, answers: Tensor, num_relations: int):
        self.num_relations = num_relations
        keys = anchors * num_relations + relations
        order = torch.argsort(keys, stable=True)
        self.keys = keys[order]
        self.answers = answers[order]

    def lookup(self, anchors: Tensor, relations: Tensor) -> tuple[Tensor, Tensor]:
        """(query row, answer entity) pairs for every known answer of each query, on the queries'
        device (the index stays in host memory)."""
        device = anchors.device
        queries = (anchors * self.num_relations + relations).to(self.keys.device)
        start = torch.searchsorted(self.keys, queries, side="left")
        stop = torch.searchsorted(self.keys, queries, side="right")
        counts = stop - start
        rows = torch.repeat_interleave(torch.arange(queries.shape[0]), counts)
        offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        return rows.to(device), self.answers[start[rows] + offsets].to(device)


def filtered_ranks(scores: Tensor, targets: Tensor, known: tuple[Tensor, Tensor]) -> Tensor:
    """Realistic filtered ranks of ``targets`` [B] given ``scores`` [B, E] and known answers."""
    scores = scores.clone()
    true = scores.gather(1, targets.unsqueeze(1))  # [B, 1]
    scores[known[0], known[1]] = float("-inf")  # removes the target too: ties below exclude it
    return realistic_ranks((scores > true).sum(1), (scores == true).sum(1), true, scores.shape[1])


def realistic_ranks(better: Tensor, equal: Tensor, true: Tensor, entities: int) -> Tensor:
    """1 + #better + #equal / 2 per query; a query whose true score is not finite ranks last."""
    ranks = 1.0 + better.double() + equal.double() / 2.0
    return torch.where(torch.isfinite(true.squeeze(1)), ranks, torch.full_like(ranks, float(entities)))


class FilteredRankingMetric:
    """MRR, Hits@1/3/10 and mean rank of a split, in both directions."""

    def __init__(self, graph: KnowledgeGraph, reciprocal: bool):
        everything = graph.all_triples()
        heads, relations, tails = everything.unbind(1)
        self.num_relations = graph.num_relations
        self.reciprocal = reciprocal
        self.tail_filter = FilterIndex(heads, relations, tails, graph.num_relations)
        self.head_filter = FilterIndex(tails, relations, heads, graph.num_relations)

    def ranks(self, model: KgeModel, entities: Tensor, triples: Tensor,
              progress: Callable[[Iterable], Iterable] = iter) -> Tensor:
        """[2 * n] ranks: tail queries then head queries, in triple order."""
        step = max(1, min(1024, SCORE_BUDGET // max(1, entities.shape[0])))
        tail_ranks, head_ranks = [], []
        for start in progress(range(0, triples.shape[0], step)):
            h, r, t = triples[start:start + step].unbind(1)
            scores = model.score_all_tails(entities, h, r)
            tail_ranks.append(filtered_ranks(scores, t, self.tail_filter.lookup(h, r)))
            if self.reciprocal:
                scores = model.score_all_tails(entities, t, r + self.num_relations)
            else:
                scores = model.score_all_heads(entities, r, t)
            head_ranks.append(filtered_ranks(scores, h, self.head_filter.lookup(t, r)))
        return torch.cat(tail_ranks + head_ranks)

    def __call__(self, model: KgeModel, entities: Tensor, triples: Tensor,
                 progress: Callable[[Iterable], Iterable] = iter) -> dict[str, float]:
        return summarize_ranks(self.ranks(model, entities, triples, progress))

    def ranks_in_blocks(self, model: KgeModel, rows: Callable[[Tensor], Tensor], candidates: int | Tensor,
                        triples: Tensor, block: int, progress: Callable[[Iterable], Iterable] = iter) -> Tensor:
        """``ranks``, with the candidates' rows read ``block`` at a time through ``rows(ids)``: the
        table is never whole in this process (a model larger than it may hold, read from where the
        rows live). ``candidates``: the number of entities (each query ranked against every entity:
        exact), or the sorted, distinct ids of the entities each query is ranked against (sampled
        evaluation); a query's own target always takes part. Each query's true score is scored against
        its own target's row; every block counts the candidates that score above it or level with
        it, the known answers left out, as ``filtered_ranks`` does on the whole table. (Entities whose
        rows are identical tie exactly within one matrix product; products of other shapes may differ
        in the last bit, so such a tie may count as one better or worse instead: the rank moves by half.)"""
        ids_all = torch.arange(candidates) if isinstance(candidates, int) else candidates.cpu()
        total = ids_all.shape[0]
        step = max(1, min(1024, SCORE_BUDGET // max(1, block)))
        tail_ranks, head_ranks = [], []
        for start in progress(range(0, triples.shape[0], step)):
            # rows are read by host ids from wherever they live; the scores are computed where ``rows``
            # puts them (an accelerator), and the queries go there
            h, r, t = (column.contiguous() for column in triples[start:start + step].cpu().unbind(1))
            head_rows, tail_rows = rows(h), rows(t)
            h, r, t = (column.to(head_rows.device) for column in (h, r, t))
            if self.reciprocal:
                r_inverse = r + self.num_relations
                head_side = lambda candidates: model.score_tails_against(tail_rows, r_inverse, candidates)  # noqa: E731
            else:
                head_side = lambda candidates: model.score_heads_against(candidates, r, tail_rows)  # noqa: E731
            sides = ((lambda candidates: model.score_tails_against(head_rows, r, candidates), t, tail_rows,  # noqa: E731
                      self.tail_filter.lookup(h, r)), (head_side, h, head_rows, self.head_filter.lookup(t, r)))
            counts = []
            for score, targets, target_rows, known in sides:
                true = score(target_rows).diagonal().unsqueeze(1)  # [B, 1]: each query against its own target
                better = torch.zeros(targets.shape[0], dtype=torch.float64, device=true.device)
                equal = torch.zeros_like(better)
                counts.append((score, true, better, equal, known))
            for first in range(0, total, block):
                ids = ids_all[first:first + block]
                candidate_rows = rows(ids)
                ids = ids.to(candidate_rows.device)
                for score, true, better, equal, known in counts:
                    scores = score(candidate_rows)
                    # the known answers (the target too) among this block's candidates: their columns
                    column = torch.searchsorted(ids, known[1]).clamp(max=ids.shape[0] - 1)
                    inside = ids[column] == known[1]
                    scores[known[0][inside], column[inside]] = float("-inf")
                    better += (scores > true).sum(1)
                    equal += (scores == true).sum(1)
            last = total if isinstance(candidates, int) else total + 1  # the rank of a non-finite true score
            for (score, true, better, equal, known), out in zip(counts, (tail_ranks, head_ranks)):
                out.append(realistic_ranks(better, equal, true, last))
        return torch.cat(tail_ranks + head_ranks)


def summarize_ranks(ranks: Tensor) -> dict[str, float]:
    metrics = {"mrr": float((1.0 / ranks).mean())}
    for k in HITS_AT:
        metrics[f"hits@{k}"] = float((ranks <= k).double().mean())
    metrics["mean_rank"] = float(ranks.mean())
    return metrics
