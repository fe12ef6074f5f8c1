#!/usr/bin/env python
"""Where a GPU run's time goes: issue 9's 10M-entity KGE setting (``gpu_check.py``'s ``kge-large`` part,
fewer edges) trained under each strategy inside ``torch.profiler`` (CPU and CUDA activities), one
table per strategy: the operators by self CPU time and by self CUDA time, the kernel launches, and
the pipeline's busy seconds per stage.

    python3 benchmarks/gpu_profile.py [--strategies sync,async] [--edges 600000] [--out DIR]

Writes ``DIR/gpu_profile_<strategy>.txt`` (default ``benchmarks/results/``). The profiler records
the operators of the thread that started it; CUDA activity (launches, kernels, copies) of every
thread. It slows a run down: read the shares and counts per batch, not the examples/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from provenance import add_flag, check  # same folder: every result traces to a commit

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_check import CONFIGS, PARTS

from cadence import api
from cadence.config import load_config

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="sync,async", help="comma-separated (default sync,async)")
    parser.add_argument("--edges", type=int, default=600_000, help="training edges (default 600,000)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the tables")
    add_flag(parser)
    args = parser.parse_args()
    provenance = check(args)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_profile.py: no CUDA device here (torch.cuda.is_available() is False)")
    part = PARTS["kge-large"][0]
    args.out.mkdir(parents=True, exist_ok=True)
    for strategy in (name.strip() for name in args.strategies.split(",") if name.strip()):
        config = load_config(CONFIGS / part.config, [
            *part.overrides, f"data.synthetic.num_edges={args.edges}", f"strategy={strategy}", "device=cuda",
            "train.epochs=1", "seed=0", "progress=false", "checkpoint.every=0", "eval.test=false"])
        with tempfile.TemporaryDirectory() as out:
            config.out = out
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                started = time.perf_counter()
                summary = api.train(config, overwrite=True).summary
                wall = time.perf_counter() - started
        busy = {key: value for key, value in summary.items() if key.endswith("_busy_seconds")}
        head = (f"{strategy} at {provenance['commit']}: {summary['examples_per_second']:,.0f} ex/s (profiled), "
                f"train {summary['train_seconds']} s, wall {wall:.1f} s, busy {busy}")
        averages = prof.key_averages()
        path = args.out / f"gpu_profile_{strategy}.txt"
        path.write_text(head + "\n" + averages.table(sort_by="self_cpu_time_total", row_limit=45,
                                                     max_name_column_width=60)
                        + "\n" + averages.table(sort_by="self_cuda_time_total", row_limit=20,
                                                max_name_column_width=60) + "\n")
        print(head, file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
