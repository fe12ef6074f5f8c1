#!/usr/bin/env python
"""Filtered KGE evaluation at scale (issue 28): time and peak memory of ranking 10,000 test triples of a
2M-entity graph in both directions, exactly (against every entity) and against sampled entities.

    .venv/bin/python benchmarks/eval_scale.py [--entities N] [--test N] [--filter N] [--negatives N] [--out FILE]

The graph: a seeded power-law graph (``cadence.data.synthetic``) of ``--entities`` entities whose
``--filter`` triples (train + valid + test) are the filter, ``--test`` of them the test split; the
model: DistMult d=100 with a seeded random entity table (evaluation costs the same whatever the
rows hold). Each contender runs in a fresh process (its peak RSS is its own), one after the other:

- ``exact-whole``: ``FilteredRankingMetric.__call__`` on the whole entity table in memory (the path
  a table of at most 256 MiB of rows takes; here 800 MB of rows);
- ``exact-blocks``: ``ranks_in_blocks`` over every entity, 16 MiB of rows at a time (the path of a
  larger table, read from wherever its rows live);
- ``sampled``: ``ranks_in_blocks`` against ``--negatives`` entities drawn once (``eval.negatives``).

Per contender: seconds, peak RSS, MRR. Writes ``benchmarks/results/eval_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from provenance import add_flag, check, stamp

import torch

from cadence.config import SyntheticGraphConfig, load_config
from cadence.data.synthetic import power_law_graph
from cadence.evaluation.ranking import FilteredRankingMetric, summarize_ranks
from cadence.models.kge import KgeModel

RESULTS = Path(__file__).parent / "results"
CONTENDERS = ("exact-whole", "exact-blocks", "sampled")
DIM = 100
BLOCK = (1 << 22) // DIM  # 16 MiB of rows, as the kge task reads a large table


def measure(contender: str, entities: int, test: int, filter_triples: int, negatives: int) -> dict:
    torch.set_num_threads(os.cpu_count() or 1)
    graph = power_law_graph(SyntheticGraphConfig(num_entities=entities, num_edges=filter_triples, holdout=test,
                                                 num_relations=16), 0)
    model = KgeModel(load_config(None, ["model.name=distmult", f"model.dim={DIM}"]), graph.num_relations)
    table = torch.randn(entities, DIM, generator=torch.Generator().manual_seed(1)) * 0.1
    metric = FilteredRankingMetric(graph, False)
    started = time.perf_counter()
    with torch.no_grad():
        if contender == "exact-whole":
            metrics = metric(model, table, graph.test)
        else:
            candidates = entities
            if contender == "sampled":
                generator = torch.Generator().manual_seed(2)
                candidates = torch.randperm(entities, generator=generator)[:negatives].sort().values
            metrics = summarize_ranks(metric.ranks_in_blocks(model, lambda ids: table[ids], candidates, graph.test,
                                                            BLOCK))
    seconds = time.perf_counter() - started
    return {"contender": contender, "seconds": seconds, "mrr": metrics["mrr"], "test_triples": int(graph.test.shape[0]),
            "filter_triples": int(graph.all_triples().shape[0]), "table_mib": table.numel() * 4 / 2 ** 20,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=2_000_000)
    parser.add_argument("--test", type=int, default=10_000)
    parser.add_argument("--filter", type=int, default=100_000, help="train + valid + test triples")
    parser.add_argument("--negatives", type=int, default=1000)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child: one contender, JSON out
    parser.add_argument("--out", default=str(RESULTS / "eval_scale.json"))
    add_flag(parser)
    args = parser.parse_args()
    sizes = (args.entities, args.test, args.filter, args.negatives)
    if args.one:
        print(json.dumps(measure(args.one, *sizes)))
        return 0
    provenance = check(args, "eval_scale.py")
    print(f"eval_scale at {provenance['commit']}", file=sys.stderr)
    runs = []
    for contender in args.contenders.split(","):
        load = os.getloadavg()[0]
        done = subprocess.run([sys.executable, __file__, "--one", contender, "--entities", str(args.entities),
                               "--test", str(args.test), "--filter", str(args.filter), "--negatives",
                               str(args.negatives), "--dirty"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"eval_scale.py: {contender} failed:\n{done.stderr[-2000:]}")
        record = {**json.loads(done.stdout.strip().splitlines()[-1]), "loadavg_before": load}
        runs.append(record)
        print(f"{contender:13s} {record['seconds']:8.1f} s  peak {record['peak_rss_mib']:7,.0f} MiB  "
              f"MRR {record['mrr']:.6f}", file=sys.stderr)
    report = {"command": " ".join([".venv/bin/python", "benchmarks/eval_scale.py", *sys.argv[1:]]),
              "entities": args.entities, "negatives": args.negatives, "cpus": os.cpu_count(), "runs": runs}
    Path(args.out).write_text(json.dumps(stamp(report), indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
