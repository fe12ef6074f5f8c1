"""Recommendations and ratings against numpy over the exported factors and biases: a user's top items
leave out the items they rated in training and are every other item's rating sorted; a predicted
rating is evaluation's (the RMSE of the test split's predictions is ``cadence eval``'s)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cadence
from cadence import api
from cadence.errors import QueryError

pytestmark = pytest.mark.xdist_group("prediction")


class Factors:
    """The exported model: rating(u, i) = mu + b_u + b_i + <p_u, q_i>, clipped to the training range."""

    def __init__(self, run: Path, out: Path):
        api.export(run, out, "npy")
        load = lambda name: np.load(out / f"{name}.npy").astype(np.float64)  # noqa: E731
        self.p, self.bu, self.q, self.bi, self.mu = (load(name) for name in ("user_factors", "user_biases",
                                                                               "item_factors", "item_biases",
                                                                               "global_mean"))
        self.users = [line.split("\t")[1] for line in (out / "user_ids.tsv").read_text().splitlines()]
        self.items = [line.split("\t")[1] for line in (out / "item_ids.tsv").read_text().splitlines()]

    def scores(self, user: str) -> np.ndarray:
        u = self.users.index(user)
        return self.mu + self.bu[u] + self.bi + self.q @ self.p[u]


@pytest.fixture(scope="module")
def factors(mf_run: Path, tmp_path_factory) -> Factors:
    return Factors(mf_run, tmp_path_factory.mktemp("mf-export"))


@pytest.fixture(scope="module")
def task(mf_run: Path):
    return api.load_model(mf_run)[1]


def rated_in_training(task, user: str) -> set[str]:
    train, data = task.splits["train"], task.dataset
    return {data.item_ids[i] for u, i in zip(train.users.tolist(), train.items.tolist()) if data.user_ids[u] == user}


@pytest.mark.parametrize("top", [1, 5, 20])
def test_top_items_are_the_unrated_items_by_rating(mf_run: Path, factors: Factors, task, top: int) -> None:
    model = cadence.load(mf_run)
    low, high = float(task.splits["train"].values.min()), float(task.splits["train"].values.max())
    for user in ("u0", "u3", "u17"):
        rated = rated_in_training(task, user)
        assert rated, f"{user} rated nothing in training"
        scores = factors.scores(user)
        order = [i for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)) if factors.items[i] not in rated]
        answer = model.top_items(user, top=top)
        assert answer.columns == ("item", "rating", "score")
        assert answer.column("item") == [factors.items[i] for i in order[:top]]
        assert answer.column("score") == pytest.approx([scores[i] for i in order[:top]], abs=1e-5)
        assert answer.column("rating") == pytest.approx([min(max(scores[i], low), high) for i in order[:top]],
                                                        abs=1e-5)
        assert not set(answer.column("item")) & rated
        model.block_rows = 3  # a block of rows at a time: the same answer
        assert model.top_items(user, top=top).column("item") == answer.column("item")
        model.block_rows = 10_000


def test_a_rating_is_the_one_evaluation_predicts(mf_run: Path, factors: Factors, task) -> None:
    model = cadence.load(mf_run)
    test, data = task.splits["test"], task.dataset
    low, high = float(task.splits["train"].values.min()), float(task.splits["train"].values.max())
    squared = 0.0
    for u, i, r in zip(test.users.tolist(), test.items.tolist(), test.values.tolist()):
        predicted = model.rating(data.user_ids[u], data.item_ids[i])
        assert predicted == pytest.approx(min(max(factors.scores(data.user_ids[u])[i], low), high), abs=1e-5)
        squared += (r - predicted) ** 2
    assert (squared / len(test)) ** 0.5 == pytest.approx(api.evaluate(mf_run, "test")["rmse"], rel=1e-6)
    everything = {model.rating(user, item) for user in factors.users[:5] for item in factors.items}
    assert low in everything and high in everything  # (clipping is exercised)


def test_unknown_users_and_items_are_named(mf_run: Path) -> None:
    model = cadence.load(mf_run)
    assert model.kinds == ("users", "items") and "u0" in model.names("users")
    with pytest.raises(QueryError, match="unknown user 'nobody'"):
        model.top_items("nobody")
    with pytest.raises(QueryError, match="unknown item 'i99'"):
        model.rating("u0", "i99")
