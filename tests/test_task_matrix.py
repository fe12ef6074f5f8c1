"""The task x strategy matrix: every registered task trains under every strategy, and every
asynchronous strategy in its degenerate setting equals ``sync`` bit for bit, on every task.

A task registered without its row here, or a strategy without the settings its contract tests
train it with (``Strategy.contract``), fails the meta-tests, so nothing lands untested.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.errors import ConfigError
from cadence.strategies.catalog import STRATEGIES, strategy_names
from cadence.tasks import TASKS
from tests.conftest import CUDA_MARKS, make_config, needs_cuda

TASK_NAMES = ("kge", "ctr", "mf", "w2v", "image")
# every strategy, with the settings it declares for these tests (``Strategy.contract``: a short run
# that shows how it differs from sync, and the setting under which it computes what sync does)
STRATEGY_NAMES = strategy_names()


def test_every_registered_task_has_a_row() -> None:
    assert set(TASKS.names()) == set(TASK_NAMES)


def test_every_registered_strategy_declares_the_setting_that_makes_it_sync() -> None:
    undeclared = [name for name in strategy_names() if STRATEGIES.get(name).contract.twin is None]
    assert undeclared == []


def run(task_data, tmp_path: Path, task: str, name: str, *overrides: str):
    config = make_config(tmp_path / name, *task_data[task], "eval.every=1", *overrides)
    return api.train(config)


def final_model(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(keys, their rows, the dense state) of a finished run, whichever runtime trained it; keys are
    the union that any runtime may hold (a parameter server creates rows only when they are pulled)."""
    _, task, view, dense = api.load_model(run_dir)
    keys = task.known_keys()
    return keys, view.values(keys), dense.state_dict()


def assert_same_model(first: Path, second: Path, exact: bool = True) -> None:
    """The two runs' models are bit-identical, or (``exact=False``) equal up to float rounding."""
    (keys, rows, dense), (other_keys, other_rows, other_dense) = final_model(first), final_model(second)
    assert torch.equal(keys, other_keys)
    assert dense.keys() == other_dense.keys()
    pairs = [("rows", rows, other_rows), *((name, value, other_dense[name]) for name, value in dense.items())]
    for name, value, other in pairs:
        if exact:
            differ = (value != other).flatten(1).any(1).sum() if value.dim() > 1 else (value != other).sum()
            assert torch.equal(value, other), f"{name}: {int(differ)} rows differ"
        else:
            torch.testing.assert_close(value, other, rtol=ROUNDING, atol=ROUNDING, msg=lambda m, n=name: f"{n}: {m}")




def check_trains(task_data, tmp_path: Path, task: str, strategy: str, *overrides: str):
    """``strategy`` trains ``task`` in the short run it declares (``contract.exercised``): two epochs,
    validated after each, a finite metric and speed, on the runtime its entry picks."""
    settings = (f"strategy={strategy}", *STRATEGIES.get(strategy).contract.exercised, *overrides)
    result = run(task_data, tmp_path, task, strategy, *settings)
    summary = result.summary
    metric = summary["primary_metric"]
    assert summary["task"] == task and summary["strategy"] == strategy
    assert summary["runtime"] == STRATEGIES.get(strategy).runtime(make_config(tmp_path / "x", *settings)).name
    assert math.isfinite(summary[metric]) and math.isfinite(summary[f"best_valid_{metric}"])
    assert summary["examples_per_second"] > 0
    valid = [r for r in result.metrics if r["split"] == "valid"]
    assert [r["epoch"] for r in valid] == [1, 2]
    assert summary["train_loss"] == valid[-1]["loss"]  # the last epoch's loss, also without evaluation
    return result


@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_every_task_trains_under_every_strategy(task: str, strategy: str, task_data, tmp_path: Path) -> None:
    check_trains(task_data, tmp_path, task, strategy)


# strategies whose every run takes one computation order: on the GPU they train the model the CPU
# trains, up to float rounding (the others' order depends on thread timing, which the device changes;
# their equality on the GPU is the degenerate-setting test's and OAC's replay test's)
ONE_ORDER = ("sync",)
# On the GPU, only these apply their updates with sync's own kernels, on the device: bit-identical to
# sync there. The others (a parameter server's host-side optimizers, pdASGD's in-place dense rule)
# round differently on the GPU than sync's device kernels do: equal up to ROUNDING.
SYNC_KERNELS = ("async", "oac")
ROUNDING = 1e-4
CPU_ONLY = ("adapm",)  # its nodes compute on the CPU: device cuda is a clear error


@needs_cuda
@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("strategy", sorted(set(STRATEGY_NAMES) - set(CPU_ONLY)))
def test_every_task_trains_under_every_strategy_on_cuda(task: str, strategy: str, task_data, tmp_path: Path) -> None:
    """``--device cuda``: the pipeline's batches and the parameter-server workers' compute on the GPU
    (evaluation too); for a strategy of one computation order the model is the one the CPU trains."""
    on_gpu = check_trains(task_data, tmp_path / "cuda", task, strategy, "device=cuda")
    if strategy in ONE_ORDER:
        on_cpu = check_trains(task_data, tmp_path / "cpu", task, strategy, "device=cpu")
        metric = on_cpu.summary["primary_metric"]
        assert on_gpu.summary[metric] == pytest.approx(on_cpu.summary[metric], rel=0.05, abs=0.02)


@pytest.mark.parametrize("strategy", CPU_ONLY)
def test_a_cpu_only_strategy_refuses_cuda_by_name(strategy: str, task_data, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"device=cuda: 'cuda': {strategy}'s nodes compute on the CPU"):
        run(task_data, tmp_path, "kge", strategy, f"strategy={strategy}", "device=cuda")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA_MARKS)])
@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("strategy", sorted(set(STRATEGY_NAMES) - {"sync"}))
def test_degenerate_setting_equals_sync(task: str, strategy: str, device: str, task_data, tmp_path: Path) -> None:
    if device == "cuda" and strategy in CPU_ONLY:
        pytest.skip(f"{strategy} computes on the CPU (test_a_cpu_only_strategy_refuses_cuda_by_name)")
    check_twin_equals_sync(task_data, tmp_path, task, strategy, device)


def check_twin_equals_sync(task_data, tmp_path: Path, task: str, strategy: str, device: str = "cpu") -> None:
    """``strategy`` in the setting it declares its twin of sync (``contract.twin``) trains ``task`` to
    sync's model: bit for bit (on a GPU, up to rounding where it updates with kernels of its own)."""
    sync = run(task_data, tmp_path, task, "sync", f"device={device}")
    other = run(task_data, tmp_path, task, strategy, f"strategy={strategy}", *STRATEGIES.get(strategy).contract.twin,
                f"device={device}")
    assert other.summary["strategy"] == strategy
    exact = device == "cpu" or strategy in SYNC_KERNELS
    assert_same_model(sync.run_dir, other.run_dir, exact)
    metric = sync.summary["primary_metric"]
    assert other.summary[metric] == (sync.summary[metric] if exact else pytest.approx(sync.summary[metric], rel=1e-3))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA_MARKS)])
@pytest.mark.parametrize("task", TASK_NAMES)
def test_oac_equals_the_sync_replay_of_its_order(task: str, device: str, task_data, tmp_path: Path) -> None:
    """On a GPU with the streams and events of pipeline/transfer.py and deterministic kernels too."""
    order = tmp_path / "order.jsonl"
    oac = run(task_data, tmp_path, task, "oac", "strategy=oac", "pipeline.staleness_bound=8",
              "pipeline.loader_threads=3", f"record_order={order}", f"device={device}")
    replay = run(task_data, tmp_path, task, "replay", f"batch_order={order}", f"device={device}")
    assert_same_model(oac.run_dir, replay.run_dir)
