"""Recorded computation orders: replayed exactly, and bad order files rejected with file and line."""

import json
from pathlib import Path

import pytest

from cadence import api
from cadence.errors import DataError
from tests.conftest import make_config


def test_sync_records_plan_order_and_replays_a_given_order(tiny_graph: Path, tmp_path: Path) -> None:
    order = tmp_path / "order.jsonl"
    api.train(make_config(tmp_path / "a", f"data.dataset={tiny_graph}", f"record_order={order}"))
    entries = [json.loads(line) for line in order.read_text().splitlines()]
    assert [e["index"] for e in entries if e["epoch"] == 0] == list(range(7))  # 220 / 32 batches
    reversed_order = tmp_path / "reversed.jsonl"
    recorded_again = tmp_path / "again.jsonl"
    reversed_order.write_text("".join(json.dumps({"epoch": e, "index": i}) + "\n"
                                      for e in (0, 1) for i in reversed(range(7))))
    api.train(make_config(tmp_path / "b", f"data.dataset={tiny_graph}", f"batch_order={reversed_order}",
                          f"record_order={recorded_again}"))
    replayed = [json.loads(line) for line in recorded_again.read_text().splitlines()]
    assert [e["index"] for e in replayed] == list(reversed(range(7))) * 2


@pytest.mark.parametrize("content, message", [
    ('{"epoch": 0, "index": 0}\nnot json\n', r"order.jsonl:2: expected a JSON object"),
    ('{"epoch": 0, "index": 0}\n', r"epoch 0 of the recorded order does not list each of its 7 batches"),
    ("", "batch order file is empty"),
])
def test_bad_order_files(tiny_graph: Path, tmp_path: Path, content: str, message: str) -> None:
    order = tmp_path / "order.jsonl"
    order.write_text(content)
    with pytest.raises(DataError, match=message):
        api.train(make_config(tmp_path / "run", f"data.dataset={tiny_graph}", f"batch_order={order}"))
    assert not (tmp_path / "run").exists()  # rejected before anything was written


def test_an_order_whose_epochs_differ_in_batch_count_replays(task_data, tmp_path: Path) -> None:
    """word2vec's subsampling keeps other tokens each epoch, so its epochs have other batch counts:
    each epoch of a recorded order is checked against that epoch's own plan."""
    order = tmp_path / "order.jsonl"
    first = api.train(make_config(tmp_path / "a", *task_data["w2v"], "train.epochs=3", f"record_order={order}"))
    counts = {epoch: sum(json.loads(line)["epoch"] == epoch for line in order.read_text().splitlines())
              for epoch in range(3)}
    assert len(set(counts.values())) > 1, counts  # (the case this checks)
    again = api.train(make_config(tmp_path / "b", *task_data["w2v"], "train.epochs=3", f"batch_order={order}"))
    assert [again.summary[k] for k in ("train_loss", "wordsim353")] == [first.summary[k] for k in ("train_loss", "wordsim353")]
