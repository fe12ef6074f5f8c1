#!/usr/bin/env python
"""Where a GPU run's time goes: issue 9's 10M-entity KGE setting (``gpu_check.py``'s ``kge-large`` part,
fewer edges) trained under each strategy inside ``torch.profiler`` (CPU and CUDA activities), one
table per strategy: the operators by self CPU time and by self CUDA time, the kernel launches, and
the pipeline's busy seconds per stage.

    python3 benchmarks/gpu_profile.py [--strategies sync,async] [--part kge-10m|kge-fb15k-complex|kge-fb15k-distmult]
                                      [--edges 600000] [--out DIR]

Writes ``DIR/gpu_profile_<strategy>.txt`` (default ``benchmarks/results/``; ``_<part>`` added for a part
other than kge-10m) and ``DIR/gpu_profile.json``: per strategy the step profile (``step_profile``):
kernel launches per batch, the GPU's busy share (kernel time over the training's wall time) and
the host's seconds per batch. The profiler records
the operators of the thread that started it; CUDA activity (launches, kernels, copies) of every
thread. It slows a run down: read the shares and counts per batch, not the examples/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from provenance import add_flag, check  # same folder: every result traces to a commit

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from gpu_check import CONFIGS, PARTS

from cadence import api
from cadence.config import load_config

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="sync,async", help="comma-separated (default sync,async)")
    parser.add_argument("--part", default="kge-10m", help="a kge part of gpu_check.py (default kge-10m)")
    parser.add_argument("--edges", type=int, default=None,
                        help="training edges (default 600,000 for kge-10m; the part's own otherwise)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the tables")
    add_flag(parser)
    args = parser.parse_args()
    provenance = check(args)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_profile.py: no CUDA device here (torch.cuda.is_available() is False)")
    parts = {part.name: part for name in ("kge-large", "kge-fb15k") for part in PARTS[name]}
    if args.part not in parts:
        raise SystemExit(f"gpu_profile.py: --part: one of {', '.join(parts)}")
    part = parts[args.part]
    edges = args.edges or (600_000 if args.part == "kge-10m" else None)
    args.out.mkdir(parents=True, exist_ok=True)
    profiles = {}
    for strategy in (name.strip() for name in args.strategies.split(",") if name.strip()):
        config = load_config(CONFIGS / part.config, [
            *part.overrides, *([f"data.synthetic.num_edges={edges}"] if edges else []), f"strategy={strategy}",
            "device=cuda", "train.epochs=1", "seed=0", "progress=false", "checkpoint.every=0", "eval.test=false"])
        with tempfile.TemporaryDirectory() as out:
            config.out = out
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                started = time.perf_counter()
                summary = api.train(config, overwrite=True, warm_up=api.WARM_UP_BATCHES).summary
                # the warm-up (one-time compilation) off the wall time; its batches' launches stay in
                # the profile and are counted as batches
                wall = time.perf_counter() - started - summary.get("warmup_seconds", 0.0)
        busy = {key: value for key, value in summary.items() if key.endswith("_busy_seconds")}
        head = (f"{strategy} at {provenance['commit']}: {summary['examples_per_second']:,.0f} ex/s (profiled), "
                f"train {summary['train_seconds']} s, wall {wall:.1f} s, busy {busy}")
        averages = prof.key_averages()
        batches = -(-summary["examples_seen"] // config.train.batch_size) + api.WARM_UP_BATCHES
        profiles[strategy] = {**step_profile(averages, batches, wall), "examples_per_second": summary["examples_per_second"]}
        head += f"\n{profiles[strategy]}"
        path = args.out / f"gpu_profile_{strategy}{'' if args.part == 'kge-10m' else '_' + args.part}.txt"
        path.write_text(head + "\n" + averages.table(sort_by="self_cpu_time_total", row_limit=45,
                                                     max_name_column_width=60)
                        + "\n" + averages.table(sort_by="self_cuda_time_total", row_limit=20,
                                                max_name_column_width=60) + "\n")
        print(head, file=sys.stderr, flush=True)
    (args.out / "gpu_profile.json").write_text(json.dumps(
        {"part": args.part, "edges": edges, "provenance": provenance, "strategies": profiles}, indent=1) + "\n")
    return 0


LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch")


def step_profile(averages, batches: int, wall: float) -> dict:
    """From a profile's ``key_averages()``: kernel launches per batch (the runtime's launch calls),
    the GPU's busy share (the summed time of the device's events over ``wall``) and the host's
    seconds per batch (``wall`` / ``batches``)."""
    launches = sum(event.count for event in averages if event.key in LAUNCHES)
    # the device's own events (kernels, copies); a CPU operator's device time is its kernels', counted there
    device_us = sum(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0))
                    for event in averages if getattr(event, "device_type", DeviceType.CPU) != DeviceType.CPU)
    return {"batches": batches, "launches_per_batch": round(launches / max(1, batches), 1),
            "gpu_busy_share": round(device_us / 1e6 / wall, 3) if wall else None,
            "host_seconds_per_batch": round(wall / max(1, batches), 6)}


if __name__ == "__main__":
    sys.exit(main())
