"""Biased MF's per-rating loop (``mf.update: rating``, Surprise's ``SVD`` step) against independent
references: a training run against a rating-by-rating Python loop in float64, a batch in pieces
against the whole, and the settings that cannot run it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cadence import api, compiled
from cadence.errors import ConfigError
from tests.conftest import make_config, write_ratings

pytestmark = pytest.mark.skipif(not compiled.AVAILABLE, reason="numba is not installed")


def surprise_sgd(train, users: int, rows: torch.Tensor, mean: float, lr: float, reg: float, plans,
                 losses: list[float] | None = None) -> torch.Tensor:
    """Surprise's SVD loop written out: for each rating in order, the error at the current values,
    then the step on the user's and the item's factors (each from the other's values before it)
    and biases; ``losses`` gets each batch's mean of ``e^2 + reg (|u|^2 + |i|^2)``."""
    rows = rows.double().clone()
    for plan in plans:
        total = 0.0
        for j in plan.tolist():
            u, i, r = int(train.users[j]), int(train.items[j]) + users, float(train.values[j])
            p, q = rows[u].clone(), rows[i].clone()
            error = float(r - (mean + p[-1] + q[-1] + float(p[:-1] @ q[:-1])))
            total += error ** 2 + reg * float(p @ p + q @ q)
            rows[u, :-1] += lr * (error * q[:-1] - reg * p[:-1])
            rows[i, :-1] += lr * (error * p[:-1] - reg * q[:-1])
            rows[u, -1] += lr * (error - reg * p[-1])
            rows[i, -1] += lr * (error - reg * q[-1])
        if losses is not None:
            losses.append(total / plan.shape[0])
    return rows


def rating_config(tmp_path: Path, name: str, *overrides: str):
    path = write_ratings(tmp_path / "r.tsv", 12, 9, 70, 1)
    return make_config(tmp_path / name, "task=mf", f"data.dataset={path}", "optimizer.entity=sgd",
                       "optimizer.lr=0.05", "mf.reg=0.1", "model.init_std=0.3", "train.batch_size=16",
                       "eval.every=0", "mf.update=rating", *overrides)


def test_sync_with_rating_updates_equals_surprises_loop(tmp_path: Path) -> None:
    result = api.train(rating_config(tmp_path, "run"))
    _, task, view, dense = api.load_model(result.run_dir)
    spec = task.table()
    keys = torch.arange(spec.rows)
    initial = spec.initial_values(keys)
    plans = [p.examples for epoch in range(2) for p in task.plan(epoch)]
    expected = surprise_sgd(task.splits["train"], task.dataset.num_users, initial, task.mean, 0.05, 0.1, plans)
    assert torch.allclose(view.values(keys).double(), expected, atol=2e-5)
    assert not torch.allclose(initial.double(), expected)
    assert result.summary["in_place_threads"] == 1 and result.summary["train_loss"] > 0


def test_a_batch_in_pieces_is_the_whole_batch_and_the_loss_its_mean(tmp_path: Path) -> None:
    config = rating_config(tmp_path, "x", "train.batch_size=64")
    task = api.TASKS.get("mf")(api.prepare_config(config))
    batch = task.prepare(task.plan(0)[0])
    assert batch.ids.numel() == 0
    spec = task.table()
    whole, pieces = (spec.initial_values(torch.arange(spec.rows)).contiguous() for _ in range(2))
    loss = task.step_in_place(batch, whole, 0, 1)
    parts = [task.step_in_place(batch, pieces, piece, 5) for piece in range(5)]
    assert torch.equal(whole, pieces) and sum(parts) == pytest.approx(loss, rel=1e-12)
    losses: list[float] = []
    surprise_sgd(task.splits["train"], task.dataset.num_users, spec.initial_values(torch.arange(spec.rows)),
                 task.mean, 0.05, 0.1, [batch.plan.examples], losses)
    assert loss == pytest.approx(losses[0], rel=1e-5)


@pytest.mark.parametrize("overrides, message", [
    (["strategy=oac"], "strategy oac does not run such a task"),
    (["strategy=sync", "ps.workers=2"], "none does with ps.workers=2"),
    (["optimizer.entity=adagrad"], "optimizer.entity must be sgd"),
])
def test_rating_updates_under_what_cannot_run_them_is_an_error_naming_the_key(overrides, message,
                                                                            tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mf.update") as raised:
        api.train(rating_config(tmp_path, "x", *overrides))
    assert message in str(raised.value)
    assert not (tmp_path / "x").exists()
