"""The matrix-factorisation task against a naive per-rating reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.data.ratings import read_ratings_file
from cadence.errors import ConfigError
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
                         "eval.every=0")
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


def test_the_written_out_gradient_equals_autograd_through_the_formula() -> None:
    from cadence.tasks.mf import BiasedMfLoss

    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(30, 6, generator=generator, dtype=torch.float64)
    users = torch.randint(0, 12, (50,), generator=generator)
    items = torch.randint(12, 30, (50,), generator=generator)  # repeats: gradients add up per row
    ratings = torch.randint(1, 6, (50,), generator=generator).double()
    mean = torch.tensor(3.2, dtype=torch.float64)

    def plain(rows):
        user, item = rows[users], rows[items]
        error = ratings - (mean + user[:, -1] + item[:, -1] + (user[:, :-1] * item[:, :-1]).sum(1))
        return (error.square() + 0.07 * (user.square().sum(1) + item.square().sum(1))).mean()

    first, second = rows.clone().requires_grad_(True), rows.clone().requires_grad_(True)
    expected, fused = plain(first), BiasedMfLoss.apply(second, users, items, ratings, mean, 0.07)
    (3.0 * expected).backward()
    (3.0 * fused).backward()
    assert torch.allclose(fused, expected) and torch.allclose(second.grad, first.grad)


def test_unique_keys_equals_torch_unique() -> None:
    from cadence.core.batch import unique_keys

    for num_keys, size in ((50, 200), (10_000, 20)):
        keys = torch.randint(0, num_keys, (size,), generator=torch.Generator().manual_seed(num_keys))
        ids, inverse = unique_keys(keys, num_keys)
        expected_ids, expected_inverse = torch.unique(keys, return_inverse=True)
        assert torch.equal(ids, expected_ids) and torch.equal(inverse, expected_inverse)
