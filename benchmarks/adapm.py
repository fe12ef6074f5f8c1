#!/usr/bin/env python
"""AdaPM (SPEC section 2, seed 001): the paper's Table 2 and Figures 6-8, shaped for one machine,
every contender in one invocation.

Parts (``--parts``, default all):

- ``table2``: the synthetic Zipf MF (``synthetic-zipf``, 100k users x 10k items, 1M ratings, rank
  32) partitioned as the paper does (App. C, ``--mf-partition rows``, the default: ``mf.row_blocks``
  = nodes, node p trains user block p, every item) or with DSGD's strata (``--mf-partition
  strata``, not the paper's: ``mf.strata`` = nodes, node p trains user block p and item block
  (p + s) mod P in sub-epoch s: column locality), on 2 and 4 nodes: ``adaptive`` (AdaPM),
  ``replication`` (AdaPM w/o relocation), ``relocation`` (w/o replication), ``static``
  (a classic parameter server: static partitioning), ``full`` (full replication, synchronised every
  round), and the single node. Per contender: bytes communicated per epoch and node, mean replica
  staleness (ms since the replica's last refresh, over replica reads: the paper's measure), share of
  remote accesses, relocations and replicas, epoch seconds, best test RMSE, and the effective
  speedup over the single node: its time to 90% of the single node's best quality (RMSE <= best /
  0.9) over the single node's.
- ``tasks``: quality and communication on every task, single node against AdaPM on 2 nodes, seeds
  0 .. ``--seeds`` - 1 (the paired difference's mean and 95% interval): KGE
  (Kinships, ComplEx, ``configs/kinships-complex.yaml`` for 20 epochs), MF (``configs/ml100k-mf.yaml``),
  CTR (``configs/ml100k-deepfm.yaml``), word2vec (the registered ``enwiki-excerpt`` corpus, 3 epochs).
- ``ray``: two Ray nodes on loopback (two ``ray start``; one AdaPM node actor on each): the Zipf MF
  with strata on 2 nodes, ``adaptive`` and ``replication`` against one node actor.
- ``start`` (not in the default parts): the start-of-epoch wait, ``adapm.start_rounds`` 0 against
  10, on 2 and 4 nodes (remote accesses, epoch time).
- ``timing``: Figure 8's ablation on the Zipf MF without strata (every node sees every hot key), 2
  nodes, one epoch: adaptive timing against acting immediately, for look-aheads 4 .. 1024 batches.

Bars (PASS/FAIL printed and under ``bars``): remote accesses < 0.01% of all accesses with adaptive
timing (every AdaPM run); bytes per epoch of ``adaptive`` <= 0.5 x ``replication`` on the Zipf MF;
quality within 1% of the single node on every task (mean paired difference over seeds); the timing shape: immediate's epoch time and
staleness grow with the look-ahead while adaptive's stay flat (max / min over look-aheads >= 64).

The nodes are threads of this process (the ``threads`` engine): communication volumes, staleness
and remote accesses are the protocol's; epoch times share 2 cores and one interpreter among all
nodes' workers and sync threads, so they measure overhead, not a cluster's speedup.

    .venv/bin/python benchmarks/adapm.py [--quick] [--parts table2,tasks,timing,ray] [--seeds 3]

Writes benchmarks/results/adapm.json (``--quick``: adapm_quick.json, smaller data, to check the
harness).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from provenance import add_flag, check  # same folder: every result traces to a commit

from kge_throughput import machine_info  # same folder: the shared machine record
from peer_stats import mean_ci, train_measured, write_report

from cadence.config import load_config

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
KEYS = ("bytes_per_epoch", "replica_staleness", "remote_access_share", "remote_accesses", "accesses",
        "relocations", "replicas_created", "rounds", "train_seconds", "examples_per_second", "engine", "node_hosts")
TECHNIQUES = ("adaptive", "replication", "relocation", "static", "full")


def zipf(quick: bool) -> list[str]:
    size = (["mf.synthetic.users=20000", "mf.synthetic.items=5000", "mf.synthetic.ratings=200000"] if quick
            else ["mf.synthetic.users=100000", "mf.synthetic.items=10000", "mf.synthetic.ratings=1000000"])
    return ["task=mf", "data.dataset=synthetic-zipf", *size, "model.dim=32", "train.batch_size=1000",
            "optimizer.lr=0.05", "optimizer.entity=adagrad", "mf.reg=0.02", "model.init_std=0.1",
            "progress=false"]


def run(config_path: Path | None, overrides: list[str], name: str) -> dict[str, Any]:
    config = load_config(config_path, overrides)
    record: dict[str, Any] = {"name": name, "overrides": overrides}
    result = train_measured(config, record, "adapm-bench-")
    if result is None:
        print(f"  {name}: ERROR {record['error']}", flush=True)
        return record
    summary = result.summary
    metric = summary["primary_metric"]
    curve = [(r["wall_seconds"], r[metric]) for r in result.metrics if r["split"] == "valid" and metric in r]
    record.update({key: summary.get(key) for key in KEYS})
    record.update(metric=metric, test=summary[metric], best_valid=summary.get(f"best_valid_{metric}"),
                  curve=curve, epochs=summary["epochs"],
                  epoch_seconds=round(summary["train_seconds"] / max(1, summary["epochs"]), 3))
    print(f"  {name}: {metric} {record['test']:.4f}  bytes/epoch/node {record['bytes_per_epoch'] or 0:,.0f}  "
          f"remote {record['remote_access_share'] or 0:.6%}  staleness {record['replica_staleness'] or 0:.2f} ms  "
          f"epoch {record['epoch_seconds']:.2f} s", flush=True)
    return record


def time_to(curve: list[tuple[float, float]], target: float, lower_is_better: bool) -> float | None:
    for seconds, value in curve:
        if (value <= target) if lower_is_better else (value >= target):
            return seconds
    return None


def effective_speedups(records: list[dict[str, Any]], single: dict[str, Any]) -> None:
    """Time to 90% of the single node's best quality, relative to the single node's own."""
    lower = single["metric"] == "rmse"
    values = [v for _, v in single["curve"]]
    best = min(values) if lower else max(values)
    target = best / 0.9 if lower else 0.9 * best
    base = time_to(single["curve"], target, lower)
    for record in records:
        mine = time_to(record.get("curve", []), target, lower)
        record["time_to_90"] = mine
        record["effective_speedup"] = round(base / mine, 3) if base and mine else None


PARTITIONS = {  # Table 2's MF partitioning (``--mf-partition``) for a number of nodes
    "rows": lambda nodes: [f"mf.row_blocks={nodes}"],  # the paper's (App. C): a row block per node, a column block per thread
    "strata": lambda nodes: [f"mf.strata={nodes}"],  # DSGD's strata: not the paper's (column locality)
}


def part_table2(quick: bool, partition: str = "rows", node_counts: tuple[int, ...] = (2, 4), threads: int = 1,
                techniques: tuple[str, ...] = TECHNIQUES, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """``threads`` worker threads a node (with the rows partitioning, a column block each: App. C);
    ``extra``: overrides for every contender (``--set``)."""
    epochs = ["train.epochs=2" if quick else "train.epochs=3", "eval.every=1"]
    out: dict[str, Any] = {"partition": partition, "threads_per_node": threads, "overrides": list(extra)}
    for nodes in node_counts:
        common = [*zipf(quick), *epochs, *PARTITIONS[partition](nodes), f"adapm.threads={threads}", *extra]
        print(f"table2, {nodes} nodes x {threads} threads", flush=True)
        single = run(None, [*common, "strategy=adapm", "ps.workers=1"], "single")
        rows = [run(None, [*common, "strategy=adapm", f"ps.workers={nodes}", f"adapm.technique={t}"], t)
                for t in techniques]
        effective_speedups([single, *rows], single)
        out[f"{nodes}_nodes"] = {"single": single, **{row["name"]: row for row in rows}}
    return out


TASK_RUNS = {
    "kge": (REPO / "configs" / "kinships-complex.yaml", ["train.epochs=20", "eval.patience=0"]),
    "mf": (REPO / "configs" / "ml100k-mf.yaml", ["eval.every=5"]),
    "ctr": (REPO / "configs" / "ml100k-deepfm.yaml", ["ps.tolerance=2"]),
    "w2v": (REPO / "configs" / "w2v.yaml", ["data.dataset=enwiki-excerpt"]),
}


def part_tasks(quick: bool, seeds: int, tasks: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for task in tasks:
        path, extra = TASK_RUNS[task]
        shorter = ["train.epochs=2"] if quick else []
        common = [*extra, *shorter, "strategy=adapm", "progress=false"]
        print(f"tasks: {task}", flush=True)
        entry: dict[str, Any] = {"single": [], "adapm-2": []}
        for seed in range(seeds):
            entry["single"].append(run(path, [*common, f"seed={seed}", "ps.workers=1"], f"single-s{seed}"))
            entry["adapm-2"].append(run(path, [*common, f"seed={seed}", "ps.workers=2"], f"adapm-2-s{seed}"))
        pairs = [(a["test"], b["test"]) for a, b in zip(entry["single"], entry["adapm-2"]) if "test" in a and "test" in b]
        if pairs:
            lower = entry["single"][0]["metric"] == "rmse"
            sign = 1.0 if lower else -1.0  # > 0: AdaPM worse than the single node
            single_mean = mean_ci([a for a, _ in pairs])["mean"]
            entry["single_test"] = mean_ci([a for a, _ in pairs])
            entry["adapm_test"] = mean_ci([b for _, b in pairs])
            entry["paired_difference"] = mean_ci([sign * (b - a) for a, b in pairs])
            entry["relative_gap"] = round(entry["paired_difference"]["mean"] / abs(single_mean), 5)
        out[task] = entry
    return out


def part_timing(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    aheads = (4, 16, 64, 256) if quick else (4, 16, 64, 256, 1024)
    for timing in ("adaptive", "immediate"):
        print(f"timing: {timing}", flush=True)
        rows = []
        for ahead in aheads:
            rows.append(run(None, [*zipf(quick), "train.epochs=1", "eval.every=1", "strategy=adapm", "ps.workers=2",
                                   f"adapm.timing={timing}", f"adapm.lookahead={ahead}"], f"{timing}-{ahead}"))
            rows[-1]["lookahead"] = ahead
        out[timing] = rows
    return out


def part_start(quick: bool) -> dict[str, Any]:
    """The start-of-epoch wait (``adapm.start_rounds``, cadence's, not the paper's): the Zipf MF with
    strata, 1 epoch, 2 and 4 nodes, no wait against the default 10 rounds, 3 seeds each: remote
    accesses and epoch time."""
    out: dict[str, Any] = {}
    for nodes in (2, 4):
        for rounds in (0, 10):
            name = f"{nodes}-nodes-start-{rounds}"
            print(f"start: {name}", flush=True)
            out[name] = [run(None, [*zipf(quick), "train.epochs=1", "eval.every=0", "strategy=adapm",
                                    f"ps.workers={nodes}", f"mf.strata={nodes}", f"adapm.start_rounds={rounds}",
                                    f"seed={seed}"], f"{name}-seed{seed}") for seed in range(3)]
    return out


def part_ray(quick: bool) -> dict[str, Any]:
    """Two Ray nodes on loopback (``ray start`` twice): one AdaPM node actor per Ray node."""
    from ray_cluster import two_nodes

    out: dict[str, Any] = {}
    common = [*zipf(quick), "train.epochs=2" if quick else "train.epochs=3", "eval.every=1", "mf.strata=2",
              "strategy=adapm", "ps.engine=ray"]
    with two_nodes() as address:
        print(f"ray: two nodes at {address}", flush=True)
        where = [f"ps.ray_address={address}"]
        single = run(None, [*common, *where, "ps.workers=1"], "single")
        rows = [run(None, [*common, *where, "ps.workers=2", f"adapm.technique={t}"], t)
                for t in ("adaptive", "replication")]
    effective_speedups([single, *rows], single)
    out = {"single": single, **{row["name"]: row for row in rows}}
    return out


def bars(report: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    runs = []
    for group in [*(g for g in report.get("table2", {}).values() if isinstance(g, dict)), report.get("ray", {})]:
        runs += [r for name, r in group.items() if name == "adaptive" and "accesses" in r]
    for group in report.get("tasks", {}).values():
        runs += [r for r in group["adapm-2"] if "accesses" in r]
    if runs:
        share = max(r["remote_access_share"] for r in runs)
        result["remote_share_below_0.01%"] = {"max": share, "pass": share < 1e-4}
    table = {**{k: g for k, g in report.get("table2", {}).items() if isinstance(g, dict)},
             **({"ray_2_nodes": report["ray"]} if "ray" in report else {})}
    for nodes, group in table.items():
        if "bytes_per_epoch" in group.get("adaptive", {}) and "bytes_per_epoch" in group.get("replication", {}):
            ratio = group["adaptive"]["bytes_per_epoch"] / group["replication"]["bytes_per_epoch"]
            bar = 0.2 if nodes == "8_nodes" else 0.5  # (at the paper's 8 nodes, issue 47's bar; the paper: 0.11)
            result[f"bytes_vs_replication_{nodes}"] = {"ratio": round(ratio, 4), "bar": bar, "pass": ratio <= bar}
    for task, group in report.get("tasks", {}).items():
        gap = group.get("relative_gap")
        if gap is not None:  # (the mean of the paired differences over seeds, relative to the single node's mean)
            result[f"quality_within_1%_{task}"] = {"relative_gap": gap, "ci95": group["paired_difference"]["ci95"],
                                                  "pass": gap <= 0.01}
    timing = report.get("timing", {})
    if timing:
        def spread(rows, key):
            values = [r[key] for r in rows if r.get(key) is not None and r["lookahead"] >= 64]
            return round(max(values) / min(values), 3) if values and min(values) > 0 else None
        shape = {t: {key: spread(rows, key) for key in ("epoch_seconds", "replica_staleness", "bytes_per_epoch")}
                 for t, rows in timing.items()}
        result["timing_shape"] = {"max_over_min_for_lookahead_ge_64": shape,
                                  "pass": all((shape["immediate"][k] or 0) > (shape["adaptive"][k] or 0)
                                              for k in ("replica_staleness", "bytes_per_epoch"))}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="table2,tasks,timing,ray")
    parser.add_argument("--out", default=None)
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the tasks part (default 3)")
    parser.add_argument("--tasks", default=",".join(TASK_RUNS), help="tasks of the tasks part (default all)")
    parser.add_argument("--mf-partition", choices=sorted(PARTITIONS), default="rows",
                        help="Table 2's partitioning: rows (the paper's App. C, default) or strata (DSGD's)")
    parser.add_argument("--table2-nodes", default="2,4", help="Table 2's node counts (default 2,4; the paper's 8)")
    parser.add_argument("--table2-threads", type=int, default=1, help="Table 2's worker threads a node (default 1)")
    parser.add_argument("--techniques", default=",".join(TECHNIQUES), help="Table 2's contenders (default all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="Table 2: a config override for every contender (repeatable), e.g. mf.visit=by-column")
    add_flag(parser)
    args = parser.parse_args()
    check(args)
    started = time.perf_counter()
    out = Path(args.out) if args.out else RESULTS / f"adapm{'_quick' if args.quick else ''}.json"
    report: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/adapm.py", *sys.argv[1:]]),
        "machine": machine_info(), "engine": "threads (every node in this process)",
    }
    parts = {"table2": lambda quick: part_table2(quick, args.mf_partition,
                                                 tuple(int(n) for n in args.table2_nodes.split(",")),
                                                 args.table2_threads, tuple(args.techniques.split(",")),
                                                 tuple(args.set)), "tasks": lambda quick: part_tasks(quick, 1 if quick else args.seeds, args.tasks.split(",")),
             "timing": part_timing, "ray": part_ray, "start": part_start}
    for name in args.parts.split(","):
        report[name] = parts[name](args.quick)
        write_report(report, out, started, 0.0)  # (a partial report survives an interrupted run)
    report["bars"] = bars(report)
    for name, bar in report["bars"].items():
        print(f"{'PASS' if bar['pass'] else 'FAIL'}  {name}: {({k: v for k, v in bar.items() if k != 'pass'})}")
    print(write_report(report, out, started, 0.0))


if __name__ == "__main__":
    main()
