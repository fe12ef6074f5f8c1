"""The dense optimizer's schedule (``optimizer.schedule``) against torch's own schedulers, and the
rate every runtime sets each epoch."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cadence import api
from cadence.config import OptimizerConfig
from cadence.optim import dense_lr
from tests.conftest import make_config


def test_constant_schedule_is_the_base_rate_after_the_warm_up() -> None:
    config = OptimizerConfig(lr=0.1, dense_lr=0.02, warmup_epochs=2, warmup_lr=0.005)
    assert [dense_lr(config, 5, e) for e in range(5)] == [0.005, 0.005, 0.02, 0.02, 0.02]
    assert dense_lr(OptimizerConfig(lr=0.3), 5, 3) == 0.3


def test_cosine_schedule_is_torchs_cosine_annealing_after_the_warm_up() -> None:
    """Reference: ``CosineAnnealingLR(T_max = epochs - warm-up)`` stepped once per epoch, after
    ``warmup`` epochs at the warm-up rate (the seed's protocol)."""
    epochs, warmup = 12, 3
    config = OptimizerConfig(lr=0.015, schedule="cosine", warmup_epochs=warmup, warmup_lr=0.005)
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.015)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs - warmup)
    expected = [0.005] * warmup
    for _ in range(epochs - warmup):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert [dense_lr(config, epochs, e) for e in range(epochs)] == pytest.approx(expected, rel=1e-12)
    assert dense_lr(config, epochs, warmup) == 0.015 and dense_lr(config, epochs, epochs - 1) > 0


@pytest.mark.parametrize("strategy, extra", [("sync", []), ("pdasgd", []), ("bsp", ["ps.workers=2"]),
                                             ("hogwild", ["ps.workers=2"]), ("sync", ["ps.workers=2", "ps.dense=workers"])])
def test_every_runtime_trains_each_epoch_at_the_scheduled_rate(strategy: str, extra: list[str], task_data,
                                                               tmp_path) -> None:
    """The rate of the last epoch is in the checkpointed optimizer state, wherever the dense
    optimizer lives (the pipeline, shard 0, the workers' replicas)."""
    config = make_config(tmp_path / strategy, *task_data["image"], f"strategy={strategy}", *extra, "train.epochs=3",
                         "optimizer.schedule=cosine", "optimizer.warmup_epochs=1", "optimizer.warmup_lr=0.01")
    result = api.train(config)
    state = json.loads((result.run_dir / "checkpoints" / "final" / "state.json").read_text())
    groups = state["state"]["dense_optimizer"]["param_groups"]
    assert groups[0]["lr"] == pytest.approx(dense_lr(config.optimizer, 3, 2))
    assert groups[0]["lr"] == pytest.approx(0.05 * 0.5 * (1 + math.cos(math.pi / 2)))
