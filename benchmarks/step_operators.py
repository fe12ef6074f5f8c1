#!/usr/bin/env python
"""Operators a KGE training batch dispatches (issue 46): every ATen operator the calling thread runs,
counted by a ``TorchDispatchMode`` around a whole sync run on the CPU, and the marginal count per
batch: (count of a ``--long``-batch run - count of a ``--short``-batch run) / the difference, so the
run's one-time work (data, tables, checkpoints) cancels. Sync runs its stages inline on the calling
thread and autograd runs a CPU backward there too, so the mode sees the whole step: the batch's
preparation, the rows' read, forward, backward, the optimizer steps and the rows' write. On a GPU each
of these operators is at least one kernel launch (or a host-side step the launches wait for).

    .venv/bin/python benchmarks/step_operators.py [--short 20] [--long 100] [--top 25] [--out FILE] [--dirty]

The setting (issue 46's): DistMult d=8, 100 shared negatives per side, batches of 1,000 edges,
logistic loss, row-wise Adagrad, on a synthetic graph of 20,000 entities, ``train.compiled`` on and
off. Writes ``benchmarks/results/step_operators.json``: per setting the marginal operators per batch
and the operators that make them up (per batch, largest first).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cadence import api
from cadence.config import load_config

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 1000
SETTING = ["task=kge", "strategy=sync", "data.dataset=synthetic", "data.synthetic.num_entities=20000",
           "data.synthetic.num_relations=8", "data.synthetic.holdout=10", "model.name=distmult", "model.dim=8",
           "train.scoring=sampled", "train.negatives=100", "train.negative_chunk=0", "train.negative_pool=all",
           "train.loss=logistic", f"train.batch_size={BATCH}", "train.epochs=1", "optimizer.entity=rowwise_adagrad",
           "optimizer.dense=adagrad", "optimizer.lr=0.1", "threads=1", "adapt_threads=false", "eval.every=0",
           "eval.test=false", "checkpoint.every=0", "progress=false", "seed=0"]


class OperatorCounter(TorchDispatchMode):
    """Counts each ATen operator (by overload packet: ``aten.index_select``) this thread dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def counted_run(batches: int, overrides: list[str], out: Path) -> Counter[str]:
    """The operators a sync run of ``batches`` batches dispatches (the edges: exactly that many batches)."""
    config = load_config(None, [*SETTING, f"data.synthetic.num_edges={batches * BATCH + 10}", *overrides,
                                f"out={out}"])
    with OperatorCounter() as counter:
        api.train(config)
    return counter.counts


def per_batch(short: int, long: int, overrides: list[str]) -> tuple[float, dict[str, float]]:
    """(marginal operators per batch, each operator's share of them), from a ``short``- and a
    ``long``-batch run."""
    with tempfile.TemporaryDirectory(prefix="cadence-step-operators-") as root:
        few = counted_run(short, overrides, Path(root) / "short")
        many = counted_run(long, overrides, Path(root) / "long")
    span = long - short
    each = {name: (many[name] - few[name]) / span for name in set(many) | set(few)}
    each = {name: count for name, count in sorted(each.items(), key=lambda kv: -kv[1]) if count}
    return sum(each.values()), each


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", type=int, default=20, help="batches of the shorter run (default 20)")
    parser.add_argument("--long", type=int, default=100, help="batches of the longer run (default 100)")
    parser.add_argument("--top", type=int, default=25, help="operators listed per setting (default 25)")
    parser.add_argument("--out", type=Path, default=RESULTS / "step_operators.json")
    add_flag(parser)
    args = parser.parse_args()
    check(args)
    torch.set_num_threads(1)
    report = {"setting": SETTING, "short": args.short, "long": args.long, "torch": torch.__version__, "runs": {}}
    for name, overrides in (("compiled", ["train.compiled=true"]), ("not compiled", ["train.compiled=false"])):
        total, each = per_batch(args.short, args.long, overrides)
        report["runs"][name] = {"operators_per_batch": round(total, 2), "by_operator": each}
        print(f"{name}: {total:.1f} operators per batch")
        for op, count in list(each.items())[:args.top]:
            print(f"  {count:7.2f}  {op}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp(report), indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
