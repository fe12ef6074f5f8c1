"""Rating data for matrix factorization: MovieLens-100k, the ratings-file reader, splits, the generator."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cadence.data.ctr import CTR_DATASETS
from cadence.data.ratings import (
    RATING_DATASETS, RatingDataset, Ratings, load_rating_dataset, read_ratings_file, synthetic_zipf,
)
from cadence.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def movielens() -> RatingDataset:
    return load_rating_dataset("ml-100k", seed=0)


def write_lines(path: Path, *lines: str | bytes) -> Path:
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


def cells(ratings: Ratings, num_items: int) -> torch.Tensor:
    """One int64 code per (user, item) cell."""
    return ratings.users * num_items + ratings.items


def source_positions(dataset: RatingDataset, part: Ratings) -> torch.Tensor:
    """Where each rating of ``part`` sits in ``dataset.ratings`` (cells are distinct)."""
    everything = cells(dataset.ratings, dataset.num_items)
    order = everything.argsort()
    return order[torch.searchsorted(everything[order], cells(part, dataset.num_items))]


def small_synthetic(seed: int = 0, exponent: float = 1.1) -> RatingDataset:
    return synthetic_zipf(users=2000, items=500, ratings=20_000, exponent=exponent, seed=seed)


# --- MovieLens-100k -----------------------------------------------------------------------------------

def test_movielens_100k_counts(movielens: RatingDataset) -> None:
    ratings = movielens.ratings
    assert (movielens.num_users, movielens.num_items, len(ratings)) == (943, 1682, 100_000)
    assert ratings.users.dtype == ratings.items.dtype == ratings.timestamps.dtype == torch.int64
    assert ratings.values.dtype == torch.float32
    assert set(ratings.values.unique().tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert 3.4 < ratings.values.mean().item() < 3.7
    assert ratings.timestamps.min() > 800_000_000  # seconds since 1970: 1997-1998
    assert len(cells(ratings, movielens.num_items).unique()) == 100_000


def test_movielens_rows_match_the_raw_file_and_number_by_first_appearance(movielens: RatingDataset) -> None:
    inter = RATING_DATASETS.get("ml-100k").fetch() / "ml-100k.inter"
    raw = [line.split("\t") for line in inter.read_text().splitlines()[1:] if line.strip()]
    ratings = movielens.ratings
    for n in (0, 1, 4_999, 54_321, 99_999):
        user, item, rating, timestamp = raw[n]
        assert movielens.user_ids[ratings.users[n]] == user and movielens.item_ids[ratings.items[n]] == item
        assert ratings.values[n].item() == float(rating) and ratings.timestamps[n].item() == int(timestamp)
    for index in (ratings.users, ratings.items):
        first_seen = [int((index == i).nonzero()[0]) for i in range(50)]
        assert first_seen == sorted(first_seen) and first_seen[0] == 0


def test_movielens_shares_the_ctr_dataset_files() -> None:
    assert RATING_DATASETS.get("ml-100k").fetch() == CTR_DATASETS.get("ml-100k").fetch()
    assert RATING_DATASETS.get("ml-100k").is_fetched()


# --- splits ---------------------------------------------------------------------------------------------

def test_random_split_sizes_disjoint_in_source_order(movielens: RatingDataset) -> None:
    parts = movielens.random_split(seed=3)
    assert [len(p) for p in parts] == [80_000, 10_000, 10_000]
    positions = [source_positions(movielens, p) for p in parts]
    assert torch.equal(torch.cat(positions).sort().values, torch.arange(100_000))
    for p in positions:
        assert bool((p[1:] > p[:-1]).all())


def test_random_split_is_deterministic_in_the_seed(movielens: RatingDataset) -> None:
    first, again, other = (movielens.random_split(seed=s)[2] for s in (3, 3, 4))
    assert torch.equal(first.users, again.users) and torch.equal(first.items, again.items)
    assert not torch.equal(cells(first, 1682), cells(other, 1682))
    with pytest.raises(ConfigError, match="fractions"):
        movielens.random_split(seed=0, fractions=(0.8, 0.3, 0.1))


def test_folds_test_every_rating_exactly_once(movielens: RatingDataset) -> None:
    k, tested = 5, []
    for fold in range(k):
        train, valid, test = movielens.folds(k, fold, seed=7, valid_fraction=0.1)
        parts = [source_positions(movielens, p) for p in (train, valid, test)]
        assert torch.equal(torch.cat(parts).sort().values, torch.arange(100_000))
        assert len(test) == 20_000 and len(valid) == 8_000 and len(train) == 72_000
        assert all(bool((p[1:] > p[:-1]).all()) for p in parts)
        tested.append(parts[2])
    assert torch.equal(torch.cat(tested).sort().values, torch.arange(100_000))
    again = movielens.folds(k, 2, seed=7)
    assert torch.equal(source_positions(movielens, again[2]), tested[2])
    assert not torch.equal(source_positions(movielens, movielens.folds(k, 2, seed=8)[2]), tested[2])


@pytest.mark.parametrize(("k", "fold", "key"), [(5, 5, "mf.fold"), (5, -1, "mf.fold"), (1, 0, "mf.folds"),
                                               (200_000, 0, "mf.folds")])
def test_folds_out_of_range_name_the_key(movielens: RatingDataset, k: int, fold: int, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key}\b"):
        movielens.folds(k, fold, seed=0)


def test_write_id_maps(movielens: RatingDataset, tmp_path: Path) -> None:
    movielens.write_id_maps(tmp_path)
    for kind, names in (("user", movielens.user_ids), ("item", movielens.item_ids)):
        lines = (tmp_path / f"{kind}_ids.tsv").read_text(encoding="utf-8").splitlines()
        assert lines == [f"{i}\t{name}" for i, name in enumerate(names)]


# --- the ratings-file reader ---------------------------------------------------------------------------

def test_file_reader_happy_path(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "r.tsv", "# user item rating time", "alice\tdune\t4.5\t100", "",
                       "bob\tdune\t2", "alice\tbrazil\t5\t300", "  ", "carol\talien\t1\t-5")
    data = load_rating_dataset(str(path), seed=0)
    assert data.user_ids == ["alice", "bob", "carol"] and data.item_ids == ["dune", "brazil", "alien"]
    assert data.ratings.users.tolist() == [0, 1, 0, 2] and data.ratings.items.tolist() == [0, 0, 1, 2]
    assert data.ratings.values.tolist() == [4.5, 2.0, 5.0, 1.0]
    assert data.ratings.timestamps.tolist() == [100, 0, 300, -5]
    assert data.num_users == 3 and data.num_items == 3 and data.notes == {}


@pytest.mark.parametrize(("line", "reason"), [
    ("a\tb", "expected 3 or 4"),
    ("a\tb\t3\t4\t5", "expected 3 or 4"),
    ("a b 3", "expected 3 or 4"),
    ("a\tb\tgood", "rating 'good' is not a number"),
    ("a\tb\tnan", "not a finite number"),
    ("a\tb\tinf", "not a finite number"),
    ("a\tb\t3\tyesterday", "timestamp 'yesterday' is not an integer"),
    ("a\tb\t3\t1.5", "not an integer"),
    ("\tb\t3", "empty field"),
    (b"a\t\xff\t3", "not UTF-8"),
])
def test_file_reader_errors_name_the_line(tmp_path: Path, line: str | bytes, reason: str) -> None:
    path = write_lines(tmp_path / "r.tsv", "x\ty\t1", "# a comment", line, "z\ty\t2")
    with pytest.raises(DataError, match=reason) as caught:
        read_ratings_file(path)
    assert caught.value.line == 3 and caught.value.path == str(path)
    assert str(caught.value).startswith(f"{path}:3: ")


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = write_lines(tmp_path / "empty.tsv", "# only a comment", "")
    with pytest.raises(DataError, match="empty"):
        read_ratings_file(empty)
    with pytest.raises(DataError, match="not found"):
        load_rating_dataset(str(tmp_path / "missing.tsv"), seed=0)
    with pytest.raises(DataError, match="not found"):
        load_rating_dataset("./nothing-here", seed=0)
    with pytest.raises(ConfigError, match="ml-100k"):
        load_rating_dataset("ml-100j", seed=0)


def test_duplicates_are_dropped_with_a_count_or_rejected_when_strict(tmp_path: Path, caplog) -> None:
    path = write_lines(tmp_path / "dup.tsv", "u1\ti1\t4", "u2\ti1\t3", "u1\ti1\t1", "u1\ti2\t2", "u2\ti1\t5")
    with caplog.at_level(logging.WARNING, logger="cadence"):
        data = read_ratings_file(path)
    assert data.ratings.values.tolist() == [4.0, 3.0, 2.0]  # the first rating of each pair is kept
    assert data.notes == {"duplicate_ratings_dropped": 2}
    assert "dropped 2 duplicate" in caplog.text
    with pytest.raises(DataError, match=r"duplicate.*first on line 1") as caught:
        load_rating_dataset(str(path), seed=0, strict=True)
    assert caught.value.line == 3


# --- the synthetic generator ---------------------------------------------------------------------------

def test_synthetic_is_deterministic_shaped_and_distinct() -> None:
    data, again, other = small_synthetic(0), small_synthetic(0), small_synthetic(1)
    ratings = data.ratings
    assert (data.num_users, data.num_items, len(ratings)) == (2000, 500, 20_000)
    assert len(data.user_ids) == 2000 and len(set(data.item_ids)) == 500
    for name in ("users", "items", "values", "timestamps"):
        assert torch.equal(getattr(ratings, name), getattr(again.ratings, name))
    assert not torch.equal(ratings.users, other.ratings.users)
    assert len(cells(ratings, 500).unique()) == 20_000
    assert 0 <= ratings.users.min() and ratings.users.max() < 2000 and ratings.items.max() < 500
    assert set(ratings.values.unique().tolist()) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert ratings.values.dtype == torch.float32 and ratings.users.dtype == torch.int64


def top_share(index: torch.Tensor, size: int, fraction: float) -> float:
    """The share of ratings held by the most active ``fraction`` of users (or items)."""
    counts = torch.bincount(index, minlength=size).sort(descending=True).values
    return counts[: int(fraction * size)].sum().item() / counts.sum().item()


def test_synthetic_popularity_is_zipf_skewed() -> None:
    skewed, uniform = small_synthetic(exponent=1.1).ratings, small_synthetic(exponent=0.0).ratings
    assert top_share(skewed.users, 2000, 0.1) > 0.4 and top_share(uniform.users, 2000, 0.1) < 0.2
    assert top_share(skewed.items, 500, 0.1) > 0.4 and top_share(uniform.items, 500, 0.1) < 0.2
    counts = torch.bincount(skewed.users, minlength=2000).sort(descending=True).values.double()
    assert counts[0] > 5 * counts[100] > 5 * counts[1000]  # a long head-to-tail decay


def test_synthetic_ratings_have_learnable_structure() -> None:
    data = small_synthetic(seed=2)
    train, _, test = data.random_split(seed=0, fractions=(0.8, 0.0, 0.2))
    mean = train.values.mean()
    # user and item biases, fitted on train by a few alternating passes of shrunk averages
    def shrunk_mean(index: torch.Tensor, residual: torch.Tensor, size: int) -> torch.Tensor:
        return torch.bincount(index, residual, size) / (torch.bincount(index, minlength=size) + 5)

    user_bias, item_bias = torch.zeros(data.num_users), torch.zeros(data.num_items)
    for _ in range(5):
        user_bias = shrunk_mean(train.users, train.values - mean - item_bias[train.items], data.num_users)
        item_bias = shrunk_mean(train.items, train.values - mean - user_bias[train.users], data.num_items)
    predicted = mean + user_bias[test.users] + item_bias[test.items]
    baseline = (test.values - mean).pow(2).mean().sqrt()
    assert (test.values - predicted).pow(2).mean().sqrt() < 0.9 * baseline


def test_synthetic_through_the_registry_and_its_config() -> None:
    size = SimpleNamespace(users=300, items=40, ratings=1000, exponent=1.1)
    data = load_rating_dataset("synthetic-zipf", seed=5, synthetic=size)
    assert (data.num_users, data.num_items, len(data.ratings)) == (300, 40, 1000)
    default = load_rating_dataset("synthetic-zipf", seed=5)
    assert (default.num_users, default.num_items, len(default.ratings)) == (100_000, 10_000, 1_000_000)
    with pytest.raises(ConfigError, match="mf.synthetic.ratings"):
        synthetic_zipf(users=10, items=10, ratings=60, exponent=1.1, seed=0)
    assert set(RATING_DATASETS.names()) >= {"ml-100k", "synthetic-zipf"}


def test_generated_ids_are_the_numbers_without_holding_them(tmp_path: Path) -> None:
    """A generated set's raw ids read, slice, iterate, fingerprint and write exactly like the list
    of strings "0" .. "n-1" (the reference), without holding n strings."""
    from cadence.data.fingerprint import digest
    from cadence.data.ratings import NumberedIds

    data = synthetic_zipf(users=300, items=40, ratings=1000, exponent=1.1, seed=0)
    for ids, count in ((data.user_ids, 300), (data.item_ids, 40)):
        reference = [str(i) for i in range(count)]
        assert isinstance(ids, NumberedIds) and len(ids) == count
        assert list(ids) == reference and ids[7] == "7" and ids[-1] == reference[-1] and ids[3:9:2] == reference[3:9:2]
        assert digest(ids) == digest(reference)
        with pytest.raises(IndexError):
            ids[count]
    data.write_id_maps(tmp_path)
    assert (tmp_path / "item_ids.tsv").read_text() == "".join(f"{i}\t{i}\n" for i in range(40))
