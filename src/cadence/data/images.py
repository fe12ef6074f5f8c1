"""Image classification data (``task: image``): IDX files, as MNIST and Fashion-MNIST ship them.

- ``fashion-mnist``: Zalando's Fashion-MNIST (70,000 28x28 grey images of 10 kinds of clothing;
  60,000 train, 10,000 test) from Debian's ``dataset-fashion-mnist`` package, fetched with
  ``apt-get download`` (never installed), sha256 pinned, its four ``.gz`` files unpacked in Python
  into ``$CADENCE_HOME/datasets/fashion-mnist/``.
- a directory path holding ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
  ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each optionally ``.gz``): any IDX
  data set (MNIST, KMNIST, a user's own).

An IDX file is a big-endian header (two zero bytes, a type code: 0x08 for unsigned bytes, the
number of dimensions) followed by one 32-bit size per dimension and the data.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from cadence.data import fetch as fetching
from cadence.data.fetch import DebianPackage, debian_members
from cadence.errors import DataError
from cadence.registry import Registry

FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

FASHION_MNIST = DebianPackage("dataset-fashion-mnist", "0.0~git20200523.55506a9-1",
                              "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0")
FASHION_MNIST_DIR = "usr/share/datasets/fashion-mnist/"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                         "Bag", "Ankle boot")


@dataclass(frozen=True)
class ImageDataset:
    name: str
    train_images: Tensor  # [N, H, W] uint8
    train_labels: Tensor  # [N] int64
    test_images: Tensor
    test_labels: Tensor
    classes: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.train_images.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def read_idx(path: Path, dims: int) -> Tensor:
    """The unsigned-byte array of an IDX file (gzip-compressed or not) with ``dims`` dimensions."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError("file not found", path) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise DataError(f"not a readable gzip file ({err})", path) from None
    if len(raw) < 4 or raw[:2] != b"\0\0":
        raise DataError("not an IDX file (the first two bytes must be zero)", path)
    kind, count = raw[2], raw[3]
    if kind != 0x08:
        raise DataError(f"IDX type code 0x{kind:02x}; only unsigned bytes (0x08) are supported", path)
    if count != dims:
        raise DataError(f"{count} dimensions; expected {dims}", path)
    if len(raw) < 4 + 4 * dims:
        raise DataError("truncated IDX header", path)
    sizes = struct.unpack(f">{dims}I", raw[4:4 + 4 * dims])
    expected = 4 + 4 * dims + int(np.prod(sizes))
    if len(raw) != expected:
        raise DataError(f"{len(raw)} bytes; the header's sizes {list(sizes)} need {expected}", path)
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(sizes)
    return torch.from_numpy(data.copy())


def _find(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise DataError(f"no {stem} (or {stem}.gz) in this directory", directory)


def read_image_directory(directory: Path, name: str | None = None,
                         classes: tuple[str, ...] | None = None) -> ImageDataset:
    if not directory.is_dir():
        raise DataError("not a directory of IDX files", directory)
    arrays: dict[str, tuple[Tensor, Tensor]] = {}
    for split, (images_stem, labels_stem) in FILES.items():
        images_path, labels_path = _find(directory, images_stem), _find(directory, labels_stem)
        images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
        if images.shape[0] != labels.shape[0]:
            raise DataError(f"{images.shape[0]} images but {labels.shape[0]} labels in {labels_path.name}",
                            images_path)
        arrays[split] = (images, labels.long())
    if arrays["train"][0].shape[1:] != arrays["test"][0].shape[1:]:
        raise DataError(f"test images are {tuple(arrays['test'][0].shape[1:])}, train images "
                        f"{tuple(arrays['train'][0].shape[1:])}", directory)
    if not arrays["train"][0].shape[0]:
        raise DataError("the training images are empty", directory)
    labels = torch.cat([arrays["train"][1], arrays["test"][1]])
    count = int(labels.max()) + 1
    if classes is None or len(classes) < count:
        classes = tuple(str(label) for label in range(count))
    return ImageDataset(name or directory.name, *arrays["train"], *arrays["test"], classes)


@dataclass(frozen=True)
class ImageSource:
    name: str
    description: str
    package: DebianPackage
    directory: str  # where the IDX files lie in the package
    classes: tuple[str, ...]

    @property
    def source(self) -> str:
        return f"Debian {self.package.name}={self.package.version} (sha256 {self.package.sha256[:12]}...)"

    def stems(self) -> list[str]:
        return [stem + ".gz" for pair in FILES.values() for stem in pair]

    def fetch(self) -> Path:
        wanted = [self.directory + stem for stem in self.stems()]

        def write(staging: Path) -> None:
            for path, body in debian_members(self.package, wanted).items():
                (staging / Path(path).name).write_bytes(body)

        return fetching.publish(self.name, write, self.is_fetched)

    def is_fetched(self) -> bool:
        return all((fetching.dataset_dir(self.name) / stem).is_file() for stem in self.stems())

    def load(self) -> ImageDataset:
        return read_image_directory(self.fetch(), self.name, self.classes)


IMAGE_DATASETS: Registry[ImageSource] = Registry("image dataset", "data.dataset")
IMAGE_DATASETS.register("fashion-mnist")(ImageSource(
    "fashion-mnist", "Fashion-MNIST: 60k train + 10k test 28x28 grey images, 10 classes",
    FASHION_MNIST, FASHION_MNIST_DIR, FASHION_MNIST_CLASSES))


def load_image_dataset(name_or_path: str) -> ImageDataset:
    """A registered data set, or a user's directory of IDX files."""
    if name_or_path in IMAGE_DATASETS:
        return IMAGE_DATASETS.get(name_or_path).load()
    path = Path(name_or_path).expanduser()
    if path.is_dir() or "/" in name_or_path or name_or_path.startswith("."):
        return read_image_directory(path)
    IMAGE_DATASETS.get(name_or_path)  # raises with the list of names and a close match
    raise AssertionError("unreachable")


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write ``array`` (uint8) as an IDX file (gzip when ``path`` ends in ``.gz``): tests, and users
    converting their own images."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    body = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(body) if path.suffix == ".gz" else body)
