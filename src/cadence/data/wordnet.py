"""WordNet 3.0 as a knowledge graph: the database WN18 and WN18RR were derived from, read from Debian's
``wordnet-base`` package (``apt-get download``, sha256-pinned, unpacked in Python, never installed).

- Entities: the synsets of ``data.noun``, ``data.verb``, ``data.adj`` and ``data.adv`` that take part
  in an edge, named ``LEMMA.POS.OFFSET`` (the synset's first word, its part of speech ``n``, ``v``,
  ``a`` or ``r``, and its byte offset in its data file, which WordNet uses as its id: ``dog.n.02084071``).
  Adjective satellites are adjectives (``a``).
- Relations: WN18's 18 (Bordes et al. 2013), from the pointer symbols of each synset (``@`` is
  ``_hypernym``, ``~`` ``_hyponym``, ``%p`` ``_has_part``, ...: ``RELATIONS``). A lexical pointer (from
  one word of a synset to one of another) is an edge between their synsets, as in WN18; self-loops
  and repeated edges are dropped. WordNet's other pointers (antonyms, attributes, entailment, cause,
  pertainyms, participles, substance parts) are not WN18's relations and are left out.
- ``wordnet-rr``: WN18RR's 11 relations (Dettmers et al. 2018), WN18's without the 7 that are the
  inverse of another (``_hyponym`` of ``_hypernym``, ...): with them a model can look a test edge's
  answer up in its inverse training edge.
- Splits: 80/10/10, seeded (seed 0, fixed: the files are written once, at the fetch), by *pair of
  entities*: every edge between two synsets, in either direction and of any relation, falls in the
  same split, so no test edge has its inverse or its reverse in train. Valid/test edges whose entity
  or relation never occurs in train are dropped when the graph is read (docs/data.md's policy).

This is not the official WN18 or WN18RR split (those were made from WordNet 3.0 too, but over a subset
of 40,943 synsets chosen by the authors, with splits of their own): published WN18/WN18RR numbers are
orientation only.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterable

from cadence.data.fetch import DebianPackage, debian_members
from cadence.errors import DataError

WORDNET_BASE = DebianPackage("wordnet-base", "1:3.0-37",
                             "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752", source="wordnet")
DATA_FILES = {part: f"usr/share/wordnet/data.{part}" for part in ("noun", "verb", "adj", "adv")}
POS = {"n": "n", "v": "v", "a": "a", "s": "a", "r": "r"}  # a satellite is an adjective

# WN18's relations by WordNet pointer symbol (wndb(5WN)); a symbol not here is not one of WN18's
RELATIONS = {"@": "_hypernym", "~": "_hyponym", "@i": "_instance_hypernym", "~i": "_instance_hyponym",
             "#m": "_member_holonym", "%m": "_member_meronym", "#p": "_part_of", "%p": "_has_part",
             "+": "_derivationally_related_form", ";c": "_synset_domain_topic_of", "-c": "_member_of_domain_topic",
             ";r": "_synset_domain_region_of", "-r": "_member_of_domain_region", ";u": "_synset_domain_usage_of",
             "-u": "_member_of_domain_usage", "^": "_also_see", "$": "_verb_group", "&": "_similar_to"}
# what WN18RR removed: each the inverse of a relation it kept
RR_REMOVED = frozenset({"_hyponym", "_instance_hyponym", "_member_holonym", "_part_of", "_member_of_domain_topic",
                        "_synset_domain_usage_of", "_synset_domain_region_of"})
SPLIT_SEED = 0
SPLIT_SHARES = (0.8, 0.1)  # train, valid; test the rest


def synset_edges(files: dict[str, str]) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """({synset id: name}, [(head synset, relation, tail synset)]) of WordNet data files' text
    ({part: text}), in file order, self-loops and repeated edges dropped. A synset id is
    ``OFFSET.POS``; lines starting with two spaces are the licence header."""
    names: dict[str, str] = {}
    edges: dict[tuple[str, str, str], None] = {}
    for part, text in files.items():
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.startswith("  "):
                continue
            try:
                fields = line.split(" | ", 1)[0].split()
                offset, pos, words = fields[0], POS[fields[2]], int(fields[3], 16)
                head = f"{offset}.{pos}"
                names[head] = f"{fields[4]}.{pos}.{offset}"
                at = 4 + 2 * words
                for index in range(int(fields[at])):
                    symbol, target, target_pos, _ = fields[at + 1 + 4 * index: at + 5 + 4 * index]
                    relation = RELATIONS.get(symbol)
                    tail = f"{target}.{POS[target_pos]}"
                    if relation is not None and tail != head:
                        edges[(head, relation, tail)] = None
            except (IndexError, KeyError, ValueError):
                raise DataError("not a WordNet data line", f"data.{part}", number) from None
    missing = sorted({tail for _, _, tail in edges if tail not in names})
    if missing:
        raise DataError(f"a pointer to synset {missing[0]}, which no data file holds", "WordNet data files")
    return names, list(edges)


def split_by_pair(edges: Iterable[tuple[str, str, str]], seed: int = SPLIT_SEED) -> dict[str, list]:
    """{split: edges}: each pair of entities (either direction) drawn into one split, 80/10/10."""
    pairs: dict[frozenset, list] = {}
    for edge in edges:
        pairs.setdefault(frozenset((edge[0], edge[2])), []).append(edge)
    rng = random.Random(seed)
    splits: dict[str, list] = {"train": [], "valid": [], "test": []}
    for key in sorted(pairs, key=sorted):  # a fixed order, whatever the hash seed
        draw = rng.random()
        split = "train" if draw < SPLIT_SHARES[0] else "valid" if draw < sum(SPLIT_SHARES) else "test"
        splits[split].extend(pairs[key])
    return splits


def write_graph(directory: Path, names: dict[str, str], splits: dict[str, list], keep: frozenset | None = None) -> None:
    """``train.txt``, ``valid.txt``, ``test.txt`` of the named edges (only relations in ``keep``, if given)."""
    for split, edges in splits.items():
        lines = (f"{names[h]}\t{r}\t{names[t]}\n" for h, r, t in edges if keep is None or r in keep)
        (directory / f"{split}.txt").write_text("".join(lines), encoding="utf-8")


def builder(inverse_free: bool):
    """The writer of ``wordnet`` (WN18's relations) or ``wordnet-rr`` (WN18RR's) into a directory: both
    split the same pairs alike, so ``wordnet-rr``'s splits are ``wordnet``'s without the removed relations."""

    def build(directory: Path) -> None:
        members = debian_members(WORDNET_BASE, list(DATA_FILES.values()))
        names, edges = synset_edges({part: members[path].decode("utf-8") for part, path in DATA_FILES.items()})
        write_graph(directory, names, split_by_pair(edges),
                    frozenset(RELATIONS.values()) - RR_REMOVED if inverse_free else None)

    return build
