"""Contract tests run over every registered strategy.

Every strategy must train on tiny data and, in its degenerate setting, equal its sequential twin
(the sync strategy) bit for bit. A strategy registered without a degenerate setting here fails the
meta-test, so no strategy lands untested.
"""

from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.strategies.pipelined.base import SCHEDULES as STRATEGIES
from cadence.training.run_directory import RunDirectory
from tests.conftest import make_config

# strategy -> config overrides that make it behave synchronously (one batch in flight, one worker)
DEGENERATE_SETTINGS: dict[str, list[str]] = {
    "sync": [],
    "async": ["pipeline.staleness_bound=1"],
    "oac": ["pipeline.staleness_bound=1"],
    "pdasgd": ["pdasgd.backward_threads=1", "pdasgd.barrier=true"],
    "pdasgd-bu": ["pdasgd.backward_threads=1", "pdasgd.barrier=true"],
}


def test_every_registered_strategy_has_a_degenerate_setting() -> None:
    assert set(STRATEGIES.names()) == set(DEGENERATE_SETTINGS)


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_degenerate_setting_equals_the_sync_twin(name: str, tiny_graph: Path, tmp_path: Path) -> None:
    sync = api.train(make_config(tmp_path / "sync", f"data.dataset={tiny_graph}"))
    other = api.train(make_config(tmp_path / f"strategy-{name}", f"data.dataset={tiny_graph}", f"strategy={name}",
                                  *DEGENERATE_SETTINGS[name]))
    values = [api.final_checkpoint(RunDirectory(r.run_dir))[0]["table.values"] for r in (sync, other)]
    assert torch.equal(values[0], values[1])
    assert other.summary["strategy"] == name and other.summary["examples_per_second"] > 0
