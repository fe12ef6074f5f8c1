"""Seeded synthetic CTR data with Zipf-skewed ids and a planted model, for throughput at scale.

Each field's value is drawn from a bounded power law over ranks (p(rank k) ~ k^-zipf_exponent, by
inverse transform of the continuous law, so memory does not grow with the vocabulary), and ranks
are scattered over the value range by an affine bijection so the hot keys are not the small ones.

The label follows a planted factorization machine, so a model has something to learn::

    logit = BIAS + sum_f w[key_f] + sum_{f<g} <v[key_f], v[key_g]>,   label ~ Bernoulli(sigmoid(logit))

with ``w`` and the ``dim``-dimensional ``v`` derived from a hash of (key, seed) rather than stored:
the model is the same whatever the number of examples, and costs no memory for huge vocabularies.
The linear and pairwise parts each have standard deviation about ``PART_STD``. Timestamps are the
example index. The same arguments always give the same dataset.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from cadence.task_config import SyntheticCtrConfig
from cadence.data.ctr_examples import CTR_DATASETS, VALUE_BITS, CtrDataset, CtrDatasetEntry, CtrExamples
from cadence.errors import ConfigError
from cadence.seeding import derive_seed

BIAS = -1.0  # a click rate around 0.4
PART_STD = 1.5
CHUNK = 1 << 18


def synthetic_ctr(num_examples: int, num_fields: int, vocab_per_field: int, zipf_exponent: float,
                  dim: int, seed: int) -> CtrDataset:
    _check(num_examples, num_fields, vocab_per_field, zipf_exponent, dim)
    rng = np.random.default_rng(derive_seed(seed, "synthetic-ctr"))
    scatter = [_affine_bijection(rng, vocab_per_field) for _ in range(num_fields)]
    field_bits = np.arange(num_fields, dtype=np.int64) << VALUE_BITS
    keys = np.empty((num_examples, num_fields), dtype=np.int64)
    labels = np.empty(num_examples, dtype=np.float32)
    for start in range(0, num_examples, CHUNK):
        stop = min(start + CHUNK, num_examples)
        ranks = zipf_ranks(rng, (stop - start, num_fields), vocab_per_field, zipf_exponent)
        values = np.stack([(ranks[:, f] * a + b) % vocab_per_field for f, (a, b) in enumerate(scatter)], 1)
        keys[start:stop] = values | field_bits
        probability = 1 / (1 + np.exp(-planted_logits(keys[start:stop], dim, seed)))
        labels[start:stop] = rng.random(stop - start) < probability
    examples = CtrExamples(
        keys=torch.from_numpy(keys),
        bags=torch.empty(num_examples, 0, 0, dtype=torch.int64),
        dense=torch.empty(num_examples, 0),
        labels=torch.from_numpy(labels),
        timestamps=torch.arange(num_examples, dtype=torch.int64),
    )
    return CtrDataset("synthetic-ctr", [f"field{f}" for f in range(num_fields)], [], [], examples)


def synthetic_ctr_from_config(config: SyntheticCtrConfig, seed: int) -> CtrDataset:
    return synthetic_ctr(config.num_examples, config.num_fields, config.vocab_per_field,
                         config.zipf_exponent, config.dim, seed)


# ---- the same law, one example at a time: for data sets larger than memory ------------------------
class StreamExamples:
    """Examples ``start .. start + count - 1`` of a stream: example i is a pure function of (seed, i)
    (its values from hashes of (i, field), its label from a hash of i), so any subset is generated on
    demand, in any process, and nothing is held. ``subset`` returns real ``CtrExamples``."""

    def __init__(self, config, seed: int, start: int, count: int, scatter: list[tuple[int, int]]):
        self.config, self.seed, self.start, self.count, self.scatter = config, seed, start, count, scatter

    def __len__(self) -> int:
        return self.count

    @property
    def labels(self) -> torch.Tensor:  # (evaluation reads the labels of a whole split: held-out parts are small)
        return self.subset(torch.arange(self.count)).labels

    def subset(self, index: torch.Tensor) -> CtrExamples:
        config = self.config
        ids = index.numpy().astype(np.int64) + self.start
        keys = np.empty((ids.shape[0], config.num_fields), dtype=np.int64)
        for f, (a, b) in enumerate(self.scatter):
            u = _unit(hashed_uniform(ids * config.num_fields + f, derive_seed(self.seed, "stream-value")))
            ranks = zipf_from_uniform(u, config.vocab_per_field, config.zipf_exponent)
            keys[:, f] = ((ranks * a + b) % config.vocab_per_field) | (f << VALUE_BITS)
        probability = 1 / (1 + np.exp(-planted_logits(keys, config.dim, self.seed)))
        labels = _unit(hashed_uniform(ids, derive_seed(self.seed, "stream-label"))) < probability
        n = ids.shape[0]
        return CtrExamples(keys=torch.from_numpy(keys), bags=torch.empty(n, 0, 0, dtype=torch.int64),
                           dense=torch.empty(n, 0), labels=torch.from_numpy(labels.astype(np.float32)),
                           timestamps=torch.from_numpy(ids))


class StreamCtrDataset(CtrDataset):
    """``synthetic-ctr-stream``: ``num_examples`` examples never held in memory; the last
    ``2 x holdout`` are valid and test (the split is by position: examples are i.i.d.)."""

    def __init__(self, config, seed: int):
        _check(config.num_examples, config.num_fields, config.vocab_per_field, config.zipf_exponent, config.dim)
        if 2 * config.holdout >= config.num_examples:
            raise ConfigError("ctr.synthetic.holdout: valid and test (2 x holdout) must leave training examples")
        rng = np.random.default_rng(derive_seed(seed, "synthetic-ctr"))
        scatter = [_affine_bijection(rng, config.vocab_per_field) for _ in range(config.num_fields)]
        self.parts = [StreamExamples(config, seed, start, count, scatter) for start, count in (
            (0, config.num_examples - 2 * config.holdout),
            (config.num_examples - 2 * config.holdout, config.holdout),
            (config.num_examples - config.holdout, config.holdout))]
        super().__init__("synthetic-ctr-stream", [f"field{f}" for f in range(config.num_fields)], [], [],
                         self.parts[0])

    def random_split(self, seed: int, fractions=None):
        return tuple(self.parts)

    def periods(self, count: int):
        raise ConfigError("synthetic-ctr-stream has no time-ordered periods (use ctr.split: random)")


def _unit(z: np.ndarray) -> np.ndarray:
    """``hashed_uniform``'s [-sqrt 3, sqrt 3) mapped to [0, 1)."""
    return (z / math.sqrt(3) + 1) / 2


def zipf_from_uniform(u: np.ndarray, vocab: int, exponent: float) -> np.ndarray:
    """``zipf_ranks`` for given uniforms in [0, 1)."""
    if abs(exponent - 1) < 1e-9:
        x = np.exp(u * math.log(vocab + 1))
    else:
        power = 1 - exponent
        x = (u * ((vocab + 1) ** power - 1) + 1) ** (1 / power)
    return np.minimum(x.astype(np.int64) - 1, vocab - 1).clip(0)


def _check(num_examples: int, num_fields: int, vocab_per_field: int, zipf_exponent: float, dim: int) -> None:
    for name, value, low in (("num_examples", num_examples, 1), ("num_fields", num_fields, 1),
                             ("vocab_per_field", vocab_per_field, 1), ("dim", dim, 0)):
        if value < low:
            raise ConfigError(f"synthetic ctr {name} must be at least {low}, got {value}")
    if vocab_per_field > 1 << VALUE_BITS:
        raise ConfigError(f"synthetic ctr vocab_per_field must be at most 2**{VALUE_BITS}")
    if not zipf_exponent >= 0:
        raise ConfigError(f"synthetic ctr zipf_exponent must be >= 0, got {zipf_exponent}")


def zipf_ranks(rng: np.random.Generator, shape: tuple[int, ...], vocab: int, exponent: float) -> np.ndarray:
    """Ranks in [0, vocab) with p(rank k) ~ (k+1)^-exponent (inverse transform of the continuous law)."""
    return zipf_from_uniform(rng.random(shape), vocab, exponent)


def _affine_bijection(rng: np.random.Generator, vocab: int) -> tuple[int, int]:
    """(a, b) with gcd(a, vocab) = 1, so rank -> (a * rank + b) % vocab permutes [0, vocab).

    a < 2**22 keeps a * rank < 2**62 for any vocab up to 2**40.
    """
    while True:
        a = int(rng.integers(1, max(2, min(vocab, 1 << 22))))
        if math.gcd(a, vocab) == 1:
            return a, int(rng.integers(0, vocab))


def planted_logits(keys: np.ndarray, dim: int, seed: int) -> np.ndarray:
    """The planted model's logit of each row of ``keys`` [n, F]."""
    num_fields = keys.shape[1]
    weights = hashed_uniform(keys, derive_seed(seed, "synthetic-ctr-weight"))
    logits = BIAS + PART_STD / math.sqrt(num_fields) * weights.sum(axis=1)
    pairs = num_fields * (num_fields - 1) // 2
    if pairs == 0 or dim == 0:
        return logits
    scale = math.sqrt(PART_STD) * (pairs * dim) ** -0.25  # each factor coordinate's std
    for j in range(dim):  # <v_f, v_g> summed over pairs = ((sum_f v_f)^2 - sum_f v_f^2) / 2, per coordinate
        factor = scale * hashed_uniform(keys, derive_seed(seed, "synthetic-ctr-factor", j))
        logits += 0.5 * (factor.sum(axis=1) ** 2 - (factor ** 2).sum(axis=1))
    return logits


def hashed_uniform(keys: np.ndarray, salt: int) -> np.ndarray:
    """A unit-variance uniform value in [-sqrt 3, sqrt 3) per key: the splitmix64 finalizer of key + salt."""
    z = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 * 2 - 1) * math.sqrt(3)


CTR_DATASETS.register("synthetic-ctr")(CtrDatasetEntry(
    "synthetic-ctr", "seeded Zipf-skewed CTR data with a planted model (ctr.synthetic.*; default 200k "
    "examples, 8 fields x 100k values)",
    lambda seed: synthetic_ctr_from_config(SyntheticCtrConfig(), seed),
    generate=synthetic_ctr_from_config,
))
CTR_DATASETS.register("synthetic-ctr-stream")(CtrDatasetEntry(
    "synthetic-ctr-stream", "the same law, each example generated on demand from its index (for data "
    "larger than memory; ctr.synthetic.*)",
    lambda seed: StreamCtrDataset(SyntheticCtrConfig(), seed),
    generate=lambda config, seed: StreamCtrDataset(config, seed),
))
