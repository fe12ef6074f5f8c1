"""Parameter-server modes side by side on MovieLens-100k CTR (issue 4 / the GBA paper's claims).

Parts, all with configs/ml100k-deepfm.yaml's hyperparameters for every mode (GBA's point: no
retuning), run in one invocation:

1. quality: test AUC of sync, async, bsp, gba, hop_bs, hop_bw (random 80/10/10 split);
2. stragglers: 4 workers, worker 0 4x slower; global examples/s of sync, gba, async. Workers are
   threads of one 2-core process, so each batch also spends ``--latency`` seconds off-CPU, as if
   each worker had a machine of its own (without it, a sleeping straggler just frees a core);
3. a killed worker: gba with worker 2 killed after 50 batches vs the same run without the fault;
4. switching: sync trains periods 0-4 of the time-ordered split, then each mode continues from
   that checkpoint (``--init-from``) on periods 5-8; next-period AUC compared with staying sync.

    .venv/bin/python benchmarks/ps_training.py [--quick] [--only quality|stragglers|kill|switch]

Writes benchmarks/results/ps_training.json (or ps_training_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

import torch

from cadence import api
from cadence.config import load_config

CONFIG = Path(__file__).parents[1] / "configs" / "ml100k-deepfm.yaml"
RESULTS = Path(__file__).parent / "results"
MODES = ("sync", "async", "bsp", "gba", "hop_bs", "hop_bw")


def train(out: Path, *overrides: str) -> dict:
    config = load_config(CONFIG, ["progress=false", *overrides])
    config.out = str(out)
    return api.train(config, overwrite=True).summary


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def quality(work: Path, epochs: int) -> dict:
    table = {}
    for mode in MODES:
        summary = train(work / f"quality-{mode}", f"strategy={mode}", f"train.epochs={epochs}")
        table[mode] = {k: summary[k] for k in ("auc", "logloss", "examples_per_second", "global_steps",
                                               "gradients_dropped", "staleness_mean", "staleness_max")}
        say(f"quality {mode}: auc {summary['auc']:.4f}")
    return {"modes": table, "gba_minus_sync_auc": table["gba"]["auc"] - table["sync"]["auc"]}


def stragglers(work: Path, latency: float, repeats: int) -> dict:
    speeds: dict[str, list[float]] = {m: [] for m in ("sync", "gba", "async")}
    aucs: dict[str, list[float]] = {m: [] for m in speeds}
    for repeat in range(repeats):
        for mode in speeds:  # interleaved
            summary = train(work / f"straggler-{mode}", f"strategy={mode}", "train.epochs=1",
                            'ps.stragglers=["0:4"]', f"ps.emulated_latency={latency}", "eval.every=0")
            speeds[mode].append(summary["examples_per_second"])
            aucs[mode].append(summary["auc"])
            say(f"straggler {mode} repeat {repeat}: {summary['examples_per_second']:,.0f} examples/s")
    median = {m: statistics.median(v) for m, v in speeds.items()}
    return {"examples_per_second": speeds, "test_auc": aucs, "latency_seconds": latency,
            "gba_over_sync": median["gba"] / median["sync"], "gba_over_async": median["gba"] / median["async"]}


def kill(work: Path, epochs: int) -> dict:
    clean = train(work / "kill-clean", "strategy=gba", f"train.epochs={epochs}")
    faulty = train(work / "kill-faulty", "strategy=gba", f"train.epochs={epochs}", 'ps.kill_workers=["2:50"]')
    say(f"kill: auc {clean['auc']:.4f} clean, {faulty['auc']:.4f} with worker 2 killed")
    return {"auc_clean": clean["auc"], "auc_killed": faulty["auc"], "auc_difference": faulty["auc"] - clean["auc"],
            "workers_killed": faulty["workers_killed"], "examples_clean": clean["examples_seen"],
            "examples_killed": faulty["examples_seen"]}


def switch(work: Path) -> dict:
    periods = ["ctr.split=periods", "ctr.num_periods=10", "train.epochs=2"]
    base = work / "switch-sync-0-4"
    train(base, "strategy=sync", *periods, "ctr.last_period=4")
    results = {}
    for mode in ("sync", "gba", "async", "bsp", "hop_bs", "hop_bw"):
        summary = train(work / f"switch-{mode}", f"strategy={mode}", *periods, "ctr.first_period=5",
                        "ctr.last_period=8", f"ctr.init_from={base}")
        results[mode] = summary["next_period_auc"]
        say(f"switch sync -> {mode}: next-period AUC {[round(a, 4) for a in summary['next_period_auc']]}")
    stay = results["sync"]
    drops = {mode: [s - a for s, a in zip(stay, aucs)] for mode, aucs in results.items() if mode != "sync"}
    return {"next_period_auc": results, "periods": [6, 7, 8, 9],
            "auc_drop_vs_staying_sync_first_period": {m: d[0] for m, d in drops.items()},
            "auc_drop_vs_staying_sync_mean": {m: statistics.fmean(d) for m, d in drops.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["quality", "stragglers", "kill", "switch"])
    parser.add_argument("--latency", type=float, default=0.02)
    add_flag(parser)
    args = parser.parse_args()
    check(args)
    results: dict = {"command": " ".join([".venv/bin/python", "benchmarks/ps_training.py", *sys.argv[1:]]),
                     "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__}}
    epochs = 1 if args.quick else 8
    with tempfile.TemporaryDirectory(prefix="cadence-ps-") as scratch:
        work = Path(scratch)
        parts = {"quality": lambda: quality(work, epochs),
                 "stragglers": lambda: stragglers(work, args.latency, 1 if args.quick else 3),
                 "kill": lambda: kill(work, epochs),
                 "switch": lambda: switch(work)}
        for name, part in parts.items():
            if args.only in (None, name) and not (args.quick and name == "switch"):
                results[name] = part()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / ("ps_training_quick.json" if args.quick else "ps_training.json")
    if args.only and path.exists():
        previous = json.loads(path.read_text())
        results = {**previous, **{k: v for k, v in results.items() if k not in ("command", "date")},
                   f"{args.only}_measured": {"command": results["command"], "date": results["date"]}}
    path.write_text(json.dumps(stamp(results), indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k not in ("machine",)}, indent=1)[:3000])


if __name__ == "__main__":
    main()
