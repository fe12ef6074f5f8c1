"""Sync vs async vs OAC, side by side in one invocation (issue 3 / OAC paper Figures 2-3).

Part 1, UMLS in memory: the shipped ComplEx config (every batch touches every entity, so async
batches always overlap), each strategy run ``--repeats`` times interleaved; edges/s, test MRR and
each strategy's counters; async and oac both with the default ``pipeline.overlap`` (auto) and kept
in the threads (``-threads``: ``pipeline.overlap=always``).
Part 2, a synthetic power-law graph whose tables exceed 4 GiB, in the memory-mapped store: edges/s
of one epoch per strategy (no evaluation: ranking 4M entities is not what is measured here).
Part 3, every other task (issue 27: async and OAC >= 0.9x sync on every task): each task's shipped
setting in memory (``TASK_SETTINGS``: fewer epochs; ctr on the one-process pipeline; image
without pdASGD's keys), sync / async / oac with the default ``pipeline.overlap``, interleaved,
5 times (the order reversed every other time); examples/s and the task's primary metric.

    .venv/bin/python benchmarks/pipeline_throughput.py [--quick] [--only umls|synthetic|tasks]

Writes benchmarks/results/pipeline_throughput.json (or ..._quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

import torch

from cadence import api
from cadence.config import load_config

STRATEGIES = ("sync", "async", "oac")
RESULTS = Path(__file__).parent / "results"
CONFIGS = Path(__file__).parents[1] / "configs"


def run(overrides: list[str], config_file: Path | None, out: Path) -> dict:
    config = load_config(config_file, ["progress=false", *overrides])
    config.out = str(out)
    started = time.perf_counter()
    summary = api.train(config, overwrite=True).summary
    summary["wall_seconds_total"] = time.perf_counter() - started
    return summary


# part 1's contenders: each strategy with the default pipeline.overlap (auto: async and oac run their
# epochs inline when nothing waits to be hidden), and async and oac kept in the threads every epoch
# (pipeline.overlap=always: the only behaviour before issue 27)
UMLS_CONTENDERS = {"sync": ["strategy=sync"], "async": ["strategy=async"], "oac": ["strategy=oac"],
                   "async-threads": ["strategy=async", "pipeline.overlap=always"],
                   "oac-threads": ["strategy=oac", "pipeline.overlap=always"]}


# part 3: (config file, overrides, quick overrides) per task; every strategy of STRATEGIES runs each.
# Each run trains for a few seconds at least: runs of a fraction of a second (10 epochs of ML-100k
# MF) moved by +-30% from one to the next on this machine
TASK_SETTINGS: dict[str, tuple[str | None, list[str], list[str]]] = {
    "mf": ("ml100k-mf.yaml", ["train.epochs=80"], ["train.epochs=2"]),
    "ctr": ("ml100k-deepfm.yaml", ["ps.workers=1", "train.batch_size=1024", "train.epochs=8"], ["train.epochs=1"]),
    "w2v": ("w2v.yaml", ["data.dataset=enwiki-excerpt", "train.epochs=2"], ["w2v.max_vocab=2000", "train.epochs=1"]),
    "image": (None, ["task=image", "data.dataset=fashion-mnist", "model.name=mlp", "train.batch_size=128",
                     "optimizer.dense=sgd", "optimizer.lr=0.015", "optimizer.momentum=0.9", "train.epochs=3"],
              ["image.valid_size=55000", "train.epochs=1"]),
}


def tasks_part(work: Path, repeats: int, quick: bool) -> dict:
    """Per task: each strategy's examples/s and primary metric over ``repeats`` interleaved runs."""
    parts = {}
    for task, (config_file, overrides, quick_overrides) in TASK_SETTINGS.items():
        runs: dict[str, list[dict]] = {name: [] for name in STRATEGIES}
        for repeat in range(repeats):
            order = STRATEGIES if repeat % 2 == 0 else STRATEGIES[::-1]
            for name in order:
                chosen = [f"strategy={name}", *overrides, *(quick_overrides if quick else []), "eval.every=0",
                          "eval.patience=0", "checkpoint.every=0", f"seed={repeat}"]
                summary = run(chosen, CONFIGS / config_file if config_file else None, work / f"{task}-{name}-{repeat}")
                summary["mrr"] = summary[summary["primary_metric"]]  # summarize's quality column
                runs[name].append(summary)
                print(f"{task} {name} repeat {repeat}: {summary['examples_per_second']:,.0f} examples/s, "
                      f"{summary['primary_metric']} {summary['mrr']:.4f}", file=sys.stderr)
        result = summarize(runs, with_mrr=True)
        metric = runs["sync"][0]["primary_metric"]
        for entry in result["strategies"].values():  # name the quality column by its metric
            entry[metric], entry[f"{metric}_mean"] = entry.pop("test_mrr"), entry.pop("test_mrr_mean")
        result["setting"] = {"config": config_file, "overrides": overrides + (quick_overrides if quick else [])}
        parts[task] = result
    return parts


def umls_part(work: Path, repeats: int, epochs: int) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in UMLS_CONTENDERS}
    for repeat in range(repeats):
        for name, chosen in UMLS_CONTENDERS.items():  # interleaved, so machine noise hits every contender alike
            overrides = [*chosen, f"train.epochs={epochs}", "eval.patience=0", "eval.every=0",
                         "checkpoint.every=0", f"seed={repeat}"]
            summary = run(overrides, CONFIGS / "umls-complex.yaml", work / f"umls-{name}-{repeat}")
            runs[name].append(summary)
            print(f"umls {name} repeat {repeat}: {summary['examples_per_second']:,.0f} edges/s, "
                  f"mrr {summary['mrr']:.4f}", file=sys.stderr)
    return summarize(runs, with_mrr=True)


def synthetic_part(work: Path, entities: int, dim: int, edges: int, batch: int, negatives: int,
                   repeats: int) -> dict:
    table_bytes = entities * dim * 4 + entities * (4 + 8)
    runs: dict[str, list[dict]] = {name: [] for name in STRATEGIES}
    for repeat, name in ((r, n) for r in range(repeats) for n in STRATEGIES):
        store_dir = work / f"store-{name}"
        overrides = [f"strategy={name}", "data.dataset=synthetic", f"data.synthetic.num_entities={entities}",
                     f"data.synthetic.num_edges={edges}", "data.synthetic.holdout=100", "model.name=distmult",
                     f"model.dim={dim}", "train.epochs=1", f"train.batch_size={batch}",
                     f"train.negatives={negatives}", "eval.every=0", "eval.test=false", "checkpoint.every=0",
                     "store.backend=mmap", f"store.path={store_dir}"]
        summary = run(overrides, None, work / f"synthetic-{name}")
        runs[name].append(summary)
        print(f"synthetic {name} repeat {repeat}: {summary['examples_per_second']:,.0f} edges/s", file=sys.stderr)
        shutil.rmtree(store_dir, ignore_errors=True)
    result = summarize(runs, with_mrr=False)
    result["table_gib"] = table_bytes / 2**30
    result["setting"] = {"entities": entities, "dim": dim, "edges": edges, "batch_size": batch,
                         "negatives": negatives, "store": "mmap"}
    return result


def summarize(runs: dict[str, list[dict]], with_mrr: bool) -> dict:
    table = {}
    for name, summaries in runs.items():
        speeds = [s["examples_per_second"] for s in summaries]
        entry = {"edges_per_second_median": statistics.median(speeds), "edges_per_second": speeds}
        if with_mrr:
            entry["test_mrr"] = [s["mrr"] for s in summaries]
            entry["test_mrr_mean"] = statistics.fmean(entry["test_mrr"])
        for key in ("stale_reads", "lost_updates", "repaired_rows", "skipped_writes", "peak_cache_rows",
                    "evicted_rows", "inline_epochs", "pipelined_epochs", "intra_op_threads"):
            if key in summaries[0]:
                entry[key] = [s[key] for s in summaries]
        table[name] = entry
    speed = {name: table[name]["edges_per_second_median"] for name in table}
    ratios = {"async_over_sync": speed["async"] / speed["sync"], "oac_over_sync": speed["oac"] / speed["sync"],
              "oac_over_async": speed["oac"] / speed["async"]}
    for name in ("async-threads", "oac-threads"):
        if name in speed:
            ratios[f"{name.replace('-', '_')}_over_sync"] = speed[name] / speed["sync"]
    return {"strategies": table, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the harness")
    parser.add_argument("--only", choices=["umls", "synthetic", "tasks"])
    add_flag(parser)
    args = parser.parse_args()
    check(args)
    results: dict = {
        "command": " ".join([".venv/bin/python", "benchmarks/pipeline_throughput.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()},
    }
    with tempfile.TemporaryDirectory(prefix="cadence-bench-", dir=os.environ.get("CADENCE_BENCH_DIR")) as scratch:
        work = Path(scratch)
        if args.only in (None, "umls"):
            results["umls_memory"] = umls_part(work, repeats=1 if args.quick else 3, epochs=2 if args.quick else 20)
        if args.only in (None, "synthetic"):
            if args.quick:
                results["synthetic_mmap"] = synthetic_part(work, 20_000, 32, 100_000, 2_000, 100, repeats=1)
            else:  # 4.2M x 256 float32 = 4.0 GiB of values, plus state and versions
                results["synthetic_mmap"] = synthetic_part(work, 4_200_000, 256, 2_000_000, 10_000, 1_000,
                                                           repeats=2)
        if args.only in (None, "tasks"):
            results["tasks_memory"] = tasks_part(work, repeats=1 if args.quick else 5, quick=args.quick)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / ("pipeline_throughput_quick.json" if args.quick else "pipeline_throughput.json")
    if args.only and path.exists():  # keep the other part's numbers, with their own command and date
        previous = json.loads(path.read_text())
        kept = {k: v for k, v in previous.items()
                if k in ("umls_memory", "synthetic_mmap", "tasks_memory") and k not in results}
        for key, value in kept.items():
            value.setdefault("measured", {"command": previous.get("command"), "date": previous.get("date")})
        results.update(kept)
    path.write_text(json.dumps(stamp(results), indent=2) + "\n")
    ratios = {k: v.get("ratios") for k, v in results.items() if isinstance(v, dict) and "ratios" in v}
    ratios.update({task: v["ratios"] for task, v in results.get("tasks_memory", {}).items() if "ratios" in v})
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
