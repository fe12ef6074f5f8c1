"""IDX image files and the Fashion-MNIST package (task: image)."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from cadence.data import fetch as fetching
from cadence.data.images import (FASHION_MNIST, IMAGE_DATASETS, load_image_dataset, read_idx,
                                 read_image_directory, write_idx)
from cadence.errors import ConfigError, DataError
from tests.conftest import write_images


def test_idx_round_trip_gzip_or_not(tmp_path: Path) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    for name in ("a-idx3-ubyte", "b-idx3-ubyte.gz"):
        write_idx(tmp_path / name, array)
        assert torch.equal(read_idx(tmp_path / name, 3), torch.from_numpy(array))
    # the header by hand: magic 0x00000803, sizes big-endian
    assert (tmp_path / "a-idx3-ubyte").read_bytes()[:16] == bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4])


@pytest.mark.parametrize("body, message", [
    (b"\x01\x02\x08\x03", "not an IDX file"),
    (bytes([0, 0, 0x0D, 3]) + b"\0" * 12, "type code 0x0d"),
    (bytes([0, 0, 8, 1, 0, 0, 0, 5]), "1 dimensions; expected 3"),
    (bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2]) + b"\0" * 7, "7 bytes|23 bytes"),
    (b"\x1f\x8b garbage", "not a readable gzip file"),
])
def test_a_malformed_idx_file_is_a_data_error_naming_it(tmp_path: Path, body: bytes, message: str) -> None:
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(body)
    with pytest.raises(DataError, match=message) as caught:
        read_idx(path, 3)
    assert str(path) in str(caught.value)


def test_a_directory_missing_a_file_or_with_mismatched_labels_is_named(tmp_path: Path) -> None:
    directory = write_images(tmp_path / "images", 20, 10, 0)
    (directory / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="no t10k-labels-idx1-ubyte"):
        read_image_directory(directory)
    write_idx(directory / "t10k-labels-idx1-ubyte", np.zeros(9, dtype=np.uint8))
    with pytest.raises(DataError, match="10 images but 9 labels"):
        read_image_directory(directory)


def test_an_unknown_data_set_name_suggests_one() -> None:
    with pytest.raises(ConfigError, match="did you mean 'fashion-mnist'"):
        load_image_dataset("fashion-mnst")


def test_fashion_mnist_from_the_debian_package(tmp_path: Path, monkeypatch) -> None:
    """The real data: 60,000 + 10,000 28x28 images, 10 balanced classes, from the pinned .deb (the
    cached download is reused; a fresh cache fetches it with apt-get)."""
    cached = fetching.cadence_home() / "downloads" / FASHION_MNIST.filename
    monkeypatch.setenv("CADENCE_HOME", str(tmp_path))
    if cached.is_file():  # reuse the session's download (it is checked against the pin again)
        (tmp_path / "downloads").mkdir()
        (tmp_path / "downloads" / FASHION_MNIST.filename).symlink_to(cached)
    data = IMAGE_DATASETS.get("fashion-mnist").load()
    assert data.train_images.shape == (60000, 28, 28) and data.test_images.shape == (10000, 28, 28)
    assert data.train_images.dtype == torch.uint8
    assert data.train_labels.bincount().tolist() == [6000] * 10
    assert data.test_labels.bincount().tolist() == [1000] * 10
    assert data.classes[0] == "T-shirt/top" and data.classes[9] == "Ankle boot"
    deb = tmp_path / "downloads" / FASHION_MNIST.filename
    assert hashlib.sha256(deb.read_bytes()).hexdigest() == FASHION_MNIST.sha256
    published = sorted(p.name for p in (tmp_path / "datasets" / "fashion-mnist").iterdir())
    assert published == sorted(["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"])
    # the first training label of Fashion-MNIST is 9 (ankle boot), its first test label too
    assert int(data.train_labels[0]) == 9 and int(data.test_labels[0]) == 9
    assert gzip.decompress((tmp_path / "datasets" / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes())[8] == 9
