#!/usr/bin/env python
"""What a run on the Ray engine costs before and around its training, with and without the
processes a finished run leaves idle (``ps.ray_idle_processes``), in one driver process.

    .venv/bin/python benchmarks/ray_run_start.py [--reps 4] [--out FILE] [--dirty]

One local Ray cluster (``num_cpus`` = the usable cores); then ``--reps`` pairs of runs of the same
small setting (``task: mf`` on a synthetic 300-rating matrix, ``hop_bw``, 2 workers, 2 shards: 5
roles, 2 epochs): the pool of idle processes is emptied, a first run starts its 5 processes (each
imports torch and cadence: what every ``cadence train`` process pays), and a second run right
after builds its roles in the processes the first one left (``ps.ray_idle_processes: 8``, the
default). Per run: the wall time of ``api.train`` (building the runtime, training, evaluating,
closing), the summary's ``engine_start_seconds`` (waiting for the roles to be built) and its train
seconds. Result: the runs, the medians of each kind and their ratio, the load, machine and commit,
in ``benchmarks/results/ray_run_start.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from kge_throughput import loadavg, machine_info  # same folder
from peer_stats import write_report
from provenance import check

from cadence import api
from cadence.config import load_config
from cadence.engines.ray import hosts
from cadence.engines.threads import usable_cores

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def write_ratings(path: Path, users: int = 25, items: int = 20, count: int = 300, seed: int = 4) -> Path:
    import random

    draw = random.Random(seed)
    lines = [f"{draw.randrange(users)}\t{draw.randrange(items)}\t{draw.randint(1, 5)}" for _ in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


def one_run(root: Path, name: str, data: Path) -> dict[str, Any]:
    config = load_config(None, ["task=mf", f"data.dataset={data}", "strategy=hop_bw", "ps.workers=2",
                                "ps.backup_workers=0", "ps.shards=2", "ps.engine=ray", "train.epochs=2",
                                "progress=false", "threads=1", "ps.ray_idle_processes=8",
                                f"out={root / name}"])
    load = loadavg()
    started = time.perf_counter()
    result = api.train(config)
    seconds = time.perf_counter() - started
    summary = result.summary
    return {"run_seconds": round(seconds, 3),
            "engine_start_seconds": summary.get("engine_start_seconds"),
            "train_seconds": summary.get("train_seconds"), "loadavg_before": load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS / "ray_run_start.json")
    parser.add_argument("--dirty", action="store_true", help="measure a tree with uncommitted changes (marked dirty)")
    args = parser.parse_args(argv)
    check(args)
    began = time.perf_counter()
    cores = usable_cores()
    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = write_ratings(root / "ratings.tsv")
        one_run(root, "warm", data)  # the cluster's first actors and the data's first read: not counted
        for rep in range(args.reps):
            hosts().clear()
            for kind in ("new", "kept"):
                record = one_run(root, f"run-{rep}-{kind}", data)
                record.update(rep=rep, processes=kind)
                runs.append(record)
                print(f"rep {rep} {kind} processes: {record['run_seconds']:.2f} s "
                      f"(waiting for roles {record['engine_start_seconds']} s)", file=sys.stderr)
    ray.shutdown()
    medians = {kind: statistics.median(r["run_seconds"] for r in runs if r["processes"] == kind)
               for kind in ("new", "kept")}
    starts = {kind: statistics.median(r["engine_start_seconds"] for r in runs if r["processes"] == kind)
              for kind in ("new", "kept")}
    report = {"benchmark": "ray_run_start", "command": " ".join([".venv/bin/python", "benchmarks/ray_run_start.py",
                                                                  *sys.argv[1:]]),
              "setting": "mf, 300 ratings, hop_bw, 2 workers, 2 shards (5 roles), 2 epochs, threads=1",
              "ray_version": ray.__version__, "num_cpus": cores, "machine": machine_info(), "runs": runs,
              "median_run_seconds": medians, "median_engine_start_seconds": starts,
              "new_over_kept": medians["new"] / medians["kept"]}
    out = write_report(report, args.out, began, 0.0)
    print(f"median run: new processes {medians['new']:.2f} s, kept processes {medians['kept']:.2f} s "
          f"({medians['new'] / medians['kept']:.1f}x); results in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
