"""Seeded synthetic graphs with power-law degrees, for throughput at scale (and, with communities,
for quality over time).

Each endpoint of an edge is drawn from a Zipf-like law over a random permutation of the entities
(p(rank k) ~ k^-exponent), so a few entities are touched by many batches and most by few, the access
skew of real graphs. Relations are uniform. The last ``2 * holdout`` edges become valid and test.
The same (config, seed) always yields the same graph.

``communities = 0`` (the default): the endpoints are independent, so there is nothing to learn beyond
how popular each entity is, and held-out quality peaks within an epoch or two. ``communities = C``:
the entity at popularity rank ``k`` belongs to community ``k mod C`` (each community a thinned copy of
the whole law), each relation pairs the communities (a seeded perfect matching, its own inverse, so
the structure is symmetric as DistMult's scores are), and an edge's tail is moved to the member of
the paired community nearest its drawn rank: every edge, held-out ones too, joins a head's community
to the one its relation pairs it with, a structure a model learns over several epochs. The draws are
those of ``communities = 0``; only the tails move.
"""

from __future__ import annotations

import numpy as np
import torch

from cadence.config import SyntheticGraphConfig
from cadence.data.triples import KnowledgeGraph
from cadence.errors import ConfigError
from cadence.seeding import derive_seed

EDGE_CHUNK = 1 << 22


def community_pairs(communities: int, relations: int, seed: int) -> np.ndarray:
    """``[relations, communities]``: the community each relation pairs each community with; each
    row a seeded perfect matching (an involution: ``pairs[r, pairs[r, c]] == c``; with an odd count
    one community pairs with itself)."""
    rng = np.random.default_rng(derive_seed(seed, "synthetic-graph-communities"))
    pairs = np.empty((relations, communities), dtype=np.int64)
    for relation in range(relations):
        order = rng.permutation(communities)
        pairs[relation, order] = order  # the odd one out, if any, stays with itself
        even = communities - communities % 2
        pairs[relation, order[0:even:2]] = order[1:even:2]
        pairs[relation, order[1:even:2]] = order[0:even:2]
    return pairs


def _entity_of_rank(rng: np.random.Generator, entities: int) -> np.ndarray:
    """The entity at each popularity rank: the graph generator's first draw."""
    return rng.permutation(entities).astype(np.int64)


def entity_communities(config: SyntheticGraphConfig, seed: int) -> np.ndarray:
    """Each entity's community in ``power_law_graph(config, seed)`` (``data.synthetic.communities``
    > 0): its popularity rank modulo the count."""
    if config.communities < 1:
        raise ConfigError("data.synthetic.communities is 0: the graph has no communities")
    entity_of_rank = _entity_of_rank(np.random.default_rng(derive_seed(seed, "synthetic-graph")), config.num_entities)
    found = np.empty(config.num_entities, dtype=np.int64)
    found[entity_of_rank] = np.arange(config.num_entities) % config.communities
    return found


def power_law_graph(config: SyntheticGraphConfig, seed: int) -> KnowledgeGraph:
    if config.num_edges <= 2 * config.holdout:
        raise ConfigError("data.synthetic.num_edges must exceed 2 * data.synthetic.holdout")
    if not 0 <= config.communities <= config.num_entities:
        raise ConfigError(f"data.synthetic.communities must be between 0 and data.synthetic.num_entities "
                          f"({config.num_entities}), got {config.communities}")
    communities = config.communities
    pairs = community_pairs(communities, config.num_relations, seed) if communities else None
    rng = np.random.default_rng(derive_seed(seed, "synthetic-graph"))
    ranks = np.arange(1, config.num_entities + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -config.exponent)
    cdf /= cdf[-1]
    entity_of_rank = _entity_of_rank(rng, config.num_entities)
    triples = np.empty((config.num_edges, 3), dtype=np.int64)
    for start in range(0, config.num_edges, EDGE_CHUNK):
        stop = min(start + EDGE_CHUNK, config.num_edges)
        n = stop - start
        head, tail = (np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), config.num_entities - 1)
                      for _ in range(2))
        relation = rng.integers(0, config.num_relations, n)
        if pairs is not None:  # the tail moves within its block of C ranks to the paired community's member
            tail = tail - tail % communities + pairs[relation, head % communities]
            tail[tail >= config.num_entities] -= communities
        triples[start:stop, 0] = entity_of_rank[head]
        triples[start:stop, 1] = relation
        triples[start:stop, 2] = entity_of_rank[tail]
    all_triples = torch.from_numpy(triples)
    cut = config.num_edges - 2 * config.holdout
    return KnowledgeGraph(
        name="synthetic",
        num_entities=config.num_entities,
        num_relations=config.num_relations,
        train=all_triples[:cut],
        valid=all_triples[cut:cut + config.holdout],
        test=all_triples[cut + config.holdout:],
    )
