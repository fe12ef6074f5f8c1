"""Knowledge graphs as id triples, read from tab-separated files with strict validation.

A graph directory holds ``train.txt``, ``valid.txt`` and ``test.txt``: one ``head<TAB>relation<TAB>tail``
per line, UTF-8. Names are mapped to ids by sorted name over the training split (so the same files
always give the same ids). Policy for inconsistent input, documented in docs/data.md:

- malformed lines, non-UTF-8 bytes, missing or empty files: always an error naming file and line;
- duplicate triples within a split, valid/test triples already in an earlier split, and valid/test
  triples whose entity or relation never occurs in train: dropped with a printed count, or an error
  (naming the first offending line) when ``strict`` is set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from cadence.data.text import numbered_lines
from cadence.errors import DataError

log = logging.getLogger("cadence")

SPLITS = ("train", "valid", "test")
# a first line made only of these words is a header (column names), not a triple
HEADER_WORDS = frozenset({"head", "relation", "tail", "subject", "predicate", "object", "source", "target",
                          "h", "r", "t", "s", "p", "o", "head_label", "relation_label", "tail_label", "from", "to",
                          "edge", "label"})


@dataclass
class KnowledgeGraph:
    """Triples as int64 tensors ``[n, 3]`` of (head, relation, tail) ids."""

    name: str
    num_entities: int
    num_relations: int
    train: Tensor
    valid: Tensor
    test: Tensor
    entity_names: list[str] | None = None  # id -> name, when read from named files
    relation_names: list[str] | None = None
    notes: dict[str, int] = field(default_factory=dict)  # counts of filtered input, for the run log

    def split(self, name: str) -> Tensor:
        return {"train": self.train, "valid": self.valid, "test": self.test}[name]

    def all_triples(self) -> Tensor:
        return torch.cat([self.train, self.valid, self.test])


def read_triple_file(path: Path) -> list[tuple[str, str, str, int]]:
    """Read ``(head, relation, tail, line_number)`` rows, rejecting malformed input."""
    rows: list[tuple[str, str, str, int]] = []
    for number, line in numbered_lines(path, "file not found (a graph directory needs train.txt, valid.txt, test.txt)"):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise DataError(f"expected 3 tab-separated fields (head, relation, tail), found {len(fields)}",
                            path, number)
        head, relation, tail = (f.strip() for f in fields)
        if number == 1 and {head.lower(), relation.lower(), tail.lower()} <= HEADER_WORDS:
            log.warning("%s:1: skipped a header line (%s, %s, %s)", path, head, relation, tail)
            continue
        if not head or not relation or not tail:
            raise DataError("empty field (head, relation and tail must all be non-empty)", path, number)
        rows.append((head, relation, tail, number))
    if not rows:
        raise DataError("file is empty: it holds no triples", path)
    return rows


def read_graph_directory(directory: str | Path, strict: bool = False, name: str | None = None) -> KnowledgeGraph:
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError("dataset directory not found", directory)
    raw = {split: read_triple_file(directory / f"{split}.txt") for split in SPLITS}
    entity_names = sorted({h for h, _, _, _ in raw["train"]} | {t for _, _, t, _ in raw["train"]})
    relation_names = sorted({r for _, r, _, _ in raw["train"]})
    entity_ids = {n: i for i, n in enumerate(entity_names)}
    relation_ids = {n: i for i, n in enumerate(relation_names)}
    notes: dict[str, int] = {}
    seen: set[tuple[int, int, int]] = set()
    tensors = {}
    for split in SPLITS:
        path = directory / f"{split}.txt"
        kept: list[tuple[int, int, int]] = []
        unseen = duplicates = 0
        for head, relation, tail, number in raw[split]:
            ids = (entity_ids.get(head), relation_ids.get(relation), entity_ids.get(tail))
            if None in ids:
                missing = [n for n, i in zip((head, relation, tail), ids) if i is None]
                if strict:
                    raise DataError(f"{missing[0]!r} does not occur in train.txt (--strict)", path, number)
                unseen += 1
                continue
            if ids in seen:
                if strict:
                    raise DataError(f"duplicate triple {head}\t{relation}\t{tail} (--strict)", path, number)
                duplicates += 1
                continue
            seen.add(ids)
            kept.append(ids)
        if not kept:
            raise DataError("no usable triples left after filtering", path)
        for label, count in (("unseen", unseen), ("duplicate", duplicates)):
            if count:
                notes[f"{split}_{label}_dropped"] = count
                what = "with an entity or relation unseen in train" if label == "unseen" else "duplicates"
                log.warning("%s: dropped %d triples %s", path, count, what)
        tensors[split] = torch.tensor(kept, dtype=torch.int64)
    return KnowledgeGraph(
        name=name or directory.name,
        num_entities=len(entity_names),
        num_relations=len(relation_names),
        train=tensors["train"], valid=tensors["valid"], test=tensors["test"],
        entity_names=entity_names, relation_names=relation_names, notes=notes,
    )


def write_id_maps(graph: KnowledgeGraph, directory: Path) -> None:
    """Save ``entity_ids.tsv`` and ``relation_ids.tsv`` (id<TAB>name) next to a run."""
    for kind, names in (("entity", graph.entity_names), ("relation", graph.relation_names)):
        if names is None:
            continue
        with open(directory / f"{kind}_ids.tsv", "w", encoding="utf-8") as handle:
            handle.writelines(f"{i}\t{n}\n" for i, n in enumerate(names))


def with_reciprocals(triples: Tensor, num_relations: int) -> Tensor:
    """Append (t, r + R, h) for each (h, r, t): head prediction becomes tail prediction."""
    inverse = torch.stack([triples[:, 2], triples[:, 1] + num_relations, triples[:, 0]], dim=1)
    return torch.cat([triples, inverse])
