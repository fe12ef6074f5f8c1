"""Tiny trained runs, one per task, trained once per test process (every test module here is in the
xdist group ``prediction``: one worker trains them) and only read by the tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence import api
from tests.conftest import (make_config, random_triples, write_corpus, write_criteo, write_graph, write_images,
                            write_ratings)


def graph(directory: Path) -> Path:
    """``tiny_graph``'s graph: 30 entities, 4 relations, valid and test within train's names."""
    triples = random_triples(30, 4, 260, seed=1)
    train = triples[:220]
    names = {h for h, _, _ in train} | {t for _, _, t in train}
    held = [t for t in triples[220:] if t[0] in names and t[2] in names]
    return write_graph(directory, train, held[: len(held) // 2], held[len(held) // 2:])


def trained(directory: Path, *overrides: str) -> Path:
    return api.train(make_config(directory / "run", *overrides)).run_dir


@pytest.fixture(scope="session")
def kge_data(tmp_path_factory) -> Path:
    return graph(tmp_path_factory.mktemp("graph") / "tiny")


@pytest.fixture(scope="session")
def kge_run(tmp_path_factory, kge_data: Path) -> Path:
    """ComplEx, both sides trained (no reciprocal relations)."""
    return trained(tmp_path_factory.mktemp("kge"), f"data.dataset={kge_data}", "model.name=complex", "model.dim=8")


@pytest.fixture(scope="session")
def kge_reciprocal_run(tmp_path_factory, kge_data: Path) -> Path:
    """DistMult with reciprocal relations: heads are asked of the inverse relation."""
    return trained(tmp_path_factory.mktemp("kge-reciprocal"), f"data.dataset={kge_data}", "model.name=distmult",
                   "train.reciprocal=true")


@pytest.fixture(scope="session")
def w2v_run(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("w2v")
    return trained(directory, "task=w2v", f"data.dataset={write_corpus(directory / 'corpus.txt', 60, 5)}",
                   "w2v.min_count=1", "w2v.sample=0.01", "optimizer.entity=sgd", "optimizer.lr=0.05",
                   "model.init_std=0.03")


@pytest.fixture(scope="session")
def mf_data(tmp_path_factory) -> Path:
    return write_ratings(tmp_path_factory.mktemp("ratings") / "ratings.tsv", 25, 20, 300, 4)


@pytest.fixture(scope="session")
def mf_run(tmp_path_factory, mf_data: Path) -> Path:
    """Rows drawn wide (init_std 1): some predictions leave the rating scale, and are clipped."""
    return trained(tmp_path_factory.mktemp("mf"), "task=mf", f"data.dataset={mf_data}", "model.init_std=1.0")


@pytest.fixture(scope="session")
def ctr_data(tmp_path_factory) -> Path:
    return write_criteo(tmp_path_factory.mktemp("clicks") / "clicks.tsv", 400, 3)


@pytest.fixture(scope="session")
def ctr_run(tmp_path_factory, ctr_data: Path) -> Path:
    """DeepFM with dropout: prediction must run the model as evaluation does (no dropout)."""
    return trained(tmp_path_factory.mktemp("ctr"), "task=ctr", f"data.dataset={ctr_data}", "model.name=deepfm",
                   "model.init_std=0.1", "ctr.hidden=[8]", "ctr.dropout=0.5")


@pytest.fixture(scope="session")
def image_data(tmp_path_factory) -> Path:
    return write_images(tmp_path_factory.mktemp("images") / "images", 240, 60, 5)


@pytest.fixture(scope="session")
def image_run(tmp_path_factory, image_data: Path) -> Path:
    return trained(tmp_path_factory.mktemp("image"), "task=image", f"data.dataset={image_data}",
                   "image.valid_size=40", "image.hidden=[32]", "optimizer.dense=sgd", "optimizer.momentum=0.9",
                   "optimizer.lr=0.05")
