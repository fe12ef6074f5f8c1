"""Knowledge graphs as id triples, read from tab-separated files with strict validation.

A graph directory holds ``train.txt``, ``valid.txt`` and ``test.txt``: one ``head<TAB>relation<TAB>tail``
per line, UTF-8. Names are mapped to ids by sorted name over the training split (so the same files
always give the same ids). Policy for inconsistent input, documented in docs/data.md:

- malformed lines, non-UTF-8 bytes, missing or empty files: always an error naming file and line;
- duplicate triples within a split, valid/test triples already in an earlier split, and valid/test
  triples whose entity or relation never occurs in train: dropped with a printed count, or an error
  (naming the first offending line) when ``strict`` is set.

Two readers, one result: the column reader (``_read_columns``) takes a block of lines at a time
into columns of names and maps them to ids and drops duplicates with array operations; at anything
irregular (a line not of three fields, an empty field or line, bytes that are not UTF-8, a
violation under ``strict``, a graph too large for one int64 key per triple) it gives way to the
line reader (``_read_lines``), which reads the files line by line and names the problem's file and
line. A file of 64 MiB or more shows a progress bar on a terminal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from cadence.data.text import UTF8_BOM, numbered_lines
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


def read_graph_directory(directory: str | Path, strict: bool = False, name: str | None = None,
                         progress: bool | None = None) -> KnowledgeGraph:
    """The graph of ``directory``'s ``train.txt``, ``valid.txt`` and ``test.txt``. ``progress``: a bar
    for files of ``PROGRESS_BYTES`` or more (None: on a terminal only)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError("dataset directory not found", directory)
    try:
        return _read_columns(directory, strict, name, progress)
    except _Irregular:
        return _read_lines(directory, strict, name)


# ---- the column reader ----------------------------------------------------------------------------------
BLOCK_BYTES = 1 << 24  # text parsed at a time
PROGRESS_BYTES = 1 << 26  # files this large show a progress bar


class _Irregular(Exception):
    """The column reader stops: the line reader reads these files (and names any problem's line)."""


def _columns(path: Path, bar) -> Iterator[tuple[list[str], list[str], list[str]]]:
    """(heads, relations, tails) of each block of a file's lines, each field stripped."""
    if not path.is_file():
        raise _Irregular
    with open(path, "rb") as handle:
        rest, first, at_start = b"", True, True
        while True:
            chunk = handle.read(BLOCK_BYTES)
            bar.update(len(chunk))
            data = rest + chunk
            if chunk:
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # no whole line yet
                    rest = data
                    continue
                data, rest = data[:cut], data[cut:]
            if first and data.startswith(UTF8_BOM):
                data = data[len(UTF8_BOM):]
            first = False
            if data:
                try:
                    lines = data.decode("utf-8").split("\n")
                except UnicodeDecodeError:
                    raise _Irregular from None
                if lines[-1] == "":
                    lines.pop()
                if set(map(str.count, lines, repeat("\t"))) != {2}:  # three fields on every line
                    raise _Irregular
                fields = "\t".join(lines).split("\t")
                heads, relations, tails = (list(map(str.strip, fields[column::3])) for column in range(3))
                if "" in heads or "" in relations or "" in tails:
                    raise _Irregular
                if at_start and {heads[0].lower(), relations[0].lower(), tails[0].lower()} <= HEADER_WORDS:
                    raise _Irregular  # a line of column names: the line reader skips it, with a warning
                at_start = False
                yield heads, relations, tails
            if not chunk:
                return


class _Names:
    """Names to provisional ids, in no particular order (``ranks`` maps them to sorted order)."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def add(self, names: list[str]) -> np.ndarray:
        codes = self.find(names)
        missing = np.flatnonzero(codes < 0)
        if missing.size:  # (the names seen before, most of them in a large graph, are looked up once)
            ids = self.ids
            fresh = [names[i] for i in missing.tolist()]
            ids.update(zip(dict.fromkeys(fresh), range(len(ids), len(ids) + len(fresh))))
            codes[missing] = np.fromiter(map(ids.__getitem__, fresh), np.int64, len(fresh))
        return codes

    def find(self, names: list[str]) -> np.ndarray:
        """Provisional ids, -1 where a name is not known."""
        return np.fromiter(map(self.ids.get, names, repeat(-1)), np.int64, len(names))

    def ranks(self) -> tuple[list[str], np.ndarray]:
        """The names sorted, and for each provisional id its place among them."""
        names = sorted(self.ids)
        rank = np.empty(len(names), np.int64)
        rank[np.fromiter(map(self.ids.__getitem__, names), np.int64, len(names))] = np.arange(len(names))
        return names, rank


def _read_split(path: Path, progress: bool | None, read) -> list[np.ndarray]:
    """A split's columns as provisional ids (``read(column, names)`` per column), a block at a time."""
    size = path.stat().st_size if path.is_file() else 0
    disable = True if progress is False or size < PROGRESS_BYTES else (None if progress is None else False)
    with tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {path.name}", leave=False,
              disable=disable) as bar:
        parts = [(read(0, heads), read(1, relations), read(2, tails)) for heads, relations, tails in _columns(path, bar)]
    if not parts:
        raise _Irregular  # an empty file: the line reader says so
    return [np.concatenate(column) for column in zip(*parts)]


def _first_occurrences(keys: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """Indices of the keys not in ``earlier`` (sorted) that come first among equal keys, in order."""
    fresh = np.arange(keys.size)
    if earlier.size:
        place = np.minimum(np.searchsorted(earlier, keys), earlier.size - 1)
        fresh = np.flatnonzero(earlier[place] != keys)
    _, first = np.unique(keys[fresh], return_index=True)
    return np.sort(fresh[first])


def _read_columns(directory: Path, strict: bool, name: str | None, progress: bool | None) -> KnowledgeGraph:
    entities, relations = _Names(), _Names()
    table = (entities, relations, entities)
    path = directory / "train.txt"
    h, r, t = _read_split(path, progress, lambda column, names: table[column].add(names))
    entity_names, entity_rank = entities.ranks()
    relation_names, relation_rank = relations.ranks()
    if len(entity_names) ** 2 * max(1, len(relation_names)) >= 1 << 62:
        raise _Irregular  # no int64 key per triple
    ranks = (entity_rank, relation_rank, entity_rank)
    splits = {"train": [rank[column] for rank, column in zip(ranks, (h, r, t))]}
    for split in SPLITS[1:]:
        columns = _read_split(directory / f"{split}.txt", progress, lambda column, names: table[column].find(names))
        known = (columns[0] >= 0) & (columns[1] >= 0) & (columns[2] >= 0)
        splits[split] = [np.where(known, rank[np.maximum(column, 0)], -1) for rank, column in zip(ranks, columns)]
    notes: dict[str, int] = {}
    seen = np.empty(0, np.int64)
    tensors = {}
    for split in SPLITS:
        path = directory / f"{split}.txt"
        h, r, t = splits[split]
        known = np.flatnonzero(h >= 0)
        unseen = h.size - known.size
        keys = (h[known] * len(relation_names) + r[known]) * len(entity_names) + t[known]
        kept = _first_occurrences(keys, seen)
        duplicates = known.size - kept.size
        if strict and (unseen or duplicates):
            raise _Irregular  # the line reader names the first offending line
        if not kept.size:
            raise DataError("no usable triples left after filtering", path)
        _note_dropped(notes, split, path, unseen, duplicates)
        seen = np.sort(np.concatenate([seen, keys[kept]]))
        rows = known[kept]
        tensors[split] = torch.from_numpy(np.stack([h[rows], r[rows], t[rows]], axis=1))
    return _graph(name or directory.name, entity_names, relation_names, tensors, notes)


# ---- the line reader ------------------------------------------------------------------------------------
def _read_lines(directory: Path, strict: bool, name: str | None) -> KnowledgeGraph:
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
        _note_dropped(notes, split, path, unseen, duplicates)
        tensors[split] = torch.tensor(kept, dtype=torch.int64)
    return _graph(name or directory.name, entity_names, relation_names, tensors, notes)


def _graph(name: str, entity_names: list[str], relation_names: list[str], tensors: dict[str, Tensor],
           notes: dict[str, int]) -> KnowledgeGraph:
    return KnowledgeGraph(name=name, num_entities=len(entity_names), num_relations=len(relation_names),
                          train=tensors["train"], valid=tensors["valid"], test=tensors["test"],
                          entity_names=entity_names, relation_names=relation_names, notes=notes)


def _note_dropped(notes: dict[str, int], split: str, path: Path, unseen: int, duplicates: int) -> None:
    """The counts of a split's triples dropped by the policy, in ``notes`` and the run log."""
    for label, count in (("unseen", unseen), ("duplicate", duplicates)):
        if count:
            notes[f"{split}_{label}_dropped"] = count
            what = "with an entity or relation unseen in train" if label == "unseen" else "duplicates"
            log.warning("%s: dropped %d triples %s", path, count, what)


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
