"""The parameter server as a distributed system (issue 8): where its memory lives, and what Ray costs.

Parts, each in one invocation:

1. ``memory``: tables of 8.2 GiB spread over 2 server shards (biased MF on synthetic Zipf
   ratings, 4.2M users + 100k items, 256 floats per row plus Adagrad's 256 of state), one epoch of
   gba with 2 workers. Resident memory (VmRSS now, VmHWM peak, from /proc) of the driver and of
   every actor, on the ``ray`` engine (the shards hold the tables; the driver should stay flat)
   and, as the contrast, on the ``threads`` engine (everything in the driver's process).
2. ``throughput``: MovieLens-100k DeepFM (configs/ml100k-deepfm.yaml), gba with 2 workers, 6
   epochs on ``threads`` and on ``ray``, interleaved ``--repeats`` times; examples/s of training
   (``train_seconds``: on Ray the actors are built before the clock starts, as the thread engine's
   task is; that start is recorded apart as ``engine_start_seconds``) and their ratio, as the ratio
   of the medians and per repeat (the issue's bar: ray >= 0.7x threads on one machine).
   ``--strategies a,b,...``: the same for each of those strategies (``all``: every strategy that runs
   on both engines), each with 2 workers, interleaved strategy by strategy within each repeat; written
   as ``throughput_by_strategy`` in ``results/ps_cluster_strategies.json``, a file of its own, so its
   provenance is its own commit (``--epochs`` sets the epochs, default 6).
3. ``dense``: where the dense parameters live, on shard 0 (``ps.dense: server``) or on every worker,
   all-reduced each round (``ps.dense: workers``, PERSIA's split), same data and hyperparameters:
   MovieLens-100k DeepFM, gba, 6 epochs; threads (4 workers, 0.02 s emulated latency per batch) and
   ray (2 workers); examples/s, bytes moved per example, test AUC.

    .venv/bin/python benchmarks/ps_cluster.py [--only memory|throughput|dense] [--repeats 3]
        [--strategies gba,hogwild,...|all] [--epochs 6]

Writes benchmarks/results/ps_cluster.json. The memory part needs about 2 x 8.5 GiB free (the two
engines run one after the other) and skips itself with a message when there is less.
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

from cadence import api
from cadence.config import load_config
from cadence.errors import ConfigError
from cadence.strategies.catalog import STRATEGIES
from cadence.training.trainer import TrainerHook

RESULTS = Path(__file__).parent / "results"
DEEPFM = Path(__file__).parents[1] / "configs" / "ml100k-deepfm.yaml"
GIB = 1 << 30
MEMORY_RUN = ["task=mf", "data.dataset=synthetic-zipf", "mf.synthetic.users=4200000", "mf.synthetic.items=100000",
              "mf.synthetic.ratings=100000", "model.dim=255", "train.batch_size=2048", "train.epochs=1",
              "strategy=gba", "ps.workers=2", "ps.shards=2", "eval.every=0", "checkpoint.every=0",
              "progress=false", "threads=1"]


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rss(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) of a process, in GiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = round(int(value.split()[0]) * 1024 / GIB, 3)
    return fields


class MemoryProbe(TrainerHook):
    """Records the resident memory of the driver and of every actor at the end of each epoch."""

    def __init__(self):
        self.samples: list[dict] = []

    def on_epoch_end(self, trainer, epoch: int) -> None:
        sample = {"epoch": epoch, "driver": rss(os.getpid())}
        engine = trainer.runtime.engine
        if hasattr(engine, "actors"):
            import ray

            shards = [shard.handle for shard in engine.shards]
            pids = ray.get([actor.pid.remote() for actor in shards])
            sample["shards"] = [rss(pid) for pid in pids]
            workers = ray.get([actor.pid.remote() for actor in engine.workers.values()])
            sample["workers"] = [rss(pid) for pid in workers]
            sample["coordinator"] = rss(ray.get(engine.coordinator.pid.remote()))
        self.samples.append(sample)


def memory(work: Path) -> dict:
    available = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemAvailable")).split()[1]) * 1024
    if available < 12 * GIB:
        say(f"memory: skipped ({available / GIB:.1f} GiB available, 12 needed)")
        return {"skipped": f"{available / GIB:.1f} GiB available"}
    results = {}
    for engine in ("ray", "threads"):
        probe = MemoryProbe()
        config = load_config(None, [*MEMORY_RUN, f"ps.engine={engine}", f"out={work / ('memory-' + engine)}"])
        started = time.perf_counter()
        result = api.train(config, overwrite=True, hooks=[probe])
        sample = probe.samples[-1]
        results[engine] = {"seconds": round(time.perf_counter() - started, 1), "rss_gib": sample,
                           "rmse": result.summary.get("rmse")}
        say(f"memory {engine}: driver {sample['driver']}, shards {sample.get('shards')}")
    rows = 4_200_000 + 100_000  # users + items
    results["table_gib"] = round(rows * 256 * 4 * 2 / GIB, 2)  # values and Adagrad state, float32
    return results


def per_example(summary: dict) -> dict[str, float]:
    """Where the workers' time went (``worker_seconds``), in microseconds per example trained."""
    examples = max(1, summary.get("examples_seen", 0))
    return {phase: round(seconds / examples * 1e6, 2) for phase, seconds in summary.get("worker_seconds", {}).items()}


def throughput(work: Path, repeats: int, strategy: str = "gba", epochs: int = 6) -> dict:
    speeds: dict[str, list[float]] = {"threads": [], "ray": []}
    phases: dict[str, list[dict[str, float]]] = {"threads": [], "ray": []}
    starts: list[float] = []
    for repeat in range(repeats):
        for engine in speeds:  # interleaved: machine noise hits both alike
            config = load_config(DEEPFM, [f"ps.engine={engine}", "ps.workers=2", f"strategy={strategy}", f"train.epochs={epochs}",
                                          "eval.every=0", "checkpoint.every=0", "progress=false", "threads=1",
                                          f"out={work / f'throughput-{engine}-{repeat}'}"])
            summary = api.train(config, overwrite=True).summary
            speeds[engine].append(summary["examples_per_second"])
            phases[engine].append(per_example(summary))
            if engine == "ray":
                starts.append(summary.get("engine_start_seconds"))
            say(f"throughput {strategy} {engine} repeat {repeat}: {summary['examples_per_second']:,.0f} examples/s "
                f"(engine start {summary.get('engine_start_seconds', 0.0):.2f} s)")
    median = {engine: statistics.median(values) for engine, values in speeds.items()}
    return {"config": f"configs/ml100k-deepfm.yaml, {strategy}, 2 workers, 1 shard, {epochs} epochs, threads=1",
            "examples_per_second": speeds, "median": median, "ray_over_threads": median["ray"] / median["threads"],
            "ray_over_threads_per_repeat": [r / t for r, t in zip(speeds["ray"], speeds["threads"])],
            "ray_engine_start_seconds": starts, "worker_us_per_example": phases,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def median_phases(runs: list[dict[str, float]]) -> dict[str, float]:
    return {phase: round(statistics.median(run[phase] for run in runs), 2) for phase in runs[0]} if runs else {}


def both_engines() -> list[str]:
    """Every strategy that runs on the thread engine and on Ray (the one-process pipeline's do not)."""
    found = []
    for name in sorted(STRATEGIES.names()):
        try:
            config = load_config(DEEPFM, [f"strategy={name}", "ps.engine=ray", "ps.workers=2"])
            if STRATEGIES.get(name).runtime(config).engine:
                found.append(name)
        except ConfigError:
            continue
    return found


def dense(work: Path) -> dict:
    runs = {}
    for engine, extra in (("threads", ["ps.workers=4", "ps.emulated_latency=0.02"]), ("ray", ["ps.workers=2"])):
        for place in ("server", "workers"):
            config = load_config(DEEPFM, [f"ps.engine={engine}", *extra, "strategy=gba", "train.epochs=6",
                                          f"ps.dense={place}", "eval.every=0", "checkpoint.every=0",
                                          "progress=false", "threads=1", f"out={work / f'dense-{engine}-{place}'}"])
            summary = api.train(config, overwrite=True).summary
            runs[f"{engine}/{place}"] = {k: summary[k] for k in ("examples_per_second", "bytes_moved_per_example",
                                                                  "auc", "train_seconds")}
            say(f"dense {engine} {place}: {summary['examples_per_second']:,.0f} examples/s, "
                f"{summary['bytes_moved_per_example']:.0f} B/example, test AUC {summary['auc']:.4f}")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["memory", "throughput", "dense"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", default=None,
                        help="throughput: these strategies (comma-separated, or all) instead of gba alone")
    parser.add_argument("--epochs", type=int, default=6, help="throughput: epochs per run (default 6)")
    parser.add_argument("--out", default=None, help="the result file's name in benchmarks/results (default: "
                        "ps_cluster.json; with --strategies all ps_cluster_strategies.json; with a list of "
                        "strategies ps_cluster_strategies_<their names>.json, so a partial run never "
                        "overwrites the full one)")
    add_flag(parser)
    args = parser.parse_args()
    check(args)
    strategies = both_engines() if args.strategies == "all" else (
        [name.strip() for name in args.strategies.split(",") if name.strip()] if args.strategies else None)
    name = args.out or ("ps_cluster.json" if not strategies else "ps_cluster_strategies.json"
                        if args.strategies == "all" else f"ps_cluster_strategies_{'_'.join(strategies)}.json")
    out = RESULTS / name
    results = json.loads(out.read_text()) if out.exists() and not strategies else {}
    with tempfile.TemporaryDirectory(prefix="cadence-ps-cluster-") as tmp:
        work = Path(tmp)
        if args.only in (None, "throughput") and strategies:
            by_strategy = {name: {"threads": [], "ray": []} for name in strategies}
            phases = {name: {"threads": [], "ray": []} for name in strategies}
            for repeat in range(args.repeats):  # strategy by strategy within a repeat: noise spreads over all
                for name in strategies:
                    one = throughput(work / f"{name}-{repeat}", 1, name, args.epochs)
                    for engine in ("threads", "ray"):
                        by_strategy[name][engine] += one["examples_per_second"][engine]
                        phases[name][engine] += one["worker_us_per_example"][engine]
            results["throughput_by_strategy"] = {
                "config": f"configs/ml100k-deepfm.yaml, 2 workers, 1 shard, {args.epochs} epochs, threads=1",
                "command": " ".join([".venv/bin/python benchmarks/ps_cluster.py", *sys.argv[1:]]),
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "strategies": {name: {"examples_per_second": speeds,
                                      "ray_over_threads": statistics.median(speeds["ray"]) / statistics.median(speeds["threads"]),
                                      "ray_over_threads_per_repeat": [r / t for r, t in zip(speeds["ray"], speeds["threads"])],
                                      # where the workers' time went, microseconds per example (summed over the
                                      # workers; median over the repeats), by engine
                                      "worker_us_per_example": {engine: median_phases(runs)
                                                                for engine, runs in phases[name].items()}}
                               for name, speeds in by_strategy.items()}}
            for name, row in results["throughput_by_strategy"]["strategies"].items():
                say(f"{name}: ray / threads {row['ray_over_threads']:.2f}  per repeat "
                    f"{[round(r, 2) for r in row['ray_over_threads_per_repeat']]}")
                for engine, spent in row["worker_us_per_example"].items():
                    say(f"    {engine:7s} us/example: " + "  ".join(f"{k} {v:.1f}" for k, v in spent.items() if v))
        elif args.only in (None, "throughput"):
            results["throughput"] = throughput(work, args.repeats)
            results["throughput"]["command"] = " ".join([".venv/bin/python benchmarks/ps_cluster.py", *sys.argv[1:]])
        if args.only in (None, "memory"):
            results["memory"] = memory(work)
        if args.only in (None, "dense"):
            results["dense"] = dense(work)
    results.update(command=" ".join(["benchmarks/ps_cluster.py", *sys.argv[1:]]), machine=platform.platform(),
                   cpus=os.cpu_count())
    RESULTS.mkdir(exist_ok=True)
    out.write_text(json.dumps(stamp(results), indent=1))
    print(json.dumps({k: v for k, v in results.items() if k in ("throughput", "memory", "dense")}, indent=1))


if __name__ == "__main__":
    main()
