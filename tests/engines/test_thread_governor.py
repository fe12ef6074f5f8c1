"""The cores a process may use, and the governor that re-chooses the compute thread's intra-op threads
from the throughput it measures (engines.threads)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.engines import cgroups
from cadence.engines.threads import ThreadGovernor, _cgroup_quota_cores, usable_cores
from tests.conftest import make_config
from tests.test_task_matrix import TASK_NAMES, assert_same_model


# ---- usable cores -------------------------------------------------------------------------------------------
def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_quota_on_the_cgroup_or_an_ancestor_caps_the_cores(tmp_path: Path) -> None:
    """cgroup v1: quota/period of the process's cpu cgroup and every cgroup above it, the tightest wins;
    -1 is no quota. v2: ``cpu.max`` ("max" is none)."""
    write(tmp_path / "cpu/cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "cpu/cpu.cfs_period_us", "100000\n")
    write(tmp_path / "cpu/a/cpu.cfs_quota_us", "150000\n")
    write(tmp_path / "cpu/a/cpu.cfs_period_us", "100000\n")
    write(tmp_path / "cpu/a/b/cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "cpu/a/b/cpu.cfs_period_us", "100000\n")
    assert _cgroup_quota_cores(tmp_path, "4:memory:/x\n2:cpu,cpuacct:/a/b\n") == 1.5
    assert _cgroup_quota_cores(tmp_path, "2:cpu,cpuacct:/\n") is None
    write(tmp_path / "v2/c/cpu.max", "max 100000\n")
    write(tmp_path / "v2/c/d/cpu.max", "300000 100000\n")
    assert _cgroup_quota_cores(tmp_path / "v2", "0::/c/d\n") == 3.0
    assert _cgroup_quota_cores(tmp_path / "v2", "0::/c\n") is None


def _cores_in_child(affinity: set[int] | None, quota_cores: float | None, out) -> None:
    if affinity is not None:
        os.sched_setaffinity(0, affinity)
    if quota_cores is None:
        out.put(usable_cores())
        return
    with cgroups.CpuQuota(f"usable-cores-test-{os.getpid()}", quota_cores):
        out.put(usable_cores())


def cores_in_child(affinity: set[int] | None = None, quota_cores: float | None = None) -> int:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_cores_in_child, args=(affinity, quota_cores, out))
    child.start()
    value = out.get(timeout=30)
    child.join(30)
    return value


def test_usable_cores_follow_the_affinity() -> None:
    cores = sorted(os.sched_getaffinity(0))
    assert usable_cores() == len(cores)
    assert cores_in_child({cores[0]}) == 1


@pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_usable_cores_follow_a_real_cgroup_quota() -> None:
    """A process whose cgroup lets it run one core's worth per period may use one core, on a machine
    of more; half a core is still one thread."""
    assert cores_in_child(quota_cores=1.0) == 1
    assert cores_in_child(quota_cores=0.5) == 1


# ---- the governor, against a simulated machine -------------------------------------------------------------
class Machine:
    """Seconds per step at each intra-op count, by simulated time: ``phases`` [(until, {threads: s})]."""

    def __init__(self, phases: list[tuple[float, dict[int, float]]]):
        self.phases = phases
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def run(self, governor: ThreadGovernor, until: float) -> list[tuple[float, int]]:
        """Steps until ``until``; the count each step ran at, by its start time."""
        trace = []
        while self.now < until:
            governor.apply()
            threads = torch.get_num_threads()
            trace.append((self.now, threads))
            cost = next(costs for end, costs in self.phases if self.now < end)
            self.now += cost[threads]
            governor.step(1000)
        return trace


def share(trace: list[tuple[float, int]], start: float, end: float, threads: int) -> float:
    """The fraction of steps between start and end run at ``threads``."""
    inside = [t for when, t in trace if start <= when < end]
    return sum(t == threads for t in inside) / max(1, len(inside))


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_governor_leaves_a_busy_core_within_seconds_and_comes_back(restore_threads) -> None:
    """Quiet, 2 threads are 1.5x one: it stays at 2 (probes cost a few percent of steps). When another
    process takes a core, 2 threads run 10x slower than one: it is at 1 within seconds. When the core
    is free again it returns to 2 within the longest probe interval."""
    quiet, busy = {2: 0.010, 1: 0.015}, {2: 0.13, 1: 0.013}
    machine = Machine([(60.0, quiet), (120.0, busy), (240.0, quiet)])
    governor = ThreadGovernor(2, clock=machine.clock)
    trace = machine.run(governor, 240.0)
    assert share(trace, 0.0, 60.0, 2) > 0.95
    switched_down = [when for when, threads in governor.history if threads == 1 and when >= 60.0]
    assert switched_down and switched_down[0] < 60.0 + ThreadGovernor.INTERVAL_S * 4 + 1
    assert share(trace, 70.0, 120.0, 1) > 0.95
    switched_up = [when for when, threads in governor.history if threads == 2 and when >= 120.0]
    assert switched_up and switched_up[0] < 120.0 + ThreadGovernor.LONGEST_S + 2
    assert share(trace, 160.0, 240.0, 2) > 0.95
    assert governor.stats()["intra_op_threads"] == 2


def test_the_governor_climbs_a_ladder_and_never_leaves_it(restore_threads) -> None:
    """8 cores, of which 6 are taken: 2 threads are best; counts tried are 8, 4, 2, 1 only."""
    costs = {8: 0.5, 4: 0.2, 2: 0.01, 1: 0.018}
    machine = Machine([(100.0, costs)])
    governor = ThreadGovernor(8, clock=machine.clock)
    trace = machine.run(governor, 100.0)
    assert {threads for _, threads in trace} <= {8, 4, 2, 1}
    assert governor.current == 2 and share(trace, 30.0, 100.0, 2) > 0.9


def test_one_core_has_nothing_to_choose(restore_threads) -> None:
    machine = Machine([(10.0, {1: 0.01})])
    governor = ThreadGovernor(1, clock=machine.clock)
    machine.run(governor, 10.0)
    assert governor.probes == 0 and governor.current == 1


# ---- changing the count never changes what is computed ------------------------------------------------------
@pytest.fixture
def restless(monkeypatch):
    """A governor that switches on every probe, probes every few steps: the count flips all the time."""
    monkeypatch.setattr(ThreadGovernor, "INTERVAL_S", 0.0)
    monkeypatch.setattr(ThreadGovernor, "PROBE_S", 0.0)
    monkeypatch.setattr(ThreadGovernor, "PROBE_BATCHES", 1)
    monkeypatch.setattr(ThreadGovernor, "GAIN", 0.0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("strategy", ["sync", "oac"])
def test_a_run_whose_thread_count_keeps_changing_equals_one_at_a_fixed_count(task: str, strategy: str, task_data,
                                                                             tmp_path: Path, restless) -> None:
    """The governor may change the compute thread's count between any two batches; the model is the
    same bit for bit as a run at a fixed count (the claim in ThreadGovernor's docstring)."""
    common = [*task_data[task], f"strategy={strategy}", "threads=2", "eval.every=0", "eval.test=false",
              *(["pipeline.staleness_bound=1"] if strategy != "sync" else [])]  # (sync reads no pipeline keys)
    fixed = api.train(make_config(tmp_path / "fixed", *common, "adapt_threads=false"))
    moving = api.train(make_config(tmp_path / "moving", *common, "adapt_threads=true"))
    assert "intra_op_threads" not in fixed.summary
    assert moving.summary["intra_op_switches"] >= 3
    assert_same_model(tmp_path / "fixed", tmp_path / "moving")
