#!/usr/bin/env python
"""Two commits of cadence side by side: training throughput before and after a change (issue 24).

    .venv/bin/python benchmarks/refactor_ab.py --before REV --after REV [--reps 3] [--out FILE]

Each revision is checked out into a temporary git worktree; every measurement runs in a fresh
interpreter that imports that worktree's ``src`` (``PYTHONPATH``) and trains through the public API
only (``cadence.load_config``, ``cadence.train``), so one measurement script serves both. Three
measurements, interleaved before/after within each repetition (the order flipped every other
repetition, so drift hits both alike), the 1-minute load average recorded before each run:

- ``kge``: ``benchmarks/kge_throughput.py`` part 1's cadence setting (Kinships, DistMult dim 128,
  16 negatives, batch 1024, Adagrad lr 0.1, logistic loss, sampled scoring), ``--kge-epochs`` epochs:
  positives per second of training;
- ``ps-threads`` and ``ps-ray``: ``benchmarks/ps_cluster.py``'s throughput part
  (configs/ml100k-deepfm.yaml, gba, 2 workers, ``threads=1``), ``--ps-epochs`` epochs on the thread
  engine and on a local Ray cluster: examples per second of training;
- ``shadow-threads``: the same with ``shadow-easgd`` (2 trainers) on the thread engine;
- ``adapm-threads`` and ``adapm-ray``: configs/ml100k-mf.yaml under ``adapm`` with 2 nodes,
  ``--ps-epochs`` epochs on each engine;
- ``kge-d8`` (issue 46's host time per batch): sync KGE where compute is negligible, DistMult d=8,
  100 shared negatives, batches of 1,000, logistic loss, row-wise Adagrad, one torch thread, a
  synthetic graph of 20,000 entities and 200,000 edges, ``--kge-epochs`` epochs: the record's
  ``seconds_per_batch`` is the host's time per batch;
- ``umls``: the shipped configs/umls-complex.yaml, ``--kge-epochs`` epochs, sync;
- ``kge-complex-chunked``, ``kge-transe``, ``kge-rotate``: the ``kge`` setting with ComplEx under the
  softmax loss (chunked negatives: ``train.negative_chunk: auto``, the default loss's layout), TransE
  (L1) and RotatE under the logistic loss (shared negatives): the settings the fused step took on
  with issue 46's second round.

The result per measurement: each revision's runs, their medians, ``after / before`` of the medians
and per repetition, and each revision's own spread (max / min of its runs) as the noise to judge
the ratio by. The code measured is each revision's own (a worktree of the commit), so the numbers
trace to the two commits; this script itself must be committed: it refuses uncommitted changes to
``benchmarks/`` unless ``--allow-dirty``. Writes benchmarks/results/refactor_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEASUREMENTS = ("kge", "ps-threads", "ps-ray", "shadow-threads", "adapm-threads", "adapm-ray", "kge-d8", "umls",
                "kge-complex-chunked", "kge-transe", "kge-rotate")
KGE_MODELS = {"kge-complex-chunked": ["model.name=complex", "train.loss=softmax"],
              "kge-transe": ["model.name=transe", "train.loss=logistic"],
              "kge-rotate": ["model.name=rotate", "train.loss=logistic"]}
KGE_D8 = ["task=kge", "strategy=sync", "data.dataset=synthetic", "data.synthetic.num_entities=20000",
          "data.synthetic.num_relations=8", "data.synthetic.num_edges=200010", "data.synthetic.holdout=10",
          "model.name=distmult", "model.dim=8", "train.scoring=sampled", "train.negatives=100",
          "train.negative_chunk=0", "train.negative_pool=all", "train.loss=logistic", "train.batch_size=1000",
          "optimizer.entity=rowwise_adagrad", "optimizer.dense=adagrad", "optimizer.lr=0.1", "threads=1",
          "adapt_threads=false", "eval.test=false"]


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


# ---- one measurement, in a fresh interpreter importing one revision's src -----------------------------
def measure(name: str, epochs: int) -> dict:
    import cadence
    import torch

    common = ["eval.every=0", "checkpoint.every=0", "progress=false", "seed=0", f"train.epochs={epochs}"]
    with tempfile.TemporaryDirectory(prefix="cadence-ab-") as tmp:
        if name == "kge" or name in KGE_MODELS:
            config = cadence.load_config(None, [
                "data.dataset=kinships", "model.name=distmult", "model.dim=128", "train.batch_size=1024",
                "train.loss=logistic", "train.scoring=sampled", "train.reciprocal=false", "train.negatives=16",
                "optimizer.lr=0.1", "eval.test=false", *common, *KGE_MODELS.get(name, [])])
        elif name == "kge-d8":
            config = cadence.load_config(None, [*KGE_D8, *common])
        elif name == "umls":
            config = cadence.load_config(str(Path("configs/umls-complex.yaml")), ["strategy=sync", "eval.test=false",
                                                                                  *common])
        elif name.startswith("adapm"):
            engine = name.split("-")[1]
            config = cadence.load_config(str(Path("configs/ml100k-mf.yaml")), [
                f"ps.engine={engine}", "ps.workers=2", "strategy=adapm", "threads=1", "eval.test=false", *common])
        else:
            family, engine = name.split("-")
            strategy = "gba" if family == "ps" else "shadow-easgd"
            config = cadence.load_config(str(Path("configs/ml100k-deepfm.yaml")), [
                f"ps.engine={engine}", "ps.workers=2", f"strategy={strategy}", "threads=1", "eval.test=false",
                *common])
        config.out = str(Path(tmp) / "run")
        cpu, wall = time.process_time(), time.perf_counter()
        summary = cadence.train(config).summary
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    batches = -(-summary["examples_seen"] // config.train.batch_size) if config.task == "kge" else None
    return {"examples_per_second": summary["examples_per_second"], "train_seconds": summary["train_seconds"],
            "examples_seen": summary["examples_seen"],
            "seconds_per_batch": summary["train_seconds"] / batches if batches else None, "torch_threads": torch.get_num_threads(),
            "driver_cpu_share": round(cpu / wall / max(1, torch.get_num_threads()), 3)}


# ---- the driver ---------------------------------------------------------------------------------------
def run_once(tree: Path, name: str, epochs: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure", name, "--epochs", str(epochs)],
                          cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"refactor_ab: {name} in {tree} failed:\n{proc.stderr[-3000:]}")
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    record["load_1min_before"] = round(load, 2)
    return record


def summarize(runs: dict[str, list[dict]]) -> dict:
    speeds = {rev: [r["examples_per_second"] for r in records] for rev, records in runs.items()}
    median = {rev: statistics.median(values) for rev, values in speeds.items()}
    return {
        "examples_per_second": speeds,
        "median": median,
        "after_over_before": median["after"] / median["before"],
        "after_over_before_per_rep": [a / b for a, b in zip(speeds["after"], speeds["before"])],
        "spread_max_over_min": {rev: max(values) / min(values) for rev, values in speeds.items()},
        "load_1min_before": {rev: [r["load_1min_before"] for r in records] for rev, records in runs.items()},
        "driver_cpu_share": {rev: [r["driver_cpu_share"] for r in records] for rev, records in runs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="the revision before the change")
    parser.add_argument("--after", default="HEAD", help="the revision after it (default HEAD)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each measurement")
    parser.add_argument("--kge-epochs", type=int, default=5)
    parser.add_argument("--ps-epochs", type=int, default=3)
    parser.add_argument("--only", choices=MEASUREMENTS, action="append", help="run only this measurement")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "refactor_ab.json"))
    parser.add_argument("--allow-dirty", action="store_true", help="measure even with uncommitted changes")
    parser.add_argument("--measure", choices=MEASUREMENTS, help=argparse.SUPPRESS)  # (the child's mode)
    parser.add_argument("--epochs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.epochs)))
        return 0
    if not args.before:
        parser.error("--before is required")
    # (src is measured from the revisions' worktrees; results/ holds outputs, not code)
    dirty = git("status", "--porcelain", "--", "benchmarks", ":!benchmarks/results")
    if dirty and not args.allow_dirty:
        raise SystemExit("refactor_ab: uncommitted changes to benchmarks/ (commit them, or --allow-dirty):\n" + dirty)
    revs = {"before": git("rev-parse", args.before), "after": git("rev-parse", args.after)}
    names = args.only or list(MEASUREMENTS)
    with tempfile.TemporaryDirectory(prefix="cadence-ab-trees-") as tmp:
        trees = {}
        for label, rev in revs.items():
            trees[label] = Path(tmp) / label
            git("worktree", "add", "--detach", str(trees[label]), rev)
        try:
            runs = {name: {"before": [], "after": []} for name in names}
            for rep in range(args.reps):
                order = ("before", "after") if rep % 2 == 0 else ("after", "before")
                for name in names:
                    epochs = args.kge_epochs if name in ("kge", "kge-d8", "umls", *KGE_MODELS) else args.ps_epochs
                    for label in order:
                        record = run_once(trees[label], name, epochs)
                        runs[name][label].append(record)
                        print(f"rep {rep} {name:10s} {label:6s} {record['examples_per_second']:>12,.0f} examples/s "
                              f"(load {record['load_1min_before']})", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
    result = {
        "command": "benchmarks/refactor_ab.py " + " ".join(a for a in (argv or sys.argv[1:])),
        "revisions": revs,
        "measured_from": {"commit": git("rev-parse", "HEAD"), "dirty": bool(dirty)},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "reps": args.reps, "kge_epochs": args.kge_epochs, "ps_epochs": args.ps_epochs,
        "measurements": {name: summarize(runs[name]) for name in names},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, entry in result["measurements"].items():
        print(f"{name:10s} after/before {entry['after_over_before']:.3f} (per rep "
              f"{', '.join(f'{r:.3f}' for r in entry['after_over_before_per_rep'])}; spread before "
              f"{entry['spread_max_over_min']['before']:.3f}, after {entry['spread_max_over_min']['after']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
