"""The dataset registry on real package-shipped data, the fetcher, and the synthetic generator."""

import dataclasses
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from cadence.config import DataConfig, SyntheticGraphConfig
from cadence.data import fetch as fetching
from cadence.data.datasets import load_graph
from cadence.data.synthetic import community_pairs, entity_communities, power_law_graph
from cadence.errors import ConfigError, FetchError


@pytest.mark.parametrize("name, sizes, entities, relations", [
    ("umls", (5216, 652, 661), 135, 46),
    ("kinships", (8544, 1068, 1074), 104, 25),
    ("nations", (1592, 199, 201), 14, 55),
])
def test_benchmark_graphs_load_from_the_pykeen_wheel(name, sizes, entities, relations) -> None:
    graph = load_graph(DataConfig(dataset=name, strict=True), seed=0)
    assert (graph.train.shape[0], graph.valid.shape[0], graph.test.shape[0]) == sizes
    assert (graph.num_entities, graph.num_relations) == (entities, relations)


def test_fetch_checks_the_pinned_sha256(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_HOME", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fake = elsewhere / "pykeen-1.11.1-py3-none-any.whl"
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr("pykeen/datasets/umls/train.txt", "a\tb\tc\n")
    source = fetching.WheelSource("pykeen", "1.11.1", "0" * 64, {"pykeen/datasets/umls/train.txt": "train.txt"})
    monkeypatch.setattr(fetching, "_download_via_pip", lambda source, scratch: fake.replace(Path(scratch) / fake.name))
    with pytest.raises(FetchError, match="does not match the pinned"):
        fetching.fetch("umls", source)
    assert not (tmp_path / "datasets" / "umls").exists()  # nothing half-written


def test_two_fetches_of_one_dataset_at_once_take_turns_and_write_it_once(tmp_path: Path, monkeypatch) -> None:
    """Two runs started at once on a fresh machine (or two test workers) fetch the same dataset: the
    second waits for the first and finds it there, rather than deleting the copy the first reads."""
    import threading

    monkeypatch.setenv("CADENCE_HOME", str(tmp_path))
    target = fetching.dataset_dir("shared")
    writing, release, writes, results = threading.Event(), threading.Event(), [], []

    def write(label: str, wait: bool):
        def fill(staging: Path) -> None:
            writes.append(label)
            if wait:
                writing.set()
                release.wait(10)
            (staging / "data.txt").write_text(label)
        return fill

    def fetched() -> bool:
        return (target / "data.txt").is_file()

    first = threading.Thread(target=lambda: results.append(fetching.publish("shared", write("first", True), fetched)))
    first.start()
    assert writing.wait(10)
    second = threading.Thread(target=lambda: results.append(fetching.publish("shared", write("second", False), fetched)))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second fetch went ahead while the first was writing"
    release.set()
    first.join(10)
    second.join(10)
    assert writes == ["first"] and results == [target, target] and (target / "data.txt").read_text() == "first"
    assert fetching.publish("shared", write("third", False), fetched) == target and writes == ["first"]


def test_unknown_dataset_suggests_a_name() -> None:
    with pytest.raises(ConfigError, match=r"unknown dataset 'umsl' \(did you mean 'umls'\?\)"):
        load_graph(DataConfig(dataset="umsl"), seed=0)


def test_user_directory_dataset(tiny_graph: Path) -> None:
    graph = load_graph(DataConfig(dataset=str(tiny_graph)), seed=0)
    assert graph.name == "tiny" and graph.train.shape[0] == 220


def test_synthetic_graph_is_seeded_and_skewed() -> None:
    config = SyntheticGraphConfig(num_entities=5000, num_relations=7, num_edges=50_000, exponent=1.1, holdout=100)
    first, second = power_law_graph(config, seed=3), power_law_graph(config, seed=3)
    assert torch.equal(first.train, second.train) and torch.equal(first.test, second.test)
    assert not torch.equal(first.train, power_law_graph(config, seed=4).train)
    assert first.train.shape == (49_800, 3) and first.valid.shape == (100, 3)
    assert int(first.train[:, [0, 2]].max()) < 5000 and int(first.train[:, 1].max()) < 7
    degree = torch.bincount(first.train[:, [0, 2]].flatten(), minlength=5000).sort(descending=True).values
    top_share = degree[:50].sum() / degree.sum()  # 1% of the entities
    assert top_share > 0.2, "a power law concentrates edges on few entities"


@pytest.mark.parametrize("count", [10, 7])
def test_synthetic_communities_join_each_head_community_to_the_one_its_relation_pairs(count: int) -> None:
    plain = SyntheticGraphConfig(num_entities=5000, num_relations=5, num_edges=40_000, exponent=1.1, holdout=100)
    config = dataclasses.replace(plain, communities=count)
    graph, independent = power_law_graph(config, seed=2), power_law_graph(plain, seed=2)
    pairs = community_pairs(count, 5, seed=2)
    assert (pairs[np.arange(5)[:, None], pairs] == np.arange(count)).all(), "each relation's pairing is its own inverse"
    assert (pairs != np.arange(count)).sum(1).tolist() == [count - count % 2] * 5  # only an odd one out stays
    of = torch.from_numpy(entity_communities(config, seed=2))
    assert torch.bincount(of).tolist() == [len(range(c, 5000, count)) for c in range(count)]
    for mine, theirs in ((graph.train, independent.train), (graph.valid, independent.valid),
                         (graph.test, independent.test)):
        h, r, t = mine.unbind(1)
        assert torch.equal(of[t], torch.from_numpy(pairs)[r, of[h]]), "every edge, held-out ones too"
        assert torch.equal(mine[:, :2], theirs[:, :2]), "the same draws: heads and relations as without communities"
    assert (graph.train[:, 2] != independent.train[:, 2]).float().mean() > 0.5
    degree = torch.bincount(graph.train[:, 2], minlength=5000).sort(descending=True).values
    assert degree[:50].sum() / degree.sum() > 0.2, "tails keep their power law"


def test_synthetic_communities_are_checked() -> None:
    config = SyntheticGraphConfig(num_entities=100, num_edges=1000, holdout=10, communities=101)
    with pytest.raises(ConfigError, match="data.synthetic.communities"):
        power_law_graph(config, seed=0)
    with pytest.raises(ConfigError, match="no communities"):
        entity_communities(dataclasses.replace(config, communities=0), seed=0)
