"""A CPU quota on a process of this machine (cgroup v1's ``cpu`` controller): how a straggler is
made really slow, not told to sleep.

``CpuQuota(name, cores)`` moves the calling process into a cgroup of its own,
``/sys/fs/cgroup/cpu/cadence/<name>``, whose CFS quota lets it run ``cores`` cores' worth of time
per period (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), and on leaving moves it back to the
cgroup it came from and removes its own; what the kernel throttled meanwhile is kept
(``throttled``: periods and seconds, from ``cpu.stat``). Needs root and the v1 controller
(``unavailable()`` says why not, or None). Every thread of the process is throttled together: a
process is the unit a quota slows, as a slow machine would.
"""

from __future__ import annotations

import os
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000  # 10 ms: a slowed process runs in short slices, not 25 ms bursts then a 75 ms stall


def unavailable() -> str | None:
    """Why a CPU quota cannot be set here, or None when it can."""
    if not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        return f"no cgroup-v1 cpu controller at {CPU_ROOT}"
    if os.geteuid() != 0:
        return "setting a CPU quota needs root"
    return None


def own_cgroup(pid: int | str = "self") -> Path:
    """The cpu cgroup directory ``pid`` is in now."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CPU_ROOT / path.lstrip("/")
    return CPU_ROOT


class CpuQuota:
    """``with CpuQuota(name, cores):`` this process runs at most ``cores`` cores' worth of CPU time."""

    def __init__(self, name: str, cores: float, period_us: int = PERIOD_US):
        if cores <= 0:
            raise ValueError(f"a CPU quota must be positive; got {cores}")
        self.path = CPU_ROOT / "cadence" / name
        self.cores, self.period_us = cores, period_us
        self.home: Path | None = None
        self.throttled = {"periods": 0, "throttled_periods": 0, "throttled_seconds": 0.0}

    def __enter__(self) -> "CpuQuota":
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
        (self.path / "cpu.cfs_quota_us").write_text(str(max(1000, int(self.cores * self.period_us))))
        self.home = own_cgroup()
        (self.path / "cgroup.procs").write_text(str(os.getpid()))
        return self

    def __exit__(self, *exc) -> None:
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        self.throttled = {"periods": int(stat.get("nr_periods", 0)),
                          "throttled_periods": int(stat.get("nr_throttled", 0)),
                          "throttled_seconds": int(stat.get("throttled_time", 0)) / 1e9}
        (self.home / "cgroup.procs").write_text(str(os.getpid()))
        try:
            self.path.rmdir()
        except OSError:  # another process joined it meanwhile (never ours): leave it
            pass
