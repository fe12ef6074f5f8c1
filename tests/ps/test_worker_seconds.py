"""Where the parameter server's workers spend their time (summary.json's ``worker_seconds``): the
phases cover each worker's epoch, and a wait lands in the phase that waits."""

from __future__ import annotations

from pathlib import Path

from cadence.ps.worker import PHASES
from tests.ps.ctr_helpers import make_trainer


def run(tmp_path: Path, *overrides: str) -> tuple[dict[str, float], float]:
    trainer, _, _ = make_trainer(tmp_path, "ps.workers=2", "eval.every=0", "train.epochs=3", *overrides)
    summary = trainer.fit()
    return summary["worker_seconds"], trainer.runtime.train_seconds


def test_the_phases_cover_each_workers_epoch(tmp_path: Path) -> None:
    """Under sync every worker works until the epoch ends: the phases, summed over both workers, come
    to about twice the training time the runtime measured around the epochs, never more."""
    phases, seconds = run(tmp_path, "strategy=sync")
    assert set(phases) == set(PHASES)
    assert 0.5 * 2 * seconds <= sum(phases.values()) <= 2 * seconds + 0.001 * len(PHASES)  # (rounded to ms)


def test_a_steps_barrier_is_waited_in_the_pull(tmp_path: Path) -> None:
    """Worker 1 straggles (8x its compute). Under sync worker 0 waits for it at each step's barrier,
    which rides in its pull: the pull takes about as long as the computing. Under async nobody waits.
    (5 ms of emulated latency a batch, off-CPU in the compute phase: the phases are tens of ms
    otherwise, and a loaded machine's millisecond decided the comparison once.)"""
    slow = ['ps.stragglers=["1:8"]', "ps.emulated_latency=0.005"]
    synced, _ = run(tmp_path / "sync", "strategy=sync", *slow)
    free, _ = run(tmp_path / "async", "strategy=async", *slow)
    assert synced["pull"] >= 0.5 * synced["compute"]
    assert free["pull"] < 0.2 * free["compute"]
