"""Every task resumes after an interruption to the same model as an uninterrupted run, on both
runtimes (the parameter server under a deterministic strategy); eval and export work for every task.
The real-signal version (SIGKILL of the CLI) is in test_determinism_and_resume.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence import api
from cadence.training.trainer import TrainerHook
from tests.conftest import make_config
from tests.test_task_matrix import TASK_NAMES, assert_same_model

RUNTIMES = {"pipeline": ["strategy=sync"],
            "parameter_server": ["strategy=hop_bw", "ps.workers=2", "ps.backup_workers=0", "ps.shards=2"]}


class Interrupt(Exception):
    pass


class InterruptAt(TrainerHook):
    """Stops the run at the end of an epoch, before its checkpoint is written (as a kill would)."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch_end(self, trainer, epoch: int) -> None:
        if epoch == self.epoch:
            raise Interrupt


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("task", TASK_NAMES)
def test_interrupted_then_resumed_equals_an_uninterrupted_run(task: str, runtime: str, task_data,
                                                              tmp_path: Path) -> None:
    overrides = [*task_data[task], *RUNTIMES[runtime], "train.epochs=3", "eval.every=1"]
    whole = api.train(make_config(tmp_path / "whole", *overrides))
    with pytest.raises(Interrupt):
        api.train(make_config(tmp_path / "killed", *overrides), hooks=[InterruptAt(2)])
    assert not (tmp_path / "killed" / "summary.json").exists()
    resumed = api.resume(tmp_path / "killed")
    assert resumed.summary["runtime"] == runtime and resumed.summary["epochs"] == 3
    assert_same_model(whole.run_dir, resumed.run_dir)
    metric = whole.summary["primary_metric"]
    assert resumed.summary[metric] == whole.summary[metric]
    assert [r["epoch"] for r in resumed.metrics] == [r["epoch"] for r in whole.metrics]


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("task", TASK_NAMES)
def test_eval_and_export_work_for_every_task(task: str, runtime: str, task_data, tmp_path: Path) -> None:
    """``eval`` reads the final checkpoint and gives the run's own test metrics, also for keys the
    run never trained (a parameter server never created their rows: they read their initial values)."""
    result = api.train(make_config(tmp_path / "run", *task_data[task], *RUNTIMES[runtime]))
    metric = result.summary["primary_metric"]
    assert api.evaluate(result.run_dir, "test")[metric] == pytest.approx(result.summary[metric], abs=1e-6)
    written = api.export(result.run_dir, tmp_path / "export", "npy")
    assert written and all(path.is_file() and path.parent == tmp_path / "export" for path in written)
    assert not [p for p in (tmp_path / "export").iterdir() if p.name.startswith(".")]  # no staging left
