"""MovieLens-100k as a CTR dataset, read from the RecBole atomic files of the ``recbole==1.2.1`` wheel.

The wheel ships ``recbole/dataset_example/ml-100k/ml-100k.{inter,user,item}`` (SPEC 7); we fetch
it with the shared wheel fetcher (recbole itself is never installed). An atomic file is a header of
``name:type`` columns, then tab-separated rows. Each interaction becomes one example:

- fields: user_id, item_id, age, gender, occupation, zip_prefix (the first 3 characters of the
  zip code: the region, since full zips are nearly unique per user), release_year;
- bag: genres (the item's ``class`` tokens, multi-hot);
- label: rating >= 4 (about 55% of the 100,000 ratings); timestamps: the interaction's.

A field's value index numbers its distinct raw values in order of first appearance in the
interaction file. Parsing is strict: a malformed row, a non-numeric rating or timestamp, a
duplicate user or item, or an interaction whose user or item is missing raises ``DataError`` with
file and line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from cadence.data import fetch as fetching
from cadence.data.ctr_examples import (CTR_DATASETS, PAD, CtrDataset, CtrDatasetEntry, CtrExamples, CtrRows,
                                       feature_keys)
from cadence.data.text import numbered_lines
from cadence.errors import DataError

SOURCE = fetching.WheelSource(
    "recbole", "1.2.1", "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407",
    {f"recbole/dataset_example/ml-100k/ml-100k.{kind}": f"ml-100k.{kind}" for kind in ("inter", "user", "item")},
)
COLUMNS = {
    "inter": ["user_id", "item_id", "rating", "timestamp"],
    "user": ["user_id", "age", "gender", "occupation", "zip_code"],
    "item": ["item_id", "movie_title", "release_year", "class"],
}
FIELD_NAMES = ["user_id", "item_id", "age", "gender", "occupation", "zip_prefix", "release_year"]
BAG_NAMES = ["genres"]
ZIP_PREFIX_LENGTH = 3
LIKED_RATING = 4.0

Row = tuple[int, list[str]]  # (line number, column values)


def read_atomic_file(path: Path, columns: list[str]) -> list[Row]:
    """The rows of a RecBole atomic file whose header names exactly ``columns``."""
    rows: list[Row] = []
    for number, line in numbered_lines(path):
        values = line.split("\t")
        if number == 1:
            names = [value.split(":")[0] for value in values]
            if names != columns:
                raise DataError(f"header names columns {names}, expected {columns}", path, number)
        elif line.strip():
            if len(values) != len(columns):
                found = f"expected {len(columns)} tab-separated columns, found {len(values)}"
                raise DataError(found, path, number)
            rows.append((number, values))
    if not rows:
        raise DataError("file holds no rows", path)
    return rows


def _index_rows(path: Path, rows: list[Row], what: str) -> dict[str, int]:
    """Row position of each id (the first column), rejecting duplicates."""
    positions: dict[str, int] = {}
    for position, (number, values) in enumerate(rows):
        if values[0] in positions:
            raise DataError(f"duplicate {what} {values[0]!r}", path, number)
        positions[values[0]] = position
    return positions


def _number(text: str, what: str, path: Path, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise DataError(f"{what} {text!r} is not a number", path, line)
    return value


def first_appearance_codes(values: np.ndarray) -> np.ndarray:
    """Number the distinct values of ``values`` 0, 1, ... in order of first appearance."""
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def read_movielens_directory(directory: str | Path, name: str | None = None) -> CtrDataset:
    """Read ``X.inter``, ``X.user`` and ``X.item`` from ``directory`` (X: the one ``*.inter`` there)."""
    read = _Directory(Path(directory))
    examples = _examples(read.tables, np.array(read.user_index), np.array(read.item_index), read.ratings,
                         read.timestamps)
    return CtrDataset(name or read.stem, list(FIELD_NAMES), list(BAG_NAMES), [], examples)


class _Directory:
    """A MovieLens directory's three tables, and each interaction's user and item rows, rating and time."""

    def __init__(self, directory: Path):
        inter_files = sorted(directory.glob("*.inter"))
        if len(inter_files) != 1:
            raise DataError(f"expected one *.inter file, found {len(inter_files)}", directory)
        self.stem = inter_files[0].stem
        self.paths = {kind: directory / f"{self.stem}.{kind}" for kind in COLUMNS}
        self.tables = {kind: read_atomic_file(self.paths[kind], columns) for kind, columns in COLUMNS.items()}
        self.users = _index_rows(self.paths["user"], self.tables["user"], "user")
        self.items = _index_rows(self.paths["item"], self.tables["item"], "item")
        self.user_index: list[int] = []
        self.item_index: list[int] = []
        self.ratings: list[float] = []
        self.timestamps: list[int] = []
        path = self.paths["inter"]
        for number, (user, item, rating, timestamp) in self.tables["inter"]:
            self.add(path, number, user, item, _number(rating, "rating", path, number),
                     int(_number(timestamp, "timestamp", path, number)))

    def add(self, path: Path, number: int, user: str, item: str, rating: float, timestamp: int) -> None:
        """An interaction of line ``number`` of ``path``; a user or item the tables lack is an error."""
        for ident, known, what in ((user, self.users, "user"), (item, self.items, "item")):
            if ident not in known:
                raise DataError(f"{what} {ident!r} is not in {self.paths[what].name}", path, number)
        self.user_index.append(self.users[user])
        self.item_index.append(self.items[item])
        self.ratings.append(rating)
        self.timestamps.append(timestamp)


# the layouts of an interaction file of rows to predict: the .inter file's columns, rating and time optional
ROW_LAYOUTS = (COLUMNS["inter"][:2], COLUMNS["inter"][:3], COLUMNS["inter"])


def read_movielens_rows(directory: str | Path, path: str | Path) -> CtrRows:
    """Rows to predict for a run on the MovieLens data set in ``directory``: an interaction file in its
    ``.inter`` format, whose header names ``user_id``, ``item_id`` and optionally ``rating`` and
    ``timestamp``, in that order. Each row's user and item are looked up in the data set's ``.user``
    and ``.item`` files and its features coded as training coded them: codes in order of first
    appearance in the data set's interactions, then in these rows (a value the data set never showed
    gets a code of its own, whose key's row is the initial one). Labels (rating >= 4) where the file
    has ratings."""
    read, path = _Directory(Path(directory)), Path(path)
    trained = len(read.ratings)
    lines, labelled = [], False
    for number, line in numbered_lines(path):
        values = line.split("\t")
        if number == 1:
            names = [value.split(":")[0] for value in values]
            if names not in ROW_LAYOUTS:
                raise DataError(f"header names columns {names}, expected {' or '.join(map(str, ROW_LAYOUTS))}",
                                path, number)
            labelled = len(names) > 2
            continue
        if not line.strip():
            continue
        if len(values) != len(names):
            raise DataError(f"expected {len(names)} tab-separated columns, found {len(values)}", path, number)
        rating = _number(values[2], "rating", path, number) if labelled else math.nan
        read.add(path, number, values[0], values[1], rating, 0)
        lines.append(number)
    if not lines:
        raise DataError("file holds no rows", path)
    examples = _examples(read.tables, np.array(read.user_index), np.array(read.item_index), read.ratings,
                         read.timestamps).subset(torch.arange(trained, trained + len(lines)))
    if not labelled:
        examples.labels = torch.full_like(examples.labels, math.nan)
    return CtrRows(examples, lines, labelled)


def _examples(tables: dict[str, list[Row]], user_index: np.ndarray, item_index: np.ndarray,
              ratings: list[float], timestamps: list[int]) -> CtrExamples:
    user_table = np.array([[v[0], v[1], v[2], v[3], v[4][:ZIP_PREFIX_LENGTH]] for _, v in tables["user"]])
    item_table = np.array([[v[0], v[2]] for _, v in tables["item"]])
    users, items = user_table[user_index], item_table[item_index]
    raw = np.column_stack([users[:, 0], items[:, 0], users[:, 1:], items[:, 1:]])  # in FIELD_NAMES order
    keys = torch.stack([feature_keys(f, torch.from_numpy(first_appearance_codes(raw[:, f])))
                        for f in range(len(FIELD_NAMES))], dim=1)
    genres = _genre_keys([v[3].split() for _, v in tables["item"]], item_index, len(FIELD_NAMES))
    labels = torch.tensor(ratings, dtype=torch.float64).ge(LIKED_RATING).to(torch.float32)
    n = len(labels)
    return CtrExamples(keys, genres[item_index].unsqueeze(1), torch.zeros(n, 0), labels,
                       torch.tensor(timestamps, dtype=torch.int64))


def _genre_keys(genres_of_item: list[list[str]], item_index: np.ndarray, field_index: int) -> torch.Tensor:
    """[items, L] genre keys, PAD-filled; genres numbered in order of first appearance in the examples."""
    _, first = np.unique(item_index, return_index=True)
    vocabulary: dict[str, int] = {}
    for item in item_index[np.sort(first)]:
        for genre in genres_of_item[item]:
            vocabulary.setdefault(genre, len(vocabulary))
    width = max(1, max(len(genres) for genres in genres_of_item))
    table = torch.full((len(genres_of_item), width), PAD, dtype=torch.int64)
    for item, genres in enumerate(genres_of_item):
        codes = torch.tensor([vocabulary[g] for g in genres if g in vocabulary], dtype=torch.int64)
        table[item, :len(codes)] = feature_keys(field_index, codes)
    return table


def load_movielens_100k() -> CtrDataset:
    return read_movielens_directory(fetching.fetch("ml-100k", SOURCE), name="ml-100k")


def read_movielens_100k_rows(path: Path) -> CtrRows:
    return read_movielens_rows(fetching.fetch("ml-100k", SOURCE), path)


CTR_DATASETS.register("ml-100k")(CtrDatasetEntry(
    "ml-100k", "MovieLens-100k ratings as clicks (rating >= 4): 943 users, 1,682 items, 100k examples",
    lambda seed: load_movielens_100k(), SOURCE, read_rows=read_movielens_100k_rows,
))
