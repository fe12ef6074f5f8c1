"""The matrix-factorisation task against a naive per-rating reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.data.ratings import read_ratings_file
from cadence.errors import ConfigError
from cadence.tasks import TASKS
from tests.conftest import make_config, write_ratings


def naive_sgd(train, users: int, rows: torch.Tensor, mean: float, lr: float, reg: float, plans) -> torch.Tensor:
    """Biased MF, one rating at a time inside each batch (gradients of the batch mean, summed per row)."""
    rows = rows.clone()
    for plan in plans:
        grad = torch.zeros_like(rows)
        size = plan.shape[0]
        for j in plan.tolist():
            u, i, r = int(train.users[j]), int(train.items[j]) + users, float(train.values[j])
            p, q = rows[u], rows[i]
            error = r - (mean + p[-1] + q[-1] + float(p[:-1] @ q[:-1]))
            gp, gq = torch.zeros_like(p), torch.zeros_like(q)
            gp[:-1], gq[:-1] = -2 * error * q[:-1], -2 * error * p[:-1]
            gp[-1] = gq[-1] = -2 * error
            grad[u] += (gp + 2 * reg * p) / size
            grad[i] += (gq + 2 * reg * q) / size
        rows -= lr * grad
    return rows


def test_sync_mf_equals_the_naive_per_rating_reference(tmp_path: Path) -> None:
    path = write_ratings(tmp_path / "r.tsv", 12, 9, 70, 1)
    config = make_config(tmp_path / "run", "task=mf", f"data.dataset={path}", "optimizer.entity=sgd",
                         "optimizer.lr=0.05", "mf.reg=0.1", "model.init_std=0.3", "train.batch_size=16",
                         "eval.every=0", "mf.update=batch")  # (with sgd, auto is Surprise's loop)
    result = api.train(config)
    _, task, view, dense = api.load_model(result.run_dir)
    spec = task.table()
    keys = torch.arange(spec.rows)
    initial = spec.initial_values(keys)
    plans = [p.examples for epoch in range(2) for p in task.plan(epoch)]
    expected = naive_sgd(task.splits["train"], task.dataset.num_users, initial, task.mean, 0.05, 0.1, plans)
    assert torch.allclose(view.values(keys), expected, atol=1e-5)
    assert not torch.allclose(initial, expected)
    assert float(dense.mean) == pytest.approx(float(task.splits["train"].values.double().mean()))


def test_metrics_are_rmse_and_mae_of_clipped_predictions(tmp_path: Path) -> None:
    path = write_ratings(tmp_path / "r.tsv", 12, 9, 70, 1)
    result = api.train(make_config(tmp_path / "run", "task=mf", f"data.dataset={path}"))
    _, task, view, dense = api.load_model(result.run_dir)
    test = task.splits["test"]
    squared = absolute = 0.0
    for u, i, r in zip(test.users.tolist(), test.items.tolist(), test.values.tolist()):
        p, q = view.values(torch.tensor([u]))[0], view.values(torch.tensor([i + task.dataset.num_users]))[0]
        prediction = min(task.high, max(task.low, float(dense.mean + p[-1] + q[-1] + p[:-1] @ q[:-1])))
        squared += (r - prediction) ** 2
        absolute += abs(r - prediction)
    assert result.summary["rmse"] == pytest.approx((squared / len(test)) ** 0.5, rel=1e-5)
    assert result.summary["mae"] == pytest.approx(absolute / len(test), rel=1e-5)


def test_export_writes_factors_biases_and_id_maps(tmp_path: Path) -> None:
    path = write_ratings(tmp_path / "r.tsv", 12, 9, 70, 1)
    result = api.train(make_config(tmp_path / "run", "task=mf", f"data.dataset={path}"))
    api.export(result.run_dir, tmp_path / "out")
    import numpy as np

    dataset = read_ratings_file(path)
    assert np.load(tmp_path / "out" / "user_factors.npy").shape == (dataset.num_users, 8)
    assert np.load(tmp_path / "out" / "item_biases.npy").shape == (dataset.num_items,)
    assert (tmp_path / "out" / "user_ids.tsv").read_text().splitlines()[0].split("\t") == ["0", dataset.user_ids[0]]


def test_the_mf_task_has_one_model(tmp_path: Path) -> None:
    path = write_ratings(tmp_path / "r.tsv", 12, 9, 70, 1)
    with pytest.raises(ConfigError, match="the mf task has one model, biased"):
        api.train(make_config(tmp_path / "run", "task=mf", f"data.dataset={path}", "model.name=complex"))


@pytest.mark.parametrize("kind", ["torch", "compiled"])
def test_the_written_out_gradient_equals_autograd_through_the_formula(kind: str) -> None:
    """Both formulations with their gradient written out: the torch ops (float64 here: exact up
    to rounding) and the compiled kernel (float32, the store's type: to float32's precision)."""
    from cadence import compiled
    from cadence.tasks.mf import BiasedMfLoss, CompiledBiasedMfLoss

    if kind == "compiled" and not compiled.AVAILABLE:
        pytest.skip("numba is not installed")
    function, dtype = {"torch": (BiasedMfLoss, torch.float64), "compiled": (CompiledBiasedMfLoss, torch.float32)}[kind]
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(30, 6, generator=generator, dtype=dtype)
    users = torch.randint(0, 12, (50,), generator=generator)
    items = torch.randint(12, 30, (50,), generator=generator)  # repeats: gradients add up per row
    ratings = torch.randint(1, 6, (50,), generator=generator).to(dtype)
    mean = torch.tensor(3.2, dtype=dtype)

    def plain(rows):
        user, item = rows[users], rows[items]
        error = ratings - (mean + user[:, -1] + item[:, -1] + (user[:, :-1] * item[:, :-1]).sum(1))
        return (error.square() + 0.07 * (user.square().sum(1) + item.square().sum(1))).mean()

    first, second = rows.clone().requires_grad_(True), rows.clone().requires_grad_(True)
    expected, fused = plain(first), function.apply(second, users, items, ratings, mean, 0.07)
    (3.0 * expected).backward()
    (3.0 * fused).backward()
    assert torch.allclose(fused, expected, rtol=1e-5) and torch.allclose(second.grad, first.grad, rtol=1e-5, atol=1e-6)


def test_training_uses_the_compiled_kernel_on_the_cpu_unless_told_not_to(tmp_path: Path) -> None:
    """``train.compiled`` picks the formulation; both train to the same model up to float32 rounding."""
    from cadence import compiled

    if not compiled.AVAILABLE:
        pytest.skip("numba is not installed")
    results = {}
    for flag in ("true", "false"):
        config = make_config(tmp_path / flag, "task=mf", "data.dataset=ml-100k", "model.name=biased", "model.dim=8",
                             "train.epochs=2", "train.batch_size=2048", "optimizer.entity=adagrad",
                             f"train.compiled={flag}")
        task = TASKS.get("mf")(config)
        batch = task.prepare(task.plan(0)[0])
        rows = torch.randn(batch.ids.shape[0], 9, requires_grad=True)
        loss = task.loss(batch, rows, task.dense_module())
        results[flag] = (type(loss.grad_fn).__name__, api.train(config).summary["rmse"])
    assert results["true"][0].startswith("CompiledBiasedMfLoss") and results["false"][0].startswith("BiasedMfLoss")
    assert abs(results["true"][1] - results["false"][1]) < 1e-4


def test_unique_keys_equals_torch_unique() -> None:
    """Every path (the compiled passes, the torch bitmap, the sort) gives torch.unique's integers."""
    from cadence import compiled
    from cadence.core.batch import unique_keys

    for num_keys, size in ((50, 200), (10_000, 20), (3, 1000)):
        keys = torch.randint(0, num_keys, (size,), generator=torch.Generator().manual_seed(num_keys))
        expected_ids, expected_inverse = torch.unique(keys, return_inverse=True)
        ids, inverse = unique_keys(keys, num_keys)
        assert torch.equal(ids, expected_ids) and torch.equal(inverse, expected_inverse)
        ids, inverse = unique_keys(keys.int(), num_keys)  # int32: the torch bitmap
        assert torch.equal(ids, expected_ids) and torch.equal(inverse, expected_inverse)
        if compiled.AVAILABLE:
            ids, inverse = compiled.unique_keys(keys, num_keys)
            assert torch.equal(ids, expected_ids) and torch.equal(inverse, expected_inverse)
    if compiled.AVAILABLE:
        with pytest.raises(IndexError):
            compiled.unique_keys(torch.tensor([0, 5]), 5)


@pytest.mark.parametrize("low, high, size", [(0, 2, 500), (0, 1 << 62, 3000), (-(1 << 62), 1 << 62, 2000),
                                             (0, 50, 0), (7, 8, 1), (0, 1 << 45, 9000)])
def test_distinct_keys_of_any_range_equal_torch_unique(low: int, high: int, size: int) -> None:
    """CTR's feature keys (``field << 40 | value``): the compiled hash kernel, and the torch path
    it replaces, give torch.unique's integers: the sorted distinct keys and each key's place."""
    from cadence import compiled
    from cadence.core.batch import distinct_keys

    keys = torch.randint(low, high, (size,), generator=torch.Generator().manual_seed(size))
    if size > 100:
        keys[size // 2:] = keys[: size - size // 2]  # many repeats, in another order
    expected_ids, expected_inverse = torch.unique(keys, return_inverse=True)
    ids, inverse = distinct_keys(keys)
    assert torch.equal(ids, expected_ids) and torch.equal(inverse, expected_inverse)
    if compiled.AVAILABLE:
        ids, inverse = compiled.unique_any(keys)
        assert torch.equal(ids, expected_ids) and torch.equal(inverse, expected_inverse)
