"""The CTR data layer: MovieLens-100k from the recbole wheel, the Criteo reader, the synthetic generator."""

from __future__ import annotations

import itertools
import math
import shutil
from pathlib import Path

import pytest
import torch

from cadence.data.criteo import HASHED_BASE, MISSING, read_criteo
from cadence.data.ctr import CTR_DATASETS, PAD, CtrDataset, feature_key, feature_keys, field_of, load_ctr_dataset
from cadence.data.movielens import read_movielens_directory
from cadence.data.synthetic_ctr import SyntheticCtrConfig, planted_logits, synthetic_ctr
from cadence.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def movielens_dir() -> Path:
    return CTR_DATASETS.get("ml-100k").fetch()


@pytest.fixture(scope="module")
def movielens(movielens_dir: Path) -> CtrDataset:
    return load_ctr_dataset("ml-100k", seed=0)


def small_synthetic(seed: int = 0, num_examples: int = 2000) -> CtrDataset:
    return synthetic_ctr(num_examples, num_fields=4, vocab_per_field=500, zipf_exponent=1.1, dim=4, seed=seed)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    ranks = torch.empty(len(scores), dtype=torch.float64)
    ranks[scores.argsort()] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    positives = labels.sum().item()
    negatives = len(labels) - positives
    return ((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)).item()


# --- MovieLens-100k ---------------------------------------------------------------------------------

def test_movielens_100k_loads_every_field(movielens: CtrDataset) -> None:
    examples = movielens.examples
    assert movielens.field_names == ["user_id", "item_id", "age", "gender", "occupation", "zip_prefix",
                                     "release_year"]
    assert movielens.bag_names == ["genres"] and movielens.dense_names == []
    assert len(examples) == 100_000 and examples.dense.shape == (100_000, 0)
    distinct = [len(examples.keys[:, f].unique()) for f in range(7)]
    assert distinct[:2] == [943, 1682] and distinct[3] == 2 and all(d > 1 for d in distinct)
    assert torch.equal(field_of(examples.keys), torch.arange(7).expand(100_000, 7))
    assert 0.5 < examples.labels.mean().item() < 0.6
    assert set(examples.labels.unique().tolist()) == {0.0, 1.0}
    assert examples.timestamps.min() > 800_000_000  # seconds since 1970: 1997-1998


def test_movielens_genres_are_a_padded_bag(movielens: CtrDataset) -> None:
    bags = movielens.examples.bags
    assert bags.shape == (100_000, 1, 6)  # at most 6 genres per movie
    present = bags >= 0
    assert present[:, 0, 0].all(), "every movie has a genre (possibly 'unknown')"
    assert torch.equal(bags[~present], torch.full_like(bags[~present], PAD))
    assert not (present[:, :, 1:] & ~present[:, :, :-1]).any(), "padding only at the end"
    assert (field_of(bags[present]) == 7).all() and len(bags[present].unique()) == 19


def test_movielens_label_is_rating_at_least_four(movielens_dir: Path, tmp_path: Path) -> None:
    small = copy_movielens(movielens_dir, tmp_path, rows=["1\t1\t4\t10", "1\t2\t3.5\t20", "2\t1\t5\t30"])
    dataset = read_movielens_directory(small)
    assert dataset.examples.labels.tolist() == [1.0, 0.0, 1.0]
    assert dataset.examples.timestamps.tolist() == [10, 20, 30]
    keys = dataset.examples.keys
    assert keys[:, 0].tolist() == [feature_key(0, 0), feature_key(0, 0), feature_key(0, 1)]  # first appearance
    assert keys[:, 1].tolist() == [feature_key(1, 0), feature_key(1, 1), feature_key(1, 0)]


def copy_movielens(source: Path, tmp_path: Path, rows: list[str]) -> Path:
    """The real user and item files beside a few interaction rows."""
    target = tmp_path / "ml"
    target.mkdir()
    for kind in ("user", "item"):
        shutil.copy(source / f"ml-100k.{kind}", target / f"ml-100k.{kind}")
    header = (source / "ml-100k.inter").read_text().splitlines()[0]
    (target / "ml-100k.inter").write_text("\n".join([header, *rows]) + "\n")
    return target


@pytest.mark.parametrize("kind, bad_row, message", [
    ("inter", "1\t1\t4", "expected 4 tab-separated columns, found 3"),
    ("inter", "1\t1\tgood\t10", "rating 'good' is not a number"),
    ("inter", "1\t1\t4\tyesterday", "timestamp 'yesterday' is not a number"),
    ("inter", "9999\t1\t4\t10", "user '9999' is not in ml-100k.user"),
    ("inter", "1\t9999\t4\t10", "item '9999' is not in ml-100k.item"),
    ("user", "1\t30\tF\twriter\t12345", "duplicate user '1'"),
    ("item", "1\tToy Story\t1995", "expected 4 tab-separated columns, found 3"),
])
def test_movielens_bad_row_names_file_and_line(movielens_dir: Path, tmp_path: Path, kind: str, bad_row: str,
                                               message: str) -> None:
    directory = copy_movielens(movielens_dir, tmp_path, rows=["1\t1\t4\t10", "2\t2\t3\t20"])
    path = directory / f"ml-100k.{kind}"
    lines = path.read_text().splitlines()
    lines.insert(2, bad_row)  # becomes line 3 of the file
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message) as caught:
        read_movielens_directory(directory)
    assert (caught.value.path, caught.value.line) == (str(path), 3)


# --- keys and splits ---------------------------------------------------------------------------------

def test_feature_keys_are_distinct_across_fields() -> None:
    assert feature_key(0, 1) != feature_key(1, 0) and feature_key(1, 0) == 1 << 40
    assert torch.equal(feature_keys(3, torch.tensor([0, 7])), torch.tensor([feature_key(3, 0), feature_key(3, 7)]))
    assert field_of(torch.tensor([feature_key(5, (1 << 40) - 1)])).item() == 5
    with pytest.raises(ValueError):
        feature_key(0, 1 << 40)


def test_random_split_sizes_and_determinism(movielens: CtrDataset) -> None:
    train, valid, test = movielens.random_split(seed=1)
    assert (len(train), len(valid), len(test)) == (80_000, 10_000, 10_000)
    again = movielens.random_split(seed=1)
    assert all(torch.equal(a.keys, b.keys) for a, b in zip((train, valid, test), again, strict=True))
    assert not torch.equal(movielens.random_split(seed=2)[0].keys, train.keys)

    dataset = small_synthetic()  # timestamps = example index: identify the rows
    parts = dataset.random_split(seed=3, fractions=(0.5, 0.3, 0.2))
    assert [len(p) for p in parts] == [1000, 600, 400]
    assert torch.equal(torch.cat([p.timestamps for p in parts]).sort().values, torch.arange(2000))
    assert all(torch.equal(p.timestamps, p.timestamps.sort().values) for p in parts), "source order kept"
    with pytest.raises(ConfigError, match="summing to 1"):
        dataset.random_split(seed=0, fractions=(0.5, 0.5, 0.5))


def test_periods_are_time_ordered_consecutive_and_cover_everything(movielens: CtrDataset) -> None:
    periods = movielens.periods(7)
    assert [len(p) for p in periods] == [14_286] * 5 + [14_285] * 2
    stamps = torch.cat([p.timestamps for p in periods])
    assert torch.equal(stamps, movielens.examples.timestamps.sort().values)
    assert all(a.timestamps.max() <= b.timestamps.min() for a, b in itertools.pairwise(periods))

    dataset = small_synthetic(num_examples=10)
    shuffled = dataset.examples.subset(torch.randperm(10, generator=torch.Generator().manual_seed(0)))
    dataset.examples = shuffled
    assert [p.timestamps.tolist() for p in dataset.periods(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(ConfigError):
        dataset.periods(11)


def test_unknown_name_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown ctr dataset 'ml-10k' \(did you mean 'ml-100k'\?\)"):
        load_ctr_dataset("ml-10k", seed=0)
    with pytest.raises(DataError, match="file not found"):
        load_ctr_dataset(str(tmp_path / "day_0.tsv"), seed=0)


# --- Criteo ------------------------------------------------------------------------------------------

def criteo_line(label: str = "1", dense: list[str] | None = None, cats: list[str] | None = None) -> str:
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *dense, *cats])


def test_criteo_reader_parses_keys_and_dense_values(tmp_path: Path) -> None:
    path = tmp_path / "day_0.tsv"
    second_dense = ["", "-3", "7"] + ["0"] * 10
    second_cats = ["68fd1e64", "", "not-hex"] + ["ABCDEF01"] * 23
    path.write_text(criteo_line() + "\n\n" + criteo_line("0", second_dense, second_cats) + "\n" + criteo_line())
    dataset = load_ctr_dataset(str(path), seed=0)
    examples = dataset.examples
    assert dataset.field_names[0] == "C1" and dataset.dense_names[-1] == "I13"
    assert len(examples) == 3 and examples.labels.tolist() == [1.0, 0.0, 1.0]
    assert examples.keys.shape == (3, 26) and examples.bags.shape == (3, 0, 0)
    assert examples.keys[0].tolist() == [feature_key(c, c) for c in range(26)]
    second = examples.keys[1].tolist()
    assert second[:2] == [feature_key(0, 0x68FD1E64), feature_key(1, MISSING)]
    assert HASHED_BASE <= second[2] - feature_key(2, 0) < MISSING and second[3] == feature_key(3, 0xABCDEF01)
    assert torch.allclose(examples.dense[0], torch.log1p(torch.arange(13.0)))
    assert examples.dense[1, :3].tolist() == [0.0, 0.0, pytest.approx(math.log(8))]  # empty and -3 -> 0
    assert len(read_criteo(path, max_rows=2).examples) == 2


@pytest.mark.parametrize("bad_line, message", [
    (criteo_line()[:-9], "expected 40 tab-separated columns .* found 39"),
    (criteo_line(label="2"), "label '2' is not 0 or 1"),
    (criteo_line(dense=["1.5"] + ["0"] * 12), "I1 value '1.5' is not an integer"),
    (criteo_line(dense=["0", "x"] + ["0"] * 11), "I2 value 'x' is not an integer"),
])
def test_criteo_bad_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = tmp_path / "bad.tsv"
    path.write_text(criteo_line() + "\n" + bad_line + "\n")
    with pytest.raises(DataError, match=message) as caught:
        read_criteo(path)
    assert (caught.value.path, caught.value.line) == (str(path), 2)


def test_criteo_rejects_non_utf8_and_empty_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    path.write_bytes(criteo_line().encode() + b"\n\xff\n")
    with pytest.raises(DataError, match="not UTF-8") as caught:
        read_criteo(path)
    assert caught.value.line == 2
    path.write_text("\n")
    with pytest.raises(DataError, match="no examples"):
        read_criteo(path)


# --- synthetic ---------------------------------------------------------------------------------------

def test_synthetic_ctr_is_seeded_skewed_and_learnable() -> None:
    first, second = small_synthetic(seed=5), small_synthetic(seed=5)
    assert torch.equal(first.examples.keys, second.examples.keys)
    assert torch.equal(first.examples.labels, second.examples.labels)
    assert not torch.equal(small_synthetic(seed=6).examples.keys, first.examples.keys)
    assert torch.equal(field_of(first.examples.keys), torch.arange(4).expand(2000, 4))
    assert torch.equal(first.examples.timestamps, torch.arange(2000))

    dataset = synthetic_ctr(50_000, num_fields=3, vocab_per_field=10_000, zipf_exponent=1.1, dim=4, seed=0)
    counts = dataset.examples.keys[:, 0].unique(return_counts=True)[1].sort(descending=True).values
    assert counts[:100].sum() / 50_000 > 0.4, "the top 1% of a field's values take a large share"
    logits = torch.from_numpy(planted_logits(dataset.examples.keys.numpy(), dim=4, seed=0))
    assert auc(logits, dataset.examples.labels) > 0.75, "labels follow the planted model"
    assert 0.2 < dataset.examples.labels.mean().item() < 0.6


def test_synthetic_ctr_is_registered_and_sized_by_a_config() -> None:
    config = SyntheticCtrConfig(num_examples=300, num_fields=2, vocab_per_field=50, dim=2)
    dataset = load_ctr_dataset("synthetic-ctr", seed=0, synthetic_config=config)
    assert dataset.examples.keys.shape == (300, 2) and int((dataset.examples.keys & ((1 << 40) - 1)).max()) < 50
    with pytest.raises(ConfigError, match="num_fields must be at least 1"):
        synthetic_ctr(10, num_fields=0, vocab_per_field=5, zipf_exponent=1.0, dim=2, seed=0)
