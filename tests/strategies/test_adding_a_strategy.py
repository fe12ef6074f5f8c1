"""Adding a strategy with a setting is one file (tests/strategies/reverse_sync.py: a schedule, its
config section, its contract's settings) and a registration: the task matrix's checks then run it on
every task, in the settings it declares, and it equals its sequential twin (``sync`` replaying its
recorded computation order) bit for bit; its setting is read, checked and refused as any other."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence import api
from cadence.errors import ConfigError
from tests.conftest import make_config
from tests.strategies import reverse_sync
from tests.test_task_matrix import TASK_NAMES, assert_same_model, check_trains, check_twin_equals_sync


@pytest.fixture
def registered():
    reverse_sync.register()
    yield reverse_sync.NAME
    reverse_sync.unregister()


@pytest.mark.parametrize("task", TASK_NAMES)
def test_the_contract_matrix_runs_it_in_the_settings_it_declares(task: str, registered: str, task_data,
                                                                 tmp_path: Path) -> None:
    check_trains(task_data, tmp_path / "trains", task, registered)
    check_twin_equals_sync(task_data, tmp_path / "twin", task, registered)


def test_its_setting_is_read_checked_and_written_with_the_run(registered: str, task_data, tmp_path: Path) -> None:
    result = api.train(make_config(tmp_path / "two", *task_data["mf"], f"strategy={registered}", "reverse.every=2"))
    assert "reverse:\n  every: 2\n" in (result.run_dir / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"^--set reverse.every=-1: reverse.every must not be negative, got -1$"):
        make_config(tmp_path / "bad", *task_data["mf"], f"strategy={registered}", "reverse.every=-1")
    with pytest.raises(ConfigError, match="reverse.every"):  # (read by reverse-sync alone)
        api.train(make_config(tmp_path / "other", *task_data["mf"], "strategy=sync", "reverse.every=2"))


def test_its_section_leaves_with_it(tmp_path: Path) -> None:
    reverse_sync.register()
    reverse_sync.unregister()
    with pytest.raises(ConfigError, match="unknown key 'reverse'"):
        make_config(tmp_path / "gone", "reverse.every=2")


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


def test_every_setting_of_the_strategies_sections_is_declared_by_a_strategy_that_reads_it() -> None:
    """A key no strategy declares (``Strategy.reads``) would pass every run silently: the refusal of
    keys nothing reads (``api.prepare_config``) is only as good as these declarations."""
    from cadence.config import Config, flatten
    from cadence.strategies.catalog import STRATEGIES

    keys = [key for key in flatten(Config().to_dict())
            if key.split(".")[0] in ("shadow", "pdasgd", "adapm", "pipeline")
            or key in ("ps.buffer", "ps.tolerance", "ps.decay", "ps.normalizer", "ps.staleness", "ps.backup_workers")]
    declared = {name: STRATEGIES.get(name).reads for name in STRATEGIES.names()}
    unread = [key for key in keys
              if not any(key == own or key.startswith(own + ".") for reads in declared.values() for own in reads)]
    # (adapm's section is its runtime's, refused by runtime for every other strategy: api._check_foreign_keys)
    assert [key for key in unread if not key.startswith("adapm.")] == []
