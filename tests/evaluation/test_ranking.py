"""Filtered ranking against a brute-force reference with Python sets and loops."""

import torch

from cadence.config import load_config
from cadence.data.triples import KnowledgeGraph
from cadence.evaluation.ranking import FilteredRankingMetric, FilterIndex, filtered_ranks
from cadence.models.kge import KgeModel
from tests.conftest import needs_cuda


def brute_force_rank(scores: list[float], target: int, known: set[int]) -> float:
    true = scores[target]
    better = sum(1 for e, s in enumerate(scores) if e not in known and s > true)
    equal = sum(1 for e, s in enumerate(scores) if e not in known and e != target and s == true)
    return 1 + better + equal / 2


def random_graph(seed: int) -> KnowledgeGraph:
    g = torch.Generator().manual_seed(seed)
    triples = torch.unique(torch.stack([torch.randint(0, 12, (150,), generator=g),
                                        torch.randint(0, 3, (150,), generator=g),
                                        torch.randint(0, 12, (150,), generator=g)], 1), dim=0)
    triples = triples[torch.randperm(len(triples), generator=g)]
    return KnowledgeGraph("random", 12, 3, triples[:100], triples[100:115], triples[115:])


def test_filter_index_lookup_lists_every_known_answer() -> None:
    graph = random_graph(0)
    h, r, t = graph.all_triples().unbind(1)
    index = FilterIndex(h, r, t, 3)
    queries = graph.test[:, :2]
    rows, answers = index.lookup(queries[:, 0], queries[:, 1])
    for q, (qh, qr) in enumerate(queries.tolist()):
        expected = sorted(int(c) for a, b, c in graph.all_triples().tolist() if a == qh and b == qr)
        assert sorted(answers[rows == q].tolist()) == expected


def test_metric_matches_brute_force_in_both_directions() -> None:
    graph = random_graph(1)
    for reciprocal in (False, True):
        config = load_config(None, ["model.name=distmult", "model.dim=4", "model.init_std=1.0",
                                    f"train.reciprocal={str(reciprocal).lower()}"])
        model = KgeModel(config, graph.num_relations * (2 if reciprocal else 1))
        entities = torch.randn(12, 4, generator=torch.Generator().manual_seed(2))
        entities[3] = entities[5]  # force ties
        ranks = FilteredRankingMetric(graph, reciprocal).ranks(model, entities, graph.test)
        everything = [tuple(x) for x in graph.all_triples().tolist()]
        expected = []
        for side in ("tail", "head"):
            for h, r, t in graph.test.tolist():
                if side == "tail":
                    scores = model.score_all_tails(entities, torch.tensor([h]), torch.tensor([r]))[0].tolist()
                    known = {c for a, b, c in everything if a == h and b == r}
                    expected.append(brute_force_rank(scores, t, known))
                else:
                    if reciprocal:
                        scores = model.score_all_tails(entities, torch.tensor([t]), torch.tensor([r + 3]))[0]
                    else:
                        scores = model.score_all_heads(entities, torch.tensor([r]), torch.tensor([t]))[0]
                    known = {a for a, b, c in everything if b == r and c == t}
                    expected.append(brute_force_rank(scores.tolist(), h, known))
        assert ranks.tolist() == expected


def test_constant_scores_rank_in_the_middle_and_nan_ranks_last() -> None:
    scores = torch.zeros(2, 9)
    scores[1, 4] = float("nan")
    ranks = filtered_ranks(scores, torch.tensor([0, 4]), (torch.tensor([0, 1]), torch.tensor([0, 4])))
    assert ranks.tolist() == [1 + 8 / 2, 9.0]


def test_ranks_read_block_by_block_equal_the_whole_tables_ranks() -> None:
    """An entity table read a block at a time (a model larger than the evaluating process may hold)
    ranks as the whole table does (brute-force checked above): known answers split across blocks,
    both directions, reciprocal or not, a complex scorer; no read asks for more than a block of
    entity rows besides the queries' own. Two entities with identical rows tie exactly in one
    matrix product but may differ in the last bit between products of other shapes: there a rank
    may move by the half that a tie counts, never more."""
    graph = random_graph(3)
    for name, dim in (("distmult", 4), ("complex", 6)):
        for reciprocal in (False, True):
            config = load_config(None, [f"model.name={name}", f"model.dim={dim}", "model.init_std=1.0",
                                        f"train.reciprocal={str(reciprocal).lower()}"])
            model = KgeModel(config, graph.num_relations * (2 if reciprocal else 1))
            metric = FilteredRankingMetric(graph, reciprocal)
            for tied in (False, True):
                entities = torch.randn(12, dim, generator=torch.Generator().manual_seed(4))
                if tied:
                    entities[3] = entities[5]
                whole = metric.ranks(model, entities, graph.test)
                for block in (1, 2, 5, 12, 100):
                    reads = []

                    def rows(ids: torch.Tensor) -> torch.Tensor:
                        reads.append(ids.shape[0])
                        return entities[ids]

                    got = metric.ranks_in_blocks(model, rows, 12, graph.test, block)
                    if tied:
                        assert float((got - whole).abs().max()) <= 0.5, (name, reciprocal, block)
                    else:
                        assert torch.equal(got, whole), (name, reciprocal, block)
                    queries = graph.test.shape[0]
                    assert max(reads) <= max(block, queries) and sum(reads) == 2 * queries + 12


@needs_cuda
def test_ranks_read_block_by_block_on_a_gpu_equal_the_cpus() -> None:
    """A table too large to hold whole on an accelerator: rows read by host ids from the host table,
    scored on the GPU; the queries may arrive on either device. Ranks equal the CPU's whole-table ranks."""
    graph = random_graph(3)
    config = load_config(None, ["model.name=distmult", "model.dim=4", "model.init_std=1.0"])
    model = KgeModel(config, graph.num_relations)
    metric = FilteredRankingMetric(graph, False)
    entities = torch.randn(12, 4, generator=torch.Generator().manual_seed(4))
    whole = metric.ranks(model, entities, graph.test)
    on_gpu = KgeModel(config, graph.num_relations)
    on_gpu.load_state_dict(model.state_dict())
    on_gpu.to("cuda")
    for triples in (graph.test, graph.test.to("cuda")):
        got = metric.ranks_in_blocks(on_gpu, lambda ids: entities[ids].to("cuda"), 12, triples, 5)
        assert torch.equal(got.cpu(), whole)


def test_ranks_against_sampled_candidates_match_brute_force() -> None:
    """Sampled evaluation (``eval.negatives``): each query ranked against a fixed set of candidate
    entities, its target's own score compared, the known answers among the candidates left out: a
    brute-force rank over the candidates alone, in both directions, in blocks of every size."""
    graph = random_graph(5)
    everything = [tuple(x) for x in graph.all_triples().tolist()]
    config = load_config(None, ["model.name=distmult", "model.dim=4", "model.init_std=1.0"])
    model = KgeModel(config, graph.num_relations)
    metric = FilteredRankingMetric(graph, False)
    entities = torch.randn(12, 4, generator=torch.Generator().manual_seed(6))
    candidates = torch.tensor([0, 2, 3, 7, 8, 11])
    expected = []
    for side in ("tail", "head"):
        for h, r, t in graph.test.tolist():
            if side == "tail":
                scores = model.score_all_tails(entities, torch.tensor([h]), torch.tensor([r]))[0].tolist()
                target, known = t, {c for a, b, c in everything if a == h and b == r}
            else:
                scores = model.score_all_heads(entities, torch.tensor([r]), torch.tensor([t]))[0].tolist()
                target, known = h, {a for a, b, c in everything if b == r and c == t}
            true = scores[target]
            kept = [scores[e] for e in candidates.tolist() if e not in known]
            expected.append(1 + sum(s > true for s in kept) + sum(s == true for s in kept) / 2)
    for block in (1, 4, 6, 50):
        got = metric.ranks_in_blocks(model, lambda ids: entities[ids], candidates, graph.test, block)
        assert got.tolist() == expected, block
