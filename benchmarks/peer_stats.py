"""What the peer benchmarks share: their command line, confidence intervals over seeds, how much
CPU other processes took while a contender ran (a ratio is only read from undisturbed runs), and a
core taken by another process (``BusyCore``: the contention condition)."""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from provenance import add_flag, stamp

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def peer_parser(doc: str, quick_help: str, seeds: int, max_wait_help: str,
                max_wait: float | None = None) -> argparse.ArgumentParser:
    """The options every peer benchmark takes: --quick, --seeds, --max-wait, --out."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--seeds", type=int, default=None, help=f"seeds 0 .. N-1 (default {seeds}, 1 with --quick)")
    parser.add_argument("--max-wait", type=float, default=max_wait, help=max_wait_help)
    parser.add_argument("--out", default=None, help="result JSON (default: benchmarks/results/...)")
    add_flag(parser)
    return parser


def write_report(report: dict[str, Any], out: Path, started: float, waited_s: float) -> Path:
    """Add the wall seconds since ``started`` and the seconds waited for a quiet machine; write the JSON."""
    import json
    import time

    report["wall_seconds"] = time.perf_counter() - started
    report["waited_for_quiet_seconds"] = round(waited_s, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamp(report), indent=2) + "\n")
    return out


def peer_run(args: argparse.Namespace, script: str, seeds: int) -> tuple[list[int], Path, str]:
    """(the seeds, the result file, the command that reproduces the run) of ``benchmarks/<script>.py``."""
    chosen = list(range(args.seeds if args.seeds is not None else (1 if args.quick else seeds)))
    out = Path(args.out) if args.out else RESULTS_DIR / f"{script}{'_quick' if args.quick else ''}.json"
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", f"benchmarks/{script}.py", *sys.argv[1:]])
    return chosen, out, command


# two-sided 95% quantiles of Student's t by degrees of freedom
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    return T975[max(k for k in T975 if k <= df)] if df <= 30 else 1.96  # rounds df down: a wider interval


def mean_ci(values: list[float]) -> dict[str, Any]:
    """Mean and 95% t-interval over seeds (no interval from one value)."""
    n, mean = len(values), statistics.fmean(values)
    half = t975(n - 1) * statistics.stdev(values) / n ** 0.5 if n > 1 else None
    return {"mean": mean, "ci95": [mean - half, mean + half] if half is not None else None,
            "half_width": half, "n": n, "median": statistics.median(values), "per_seed": values}


def train_measured(config, record: dict[str, Any], prefix: str, warm_up: int = 0):
    """Train ``config`` in this process into a temporary directory; add to ``record`` the run's wall
    seconds, the share of the CPUs other processes used meanwhile, and ``error`` if it raised (a
    contender that crashes is recorded; the others still run). ``warm_up``: batches of a discarded
    scratch run first (``api.train``'s), so one-time costs (a GPU kernel's compilation) fall outside
    the run's ``train_seconds``. The result, or None."""
    import tempfile
    import time

    from cadence import api

    result, started = None, time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=prefix) as out, OthersMeter(in_process=True) as meter:
        config.out = out
        try:
            result = api.train(config, overwrite=True, warm_up=warm_up)
        except Exception as err:  # noqa: BLE001
            record["error"] = f"{type(err).__name__}: {err}"
    record.update(run_wall_seconds=round(time.perf_counter() - started, 2), others_cpu_share=round(meter.share, 3))
    return result


class OthersMeter:
    """The share of all CPUs that *other* processes used while a child ran: CPU time busy on the
    machine (/proc/stat) minus the CPU time of our finished children, over wall time x CPUs.

    A 2-thread torch run loses far more than half its speed when another process takes a core
    (threads wait on each other at every parallel region), so a ratio is only read from clean runs.

    ``in_process=True``: the contender runs in this process (``cadence.api``), so this process's own
    CPU time is ours too, not only that of its finished children."""

    def __init__(self, in_process: bool = False):
        self.in_process = in_process

    def __enter__(self) -> "OthersMeter":
        self.ours = _our_cpu(self.in_process)
        self.busy, self.total = _machine_jiffies()
        return self

    def __exit__(self, *exc) -> None:
        busy, total = _machine_jiffies()
        ours = (_our_cpu(self.in_process) - self.ours) * os.sysconf("SC_CLK_TCK")
        self.share = max(0.0, (busy - self.busy - ours) / max(1, total - self.total))


def _our_cpu(in_process: bool) -> float:
    """CPU seconds of our finished children, plus this process's own with ``in_process``."""
    kinds = (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF) if in_process else (resource.RUSAGE_CHILDREN,)
    return sum(usage.ru_utime + usage.ru_stime for usage in map(resource.getrusage, kinds))


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies summed over all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


# ---- data ----------------------------------------------------------------------------------------


class BusyCore:
    """Another process spinning on one core while the block runs (users share machines: the
    ``busy`` condition of the peer comparisons)."""

    def __enter__(self) -> "BusyCore":
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
