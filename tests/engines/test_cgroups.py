"""A relative CPU quota (``engines.cgroups.RelativeCpuQuota``): the process runs unthrottled for
the probe, then at its measured CPU rate over the slowdown; slowed again with that rate, from the
start. Measured in time by a spinning child."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cadence.engines import cgroups

pytestmark = pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))

CHILD = """
import json, os, sys, time
from cadence.engines.cgroups import RelativeCpuQuota, own_cgroup
slowdown, probe = float(sys.argv[1]), float(sys.argv[2])
windows = []
with RelativeCpuQuota(f"test-{os.getpid()}", slowdown, probe_s=probe) as quota:
    inside = str(own_cgroup())
    began = time.perf_counter()
    while time.perf_counter() - began < probe + 2.0:  # spin: CPU time per 0.25 s of wall time
        start_cpu, start = time.process_time(), time.perf_counter()
        while time.perf_counter() - start < 0.25:
            pass
        windows.append((start - began, (time.process_time() - start_cpu) / (time.perf_counter() - start)))
again = []  # slowed again, with the rate measured above: held from its start
with RelativeCpuQuota(f"test-{os.getpid()}", slowdown, probe_s=probe, known_cores=quota.measured_cores):
    for _ in range(3):
        start_cpu, start = time.process_time(), time.perf_counter()
        while time.perf_counter() - start < 0.25:
            pass
        again.append((time.process_time() - start_cpu) / (time.perf_counter() - start))
print(json.dumps({"windows": windows, "cores": quota.cores, "measured": quota.measured_cores, "inside": inside,
                  "after": str(own_cgroup()), "throttled": quota.throttled, "again": again}))
"""


def test_a_relative_quota_slows_the_process_by_the_factor_of_its_own_rate(tmp_path) -> None:
    slowdown, probe = 4.0, 0.75
    done = subprocess.run([sys.executable, "-c", CHILD, str(slowdown), str(probe)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    before = [rate for at, rate in found["windows"] if at + 0.25 <= probe]
    after = [rate for at, rate in found["windows"] if at >= probe + 0.5]  # (the quota's first periods aside)
    assert before and after
    assert found["cores"] == pytest.approx(found["measured"] / slowdown)
    unthrottled, throttled = sum(before) / len(before), sum(after) / len(after)
    assert throttled < unthrottled / 2.5, (unthrottled, throttled)  # 4x asked: well under half
    assert throttled > unthrottled / 8, (unthrottled, throttled)
    assert found["throttled"]["throttled_seconds"] > 0
    assert "cadence/test-" in found["inside"] and "cadence/test-" not in found["after"]
    assert max(found["again"]) < unthrottled / 2.5, found["again"]


THREADS_CHILD = """
import json, os, sys, threading, time
from cadence.engines.cgroups import RelativeCpuQuota, own_cgroup
slowdown, probe, spin = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
rates, groups = {}, {}

import hashlib
block = bytes(1 << 20)

def work(seconds):  # hashlib lets go of the interpreter lock: each thread's rate is its cores', not the lock's
    began_cpu, began = time.thread_time(), time.perf_counter()
    while time.perf_counter() - began < seconds:
        hashlib.sha256(block).digest()
    return (time.thread_time() - began_cpu) / (time.perf_counter() - began)

def spinner(name, slowed):
    if slowed:
        with RelativeCpuQuota(f"test-thread-{os.getpid()}", slowdown, probe_s=probe, thread=True) as quota:
            groups[name] = str(own_cgroup(f"self/task/{threading.get_native_id()}"))
            work(probe + 0.3)  # the probe measures this thread's own rate, then the quota holds it
            rates[name] = work(spin)
        groups[name + "-after"] = str(own_cgroup(f"self/task/{threading.get_native_id()}"))
        rates["measured"], rates["throttled"] = quota.measured_cores, quota.throttled["throttled_seconds"]
    else:
        work(probe + 0.3)
        groups[name] = str(own_cgroup(f"self/task/{threading.get_native_id()}"))
        rates[name] = work(spin)

threads = [threading.Thread(target=spinner, args=("slowed", True)), threading.Thread(target=spinner, args=("free", False))]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"rates": rates, "groups": groups, "process": str(own_cgroup())}))
"""


def test_a_thread_quota_slows_that_thread_alone() -> None:
    """cgroup v1 takes a thread id: one thread of a process in the quota (pdASGD's slowed backward
    thread), measured in time: its CPU rate over the same wall-clock window as its unslowed sibling's."""
    done = subprocess.run([sys.executable, "-c", THREADS_CHILD, "4", "0.5", "1.5"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    rates, groups = found["rates"], found["groups"]
    assert "cadence/test-thread-" in groups["slowed"] and "cadence/test-thread-" not in groups["free"]
    assert "cadence/test-thread-" not in groups["slowed-after"] and "cadence/test-thread-" not in found["process"]
    assert rates["slowed"] < rates["free"] / 2.0, rates  # 4x asked of the thread's own rate
    assert rates["throttled"] > 0


WINDOWS_CHILD = """
import json, os, sys, time
from cadence.engines.cgroups import RelativeCpuQuota
slowdown, probe, window, count = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rates, quota = [], None
for _ in range(count):  # windows shorter than the probe, as a straggler's short epochs
    quota = RelativeCpuQuota.after(quota, f"test-windows-{os.getpid()}", slowdown, probe_s=probe)
    with quota:
        began_cpu, began = time.process_time(), time.perf_counter()
        while time.perf_counter() - began < window:
            pass
        rates.append((time.process_time() - began_cpu) / (time.perf_counter() - began))
print(json.dumps({"rates": rates, "measured": quota.measured_cores, "throttled": quota.throttled}))
"""


def test_a_process_slowed_in_windows_shorter_than_the_probe_is_measured_then_held() -> None:
    """A straggler whose epochs are shorter than the probe: each epoch's quota goes on with the probe
    the earlier ones began (``RelativeCpuQuota.after``), so once the probe's time is reached in all
    the process is held at its rate over the slowdown; probing afresh each window, it ran free."""
    slowdown, probe, window, count = 4.0, 0.5, 0.2, 8  # the probe ends in the third window
    done = subprocess.run([sys.executable, "-c", WINDOWS_CHILD, str(slowdown), str(probe), str(window), str(count)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    rates = found["rates"]
    assert found["measured"] is not None
    free, held = max(rates[:2]), rates[4:]  # (the first two: wholly inside the probe)
    assert max(held) < free / 2.5, rates
    assert found["throttled"]["throttled_seconds"] > 0
