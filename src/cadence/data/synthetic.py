"""Seeded synthetic graphs with power-law degrees, for throughput at scale (not for quality).

Each endpoint of an edge is drawn from a Zipf-like law over a random permutation of the entities
(p(rank k) ~ k^-exponent), so a few entities are touched by many batches and most by few, the access
skew of real graphs. Relations are uniform. The last ``2 * holdout`` edges become valid and test.
The same (config, seed) always yields the same graph.
"""

from __future__ import annotations

import numpy as np
import torch

from cadence.config import SyntheticGraphConfig
from cadence.data.triples import KnowledgeGraph
from cadence.errors import ConfigError
from cadence.seeding import derive_seed

EDGE_CHUNK = 1 << 22


def power_law_graph(config: SyntheticGraphConfig, seed: int) -> KnowledgeGraph:
    if config.num_edges <= 2 * config.holdout:
        raise ConfigError("data.synthetic.num_edges must exceed 2 * data.synthetic.holdout")
    rng = np.random.default_rng(derive_seed(seed, "synthetic-graph"))
    ranks = np.arange(1, config.num_entities + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -config.exponent)
    cdf /= cdf[-1]
    entity_of_rank = rng.permutation(config.num_entities).astype(np.int64)
    triples = np.empty((config.num_edges, 3), dtype=np.int64)
    for start in range(0, config.num_edges, EDGE_CHUNK):
        stop = min(start + EDGE_CHUNK, config.num_edges)
        n = stop - start
        for column in (0, 2):
            rank = np.searchsorted(cdf, rng.random(n), side="right")
            triples[start:stop, column] = entity_of_rank[np.minimum(rank, config.num_entities - 1)]
        triples[start:stop, 1] = rng.integers(0, config.num_relations, n)
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
