"""Shared fixtures: tiny graphs written to disk, real datasets fetched once per session."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cadence.config import Config, load_config


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


def make_config(out: Path | None, *overrides: str) -> Config:
    base = ["progress=false", "train.epochs=2", "train.batch_size=32", "train.negatives=8",
            "model.dim=8", "threads=1"]
    config = load_config(None, base + list(overrides))
    config.out = None if out is None else str(out)
    return config


@pytest.fixture(scope="session")
def umls_dir() -> Path:
    from cadence.data.datasets import DATASETS

    return DATASETS.get("umls").fetch()
