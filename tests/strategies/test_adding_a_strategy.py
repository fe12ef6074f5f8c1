"""Adding a strategy is one file (tests/strategies/reverse_sync.py) and a registration: the task
matrix then runs it on every task, and it equals its sequential twin (``sync`` replaying its
recorded computation order) bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence import api
from cadence.errors import ConfigError
from tests.conftest import make_config
from tests.strategies import reverse_sync
from tests.test_task_matrix import TASK_NAMES, assert_same_model


@pytest.fixture
def registered():
    reverse_sync.register()
    yield reverse_sync.NAME
    reverse_sync.unregister()


@pytest.mark.parametrize("task", TASK_NAMES)
def test_a_strategy_in_one_file_runs_every_task_and_equals_its_sequential_twin(task: str, registered: str,
                                                                               task_data, tmp_path: Path) -> None:
    order = tmp_path / "order.jsonl"
    added = api.train(make_config(tmp_path / "added", *task_data[task], f"strategy={registered}",
                                  f"record_order={order}"))
    assert added.summary["strategy"] == registered and added.summary["runtime"] == "pipeline"
    first = [line for line in order.read_text().splitlines() if '"epoch": 0' in line]
    assert '"index": 0,' in first[-1]  # (it really ran last plan first)
    twin = api.train(make_config(tmp_path / "twin", *task_data[task], "strategy=sync", f"batch_order={order}"))
    assert_same_model(added.run_dir, twin.run_dir)


def test_its_runtime_keys_and_errors_come_with_its_family(registered: str, task_data, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"strategy {registered} runs in one process"):
        api.train(make_config(tmp_path / "four", *task_data["mf"], f"strategy={registered}", "ps.workers=4"))
    with pytest.raises(ConfigError, match="ps.shards applies to the parameter-server runtime"):
        api.train(make_config(tmp_path / "shards", *task_data["mf"], f"strategy={registered}", "ps.shards=2"))


def test_an_unregistered_strategy_is_an_error_naming_the_key(tmp_path: Path, task_data) -> None:
    with pytest.raises(ConfigError, match="strategy=reverse-sync: unknown strategy 'reverse-sync'"):
        api.train(make_config(tmp_path / "none", *task_data["mf"], "strategy=reverse-sync"))
