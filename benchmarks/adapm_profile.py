#!/usr/bin/env python
"""Where AdaPM's time goes (issue 47): one node against N nodes as threads of this process, on the
same cores, the same data and epochs; each thread's CPU time and wall time split by what it was doing.

Each contender trains the synthetic Zipf MF (``benchmarks/adapm.py``'s Table 2 setting, the paper's
App. C partitioning: ``mf.row_blocks`` = nodes) for ``--epochs`` epochs under ``strategy=adapm`` on
the ``threads`` engine. The methods below are wrapped so that every call adds its thread's CPU time
(``time.thread_time``) and wall time to its category (the outermost wrapped call counts; a nested one,
such as the owner's ``serve`` inside a worker's ``pull``, is inside its caller's figure):

- ``round``: a node's communication round on its sync thread (act on intents, build each request,
  the destination's ``handle`` in this thread, ``install`` the answer), ``NodeRunner.round``;
- ``pull`` and ``commit``: a worker's read of a batch's rows and write of its update (remote accesses
  included), ``Node.pull`` / ``Node.commit``; ``intent``: ``Node.intent``;
- ``compute``: forward, backward and the rows' optimizer step, ``ComputeStage.__call__``;
- ``batch``: making a batch from its plan, ``task.training_batch``.

Wall minus CPU is time spent waiting (a lock, the interpreter lock, a core). The record: examples/s
of each contender, the parallel efficiency (N nodes' examples/s over one node's), the categories'
seconds, and each one's share of the workers' or the sync threads' CPU time; ``--reps`` interleaved
repetitions, the 1-minute load average before each.

    .venv/bin/python benchmarks/adapm_profile.py [--nodes 4] [--epochs 1] [--reps 2] [--quick] [--out FILE]

Refuses a tree with uncommitted changes to ``src/`` or ``benchmarks/`` (``--dirty`` to try).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import cadence  # noqa: E402
from provenance import add_flag, check  # noqa: E402  (same folder)
from cadence.pipeline.stages import ComputeStage  # noqa: E402
from cadence.strategies.adapm import engine as adapm_engine  # noqa: E402
from cadence.pm.node import Node  # noqa: E402
from cadence.tasks.mf import MfTask  # noqa: E402

CATEGORIES = {"round": (adapm_engine.NodeRunner, "round"), "pull": (Node, "pull"), "commit": (Node, "commit"),
              "intent": (Node, "intent"), "compute": (ComputeStage, "__call__"),
              "batch": (MfTask, "training_batch")}


class Ledger:
    """Per category: calls, CPU seconds and wall seconds, from the outermost wrapped call of a thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        self.inside = threading.local()

    def wrap(self, name: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            if getattr(self.inside, "busy", False):
                return function(*args, **kwargs)
            self.inside.busy = True
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                self.inside.busy = False
                with self.lock:
                    entry = self.totals[name]
                    entry[0] += 1
                    entry[1] += cpu
                    entry[2] += wall
        return timed


def setting(nodes: int, quick: bool, epochs: int, extra: tuple[str, ...] = ()) -> list[str]:
    size = (["mf.synthetic.users=20000", "mf.synthetic.items=5000", "mf.synthetic.ratings=200000"] if quick
            else ["mf.synthetic.users=100000", "mf.synthetic.items=10000", "mf.synthetic.ratings=1000000"])
    return ["task=mf", "data.dataset=synthetic-zipf", *size, "model.dim=32", "train.batch_size=1000",
            "optimizer.lr=0.05", "optimizer.entity=adagrad", "mf.reg=0.02", "model.init_std=0.1", "progress=false",
            "strategy=adapm", f"ps.workers={nodes}", f"mf.row_blocks={nodes}", "ps.engine=threads",
            f"train.epochs={epochs}", "eval.every=0", "eval.test=false", "checkpoint.every=0", "seed=0", *extra]


def run(nodes: int, quick: bool, epochs: int, extra: tuple[str, ...] = ()) -> dict:
    ledger = Ledger()
    originals = {name: getattr(owner, attribute) for name, (owner, attribute) in CATEGORIES.items()}
    for name, (owner, attribute) in CATEGORIES.items():
        setattr(owner, attribute, ledger.wrap(name, originals[name]))
    try:
        with tempfile.TemporaryDirectory(prefix="cadence-adapm-profile-") as tmp:
            config = cadence.load_config(None, setting(nodes, quick, epochs, extra))
            config.out = str(Path(tmp) / "run")
            load = os.getloadavg()[0]
            cpu, wall = time.process_time(), time.perf_counter()
            summary = cadence.train(config).summary
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        for name, (owner, attribute) in CATEGORIES.items():
            setattr(owner, attribute, originals[name])
    categories = {name: {"calls": int(calls), "cpu_seconds": round(cpu_s, 3), "wall_seconds": round(wall_s, 3)}
                  for name, (calls, cpu_s, wall_s) in ledger.totals.items()}
    workers_cpu = sum(categories.get(n, {}).get("cpu_seconds", 0.0) for n in ("pull", "commit", "intent", "compute",
                                                                               "batch"))
    for name, entry in categories.items():
        entry["share_of_workers_cpu" if name != "round" else "share_of_process_cpu"] = round(
            entry["cpu_seconds"] / (workers_cpu if name != "round" else cpu), 3) if (workers_cpu and cpu) else None
    return {"nodes": nodes, "examples_per_second": summary["examples_per_second"],
            "train_seconds": summary["train_seconds"], "rmse": summary.get("best_valid_rmse", summary.get("rmse")),
            "process_cpu_seconds": round(cpu, 3), "wall_seconds": round(wall, 3), "load_before": load,
            "categories": categories, "remote_access_share": summary.get("remote_access_share"),
            "rounds": summary.get("rounds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4, help="the contender's node count (against one node)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--quick", action="store_true", help="a smaller matrix (checks the harness)")
    add_flag(parser)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every contender (repeatable), e.g. adapm.sync_share=0.25")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "adapm_profile.json"))
    args = parser.parse_args()
    origin = check(args, "adapm_profile")
    runs: dict[str, list[dict]] = {"1": [], str(args.nodes): []}
    for rep in range(args.reps):
        order = [1, args.nodes] if rep % 2 == 0 else [args.nodes, 1]
        for nodes in order:
            record = run(nodes, args.quick, args.epochs, tuple(args.set))
            runs[str(nodes)].append(record)
            shares = ", ".join(f"{name} {entry['cpu_seconds']:.2f}/{entry['wall_seconds']:.2f}"
                               for name, entry in sorted(record["categories"].items()))
            print(f"rep {rep} nodes {nodes}: {record['examples_per_second']:,.0f} examples/s "
                  f"(load {record['load_before']:.2f}); cpu/wall s: {shares}", flush=True)
    single = statistics.median(r["examples_per_second"] for r in runs["1"])
    many = statistics.median(r["examples_per_second"] for r in runs[str(args.nodes)])
    report = {"command": " ".join(["benchmarks/adapm_profile.py", *sys.argv[1:]]), "provenance": origin,
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "setting": setting(args.nodes, args.quick,
                                                                                                   args.epochs, tuple(args.set)),
              "runs": runs, "parallel_efficiency": round(many / single, 4)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"parallel efficiency at {args.nodes} nodes (threads, same cores): {many / single:.3f}; wrote {args.out}")


if __name__ == "__main__":
    main()
