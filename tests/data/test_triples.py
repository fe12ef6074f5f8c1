"""Reading graph directories: ids, policies for inconsistent input, and every bad-input error."""

import random
from pathlib import Path

import pytest
import torch

from cadence.data.triples import read_graph_directory, with_reciprocals
from cadence.errors import DataError
from tests.conftest import write_graph

TRAIN = [("a", "likes", "b"), ("b", "likes", "c"), ("c", "hates", "a")]


def test_ids_follow_sorted_names(tmp_path: Path) -> None:
    graph = read_graph_directory(write_graph(tmp_path / "g", TRAIN, [("a", "hates", "c")], [("b", "likes", "a")]))
    assert graph.entity_names == ["a", "b", "c"] and graph.relation_names == ["hates", "likes"]
    assert graph.train.tolist() == [[0, 1, 1], [1, 1, 2], [2, 0, 0]]
    assert graph.valid.tolist() == [[0, 0, 2]] and graph.test.tolist() == [[1, 1, 0]]


@pytest.mark.parametrize("content, line, message", [
    ("a\tlikes\tb\nb\tlikes\n", 2, "expected 3 tab-separated fields"),
    ("a\tlikes\tb\na likes c\n", 2, "found 1"),
    ("a\tlikes\tb\n\tlikes\tc\n", 2, "empty field"),
    ("a\tlikes\tb\nb\tlikes\tc\td\n", 2, "found 4"),
])
def test_malformed_line_names_file_and_line(tmp_path: Path, content: str, line: int, message: str) -> None:
    directory = write_graph(tmp_path / "g", TRAIN, TRAIN[:1], TRAIN[:1])
    (directory / "train.txt").write_text(content)
    with pytest.raises(DataError, match=message) as caught:
        read_graph_directory(directory)
    assert caught.value.line == line and caught.value.path.endswith("train.txt")
    assert f"train.txt:{line}:" in str(caught.value)


def test_non_utf8_bytes(tmp_path: Path) -> None:
    directory = write_graph(tmp_path / "g", TRAIN, TRAIN[:1], TRAIN[:1])
    (directory / "valid.txt").write_bytes(b"a\tlikes\tb\n\xff\xfe\tlikes\tc\n")
    with pytest.raises(DataError, match=r"valid.txt:2: not UTF-8"):
        read_graph_directory(directory)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    directory = write_graph(tmp_path / "g", TRAIN, TRAIN[:1], TRAIN[:1])
    (directory / "test.txt").write_text("\n\n")
    with pytest.raises(DataError, match=r"test.txt: file is empty"):
        read_graph_directory(directory)
    (directory / "test.txt").unlink()
    with pytest.raises(DataError, match=r"test.txt: file not found"):
        read_graph_directory(directory)
    with pytest.raises(DataError, match="dataset directory not found"):
        read_graph_directory(tmp_path / "nowhere")


def test_a_byte_order_mark_is_not_part_of_the_first_name(tmp_path: Path) -> None:
    """Editors on Windows start UTF-8 files with a BOM; read as text it would make a new entity
    '\ufeffa' beside 'a'."""
    directory = write_graph(tmp_path / "g", TRAIN, [("a", "hates", "c")], [("b", "likes", "a")])
    for name in ("train.txt", "valid.txt"):
        (directory / name).write_bytes(b"\xef\xbb\xbf" + (directory / name).read_bytes())
    graph = read_graph_directory(directory)
    assert graph.entity_names == ["a", "b", "c"] and graph.relation_names == ["hates", "likes"]
    assert graph.train.tolist() == [[0, 1, 1], [1, 1, 2], [2, 0, 0]] and graph.valid.tolist() == [[0, 0, 2]]


def test_a_directory_where_a_file_belongs_is_named_as_such(tmp_path: Path) -> None:
    directory = write_graph(tmp_path / "g", TRAIN, TRAIN[:1], TRAIN[:1])
    (directory / "test.txt").unlink()
    (directory / "test.txt").mkdir()
    with pytest.raises(DataError, match=r"test.txt: is a directory, where a file was expected"):
        read_graph_directory(directory)


def test_unseen_entities_are_filtered_with_a_count_or_rejected_when_strict(tmp_path: Path, caplog) -> None:
    valid = [("a", "hates", "c"), ("a", "likes", "zed"), ("b", "unknown", "c")]
    directory = write_graph(tmp_path / "g", TRAIN, valid, [("b", "likes", "a")])
    graph = read_graph_directory(directory)
    assert graph.valid.shape[0] == 1 and graph.notes == {"valid_unseen_dropped": 2}
    assert "dropped 2 triples with an entity or relation unseen in train" in caplog.text
    with pytest.raises(DataError, match=r"valid.txt:2: 'zed' does not occur in train.txt"):
        read_graph_directory(directory, strict=True)


def test_duplicates_are_dropped_or_rejected_when_strict(tmp_path: Path) -> None:
    directory = write_graph(tmp_path / "g", TRAIN + [TRAIN[0]], [TRAIN[1], ("a", "hates", "c")], [("b", "likes", "a")])
    graph = read_graph_directory(directory)
    assert graph.train.shape[0] == 3 and graph.valid.shape[0] == 1
    assert graph.notes == {"train_duplicate_dropped": 1, "valid_duplicate_dropped": 1}
    with pytest.raises(DataError, match=r"train.txt:4: duplicate triple"):
        read_graph_directory(directory, strict=True)


def test_a_split_left_empty_by_filtering_is_an_error(tmp_path: Path) -> None:
    directory = write_graph(tmp_path / "g", TRAIN, [("x", "likes", "y")], [("b", "likes", "a")])
    with pytest.raises(DataError, match="valid.txt: no usable triples left"):
        read_graph_directory(directory)


def test_reciprocals_invert_each_triple() -> None:
    import torch

    triples = torch.tensor([[0, 1, 2], [3, 0, 4]])
    assert with_reciprocals(triples, 2).tolist() == [[0, 1, 2], [3, 0, 4], [2, 3, 0], [4, 2, 3]]


# ---- the column reader against the line reader -----------------------------------------------------------
def both_readers(directory: Path, strict: bool):
    """(what ``read_graph_directory`` gives, what the line reader alone gives): a graph or a DataError's text."""
    from cadence.data import triples

    def outcome(read):
        try:
            return read(directory, strict, None)
        except DataError as err:
            return str(err)

    return outcome(lambda d, s, n: read_graph_directory(d, s, n)), outcome(triples._read_lines)


def assert_same_graph(got, expected) -> None:
    if isinstance(expected, str):
        assert got == expected
        return
    for part in ("num_entities", "num_relations", "entity_names", "relation_names", "notes"):
        assert getattr(got, part) == getattr(expected, part), part
    for split in ("train", "valid", "test"):
        assert torch.equal(got.split(split), expected.split(split)), split


def messy_graph(directory: Path, seed: int, clean: bool) -> Path:
    """Random triples over a few names (unicode ones too) with duplicates, valid/test triples unseen in
    train or already in it, a byte-order mark, CRLF endings and spaces around fields; unless ``clean``,
    also a header line, blank lines, a line of 2 fields, an empty field or bytes that are not UTF-8."""
    rng = random.Random(seed)
    entities = [f"e{i}" for i in range(12)] + ["naïve", "日本", "a b"]
    relations = ["r0", "r1", "likes"]
    directory.mkdir(parents=True)
    for split, size in (("train", 60), ("valid", 15), ("test", 15)):
        pool = entities if split == "train" else entities + ["never-in-train"]
        lines = [f"{rng.choice(pool)}\t{rng.choice(relations)}\t{rng.choice(pool)}" for _ in range(size)]
        lines = [rng.choice(["", " ", "  "]) + line.replace("\t", rng.choice(["\t", " \t", "\t "]), 1) for line in lines]
        end = rng.choice(["\n", "\r\n"])
        text = end.join(lines) + rng.choice([end, ""])
        data = (b"\xef\xbb\xbf" if rng.random() < 0.3 else b"") + text.encode()
        if not clean:
            flaw = rng.choice(["header", "blank", "fields", "empty", "bytes", "trailing-blank"])
            data = {"header": b"head\trelation\ttail\n" + data, "blank": data.replace(b"\n", b"\n\n", 1),
                    "fields": data + b"\na\tb\n", "empty": data + b"\n\tr0\te1\n", "bytes": data + b"\n\xff\tr\tx\n",
                    "trailing-blank": data + b"\n \n"}[flaw]
        (directory / f"{split}.txt").write_bytes(data)
    return directory


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_the_column_reader_gives_the_line_readers_graph(tmp_path: Path, seed: int, strict: bool) -> None:
    from cadence.data import triples

    directory = messy_graph(tmp_path / "g", seed, clean=True)
    if not strict:  # irregular only in what strict refuses: the columns read these themselves
        assert_same_graph(triples._read_columns(directory, False, None, False), triples._read_lines(directory, False, None))
    assert_same_graph(*both_readers(directory, strict))
    flawed = messy_graph(tmp_path / "f", seed, clean=False)
    assert_same_graph(*both_readers(flawed, strict))


def test_lines_cut_by_the_block_boundary_are_read_whole(tmp_path: Path, monkeypatch) -> None:
    from cadence.data import triples

    directory = messy_graph(tmp_path / "g", 3, clean=True)
    expected = triples._read_lines(directory, False, None)
    for size in (1, 5, 7, 64):  # shorter than a line, and a few lines
        monkeypatch.setattr(triples, "BLOCK_BYTES", size)
        assert_same_graph(triples._read_columns(directory, False, None, False), expected)


def test_a_large_file_shows_a_progress_bar_of_its_bytes(tmp_path: Path, monkeypatch, capsys) -> None:
    from cadence.data import triples

    directory = messy_graph(tmp_path / "g", 5, clean=True)
    size = (directory / "train.txt").stat().st_size
    monkeypatch.setattr(triples, "PROGRESS_BYTES", size)  # train.txt is large enough, valid and test are not
    read_graph_directory(directory, progress=True)
    shown = capsys.readouterr().err
    assert "reading train.txt" in shown and "reading valid.txt" not in shown and "B/s" in shown
    read_graph_directory(directory, progress=False)
    assert "reading" not in capsys.readouterr().err
