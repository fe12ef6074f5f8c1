"""Explicit ratings for the matrix-factorization task (AdaPM's MF setting, SPEC 2), and their registry.

A rating is one (user, item, value[, timestamp]) cell of the rating matrix. Users and items are
numbered 0, 1, ... in order of first appearance in the source, so the same file always gives the
same indices. Sources:

- ``ml-100k``: MovieLens-100k's explicit ratings, from the same RecBole atomic file (and the same
  fetched directory) as the CTR dataset of that name;
- a user's file given by path: ``user<TAB>item<TAB>rating[<TAB>timestamp]`` per line, UTF-8; blank
  lines and lines starting with ``#`` are skipped;
- ``synthetic-zipf``: distinct cells with Zipf-skewed users and items and planted low-rank ratings.

Policy for inconsistent input, as for triples (docs/data.md): a malformed line, a non-numeric or
non-finite rating, a non-integer timestamp, non-UTF-8 bytes, a missing or empty file are always an
error naming file and line; a repeated (user, item) pair is dropped (the first rating is kept) with
a logged count, or an error naming its line when ``strict`` is set.

Splits: ``random_split`` shuffles with a generator seeded from ``derive_seed(seed, "mf-split")``;
``folds`` cuts one seeded permutation into k folds, so over ``fold = 0 .. k-1`` every rating is a
test rating exactly once. Every part keeps source order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cadence.data import fetch as fetching
from cadence.data import movielens
from cadence.data.synthetic_ctr import zipf_ranks
from cadence.data.text import numbered_lines
from cadence.task_config import SyntheticRatingsConfig
from cadence.errors import ConfigError, DataError
from cadence.registry import Registry
from cadence.seeding import derive_seed

log = logging.getLogger("cadence")

Row = tuple[int, list[str]]  # (line number, [user, item, rating] or [user, item, rating, timestamp])


@dataclass
class Ratings:
    users: Tensor       # [n] int64 user index (0 .. num_users-1)
    items: Tensor       # [n] int64 item index
    values: Tensor      # [n] float32 rating
    timestamps: Tensor  # [n] int64 (0 where the source has none)

    def __post_init__(self) -> None:
        n = self.values.shape[0]
        for item in fields(self):
            if getattr(self, item.name).shape[0] != n:
                raise ValueError(f"Ratings.{item.name} has {getattr(self, item.name).shape[0]} rows, not {n}")

    def __len__(self) -> int:
        return self.values.shape[0]

    def subset(self, index: Tensor) -> Ratings:
        """The ratings at ``index`` (int64 positions or a bool mask), in that order."""
        return Ratings(**{item.name: getattr(self, item.name)[index] for item in fields(self)})


class NumberedIds(Sequence[str]):
    """The raw ids "0" .. "n-1" of a generated data set, without holding n strings (a model of
    millions of users would spend hundreds of MB on them, in every process that builds the task)."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [str(i) for i in range(*index.indices(self.count))]
        if not -self.count <= index < self.count:
            raise IndexError(index)
        return str(index % self.count)

    def __iter__(self) -> Iterator[str]:
        return map(str, range(self.count))

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"NumberedIds({self.count})"


@dataclass
class RatingDataset:
    name: str
    user_ids: Sequence[str]  # raw id of user index u
    item_ids: Sequence[str]  # raw id of item index i
    ratings: Ratings     # everything, in source order
    notes: dict[str, int] = field(default_factory=dict)  # counts of filtered input, for the run log

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    def random_split(
        self, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    ) -> tuple[Ratings, Ratings, Ratings]:
        """Train, valid and test parts, shuffled by ``seed``; each part keeps source order."""
        if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
            raise ConfigError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
        n = len(self.ratings)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, "mf-split")))
        first, second = round(fractions[0] * n), round((fractions[0] + fractions[1]) * n)
        return self._parts(order[:first], order[first:second], order[second:])

    def folds(self, k: int, fold: int, seed: int, valid_fraction: float = 0.1) -> tuple[Ratings, Ratings, Ratings]:
        """Train, valid and test of fold ``fold`` of ``k``: test is that fold of one seeded permutation,
        valid a seeded ``valid_fraction`` of the other folds, train the rest."""
        n = len(self.ratings)
        if not 2 <= k <= n:
            raise ConfigError(f"mf.folds must be between 2 and the number of ratings ({n}), got {k}")
        if not 0 <= fold < k:
            raise ConfigError(f"mf.fold must be in 0 .. mf.folds - 1 = {k - 1}, got {fold}")
        if not 0 <= valid_fraction < 1:
            raise ConfigError(f"the validation fraction must be in [0, 1), got {valid_fraction}")
        order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, "mf-folds")))
        chunks = torch.tensor_split(order, k)
        rest = torch.cat([chunk for index, chunk in enumerate(chunks) if index != fold])
        generator = torch.Generator().manual_seed(derive_seed(seed, "mf-folds-valid", k, fold))
        rest = rest[torch.randperm(len(rest), generator=generator)]
        cut = round(valid_fraction * len(rest))
        return self._parts(rest[cut:], rest[:cut], chunks[fold])

    def _parts(self, *positions: Tensor) -> tuple[Ratings, Ratings, Ratings]:
        train, valid, test = (self.ratings.subset(part.sort().values) for part in positions)
        return train, valid, test

    def write_id_maps(self, directory: Path) -> None:
        """Save ``user_ids.tsv`` and ``item_ids.tsv`` (index<TAB>raw id) next to a run."""
        for kind, names in (("user", self.user_ids), ("item", self.item_ids)):
            with open(Path(directory) / f"{kind}_ids.tsv", "w", encoding="utf-8") as handle:
                handle.writelines(f"{i}\t{n}\n" for i, n in enumerate(names))


# --- reading ---------------------------------------------------------------------------------------

def read_ratings_file(path: str | Path, strict: bool = False) -> RatingDataset:
    """Read ``user<TAB>item<TAB>rating[<TAB>timestamp]`` lines (see the module docstring)."""
    path = Path(path)
    return ratings_from_rows(_read_rows(path), path, path.stem, strict)


def _read_rows(path: Path) -> list[Row]:
    rows: list[Row] = []
    missing = "file not found (a ratings file holds user<TAB>item<TAB>rating[<TAB>timestamp] lines)"
    for number, line in numbered_lines(path, missing):
        if not line.strip() or line.startswith("#"):
            continue
        values = line.split("\t")
        if len(values) not in (3, 4):
            commas = " (the line is comma-separated: use tabs)" if len(line.split(",")) in (3, 4) else ""
            raise DataError("expected 3 or 4 tab-separated fields (user, item, rating[, timestamp]), "
                            f"found {len(values)}{commas}", path, number)
        if not rows and values[2].strip()[:1].isalpha() and values[2].strip().lower() not in ("nan", "inf"):
            log.warning("%s:%d: skipped a header line (%s)", path, number, ", ".join(v.strip() for v in values))
            continue
        rows.append((number, values))
    if not rows:
        raise DataError("file is empty: it holds no ratings", path)
    return rows


def ratings_from_rows(rows: list[Row], path: Path, name: str, strict: bool = False) -> RatingDataset:
    """Number users and items by first appearance, parse values, and apply the duplicate policy."""
    user_index: dict[str, int] = {}
    item_index: dict[str, int] = {}
    first_line: dict[tuple[int, int], int] = {}
    users, items, values, timestamps = [], [], [], []
    for number, columns in rows:
        user, item = columns[0].strip(), columns[1].strip()
        if not user or not item:
            raise DataError("empty field (user and item must both be non-empty)", path, number)
        value = _rating(columns[2], path, number)
        timestamp = _timestamp(columns[3], path, number) if len(columns) > 3 else 0
        cell = (user_index.setdefault(user, len(user_index)), item_index.setdefault(item, len(item_index)))
        earlier = first_line.setdefault(cell, number)
        if earlier != number:
            if strict:
                raise DataError(f"duplicate rating of item {item!r} by user {user!r} "
                                f"(first on line {earlier}) (--strict)", path, number)
            continue
        users.append(cell[0])
        items.append(cell[1])
        values.append(value)
        timestamps.append(timestamp)
    notes = {}
    if len(first_line) < len(rows):
        notes["duplicate_ratings_dropped"] = dropped = len(rows) - len(first_line)
        log.warning("%s: dropped %d duplicate ratings (the first rating of each user and item is kept)",
                    path, dropped)
    ratings = Ratings(torch.tensor(users, dtype=torch.int64), torch.tensor(items, dtype=torch.int64),
                      torch.tensor(values, dtype=torch.float32), torch.tensor(timestamps, dtype=torch.int64))
    return RatingDataset(name, list(user_index), list(item_index), ratings, notes)


def _rating(text: str, path: Path, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"rating {text.strip()!r} is not a number", path, line) from None
    if not math.isfinite(value):
        raise DataError(f"rating {text.strip()!r} is not a finite number", path, line)
    return value


def _timestamp(text: str, path: Path, line: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise DataError(f"timestamp {text.strip()!r} is not an integer", path, line) from None
    if not -2**63 <= value < 2**63:
        raise DataError(f"timestamp {text.strip()[:24]!r} is too large (a 64-bit integer is the most)", path, line)
    return value


def load_movielens_100k_ratings() -> RatingDataset:
    """The 100,000 ratings (1 .. 5) of 943 users on 1,682 movies, from the fetched CTR files."""
    path = fetching.fetch("ml-100k", movielens.SOURCE) / "ml-100k.inter"
    return ratings_from_rows(movielens.read_atomic_file(path, movielens.COLUMNS["inter"]), path, "ml-100k",
                             strict=True)


# --- the synthetic generator -----------------------------------------------------------------------

PLANTED_RANK = 8
GLOBAL_MEAN = 3.5
USER_BIAS_STD, ITEM_BIAS_STD = 0.3, 0.5
INTERACTION_STD = 0.7  # of <p_u, q_i>
NOISE_STD = 0.5
MAX_ROUNDS = 64
CHUNK = 1 << 20


def synthetic_zipf(users: int, items: int, ratings: int, exponent: float, seed: int) -> RatingDataset:
    """``ratings`` distinct cells with Zipf(``exponent``) user and item popularity and planted ratings.

    Cells are drawn in rounds (user and item ranks independently, ranks scattered over indices by a
    seeded permutation so the hot ones are not the small ones) and deduplicated, keeping draw order,
    until there are enough. A rating is ``clip(round(mu + b_u + b_i + <p_u, q_i> + noise), 1, 5)``
    with a rank-``PLANTED_RANK`` model drawn from its own seed, so it does not depend on the count.
    Heavy users saturate (at most ``items`` ratings each), which flattens the head of the law.
    """
    _check_synthetic(users, items, ratings, exponent)
    rng = np.random.default_rng(derive_seed(seed, "synthetic-mf-cells"))
    cells = _distinct_cells(rng, users, items, ratings, exponent)
    user_index, item_index = cells // items, cells % items
    values = _planted_ratings(user_index, item_index, users, items, seed)
    table = Ratings(torch.from_numpy(user_index), torch.from_numpy(item_index), torch.from_numpy(values),
                    torch.arange(ratings, dtype=torch.int64))
    return RatingDataset("synthetic-zipf", NumberedIds(users), NumberedIds(items), table)


def synthetic_zipf_from_config(config: Any, seed: int) -> RatingDataset:
    """``synthetic_zipf`` sized by an object with attributes ``users, items, ratings, exponent``."""
    return synthetic_zipf(config.users, config.items, config.ratings, config.exponent, seed)


def _check_synthetic(users: int, items: int, ratings: int, exponent: float) -> None:
    for name, value in (("users", users), ("items", items), ("ratings", ratings)):
        if value < 1:
            raise ConfigError(f"mf.synthetic.{name} must be at least 1, got {value}")
    if ratings > users * items // 2:
        raise ConfigError(f"mf.synthetic.ratings ({ratings}) must be at most half of users x items "
                          f"({users} x {items}): skewed draws cannot fill a denser matrix")
    if not exponent >= 0:
        raise ConfigError(f"mf.synthetic.exponent must be >= 0, got {exponent}")


def _distinct_cells(rng: np.random.Generator, users: int, items: int, count: int, exponent: float) -> np.ndarray:
    """``count`` distinct cell codes ``user * items + item``, in draw order."""
    user_of_rank = rng.permutation(users).astype(np.int64)
    item_of_rank = rng.permutation(items).astype(np.int64)
    cells = np.empty(0, dtype=np.int64)
    fresh_rate = 1.0  # the share of the last round's draws that were new cells
    for _ in range(MAX_ROUNDS):
        need = count - len(cells)
        if need == 0:
            return cells
        draws = math.ceil(1.2 * need / fresh_rate) + 1024
        drawn = (user_of_rank[zipf_ranks(rng, (draws,), users, exponent)] * items
                 + item_of_rank[zipf_ranks(rng, (draws,), items, exponent)])
        fresh = _first_occurrences(np.concatenate([cells, drawn]))
        fresh = fresh[fresh >= len(cells)]  # the positions of new cells, in draw order
        fresh_rate = max(len(fresh) / draws, 1e-3)
        cells = np.concatenate([cells, drawn[fresh[:need] - len(cells)]])
    raise ConfigError(f"could not draw {count} distinct cells in {MAX_ROUNDS} rounds: lower mf.synthetic.ratings "
                      "or mf.synthetic.exponent, or raise mf.synthetic.users or mf.synthetic.items")


def _first_occurrences(values: np.ndarray) -> np.ndarray:
    """The sorted positions of the first occurrence of each distinct value.

    An unstable sort plus the minimum position per run of equal values: as deterministic as a
    stable sort (np.unique's), and several times faster on tens of millions of int64.
    """
    order = np.argsort(values)
    ordered = values[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    return np.sort(np.minimum.reduceat(order, starts))


def _planted_ratings(user_index: np.ndarray, item_index: np.ndarray, users: int, items: int, seed: int) -> np.ndarray:
    model = np.random.default_rng(derive_seed(seed, "synthetic-mf-model"))
    factor_std = (INTERACTION_STD ** 2 / PLANTED_RANK) ** 0.25  # so <p_u, q_i> has std INTERACTION_STD
    user_bias = model.normal(0, USER_BIAS_STD, users)
    item_bias = model.normal(0, ITEM_BIAS_STD, items)
    user_factors = model.normal(0, factor_std, (users, PLANTED_RANK)).astype(np.float32)
    item_factors = model.normal(0, factor_std, (items, PLANTED_RANK)).astype(np.float32)
    noise = np.random.default_rng(derive_seed(seed, "synthetic-mf-noise"))
    values = np.empty(len(user_index), dtype=np.float32)
    for start in range(0, len(user_index), CHUNK):
        u, i = user_index[start:start + CHUNK], item_index[start:start + CHUNK]
        interaction = np.einsum("nk,nk->n", user_factors[u], item_factors[i])
        mean = GLOBAL_MEAN + user_bias[u] + item_bias[i] + interaction
        values[start:start + len(u)] = np.clip(np.rint(mean + noise.normal(0, NOISE_STD, len(u))), 1, 5)
    return values


# --- the registry ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RatingDatasetEntry:
    name: str
    description: str
    load: Callable[[int], RatingDataset]  # seed -> dataset, with default settings
    source: fetching.WheelSource | None = None  # where a fetched dataset comes from
    generate: Callable[[Any, int], RatingDataset] | None = None  # (mf.synthetic config, seed)

    def fetch(self) -> Path | None:
        return None if self.source is None else fetching.fetch(self.name, self.source)

    def is_fetched(self) -> bool:
        return self.source is None or fetching.is_fetched(self.name, self.source)


RATING_DATASETS: Registry[RatingDatasetEntry] = Registry("rating dataset")


def load_rating_dataset(name_or_path: str, seed: int, synthetic: Any = None, strict: bool = False) -> RatingDataset:
    """A registered rating dataset, or a ratings file given by path.

    ``synthetic`` (attributes ``users, items, ratings, exponent``: the ``mf.synthetic`` section)
    sizes a generated dataset, ``SyntheticRatingsConfig()`` when None; others ignore it.
    ``strict`` applies to a file: duplicate ratings become errors.
    """
    if name_or_path in RATING_DATASETS:
        entry = RATING_DATASETS.get(name_or_path)
        if entry.generate is not None:
            return entry.generate(SyntheticRatingsConfig() if synthetic is None else synthetic, seed)
        return entry.load(seed)
    path = Path(name_or_path).expanduser()
    if path.is_file() or "/" in name_or_path or name_or_path.startswith(".") or path.suffix:
        return read_ratings_file(path, strict)
    RATING_DATASETS.get(name_or_path)  # raises with the list of names and a close match
    raise AssertionError("unreachable")


RATING_DATASETS.register("ml-100k")(RatingDatasetEntry(
    "ml-100k", "MovieLens-100k explicit ratings 1-5: 943 users, 1,682 items, 100k ratings",
    lambda seed: load_movielens_100k_ratings(), movielens.SOURCE,
))
RATING_DATASETS.register("synthetic-zipf")(RatingDatasetEntry(
    "synthetic-zipf", "seeded Zipf-skewed ratings with a planted low-rank model (100k users, 10k items, 1M ratings)",
    lambda seed: synthetic_zipf_from_config(SyntheticRatingsConfig(), seed),
    generate=synthetic_zipf_from_config,
))
