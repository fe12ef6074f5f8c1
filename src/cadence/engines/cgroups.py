"""A CPU quota on a process of this machine (cgroup v1's ``cpu`` controller): how a straggler is
made really slow, not told to sleep.

``CpuQuota(name, cores)`` moves the calling process into a cgroup of its own,
``/sys/fs/cgroup/cpu/cadence/<name>``, whose CFS quota lets it run ``cores`` cores' worth of time
per period (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), and on leaving moves it back to the
cgroup it came from and removes its own; what the kernel throttled meanwhile is kept
(``throttled``: periods and seconds, from ``cpu.stat``). Needs root and the v1 controller
(``unavailable()`` says why not, or None). Every thread of the process is throttled together: a
process is the unit a quota slows, as a slow machine would. With ``thread=True`` only the calling
thread moves (cgroup v1 takes a thread id in ``tasks``): one thread of a process slowed, as a
delayed thread on a busy core is (pdASGD's slowed backward thread).

``RelativeCpuQuota(name, slowdown)`` sets the quota from what the process was getting: it runs
unthrottled (in its cgroup) for ``probe_s`` seconds, measures its CPU time over that wall time (a
rate in cores), then holds it to that rate over ``slowdown``; given the rate measured before
(``known_cores``: a worker slowed again in a later epoch), it holds it from the start. On a machine whose cores are shared
by more processes than it has, a quota of "threads over slowdown" cores can be about what a
process gets anyway (a quarter core against a fair share of 0.4 slows it 1.3x, not 4x); a rate
measured in place slows it by the factor asked for, against the load it meets.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from cadence.registry import Registry

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000  # 10 ms: a slowed process runs in short slices, not 25 ms bursts then a 75 ms stall
PROBE_S = 0.5  # RelativeCpuQuota: unthrottled seconds in which the process's own CPU rate is measured


def unavailable() -> str | None:
    """Why a CPU quota cannot be set here, or None when it can."""
    if not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        return f"no cgroup-v1 cpu controller at {CPU_ROOT}"
    if os.geteuid() != 0:
        return "setting a CPU quota needs root"
    return None


def own_cgroup(pid: int | str = "self") -> Path:
    """The cpu cgroup directory ``pid`` is in now (``"self/task/<tid>"``: a thread's)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CPU_ROOT / path.lstrip("/")
    return CPU_ROOT


class CpuQuota:
    """``with CpuQuota(name, cores):`` this process (``thread=True``: the calling thread) runs at most
    ``cores`` cores' worth of CPU time."""

    def __init__(self, name: str, cores: float, period_us: int = PERIOD_US, thread: bool = False):
        if cores <= 0:
            raise ValueError(f"a CPU quota must be positive; got {cores}")
        self.path = CPU_ROOT / "cadence" / name
        self.cores, self.period_us = cores, period_us
        self.thread = thread
        self.home: Path | None = None
        self.throttled = {"periods": 0, "throttled_periods": 0, "throttled_seconds": 0.0}

    def _member(self) -> tuple[str, str]:
        """(the cgroup file that moves it, the id written there): the process, or the calling thread."""
        return ("tasks", str(threading.get_native_id())) if self.thread else ("cgroup.procs", str(os.getpid()))

    def __enter__(self) -> "CpuQuota":
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
        self.limit(self.cores)
        where, member = self._member()
        self.home = own_cgroup(f"self/task/{member}" if self.thread else "self")
        (self.path / where).write_text(member)
        return self

    def limit(self, cores: float | None) -> None:
        """Hold the cgroup to ``cores`` cores' worth of time per period (None: no limit)."""
        quota = -1 if cores is None else max(1000, int(cores * self.period_us))
        (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def __exit__(self, *exc) -> None:
        self._leaving()
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        self.throttled = {"periods": int(stat.get("nr_periods", 0)),
                          "throttled_periods": int(stat.get("nr_throttled", 0)),
                          "throttled_seconds": int(stat.get("throttled_time", 0)) / 1e9}
        where, member = self._member()
        (self.home / where).write_text(member)
        try:
            self.path.rmdir()
        except OSError:  # another process joined it meanwhile (never ours): leave it
            pass

    def _leaving(self) -> None:
        """Before the process leaves the cgroup (a subclass stops what it started)."""


class RelativeCpuQuota(CpuQuota):
    """``with RelativeCpuQuota(name, slowdown):`` after ``probe_s`` unthrottled seconds, this process
    runs at most its measured CPU rate over ``slowdown`` (``cores``: the quota set, None before).

    A quota left before its probe ended keeps what the probe saw (``probed``: CPU and wall seconds);
    the next quota of the same process (``RelativeCpuQuota.after``) goes on probing from there, so a
    process slowed in windows shorter than the probe (short epochs) is still measured, then held,
    instead of probing afresh and running free in every window."""

    def __init__(self, name: str, slowdown: float, probe_s: float = PROBE_S, period_us: int = PERIOD_US,
                 known_cores: float | None = None, thread: bool = False, probed: tuple[float, float] = (0.0, 0.0)):
        if slowdown <= 1.0:
            raise ValueError(f"a slowdown must exceed 1; got {slowdown}")
        super().__init__(name, 1.0, period_us, thread)
        self.slowdown, self.probe_s = slowdown, probe_s
        self.measured_cores = known_cores  # the process's CPU rate unthrottled (the probe's, or given)
        self.cores = None if known_cores is None else max(known_cores / slowdown, 0.01)
        self.probed = probed  # (CPU seconds, wall seconds) probed unthrottled so far, in earlier windows too
        self.stop = threading.Event()
        self.timer: threading.Thread | None = None
        self._seen: Callable[[], tuple[float, float]] | None = None  # this window's probe so far

    @classmethod
    def after(cls, previous: "CpuQuota | None", name: str, slowdown: float, thread: bool = False,
              probe_s: float = PROBE_S) -> "RelativeCpuQuota":
        """The quota for the next window of a process (or thread) ``previous`` held before: its
        measured rate reused, or its unfinished probe continued."""
        known = getattr(previous, "measured_cores", None)
        probed = getattr(previous, "probed", (0.0, 0.0)) if known is None else (0.0, 0.0)
        return cls(name, slowdown, probe_s, known_cores=known, thread=thread, probed=probed)

    def __enter__(self) -> "RelativeCpuQuota":
        super().__enter__()
        if self.measured_cores is not None:
            return self
        measured = threading.get_native_id()  # (the probe runs on a thread of its own: it reads this one's clock)

        def cpu_seconds() -> float:  # what the quota holds: the process, or the thread that entered it
            return _thread_cpu_seconds(measured) if self.thread else time.process_time()

        began_cpu, began = cpu_seconds(), time.perf_counter()
        before_cpu, before_wall = self.probed

        def seen() -> tuple[float, float]:
            return before_cpu + cpu_seconds() - began_cpu, before_wall + time.perf_counter() - began

        def probe() -> None:
            if self.stop.wait(max(0.0, self.probe_s - before_wall)):
                return
            spent, elapsed = seen()
            self.measured_cores = spent / max(1e-9, elapsed)
            self.cores = max(self.measured_cores / self.slowdown, 0.01)
            self.limit(self.cores)

        self._seen = seen
        self.timer = threading.Thread(target=probe, name="cadence-quota-probe", daemon=True)
        self.timer.start()
        return self

    def _leaving(self) -> None:
        self.stop.set()
        if self.timer is not None:
            self.timer.join()
        if self.measured_cores is None and self._seen is not None:
            self.probed = self._seen()  # (the probe did not end: the next window goes on from here)


def _thread_cpu_seconds(tid: int) -> float:
    """CPU seconds (user + system) thread ``tid`` of this process has run: ``/proc``'s ticks."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ps.straggler_quota -> (name, the process's torch threads, slowdown, the quota it held in its last
# slowed window or None) -> the quota of a straggler
STRAGGLER_QUOTAS: Registry[Callable[[str, int, float, CpuQuota | None], CpuQuota]] = Registry(
    "straggler quota", "ps.straggler_quota")
STRAGGLER_QUOTAS.register("relative")(
    lambda name, threads, slowdown, previous: RelativeCpuQuota.after(previous, name, slowdown))
STRAGGLER_QUOTAS.register("absolute")(
    lambda name, threads, slowdown, previous: CpuQuota(name, max(1, threads) / slowdown))
