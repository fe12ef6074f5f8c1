"""Reading graph directories: ids, policies for inconsistent input, and every bad-input error."""

from pathlib import Path

import pytest

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
