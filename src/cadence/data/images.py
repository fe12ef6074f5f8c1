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
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from cadence.data import fetch as fetching
from cadence.data.fetch import DebianPackage, debian_members
from cadence.errors import DataError
from cadence.resources import available_memory, gib
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
    """The unsigned-byte array of an IDX file (gzip-compressed or not) with ``dims`` dimensions. The
    header is read first: sizes of zero, and sizes that would need more memory than this process may
    take (a decompression bomb claims them), are refused before anything else is read."""
    try:
        with path.open("rb") as raw:
            compressed = raw.read(2) == b"\x1f\x8b"
    except FileNotFoundError:
        raise DataError("file not found", path) from None
    except OSError as err:
        raise DataError(f"cannot read it ({err.strerror})", path) from None
    try:
        with (gzip.open(path, "rb") if compressed else path.open("rb")) as stream:
            return _read_idx_stream(stream, path, dims)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"not a readable {'gzip ' if compressed else ''}file ({err})", path) from None


def _read_idx_stream(stream, path: Path, dims: int) -> Tensor:
    head = stream.read(4)
    if len(head) < 4 or head[:2] != b"\0\0":
        raise DataError("not an IDX file (the first two bytes must be zero)", path)
    kind, count = head[2], head[3]
    if kind != 0x08:
        raise DataError(f"IDX type code 0x{kind:02x}; only unsigned bytes (0x08) are supported", path)
    if count != dims:
        raise DataError(f"{count} dimensions; expected {dims}", path)
    header = stream.read(4 * dims)
    if len(header) < 4 * dims:
        raise DataError("truncated IDX header", path)
    sizes = struct.unpack(f">{dims}I", header)
    if dims > 1 and 0 in sizes[1:]:
        raise DataError(f"images of {' x '.join(map(str, sizes[1:]))} pixels (each side must be at least 1)", path)
    needed = math.prod(sizes)  # (exact: a Python int)
    check_room(f"the header's sizes {list(sizes)}", needed, path)
    data = stream.read(needed)
    if len(data) < needed:
        raise DataError(f"{4 + 4 * dims + len(data)} bytes; the header's sizes {list(sizes)} need "
                        f"{4 + 4 * dims + needed}", path)
    if stream.read(1):
        raise DataError(f"more bytes than the header's sizes {list(sizes)} need ({4 + 4 * dims + needed})", path)
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).reshape(sizes).copy())


def check_room(what: str, needed: int, path: Path) -> None:
    """A ``DataError`` naming ``path`` when ``needed`` bytes (twice: read, then copied) are more than
    this process may take."""
    room = available_memory()
    if 2 * needed > room:
        raise DataError(f"{what} need {gib(2 * needed)} to read; this machine has {gib(room)} available", path)


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
    for split, (images_stem, _) in FILES.items():  # (no metric is made up from an empty split)
        if not arrays[split][0].shape[0]:
            raise DataError(f"no images in it: the {'training' if split == 'train' else split} split is empty",
                            _find(directory, images_stem))
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
