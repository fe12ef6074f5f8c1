"""Parallel efficiency at equal CPU, the project's scaling measure (issues 47 and 48): N processes,
each a Ray node in a CPU-quota cgroup of C / N cores, against one process given all C cores, the same
data, epochs and quality check; efficiency = the N-process examples/s over the one process's.

``measure`` runs, for each task and each N, ``--reps`` interleaved repetitions of every contender
(the single process first on even repetitions, last on odd ones), the cgroups and the Ray nodes built
once per N; ``run(task, n, contender, address)`` trains one contender (a ``cadence train`` process:
``adapm_memory.train``) and returns its record with ``examples_per_second``, ``quality`` and
``load_before``. Used by ``adapm_scaling.py`` and ``ps_scaling.py``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

from adapm_memory import NodeCgroups, quality, train  # same folder
from kge_throughput import machine_info

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000
SINGLE = "single"
Run = Callable[[str, int, str, "str | None"], dict[str, Any]]


class CpuCgroups(NodeCgroups):
    """One cpu cgroup per node, each held to ``cores`` cores' worth of time per period."""

    def __init__(self, count: int, cores: float):
        super().__init__(CPU_ROOT, "cadence-scaling", count)
        for path in self.paths:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(max(1000, int(cores * PERIOD_US))))

    def throttled_seconds(self) -> float:
        total = 0
        for path in self.paths:
            stat = dict(line.split() for line in (path / "cpu.stat").read_text().splitlines())
            total += int(stat.get("throttled_time", 0))
        return total / 1e9


def ray_unavailable() -> str | None:
    """Why Ray nodes in CPU cgroups cannot run here (None: they can)."""
    if os.geteuid() != 0 or not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        return "needs root and cgroup v1's cpu controller at /sys/fs/cgroup/cpu"
    return None


def trained(overrides: list[str], name: str, task: str) -> dict[str, Any]:
    """One ``cadence train`` process (``adapm_memory.train``): its record, with the 1-minute load
    average before it and its quality (MF: test RMSE; KG: MRR; CTR: AUC)."""
    load = os.getloadavg()[0]
    record = train(overrides, name)
    record["load_before"] = round(load, 2)
    record["quality"] = quality(record, task)
    return record


def usable_engines(given: str, script: str) -> list[str]:
    """The engines of ``given`` (comma-separated) that run here: ray is dropped, saying why, without
    root and cgroup v1's cpu controller."""
    engines = [engine for engine in given.split(",") if engine]
    why = ray_unavailable()
    if "ray" in engines and why:
        print(f"{script}: ray skipped: {why}")
        engines.remove("ray")
    return engines


def header(script: str, found: dict[str, Any]) -> dict[str, Any]:
    """A result file's first fields: the command, the machine, the commit measured, the cores."""
    return {"command": " ".join(shlex.quote(a) for a in [".venv/bin/python", f"benchmarks/{script}.py", *sys.argv[1:]]),
            "machine": machine_info(), "measured_from": {"commit": found["commit"], "dirty": found["dirty"]},
            "cores": os.cpu_count() or 1}


def on_ray(contender: str) -> bool:
    return contender == "ray" or contender.endswith("@ray")


def measure(tasks: list[str], counts: list[int], reps: int, contenders: list[str], run: Run,
            overrides: Callable[[str, int], list[str]], name: str) -> dict[str, Any]:
    """{task: {N: {"overrides", "runs": {contender: [records]}, "parallel_efficiency": {contender: x}}}}."""
    cores = os.cpu_count() or 1
    result: dict[str, Any] = {}
    for task in tasks:
        for count in counts:
            runs: dict[str, list[dict[str, Any]]] = {SINGLE: [], **{contender: [] for contender in contenders}}
            with contextlib.ExitStack() as stack:
                cgroups = address = None
                if any(on_ray(contender) for contender in contenders):
                    from ray_cluster import nodes as ray_nodes

                    cgroups = CpuCgroups(count, cores / count)
                    stack.callback(cgroups.remove)
                    address = stack.enter_context(ray_nodes(cgroups.prefixes(), cpus_per_node=1, head_cpus=0,
                                                            extra=("--object-store-memory=78643200",)))
                for rep in range(reps):
                    order = [SINGLE, *contenders] if rep % 2 == 0 else [*contenders, SINGLE]
                    for contender in order:
                        before = cgroups.throttled_seconds() if on_ray(contender) and cgroups else 0.0
                        record = run(task, count, contender, address)
                        if on_ray(contender) and cgroups:
                            record["throttled_seconds"] = round(cgroups.throttled_seconds() - before, 2)
                        runs[contender].append(record)
                        print(f"{name} {task} N={count} rep {rep} {contender:<14} " + (
                            "ERROR " + record["error"] if "error" in record else
                            f"{record.get('examples_per_second', 0):,.0f} examples/s, quality {record['quality']} "
                            f"(load {record['load_before']})"), flush=True)
            single = [r["examples_per_second"] for r in runs[SINGLE] if "examples_per_second" in r]
            efficiency = {}
            for contender in contenders:
                rates = [r["examples_per_second"] for r in runs[contender] if "examples_per_second" in r]
                if rates and single:
                    efficiency[contender] = round(statistics.median(rates) / statistics.median(single), 4)
            print(f"{name} {task} N={count}: parallel efficiency {efficiency}", flush=True)
            result.setdefault(task, {})[str(count)] = {"overrides": overrides(task, count), "runs": runs,
                                                      "parallel_efficiency": efficiency}
    return result
