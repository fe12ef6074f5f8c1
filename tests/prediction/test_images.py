"""Classes of an IDX file's images against evaluation: the test file's images classified give
``cadence eval``'s accuracy; each class is the argmax of a forward pass done here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import cadence
from cadence import api
from cadence.data.images import read_idx, write_idx
from cadence.errors import DataError
from cadence.prediction.images import ImagePredictor

pytestmark = pytest.mark.xdist_group("prediction")


def test_the_test_files_classes_give_evaluations_accuracy(image_run: Path, image_data: Path) -> None:
    answer = cadence.load(image_run).classify(image_data / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(image_data / "t10k-labels-idx1-ubyte", 1).tolist()
    assert answer.columns == ("image", "class", "probability")  # (a directory of IDX files names no class)
    assert answer.column("image") == list(range(len(labels)))
    accuracy = sum(int(c == y) for c, y in zip(answer.column("class"), labels)) / len(labels)
    assert accuracy == api.evaluate(image_run, "test")["accuracy"]
    assert len(set(answer.column("class"))) > 1  # (not one class for every image)


def test_each_class_is_the_argmax_of_a_forward_pass(image_run: Path, image_data: Path) -> None:
    _, _, _, dense = api.load_model(image_run)
    dense.eval()
    images = read_idx(image_data / "t10k-images-idx3-ubyte.gz", 3)
    with torch.no_grad():
        chances = torch.softmax(dense(images), dim=1)
    answer = cadence.load(image_run).classify(image_data / "t10k-images-idx3-ubyte.gz")
    assert answer.column("class") == chances.argmax(1).tolist()
    assert answer.column("probability") == pytest.approx(chances.max(1).values.tolist(), rel=1e-6)


def test_named_classes_are_shown(image_run: Path, tmp_path: Path) -> None:
    """(a data set that names its classes, as Fashion-MNIST does)"""
    config, task, view, dense = api.load_model(image_run)
    model = ImagePredictor(config, ("left", "middle", "right"), task.dataset.shape, dense)
    write_idx(tmp_path / "few.idx", task.dataset.test_images[:5].numpy())
    answer = model.classify(tmp_path / "few.idx")
    assert answer.columns == ("image", "class", "name", "probability")
    assert answer.column("name") == [("left", "middle", "right")[label] for label in answer.column("class")]
    assert answer.column("class") == cadence.load(image_run).classify(tmp_path / "few.idx").column("class")


def test_images_of_another_size_are_refused(image_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "wide.idx"
    write_idx(path, np.zeros((3, 12, 13), dtype=np.uint8))
    with pytest.raises(DataError, match=f"^{path}: images of 12 x 13 pixels; the run's model reads 12 x 12"):
        cadence.load(image_run).classify(path)
    write_idx(path, np.zeros(4, dtype=np.uint8))
    with pytest.raises(DataError, match="1 dimensions; expected 3"):
        cadence.load(image_run).classify(path)
