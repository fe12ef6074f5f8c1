"""Click probabilities of a file in the training data's format against evaluation: the test split's
own lines, written to a file and predicted, give ``cadence eval``'s AUC and logloss; without their
label column, the same probabilities."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import cadence
from cadence import api
from cadence.data import fetch as fetching
from cadence.data.ctr import CtrDataset, CtrExamples, rows_reader
from cadence.data.movielens import SOURCE
from cadence.errors import DataError, QueryError
from tests.conftest import make_config

pytestmark = pytest.mark.xdist_group("prediction")


def split_positions(count: int, run: Path, split: str) -> list[int]:
    """The positions in ``split`` of a run's ``count`` examples: the library's own split of examples
    tagged with their position (in their timestamps, which a split carries along)."""
    nothing = torch.zeros(count, 0, dtype=torch.int64)
    tagged = CtrDataset("tagged", [], [], [], CtrExamples(nothing, nothing.unsqueeze(2), nothing.float(),
                                                          torch.zeros(count), torch.arange(count)))
    parts = dict(zip(("train", "valid", "test"), tagged.random_split(cadence.load_config(run / "config.yaml").seed)))
    return parts[split].timestamps.tolist()


def split_lines(data: Path, run: Path, split: str) -> list[str]:
    """The lines of ``data`` (one example each) in ``split``."""
    lines = data.read_text().splitlines()
    return [lines[i] for i in split_positions(len(lines), run, split)]


def mann_whitney(probabilities: list[float], labels: list[int]) -> float:
    """AUC: the share of (positive, negative) pairs ordered right, a tie counting half."""
    positive = [p for p, y in zip(probabilities, labels) if y == 1]
    negative = [p for p, y in zip(probabilities, labels) if y == 0]
    pairs = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in positive for q in negative)
    return pairs / (len(positive) * len(negative))


@pytest.mark.parametrize("split", ["valid", "test"])
def test_a_splits_lines_predicted_give_evaluations_auc(ctr_run: Path, ctr_data: Path, tmp_path: Path,
                                                       split: str) -> None:
    lines = split_lines(ctr_data, ctr_run, split)
    path = tmp_path / "asked.tsv"
    path.write_text("\n".join(lines) + "\n")
    answer = cadence.load(ctr_run).clicks(path)
    assert answer.columns == ("line", "probability", "label")
    assert answer.column("line") == list(range(1, len(lines) + 1))
    labels = answer.column("label")
    assert labels == [int(line.split("\t")[0]) for line in lines]
    probabilities = answer.column("probability")
    metrics = api.evaluate(ctr_run, split)
    assert mann_whitney(probabilities, labels) == pytest.approx(metrics["auc"], abs=1e-12)
    loss = -sum(math.log(p) if y else math.log(1 - p) for p, y in zip(probabilities, labels)) / len(labels)
    assert loss == pytest.approx(metrics["logloss"], rel=1e-5)
    # the same rows without their label column: the same probabilities
    path.write_text("\n".join(line.split("\t", 1)[1] for line in lines) + "\n")
    unlabelled = cadence.load(ctr_run).clicks(path)
    assert unlabelled.columns == ("line", "probability")
    assert unlabelled.column("probability") == probabilities


def test_a_line_of_the_other_layout_is_named(ctr_run: Path, ctr_data: Path, tmp_path: Path) -> None:
    first, second = ctr_data.read_text().splitlines()[:2]
    path = tmp_path / "asked.tsv"
    path.write_text(f"{first}\n\n{second.split(chr(9), 1)[1]}\n")
    with pytest.raises(DataError, match=f"^{path}:3: expected 40 tab-separated columns \\(label, I1-I13, C1-C26\\), "
                                        "found 39"):
        cadence.load(ctr_run).clicks(path)
    path.write_text(f"{first.split(chr(9), 1)[1]}\n{first}\n")
    with pytest.raises(DataError, match=f"^{path}:2: expected 39 tab-separated columns \\(I1-I13, C1-C26\\), found 40"):
        cadence.load(ctr_run).clicks(path)


def test_a_generated_data_set_has_no_file_format() -> None:
    with pytest.raises(QueryError, match="synthetic-ctr data set is generated"):
        rows_reader("synthetic-ctr")


@pytest.fixture(scope="module")
def movielens_run(tmp_path_factory) -> Path:
    """Logistic regression on MovieLens-100k (its rows are RecBole interactions joined with its user
    and item files): one epoch of large batches."""
    return api.train(make_config(tmp_path_factory.mktemp("ml-100k") / "run", "task=ctr", "data.dataset=ml-100k",
                                 "model.name=lr", "train.epochs=1", "train.batch_size=2048", "eval.every=0",
                                 "eval.test=false")).run_dir


def test_movielens_interactions_predicted_give_evaluations_auc(movielens_run: Path, tmp_path: Path) -> None:
    """A run on ml-100k reads rows to predict in its .inter format, with or without ratings (the label)."""
    inter = fetching.fetch("ml-100k", SOURCE) / "ml-100k.inter"
    header, *rows = inter.read_text().splitlines()
    lines = [rows[i] for i in split_positions(len(rows), movielens_run, "test")]
    path = tmp_path / "asked.inter"
    path.write_text("\n".join([header, *lines]) + "\n")
    model = cadence.load(movielens_run)
    answer = model.clicks(path)
    assert answer.column("line") == list(range(2, len(lines) + 2))
    labels = answer.column("label")
    assert labels == [int(float(line.split("\t")[2]) >= 4) for line in lines]
    assert mann_whitney(answer.column("probability"), labels) == \
        pytest.approx(api.evaluate(movielens_run, "test")["auc"], abs=1e-12)
    path.write_text("\n".join(["user_id:token\titem_id:token", *("\t".join(line.split("\t")[:2]) for line in lines)])
                    + "\n")
    unlabelled = model.clicks(path)
    assert unlabelled.columns == ("line", "probability")
    assert unlabelled.column("probability") == answer.column("probability")
    path.write_text("user_id:token\titem_id:token\n1\t1\n9999\t1\n")
    with pytest.raises(DataError, match=f"^{path}:3: user '9999' is not in ml-100k.user"):
        model.clicks(path)
