"""Shared fixtures: tiny graphs written to disk, real datasets fetched once per session."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

# Triton's kernels (cadence.kernels) run on CPU tensors in its interpreter where there is no CUDA
# device: the mode is read when Triton is first imported, so it is set before anything imports it
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cadence.config import Config, load_config  # noqa: E402

# A CUDA test: skipped where there is no CUDA device; `make gpu-check` runs exactly these (`-m cuda`).
CUDA_MARKS = (pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))


def needs_cuda(test):
    """Decorate a CUDA test with ``CUDA_MARKS`` (for one parameter: ``pytest.param(..., marks=CUDA_MARKS)``)."""
    for mark in CUDA_MARKS:
        test = mark(test)
    return test


def write_graph(directory: Path, train: list[tuple], valid: list[tuple], test: list[tuple]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("valid", valid), ("test", test)):
        (directory / f"{name}.txt").write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))
    return directory


def random_triples(num_entities: int, num_relations: int, count: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    seen: set[tuple] = set()
    while len(seen) < count:
        seen.add((f"e{rng.randrange(num_entities)}", f"r{rng.randrange(num_relations)}",
                  f"e{rng.randrange(num_entities)}"))
    return sorted(seen)


@pytest.fixture
def tiny_graph(tmp_path: Path) -> Path:
    """A 30-entity, 4-relation graph whose valid/test only use entities seen in train."""
    triples = random_triples(30, 4, 260, seed=1)
    train = triples[:220]
    names = {h for h, _, _ in train} | {t for _, _, t in train}
    relations = {r for _, r, _ in train}
    held = [t for t in triples[220:] if t[0] in names and t[2] in names and t[1] in relations]
    return write_graph(tmp_path / "tiny", train, held[: len(held) // 2], held[len(held) // 2:])


def foreground(mode: str, *settings: str) -> list[str]:
    """``settings`` where ``mode`` is a foreground ShadowSync strategy (``fr-*``, the one that reads
    ``shadow.every`` and ``shadow.fr_sync``); none elsewhere (a key nothing reads is an error)."""
    return list(settings) if mode.startswith("fr-") else []


def make_config(out: Path | None, *overrides: str) -> Config:
    base = ["progress=false", "train.epochs=2", "train.batch_size=32", "model.dim=8", "threads=1"]
    if not any(item.startswith("task=") and item != "task=kge" for item in overrides):
        base.append("train.negatives=8")
    config = load_config(None, base + list(overrides))
    config.out = None if out is None else str(out)
    return config


@pytest.fixture(scope="session")
def umls_dir() -> Path:
    from cadence.data.datasets import DATASETS

    return DATASETS.get("umls").fetch()


def write_criteo(path: Path, rows: int, seed: int) -> Path:
    """A tiny Criteo-format TSV file whose label depends on two categorical columns; a tail of rare
    values leaves some keys of valid and test unseen in training."""
    rng = random.Random(seed)
    lines = []
    for _ in range(rows):
        cats = [f"{rng.randrange(6) if rng.random() < 0.9 else rng.randrange(6, 1000):08x}" for _ in range(26)]
        label = int((int(cats[0], 16) + int(cats[1], 16)) % 3 == 0) if rng.random() < 0.9 else rng.randrange(2)
        ints = [str(rng.randrange(20)) if rng.random() < 0.8 else "" for _ in range(13)]
        lines.append("\t".join([str(label), *ints, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_ratings(path: Path, users: int, items: int, count: int, seed: int) -> Path:
    """A tiny ratings file (user, item, rating) from a planted rank-1 model."""
    rng = random.Random(seed)
    taste = [rng.uniform(-1, 1) for _ in range(users)]
    kind = [rng.uniform(-1, 1) for _ in range(items)]
    cells = set()
    while len(cells) < count:
        cells.add((rng.randrange(users), rng.randrange(items)))
    lines = [f"u{u}\ti{i}\t{min(5, max(1, round(3 + 2 * taste[u] * kind[i] + rng.gauss(0, 0.3))))}"
             for u, i in sorted(cells)]
    path.write_text("\n".join(lines) + "\n")
    return path


# words of WordSim353 and SimLex-999 pairs, so a tiny corpus still has pairs to correlate
TINY_WORDS = ("tiger cat dog car automobile money cash bank king queen computer keyboard coast shore "
              "journey voyage boy lad food fruit bird cock doctor nurse professor student street avenue").split()


def write_corpus(path: Path, sentences: int, seed: int) -> Path:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(TINY_WORDS[: 2 * rng.randrange(1, len(TINY_WORDS) // 2)]) for _ in range(12))
             for _ in range(sentences)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_images(directory: Path, train: int, test: int, seed: int, side: int = 12, classes: int = 3) -> Path:
    """Tiny IDX image files (``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``): noise plus a
    bright band whose position is the class."""
    import numpy as np

    from cadence.data.images import write_idx

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    band = side // classes
    for split, count in (("train", train), ("t10k", test)):
        labels = rng.integers(0, classes, count)
        images = (rng.random((count, side, side)) * 100).astype(np.uint8)
        for label in range(classes):
            images[labels == label, label * band:(label + 1) * band, :] += 120
        write_idx(directory / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(directory / f"{split}-labels-idx1-ubyte", labels)
    return directory


@pytest.fixture
def task_data(tmp_path: Path, tiny_graph: Path) -> dict[str, list[str]]:
    """Config overrides that train each task on tiny data in a few seconds."""
    return {
        "kge": [f"data.dataset={tiny_graph}"],
        "ctr": ["task=ctr", f"data.dataset={write_criteo(tmp_path / 'clicks.tsv', 400, 3)}", "model.name=fm",
                "model.init_std=0.1"],
        "mf": ["task=mf", f"data.dataset={write_ratings(tmp_path / 'ratings.tsv', 25, 20, 300, 4)}",
               "model.init_std=0.1"],
        "w2v": ["task=w2v", f"data.dataset={write_corpus(tmp_path / 'corpus.txt', 60, 5)}", "w2v.min_count=1",
                "w2v.sample=0.01", "optimizer.entity=sgd", "optimizer.lr=0.05", "model.init_std=0.03",
                # the batch path, which every strategy runs (the default, auto, is word2vec's own loop
                # under sync and async: tests/tasks/test_update_choice.py)
                "w2v.update=batch"],
        "image": ["task=image", f"data.dataset={write_images(tmp_path / 'images', 240, 60, 5)}", "image.valid_size=40",
                  "image.hidden=[32]", "optimizer.dense=sgd", "optimizer.momentum=0.9", "optimizer.lr=0.05"],
    }
