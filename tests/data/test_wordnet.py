"""WordNet 3.0 as a graph (``wordnet``, ``wordnet-rr``): the data files' lines parsed against hand-read
edges, splits by entity pair, WN18RR's relations; the real package in the slow suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.data import wordnet
from cadence.data.triples import read_graph_directory
from cadence.errors import DataError

LICENCE = "  1 This software and database is being provided to you, the LICENSEE, by  \n"
NOUNS = LICENCE + (
    "00001740 03 n 01 entity 0 002 ~ 00001930 n 0000 ! 00001930 n 0101 | that which is perceived  \n"
    "00001930 03 n 02 physical_entity 0 thing 0 003 @ 00001740 n 0000 + 00000100 v 0201 @ 00001930 n 0000 | an entity  \n")
VERBS = "00000100 29 v 01 be 0 002 + 00001930 n 0102 + 00001930 n 0101 | have the quality of being  \n"
ADJS = ("00000200 00 a 01 able 0 001 & 00000300 s 0000 | having the means  \n"
        "00000300 00 s 01 capable 0 001 & 00000200 a 0000 | able  \n")


def test_data_lines_become_synset_edges_as_read_by_hand() -> None:
    names, edges = wordnet.synset_edges({"noun": NOUNS, "verb": VERBS, "adj": ADJS, "adv": ""})
    assert names == {"00001740.n": "entity.n.00001740", "00001930.n": "physical_entity.n.00001930",
                     "00000100.v": "be.v.00000100", "00000200.a": "able.a.00000200",
                     "00000300.a": "capable.a.00000300"}  # a satellite (s) is an adjective
    assert edges == [  # the antonym (!) is not a WN18 relation, the self-loop goes, the lexical pointers
        ("00001740.n", "_hyponym", "00001930.n"),  # between two synsets are one edge
        ("00001930.n", "_hypernym", "00001740.n"),
        ("00001930.n", "_derivationally_related_form", "00000100.v"),
        ("00000100.v", "_derivationally_related_form", "00001930.n"),
        ("00000200.a", "_similar_to", "00000300.a"),
        ("00000300.a", "_similar_to", "00000200.a")]


@pytest.mark.parametrize("bad, message", [
    ("00001740 03 n 01 entity 0 001 ~ 00001930 | cut short  \n", "data.noun:2: not a WordNet data line"),
    ("00001740 03 q 01 entity 0 000 | no such part of speech  \n", "data.noun:2: not a WordNet data line"),
    ("00001740 03 n 01 entity 0 001 ~ 09999999 n 0000 | nowhere  \n", "synset 09999999.n, which no data file")])
def test_a_bad_data_line_is_named(bad: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        wordnet.synset_edges({"noun": LICENCE + bad})


def test_every_pair_of_entities_falls_in_one_split_eighty_ten_ten() -> None:
    edges = [(f"e{i}", "r", f"e{j}") for i in range(60) for j in range(i + 1, 60)]
    edges += [(t, "inverse", h) for h, _, t in edges]
    splits = wordnet.split_by_pair(edges)
    pairs = {split: {frozenset((h, t)) for h, _, t in part} for split, part in splits.items()}
    assert not pairs["train"] & pairs["valid"] and not pairs["train"] & pairs["test"] and not pairs["valid"] & pairs["test"]
    assert sum(map(len, splits.values())) == len(edges)
    shares = [len(splits[split]) / len(edges) for split in ("train", "valid", "test")]
    assert shares == pytest.approx([0.8, 0.1, 0.1], abs=0.03)
    again = wordnet.split_by_pair(list(reversed(edges)))  # by pair, not by the order of the input
    assert {split: sorted(part) for split, part in splits.items()} == {split: sorted(part) for split, part in again.items()}


def test_wordnet_rr_is_wordnet_without_the_inverse_relations(tmp_path: Path, monkeypatch) -> None:
    files = {"noun": NOUNS, "verb": VERBS, "adj": ADJS, "adv": ""}
    monkeypatch.setattr(wordnet, "debian_members", lambda package, wanted: {
        path: files[part].encode() for part, path in wordnet.DATA_FILES.items()})
    for name, inverse_free in (("wn", False), ("rr", True)):
        (tmp_path / name).mkdir()
        wordnet.builder(inverse_free)(tmp_path / name)
    for split in ("train", "valid", "test"):
        full = (tmp_path / "wn" / f"{split}.txt").read_text().splitlines()
        rr = (tmp_path / "rr" / f"{split}.txt").read_text().splitlines()
        assert rr == [line for line in full if line.split("\t")[1] not in wordnet.RR_REMOVED]
    assert len(wordnet.RELATIONS) == 18 and len(set(wordnet.RELATIONS.values()) - wordnet.RR_REMOVED) == 11


@pytest.mark.slow
def test_the_real_wordnet_graphs(tmp_path: Path, monkeypatch) -> None:
    from cadence.config import DataConfig
    from cadence.data.datasets import DATASETS

    for name, relations in (("wordnet", 18), ("wordnet-rr", 11)):
        graph = DATASETS.get(name).load(DataConfig(dataset=name), 0)
        assert graph.num_relations == relations and graph.num_entities > 100_000
        assert set(graph.relation_names) <= set(wordnet.RELATIONS.values())
        splits = {split: {frozenset((h, t)) for h, _, t in graph.split(split).tolist()} for split in ("train", "valid",
                                                                                                    "test")}
        assert not splits["train"] & splits["test"] and not splits["train"] & splits["valid"]
        assert graph.train.shape[0] > 8 * graph.test.shape[0] * 0.8
        directory = DATASETS.get(name).fetch()
        assert read_graph_directory(directory).num_entities == graph.num_entities
