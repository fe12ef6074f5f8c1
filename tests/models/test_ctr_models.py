"""Each CTR model against a naive reference written with explicit loops over fields and pairs.

The references index single elements, so autograd through them also gives reference gradients for
``rows`` and for every dense parameter.
"""

import pytest
import torch
from torch import Tensor, nn

from cadence.errors import ConfigError
from cadence.evaluation.classification import auc
from cadence.models.layers import Dropout
from cadence.models.ctr import CTR_MODELS, CtrModel, pool_bags

BATCH, FIELDS, DIM, HIDDEN = 3, 4, 3, (5, 4)


def dot(a, b) -> Tensor:
    return sum(x * y for x, y in zip(a, b))


def naive_mlp(layers: nn.Sequential, x: list) -> list:
    for layer in layers:
        if isinstance(layer, nn.Linear):
            bias = layer.bias if layer.bias is not None else [0.0] * layer.out_features
            x = [dot(layer.weight[o], x) + bias[o] for o in range(layer.out_features)]
        elif isinstance(layer, nn.ReLU):
            x = [torch.clamp(value, min=0) for value in x]
        else:
            assert isinstance(layer, Dropout)  # identity in eval mode
    return x


def naive_linear(model: CtrModel, row: Tensor, dense: Tensor) -> Tensor:
    logit = model.linear.bias[0] + sum(row[f, -1] for f in range(FIELDS))  # the last column: w
    if model.linear.dense is not None:
        logit = logit + dot(model.linear.dense.weight[0], dense)
    return logit


def naive_pairs(vectors: list) -> Tensor:
    """sum_{i<j} <v_i, v_j> by the double loop."""
    return sum(dot(vectors[i], vectors[j]) for i in range(len(vectors)) for j in range(i + 1, len(vectors)))


def naive_deep(model: CtrModel, row: Tensor, dense: Tensor) -> Tensor:
    features = [row[f, k] for f in range(FIELDS) for k in range(DIM)] + list(dense)
    return naive_mlp(model.deep.mlp, features)[0]


def embeddings(row: Tensor) -> list:
    return [[row[f, k] for k in range(DIM)] for f in range(FIELDS)]


def naive_dlrm(model: CtrModel, row: Tensor, dense: Tensor) -> Tensor:
    vectors = embeddings(row)
    if model.bottom is None:
        pairs = [dot(vectors[i], vectors[j]) for i in range(FIELDS) for j in range(i + 1, FIELDS)]
        return naive_mlp(model.top, pairs)[0]
    bottom = naive_mlp(model.bottom, list(dense))
    t = [bottom] + vectors
    pairs = [dot(t[i], t[j]) for i in range(len(t)) for j in range(i + 1, len(t))]
    return naive_mlp(model.top, bottom + pairs)[0]


REFERENCES = {
    "lr": naive_linear,
    "fm": lambda m, row, dense: naive_linear(m, row, dense) + naive_pairs(embeddings(row)),
    "wide_deep": lambda m, row, dense: naive_linear(m, row, dense) + naive_deep(m, row, dense),
    "deepfm": lambda m, row, dense: (naive_linear(m, row, dense) + naive_pairs(embeddings(row))
                                     + naive_deep(m, row, dense)),
    "dlrm": naive_dlrm,
}


def test_every_registered_model_has_a_reference() -> None:
    missing = set(CTR_MODELS.names()) - set(REFERENCES)
    assert not missing, f"no naive reference for {sorted(missing)}; every registered CTR model needs one"


def build(name: str, num_dense: int, seed: int = 0, **kwargs) -> CtrModel:
    torch.manual_seed(seed)
    return CTR_MODELS.get(name)(FIELDS, num_dense, DIM, hidden=HIDDEN, **kwargs).double().eval()


def sample(num_dense: int, seed: int = 1, width: int = DIM + 1) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(BATCH, FIELDS, width, generator=generator, dtype=torch.float64)
    dense = torch.randn(BATCH, num_dense, generator=generator, dtype=torch.float64)
    return rows.requires_grad_(), dense


@pytest.mark.parametrize("num_dense", [0, 2])
@pytest.mark.parametrize("name", CTR_MODELS.names())
def test_forward_and_gradients_match_naive_reference(name: str, num_dense: int) -> None:
    model = build(name, num_dense, dropout=0.3)  # eval mode: dropout is the identity
    rows, dense = sample(num_dense, width=model.row_width(DIM))  # LR: the linear weight alone
    got = model(rows, dense)
    assert got.shape == (BATCH,)
    expected = torch.stack([REFERENCES[name](model, rows[b], dense[b]) for b in range(BATCH)])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)

    weights = torch.tensor([0.3, -1.2, 0.7], dtype=torch.float64)  # distinct per-example loss weights
    tensors = [rows, *model.parameters()]
    got_grads = torch.autograd.grad((got * weights).sum(), tensors)
    expected_grads = torch.autograd.grad((expected * weights).sum(), tensors, allow_unused=True)
    for got_grad, expected_grad in zip(got_grads, expected_grads):
        expected_grad = torch.zeros_like(got_grad) if expected_grad is None else expected_grad
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", CTR_MODELS.names())
def test_gradients_reach_rows_and_every_dense_parameter(name: str) -> None:
    model = build(name, num_dense=2)
    rows, dense = sample(2, width=model.row_width(DIM))
    labels = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    nn.functional.binary_cross_entropy_with_logits(model(rows, dense), labels).backward()
    assert rows.grad is not None and rows.grad.abs().sum() > 0
    for parameter_name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, parameter_name


@pytest.mark.parametrize("name", CTR_MODELS.names())
def test_initialisation_follows_the_global_seed(name: str) -> None:
    first, second, other = build(name, 2, seed=5), build(name, 2, seed=5), build(name, 2, seed=6)
    for (key, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), key
    assert any(not torch.equal(a, c) for a, c in zip(first.parameters(), other.parameters()) if a.numel() > 1)


def test_deepfm_is_fm_plus_its_deep_tower() -> None:
    deepfm, fm = build("deepfm", 2), build("fm", 2)
    fm.linear.load_state_dict(deepfm.linear.state_dict())
    rows, dense = sample(2)
    torch.testing.assert_close(deepfm(rows, dense), fm(rows, dense) + deepfm.deep(rows[..., :DIM], dense))


def test_dropout_is_active_only_in_training() -> None:
    model = build("wide_deep", 2, dropout=0.5)
    rows, dense = sample(2)
    evaluated = model(rows, dense)
    assert torch.equal(model(rows, dense), evaluated)
    torch.manual_seed(0)
    assert not torch.equal(model.train()(rows, dense), evaluated)


def test_shapes_and_degenerate_configurations_are_rejected() -> None:
    model = build("fm", 2)
    rows, dense = sample(2)
    with pytest.raises(ValueError, match="rows must be"):
        model(rows[..., :DIM], dense)
    with pytest.raises(ValueError, match="dense must be"):
        model(rows, dense[:, :1])
    with pytest.raises(ConfigError, match="dlrm needs"):
        CTR_MODELS.get("dlrm")(1, 0, DIM)
    with pytest.raises(ConfigError):
        CTR_MODELS.get("lr")(0, 0, DIM)


def test_pool_bags_sums_the_present_rows() -> None:
    generator = torch.Generator().manual_seed(2)
    rows = torch.randn(2, 3, 4, DIM + 1, generator=generator)  # [B, Fb, L, dim+1]
    mask = torch.rand(2, 3, 4, generator=generator) > 0.4  # [B, Fb, L]
    pooled = pool_bags(rows, mask)
    assert pooled.shape == (2, 3, DIM + 1)
    for b in range(2):
        for f in range(3):
            expected = sum((rows[b, f, i] for i in range(4) if mask[b, f, i]), torch.zeros(DIM + 1))
            torch.testing.assert_close(pooled[b, f], expected)


def planted_problem(examples=2000, fields=4, values=10, num_dense=2, seed=0):
    """Labels drawn from a planted logistic model: one weight per (field, value), plus dense terms.

    Ten values per field, not fifty: with fifty every example's key tuple is unique and the
    pairwise models, unregularised, memorise the label noise (FM's held-out AUC falls to 0.63-0.70
    while LR's is 0.88); with ten, each pair of values is seen a few times.
    """
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randint(values, (examples, fields), generator=generator) + torch.arange(fields) * values
    dense = torch.randn(examples, num_dense, generator=generator)
    key_weights = torch.randn(fields * values, generator=generator)
    dense_weights = torch.randn(num_dense, generator=generator)
    logits = key_weights[keys].sum(1) + dense @ dense_weights  # [N]
    labels = torch.bernoulli(torch.sigmoid(logits), generator=generator)
    return keys, dense, labels, fields * values


@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and spinning threads slow a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", CTR_MODELS.names())
def test_each_model_learns_a_planted_problem(name: str, one_thread) -> None:
    keys, dense, labels, num_keys = planted_problem()
    train, test = slice(0, 1500), slice(1500, None)
    torch.manual_seed(0)
    dim = 4
    model = CTR_MODELS.get(name)(keys.shape[1], dense.shape[1], dim, hidden=(16,))
    table = nn.Parameter(0.01 * torch.randn(num_keys, model.row_width(dim)))  # stands in for the store's rows
    optimizer = torch.optim.Adam([table, *model.parameters()], lr=0.02)
    for _ in range(150):
        optimizer.zero_grad()
        logits = model(table[keys[train]], dense[train])  # rows [N, F, row width]
        nn.functional.binary_cross_entropy_with_logits(logits, labels[train]).backward()
        optimizer.step()
    with torch.no_grad():
        held_out = auc(model(table[keys[test]], dense[test]), labels[test])
    assert held_out > 0.7, f"{name}: held-out AUC {held_out:.3f}"
