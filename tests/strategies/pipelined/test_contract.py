"""Contract tests run over every registered pipeline schedule.

Every schedule must train on tiny data and, in the degenerate setting it declares
(``Schedule.contract.twin``), equal its sequential twin (the sync strategy) bit for bit. A schedule
registered without one fails the meta-test, so no schedule lands untested.
"""

from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.strategies.pipelined.base import SCHEDULES as STRATEGIES
from cadence.training.run_directory import RunDirectory
from tests.conftest import make_config

def test_every_registered_schedule_declares_a_degenerate_setting() -> None:
    assert [name for name in STRATEGIES.names() if STRATEGIES.get(name).contract.twin is None] == []


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_degenerate_setting_equals_the_sync_twin(name: str, tiny_graph: Path, tmp_path: Path) -> None:
    sync = api.train(make_config(tmp_path / "sync", f"data.dataset={tiny_graph}"))
    other = api.train(make_config(tmp_path / f"strategy-{name}", f"data.dataset={tiny_graph}", f"strategy={name}",
                                  *STRATEGIES.get(name).contract.twin))
    values = [api.final_checkpoint(RunDirectory(r.run_dir))[0]["table.values"] for r in (sync, other)]
    assert torch.equal(values[0], values[1])
    assert other.summary["strategy"] == name and other.summary["examples_per_second"] > 0
