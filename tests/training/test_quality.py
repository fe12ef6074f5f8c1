"""Learning on real data: a short run learns; the shipped configs reach their bars (slow)."""

from pathlib import Path

import pytest

from cadence import api
from cadence.config import load_config
from tests.conftest import make_config

CONFIGS = Path(__file__).parents[2] / "configs"


def test_a_short_umls_run_learns(umls_dir: Path, tmp_path: Path) -> None:
    config = make_config(tmp_path / "run", "data.dataset=umls", "model.name=complex", "model.dim=64",
                         "train.epochs=5", "train.scoring=all", "train.reciprocal=true",
                         "train.batch_size=500", "threads=0")
    summary = api.train(config).summary
    assert summary["mrr"] > 0.6  # an untrained model scores ~0.04 on UMLS


@pytest.mark.slow
@pytest.mark.parametrize("name, bar", [("umls-complex", 0.93), ("kinships-complex", 0.85), ("nations", 0.75)])
def test_shipped_config_reaches_its_bar(name: str, bar: float, umls_dir: Path, tmp_path: Path) -> None:
    config = load_config(CONFIGS / f"{name}.yaml", ["progress=false"])
    config.out = str(tmp_path / name)
    assert api.train(config).summary["mrr"] >= bar
