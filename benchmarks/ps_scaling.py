#!/usr/bin/env python
"""The parameter server's parallel efficiency at equal CPU (issue 48): N workers against the
single-process pipeline on the same cores, measured as AdaPM's is (``scaling.py``).

On the CTR task (synthetic-ctr, DeepFM, one epoch, test AUC as the quality), for each worker count N
(``--workers``, default 2,4) and each strategy (``--strategies``, default async, gba, sync and
ShadowSync's three), in one invocation:

- ``single``: the one-process pipeline (``strategy=sync``, ``ps.workers=1``, threads), given the
  machine's C cores;
- ``<strategy>@ray`` (needs root and cgroup v1's cpu controller; skipped otherwise): ``ps.workers=N``
  on N Ray nodes of this machine, each a ``ray start`` whose raylet and actors (workers, shards, the
  coordinator, EASGD's sync servers, dealt round-robin) live in a CPU-quota cgroup of C / N cores;
- ``<strategy>@threads`` (``--engines threads,ray``): the same N workers as threads of one process.

Efficiency = examples/s over the single process's (medians of ``--reps`` interleaved repetitions).

    .venv/bin/python benchmarks/ps_scaling.py [--workers 2,4] [--strategies async,gba] [--reps 2]

Refuses a tree with uncommitted changes to ``src/`` or ``benchmarks/`` unless ``--dirty``. Writes
benchmarks/results/ps_scaling.json (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from peer_stats import write_report
from provenance import add_flag, check
from scaling import SINGLE, header, measure, trained, usable_engines  # same folder

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
STRATEGIES = "async,gba,sync,shadow-easgd,shadow-ma,shadow-bmuf"


def task_overrides(examples: int) -> list[str]:
    return ["task=ctr", "data.dataset=synthetic-ctr", f"ctr.synthetic.num_examples={examples}", "model.name=deepfm",
            "train.batch_size=512", "train.epochs=1", "eval.every=0", "checkpoint.every=0", "progress=false", "seed=0"]


def run(examples: int, workers: int, contender: str, address: str | None, extra: tuple[str, ...],
        shards: int = 1) -> dict[str, Any]:
    if contender == SINGLE:
        chosen = ["strategy=sync", "ps.workers=1", "ps.engine=threads"]
    else:
        strategy, engine = contender.split("@")
        chosen = [f"strategy={strategy}", f"ps.workers={workers}", f"ps.engine={engine}", f"ps.shards={shards}"]
        if engine == "ray":
            chosen.append(f"ps.ray_address={address}")
    return trained([*task_overrides(examples), *extra, *chosen], contender, "ctr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="2,4", help="worker counts N, comma-separated")
    parser.add_argument("--strategies", default=STRATEGIES)
    parser.add_argument("--engines", default="ray", help="of ray, threads (single always runs)")
    parser.add_argument("--examples", type=int, default=100_000, help="ctr.synthetic.num_examples")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--shards", type=int, default=1, help="ps.shards of the parameter-server contenders")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every contender (repeatable)")
    parser.add_argument("--out", default=str(RESULTS / "ps_scaling.json"))
    add_flag(parser)
    args = parser.parse_args()
    found = check(args, "ps_scaling")
    engines = usable_engines(args.engines, "ps_scaling")
    contenders = [f"{strategy}@{engine}" for strategy in args.strategies.split(",") for engine in engines]
    started = time.perf_counter()
    report: dict[str, Any] = header("ps_scaling", found)
    report["tasks"] = measure(
        ["ctr"], [int(n) for n in args.workers.split(",")], args.reps, contenders,
        lambda task, workers, contender, address: run(args.examples, workers, contender, address, tuple(args.set), args.shards),
        lambda task, workers: [*task_overrides(args.examples), *args.set], "ps")
    print(write_report(report, Path(args.out), started, 0.0))


if __name__ == "__main__":
    main()
