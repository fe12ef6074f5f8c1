"""Click-through-rate models over embedding rows that live outside the model.

The sparse parameters (one row per feature key) live in an ``EmbeddingStore``; a model owns only
its dense parameters (biases, dense-feature weights, MLPs) and receives, per batch, the rows the
caller has already pulled. A key's row is ``dim + 1`` floats::

    [ v_1 ... v_dim | w ]      v: the key's embedding vector, w: its linear ("wide") weight

Multi-valued (bag) fields are pooled by the caller (``pool_bags``: the sum of the bag's rows), so
``forward(rows, dense)`` always sees one row per field: ``rows`` [B, F, dim+1], ``dense`` [B, D]
(D may be 0), and returns logits [B]. ``rows`` may be a leaf with ``requires_grad``; its gradient
is what the caller pushes back to the store.

The models are sums of a few shared parts:

- ``lr``        linear(x) = b + sum_f w_f + <a, dense>
- ``fm``        linear(x) + sum_{i<j} <v_i, v_j>, in O(F dim) (Rendle 2010, "Factorization
                Machines", ICDM, eq. 1 and Lemma 3.1)
- ``wide_deep`` linear(x) + MLP([v_1, ..., v_F, dense]) (Cheng et al. 2016, "Wide & Deep Learning
                for Recommender Systems", sec. 3; the wide part here is first-order only: cross-
                product features, if wanted, are extra fields)
- ``deepfm``    linear(x) + FM + MLP, all on the same embeddings (Guo et al. 2017, "DeepFM",
                IJCAI, sec. 2.1, eq. 1)
- ``dlrm``      top MLP([bottom(dense), <t_i, t_j> for i < j]) over t = (bottom(dense), v_1..v_F)
                (Naumov et al. 2019, "Deep Learning Recommendation Model for Personalization and
                Recommendation Systems", sec. 2-3; no linear weights, as in the paper)

Dense parameters use the standard ``nn.Linear`` initialisation (biases of the linear term start at
0), so a model is reproducible whenever the caller has set ``torch.manual_seed``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Iterable

import torch
from torch import Tensor, nn

from cadence.core.batch import Batch, BatchPlan, distinct_keys
from cadence.data.ctr_examples import CtrExamples
from cadence.errors import ConfigError
from cadence.models.layers import Dropout
from cadence.registry import Registry

CTR_MODELS: Registry[type["CtrModel"]] = Registry("ctr model", "model.name")


def pool_bags(rows: Tensor, mask: Tensor) -> Tensor:
    """Sum-pool padded bags: rows [B, Fb, L, dim+1], mask [B, Fb, L] (1/True = present) ->
    [B, Fb, dim+1]. Summing vectors and linear weights alike keeps each part of the row's meaning."""
    return (rows * mask.unsqueeze(-1).to(rows.dtype)).sum(2)


def split_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """[B, F, dim+1] -> embedding vectors [B, F, dim] and linear weights [B, F]."""
    return rows[..., :-1], rows[..., -1]


def pairwise_interaction(vectors: Tensor) -> Tensor:
    """sum_{i<j} <v_i, v_j> per example: [B, F, dim] -> [B], in O(F dim) rather than O(F^2 dim).

    Rendle's identity: sum_{i<j} v_i v_j = 1/2 ((sum_i v_i)^2 - sum_i v_i^2), per component.
    """
    square_of_sum = vectors.sum(1).square()  # [B, dim]
    sum_of_squares = vectors.square().sum(1)  # [B, dim]
    return 0.5 * (square_of_sum - sum_of_squares).sum(-1)  # [B]


def mlp(in_features: int, hidden: tuple[int, ...], dropout: float, out_features: int = 1,
        final_relu: bool = False) -> nn.Sequential:
    """Linear -> ReLU (-> Dropout) per hidden layer, then a Linear to ``out_features``."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        if dropout > 0:
            layers.append(Dropout(dropout))
        in_features = width
    layers.append(nn.Linear(in_features, out_features))
    if final_relu:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class LinearTerm(nn.Module):
    """The first-order ("wide") part: b + sum_f w_f + <a, dense> -> [B]."""

    def __init__(self, num_dense: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))
        self.dense = nn.Linear(num_dense, 1, bias=False) if num_dense else None

    def forward(self, weights: Tensor, dense: Tensor) -> Tensor:
        logit = weights.sum(1) + self.bias  # [B]
        if self.dense is not None:
            logit = logit + self.dense(dense).squeeze(-1)
        return logit


class DeepTower(nn.Module):
    """An MLP over the concatenated field embeddings and dense features -> [B]."""

    def __init__(self, num_fields: int, num_dense: int, dim: int, hidden: tuple[int, ...],
                 dropout: float):
        super().__init__()
        self.mlp = mlp(num_fields * dim + num_dense, hidden, dropout)

    def forward(self, vectors: Tensor, dense: Tensor) -> Tensor:
        features = torch.cat([vectors.flatten(1), dense], dim=1)  # [B, F*dim + D]
        return self.mlp(features).squeeze(-1)


class CtrModel(nn.Module, ABC):
    """Maps per-field rows and dense features to click logits; owns dense parameters only.

    A subclass declares the shared parts it uses (``has_linear``: the first-order term;
    ``has_deep``: an MLP over the field embeddings and dense features) and combines them in ``logit``.
    """

    has_linear = False
    has_deep = False
    has_vectors = True  # False: rows are the linear weight alone (width 1; ``dim`` is unused)

    @classmethod
    def row_width(cls, dim: int) -> int:
        """Floats per feature key's row: the vector and the linear weight, or the weight alone."""
        return dim + 1 if cls.has_vectors else 1

    def __init__(self, num_fields: int, num_dense: int, dim: int, hidden: tuple[int, ...] = (64, 32),
                 dropout: float = 0.0):
        super().__init__()
        if num_fields < 1 or num_dense < 0 or dim < 1:
            raise ConfigError(f"a ctr model needs num_fields >= 1, num_dense >= 0 and dim >= 1; got "
                              f"{num_fields}, {num_dense}, {dim}")
        self.num_fields, self.num_dense, self.dim = num_fields, num_dense, dim
        if self.has_linear:
            self.linear = LinearTerm(num_dense)
        if self.has_deep:
            self.deep = DeepTower(num_fields, num_dense, dim, hidden, dropout)

    def forward(self, rows: Tensor, dense: Tensor) -> Tensor:
        """rows: [B, F, row_width] per-field rows; dense: [B, D] numeric features -> logits [B]."""
        width = self.row_width(self.dim)
        if rows.dim() != 3 or rows.shape[1:] != (self.num_fields, width):
            raise ValueError(f"rows must be [B, {self.num_fields}, {width}], got {list(rows.shape)}")
        if dense.shape != (rows.shape[0], self.num_dense):
            raise ValueError(f"dense must be [{rows.shape[0]}, {self.num_dense}], got {list(dense.shape)}")
        vectors, weights = split_rows(rows)
        return self.logit(vectors, weights, dense)

    @abstractmethod
    def logit(self, vectors: Tensor, weights: Tensor, dense: Tensor) -> Tensor:
        """vectors [B, F, dim], weights [B, F], dense [B, D] -> logits [B]."""


@CTR_MODELS.register("lr")
class LogisticRegression(CtrModel):
    """logit = b + sum_f w_f + <a, dense>; rows hold w alone (width 1, whatever ``dim``: a wider row
    would be pulled, stored and shipped for nothing, and a row-wise optimizer's state would average
    the weight's squared gradient with unused zeros, so ``dim`` would change the learning rate);
    ``hidden`` and ``dropout`` are unused."""

    has_linear = True
    has_vectors = False

    def logit(self, vectors, weights, dense):
        return self.linear(weights, dense)


@CTR_MODELS.register("fm")
class FactorizationMachine(CtrModel):
    """logit = linear + sum_{i<j} <v_i, v_j> (Rendle 2010); ``hidden`` and ``dropout`` are unused."""

    has_linear = True

    def logit(self, vectors, weights, dense):
        return self.linear(weights, dense) + pairwise_interaction(vectors)


@CTR_MODELS.register("wide_deep")
class WideAndDeep(CtrModel):
    """logit = linear + MLP([v_1..v_F, dense]) (Cheng et al. 2016), trained jointly."""

    has_linear = True
    has_deep = True

    def logit(self, vectors, weights, dense):
        return self.linear(weights, dense) + self.deep(vectors, dense)


@CTR_MODELS.register("deepfm")
class DeepFM(CtrModel):
    """logit = linear + FM + MLP, the FM and MLP sharing the embeddings (Guo et al. 2017).

    The paper's deep component reads the field embeddings only; dense features are appended to its
    input here, as Wide & Deep does, so that they reach the MLP too.
    """

    has_linear = True
    has_deep = True

    def logit(self, vectors, weights, dense):
        return self.linear(weights, dense) + pairwise_interaction(vectors) + self.deep(vectors, dense)


@CTR_MODELS.register("dlrm")
class DLRM(CtrModel):
    """Bottom MLP on dense features, pairwise dot interactions, top MLP (Naumov et al. 2019).

    t = (bottom(dense), v_1, ..., v_F) when D > 0, else (v_1, ..., v_F); the top MLP reads
    [bottom(dense), <t_i, t_j> for i < j] (row-major upper triangle, no self-interactions). As in
    the reference implementation every bottom layer, the last included, ends in a ReLU. The linear
    weights of the rows are not used. ``hidden`` shapes the top MLP, ``bottom_hidden`` the bottom.
    """

    def __init__(self, num_fields: int, num_dense: int, dim: int, hidden: tuple[int, ...] = (64, 32),
                 dropout: float = 0.0, bottom_hidden: tuple[int, ...] = (64,)):
        super().__init__(num_fields, num_dense, dim, hidden, dropout)
        self.bottom = mlp(num_dense, bottom_hidden, 0.0, dim, final_relu=True) if num_dense else None
        count = num_fields + (1 if num_dense else 0)  # vectors that interact
        pairs = count * (count - 1) // 2
        if pairs == 0:  # one field and no dense features: nothing for the top MLP to read
            raise ConfigError("dlrm needs at least two fields, or one field and dense features")
        self.register_buffer("upper", torch.triu_indices(count, count, offset=1), persistent=False)
        self.top = mlp(pairs + (dim if num_dense else 0), hidden, dropout)

    def logit(self, vectors, weights, dense):
        if self.bottom is None:
            return self.top(self.interact(vectors)).squeeze(-1)
        bottom = self.bottom(dense)  # [B, dim]
        interactions = self.interact(torch.cat([bottom.unsqueeze(1), vectors], dim=1))
        return self.top(torch.cat([bottom, interactions], dim=1)).squeeze(-1)

    def interact(self, features: Tensor) -> Tensor:
        """[B, n, dim] -> [B, n(n-1)/2]: <t_i, t_j> for i < j, in row-major order."""
        gram = features @ features.transpose(1, 2)  # [B, n, n]
        return gram[:, self.upper[0], self.upper[1]]


# ---- a batch of examples, as the models read it (training, evaluation and prediction alike) ----------------
def examples_batch(plan: BatchPlan, examples: CtrExamples) -> Batch:
    """A batch of CTR examples: its unique feature keys, and each key slot's index into them (single
    fields first, then the valid bag entries in order)."""
    present = examples.bags[examples.bags >= 0]
    keys, inverse = distinct_keys(torch.cat([examples.keys.flatten(), present]))
    inputs = {"inverse": inverse, "slots": examples.keys, "bags": examples.bags, "dense": examples.dense,
              "labels": examples.labels}
    return Batch(plan, keys, inputs)


def batch_logits(model: nn.Module, inputs: dict[str, Tensor], rows: Tensor) -> Tensor:
    """Logits of a batch from its unique rows [U, W] (gathered per field, bags sum-pooled)."""
    size, fields = inputs["slots"].shape
    inverse, bags = inputs["inverse"], inputs["bags"]
    single = rows.index_select(0, inverse[: size * fields]).view(size, fields, -1)  # [B, F, W]
    if bags.shape[1]:
        mask = bags >= 0  # [B, Fb, L]
        bag_rows = rows.new_zeros(*bags.shape, rows.shape[1])
        bag_rows = bag_rows.index_put((*mask.nonzero().unbind(1),), rows.index_select(0, inverse[size * fields:]))
        single = torch.cat([single, pool_bags(bag_rows, mask)], dim=1)  # [B, F + Fb, W]
    return model(single, inputs["dense"])


def examples_logits(model: nn.Module, examples: CtrExamples, rows: Callable[[Tensor], Tensor],
                    device: torch.device, progress: Callable[[Iterable], Iterable] = iter,
                    batch_size: int = 4096) -> Tensor:
    """[n] logits of ``examples``, ``batch_size`` at a time, each batch's rows read by key through
    ``rows`` (onto ``device``): what evaluation scores and what prediction answers, one computation."""
    logits = []
    with torch.no_grad():
        for start in progress(range(0, len(examples), batch_size)):
            part = examples.subset(torch.arange(start, min(start + batch_size, len(examples))))
            batch = examples_batch(BatchPlan(-1, start, torch.empty(0, dtype=torch.int64)), part)
            inputs = {name: value.to(device) for name, value in batch.inputs.items()}
            logits.append(batch_logits(model, inputs, rows(batch.ids)).cpu())
    return torch.cat(logits) if logits else torch.empty(0)
