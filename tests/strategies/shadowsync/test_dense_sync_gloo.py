"""The all-reduce of trainer processes: two real processes joined by gloo (torch.distributed), the
shadow thread's group separate from the default group that the main thread uses at the same time;
a trainer that dies makes the other's round fail quickly instead of hanging."""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cadence.strategies.shadowsync.dense_sync import GlooAverager, ModelAverage, PeerLost, ShadowThread


def _trainer(rank: int, store: str, out: str, die_after: int | None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=20))
    shadow_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=5))
    replica = [torch.full((3,), float(rank)), torch.full((2, 2), 10.0 * rank)]
    rule = ModelAverage(0.5, GlooAverager(shadow_group))
    if die_after is not None:  # trainer 1 dies after a few rounds; trainer 0 must not hang
        for _ in range(die_after):
            rule.round(replica, True)
        if rank == 1:
            os._exit(0)
        started = time.monotonic()
        try:
            for _ in range(100):
                rule.round(replica, True)
            outcome = "no error"
        except PeerLost:
            outcome = "peer lost"
        Path(out).write_text(f"{outcome} {time.monotonic() - started:.1f}")
        os._exit(0)
    training = {"left": 30}

    def still() -> bool:
        return training["left"] > 0

    shadow = ShadowThread(rule, replica, still).start()
    total = torch.zeros(1)
    for _ in range(30):  # the main thread's own collectives, on the default group, meanwhile
        value = torch.ones(1)
        dist.all_reduce(value)
        total += value
        training["left"] -= 1
    shadow.join(30)
    dist.barrier()
    torch.save({"replica": replica, "total": total, "syncs": shadow.syncs}, out)
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_shadow_all_reduce_runs_beside_the_default_group(tmp_path: Path) -> None:
    outs = [str(tmp_path / f"out-{rank}.pt") for rank in range(2)]
    context = mp.get_context("spawn")
    processes = [context.Process(target=_trainer, args=(rank, str(tmp_path / "store"), outs[rank], None))
                 for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(150)
        assert process.exitcode == 0
    results = [torch.load(out) for out in outs]
    assert all(r["total"].item() == 60 for r in results)  # 30 all-reduces of 1 + 1: none lost to the shadow
    syncs = results[0]["syncs"]
    assert syncs == results[1]["syncs"] >= 1
    # no training here: each round halves every replica's distance to the mean (0.5 and 5), which
    # the rounds leave in place: after s rounds, start + (mean - start) (1 - 0.5^s)
    for rank, result in enumerate(results):
        for tensor, start, mean in zip(result["replica"], (float(rank), 10.0 * rank), (0.5, 5.0)):
            expected = mean + (start - mean) * 0.5 ** syncs
            assert torch.allclose(tensor, torch.full_like(tensor, expected), atol=1e-6), (rank, syncs)


@pytest.mark.timeout(180)
def test_a_trainer_that_dies_does_not_hang_the_other(tmp_path: Path) -> None:
    outs = [str(tmp_path / f"out-{rank}.txt") for rank in range(2)]
    context = mp.get_context("spawn")
    processes = [context.Process(target=_trainer, args=(rank, str(tmp_path / "store"), outs[rank], 2))
                 for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(150)
    outcome, seconds = Path(outs[0]).read_text().rsplit(" ", 1)
    assert outcome == "peer lost" and float(seconds) < 10, (outcome, seconds)
