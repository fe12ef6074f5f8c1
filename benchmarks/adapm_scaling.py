#!/usr/bin/env python
"""AdaPM's parallel efficiency at equal CPU (issue 47): N nodes against one node on the same cores.

For each task (``--tasks``: the synthetic Zipf MF, partitioned as the paper's App. C, ``mf.row_blocks``
= N; the synthetic power-law KG) and each node count N (``--nodes``, default 2,4,8), in one invocation
and on the same data and epochs:

- ``single``: one AdaPM node (``ps.workers=1``) in its own process, given the machine's C cores;
- ``threads``: N nodes as threads of one process, the same C cores (``ps.engine=threads``);
- ``ray`` (needs root and cgroup v1's cpu controller; skipped otherwise): N Ray nodes on this machine,
  each a ``ray start`` whose raylet and node actor live in a CPU-quota cgroup of C / N cores
  (``cpu.cfs_quota_us``), the driver outside them (it only waits).

Parallel efficiency = N-node examples/s over the single node's (1.0: N nodes on the same CPU lose
nothing to the protocol; the paper's 6.5-7x on 8 machines is 0.81-0.88). Quality beside it (MF: test
RMSE; KG: filtered MRR), each run's 1-minute load average before it; ``--reps`` interleaved
repetitions of each (single, threads, ray) triple.

    .venv/bin/python benchmarks/adapm_scaling.py [--tasks mf,kge] [--nodes 2,4,8] [--reps 2] [--full]

Refuses a tree with uncommitted changes to ``src/`` or ``benchmarks/`` unless ``--dirty``. Writes
benchmarks/results/adapm_scaling.json (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from peer_stats import write_report
from provenance import add_flag, check
from scaling import header, measure, trained, usable_engines  # same folder

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def task_overrides(task: str, nodes: int, full: bool) -> list[str]:
    common = ["optimizer.entity=adagrad", "train.epochs=1", "checkpoint.every=0", "progress=false", "seed=0"]
    if task == "mf":  # (the paper's MF partitioning: node r trains user block r, every item)
        size = (["mf.synthetic.users=100000", "mf.synthetic.items=10000", "mf.synthetic.ratings=1000000"] if full
                else ["mf.synthetic.users=40000", "mf.synthetic.items=5000", "mf.synthetic.ratings=300000"])
        return ["task=mf", "data.dataset=synthetic-zipf", *size, "model.dim=32", "train.batch_size=1000",
                "optimizer.lr=0.05", "mf.reg=0.02", "model.init_std=0.1", f"mf.row_blocks={nodes}", *common]
    edges = 200_000 if full else 60_000
    return ["task=kge", "data.dataset=synthetic", f"data.synthetic.num_entities={edges // 10}", "model.dim=64",
            "data.synthetic.num_relations=20", f"data.synthetic.num_edges={edges}", "data.synthetic.holdout=200",
            "model.name=distmult", "train.batch_size=500", "optimizer.lr=0.1", *common]


def run(task: str, nodes: int, full: bool, engine: str, address: str | None = None,
        extra: tuple[str, ...] = ()) -> dict[str, Any]:
    overrides = [*task_overrides(task, nodes, full), *extra]
    adapm = ["strategy=adapm", f"ps.workers={1 if engine == 'single' else nodes}"]
    if engine == "ray":
        adapm += ["ps.engine=ray", f"ps.ray_address={address}"]
    elif engine == "threads":
        adapm += ["ps.engine=threads"]
    return trained([*overrides, *adapm], engine, task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="mf,kge")
    parser.add_argument("--nodes", default="2,4,8", help="node counts N, comma-separated")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--engines", default="threads,ray", help="of threads, ray (single always runs)")
    parser.add_argument("--full", action="store_true", help="the issue's sizes (MF 1M ratings, KG 200k edges)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every contender (repeatable), e.g. adapm.sync_share=0.25")
    parser.add_argument("--out", default=str(RESULTS / "adapm_scaling.json"))
    add_flag(parser)
    args = parser.parse_args()
    found = check(args, "adapm_scaling")
    engines = usable_engines(args.engines, "adapm_scaling")
    started = time.perf_counter()
    report: dict[str, Any] = header("adapm_scaling", found)
    report["tasks"] = measure(
        args.tasks.split(","), [int(n) for n in args.nodes.split(",")], args.reps, engines,
        lambda task, nodes, engine, address: run(task, nodes, args.full, engine, address, tuple(args.set)),
        lambda task, nodes: [*task_overrides(task, nodes, args.full), *args.set], "adapm")
    print(write_report(report, Path(args.out), started, 0.0))


if __name__ == "__main__":
    main()
