"""Where the pipeline pays: a table at least twice the memory the training process may use
(issue 9; the OAC paper's out-of-core setting). sync, async and oac side by side in one invocation.

What runs: a synthetic power-law graph (``data.dataset=synthetic``), DistMult, the memory-mapped
store (``store.backend=mmap``: the rows live in files and are paged in on demand). Defaults: 2M
entities x dim 256 (2.0 GiB of values, plus optimizer state and versions), 150k training edges,
batch 5000, 128 negatives, 1 epoch. Each run is a child process placed in a cgroup-v1 memory
cgroup capped at ``--memory-mib`` (900: the Python process with torch takes about 350 of it, the
page cache of the table gets the rest), the page cache dropped before it; strategies interleaved,
``--repeats`` times. Evaluation is on: every run writes its final checkpoint, and the final test
MRR (filtered, ``--eval-triples`` test edges ranked against every entity, both directions) is
computed from it by a child process outside the cap (ranking holds the whole entity table in
memory, which the capped process cannot; training time excludes it in any case).

The store reads rows at random (``store.readahead=false``, cadence's default); ``--set
store.readahead=true`` restores the kernel's read-ahead, the setting of the first measurements
(it made every strategy several times slower: docs/strategies/pipelined.md, "Which strategy to pick"). ``--set KEY=VALUE`` passes any
override to every strategy's runs.

Also, once, OAC's guarantee in this very setting: the first oac run records its computation order
and a sync run replays it (same cap); their final tables (values and optimizer state, read back
from the store files) must be bit-identical.

Reported per strategy: edges/s (training seconds only), its median and ratios, the test MRR (mean
and 95% interval over repetitions), OAC's counters (repaired rows, skipped writes, seconds writers
waited for and held the store's lock), the machine's major page faults of each run, and the
cgroup's anonymous memory while it ran (``total_rss``, sampled every 0.25 s: peak and median; what
the process held, the rest of the cap being the table's page cache). Bars
(printed PASS/FAIL, written in the JSON): async >= 2x sync; oac >= 0.9x async; OAC's MRR within
the repetitions' noise of sync's; OAC bit-identical to its replay.

``--latency-ms 0.1,1,5`` (issue 26, part 8): the stores live on a FUSE filesystem whose reads take
that long per request (``benchmarks/slowfs.py``: a separate process passing reads through to a
backing directory after the latency; read-ahead off; the page cache still charged to the run's
memory cgroup), one interleaved sweep per latency, each with OAC's replay check; what the server
served (requests, mean service time) is recorded per latency. Bars: oac >= 0.9x async and
bit-identical to its replay at every latency; async's lead over sync growing with the latency.
Writes ``out_of_core_slowfs.json``.

``--variant NAME:STRATEGY:KEY=VALUE[,KEY=VALUE]``: one more contender in the same interleaving, a
strategy with overrides of its own (a diagnosis, written as a subset: no bars), e.g.
``oac-nocoalesce:oac:pipeline.coalesce_writes=false``.

``--epochs N``: every run trains N epochs (its speed over all of them; the default, 1, times a cold
table only: after the first epoch a power-law graph's hot rows are read from the page cache).
``--out FILE``: where the results go.

``--curve`` (issue 49: the OAC paper's figure): every run also validates after each epoch inside its
cap (``eval.every=1``, each query ranked against ``--curve-negatives`` sampled entities, so the
capped process never holds the table) and records MRR against training seconds (metrics.jsonl's
``wall_seconds``: evaluation and checkpoints excluded). Per repetition, the target is that
repetition's sync run's best validation MRR; each strategy's time to it is the training seconds of
its first validation at or above it (never: ``null``). The paper's figure is one curve per system:
the mean over the repetitions, epoch by epoch, of the training seconds and the validation MRR
(``mean_curve``), and the target there the best of sync's mean curve (a maximum over single sampled
validations is mostly noise: two equally good runs each reach the other's best half the time). Bar
(with ``--latency-ms``, at the slowest latency): on the mean curves, OAC reaches sync's best MRR
>= 1.5x sooner than sync; the per-repetition ratios are recorded beside it. OAC's model is a sync
run's in another order, equal to sync's only within the seeds' noise, so a second bar takes as the
target sync's best less what the repetitions can tell apart (``within_noise``: the 95% half-width
of OAC's best minus sync's, paired by seed). ``--resummarize FILE`` recomputes a complete file's
summaries and bars with the current code, the runs (and the commit they ran at) kept.

Needs root (a memory cgroup, dropping the page cache); without it the benchmark says so and exits
0 without measuring.

    sudo .venv/bin/python benchmarks/out_of_core.py [--repeats 3] [--quick]

Writes benchmarks/results/out_of_core.json (``--quick``: out_of_core_quick.json; a ``--strategies``
subset, for diagnosis: out_of_core_subset.json, no bars).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

from peer_stats import mean_ci  # same folder: the shared 95% t-interval
import slowfs  # same folder: storage whose reads take time

RESULTS = Path(__file__).parent / "results"
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
STRATEGIES = ("sync", "async", "oac")
COUNTERS = ("stale_reads", "lost_updates", "repaired_rows", "skipped_writes", "coalesced_writes", "peak_cache_rows",
            "load_busy_seconds", "compute_busy_seconds", "write_busy_seconds",
            "write_lock_wait_seconds", "write_lock_held_seconds", "validation_seconds")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def usable() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if os.geteuid() != 0:
        return "needs root (a memory cgroup and dropping the page cache)"
    if not (CGROUP_ROOT / "cgroup.procs").exists():
        return f"needs the cgroup-v1 memory controller at {CGROUP_ROOT}"
    return None


def make_cgroup(limit_mib: int) -> Path:
    for stale in CGROUP_ROOT.glob("cadence-out-of-core-*"):  # left by a killed invocation: empty by now
        remove_cgroup(stale)
    group = CGROUP_ROOT / f"cadence-out-of-core-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "memory.limit_in_bytes").write_text(str(limit_mib << 20))
    return group


def remove_cgroup(group: Path) -> None:
    try:
        group.rmdir()
    except OSError:
        pass


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1")


def major_faults() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("pgmajfault "):
            return int(line.split()[1])
    return 0


def child(out: str, overrides: list[str]) -> None:
    """Inside the cgroup: one training run; its summary as JSON on stdout. ``--child-eval``
    (outside it): the test metrics of the run in ``out``."""
    from cadence import api
    from cadence.config import load_config

    if overrides == ["--eval"]:
        print(json.dumps(api.evaluate(out, "test")))
        return
    config = load_config(None, ["progress=false", *overrides])
    config.out = out
    summary = api.train(config, overwrite=True).summary
    print(json.dumps(summary))


def evaluate(out: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", str(out), "--eval"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"evaluating {out} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sample_anon(group: Path, stop: threading.Event, into: list[int], every: float = 0.25) -> None:
    """Append the cgroup's anonymous memory (``total_rss`` of memory.stat, MiB) every ``every`` s."""
    while not stop.wait(every):
        try:
            stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines() if line.strip())
        except OSError:
            return
        if "total_rss" in stat:  # (a file caught half written has none: the next sample reads it whole)
            into.append(int(stat["total_rss"]) >> 20)


def run(group: Path, out: Path, overrides: list[str]) -> dict:
    drop_caches()
    faults = major_faults()
    enter = f"echo $$ > {group / 'cgroup.procs'} && exec \"$0\" \"$@\""
    command = ["sh", "-c", enter, sys.executable, __file__, "--child", str(out), *overrides]
    started = time.perf_counter()
    anon: list[int] = []  # the cgroup's anonymous memory (MiB), sampled while the run runs
    stop = threading.Event()
    sampler = threading.Thread(target=sample_anon, args=(group, stop, anon), daemon=True)
    sampler.start()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    if done.returncode != 0:
        killed = int((group / "memory.failcnt").read_text())
        raise SystemExit(f"a run failed with exit code {done.returncode} (memory cap hit {killed} times; "
                         f"{' '.join(overrides)}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    summary["run_wall_seconds"] = round(wall, 1)
    summary["major_page_faults"] = major_faults() - faults
    summary["peak_memory_mib"] = int((group / "memory.max_usage_in_bytes").read_text()) >> 20
    if anon:  # what the process itself held, the rest of the cap being the table's page cache
        summary["peak_anon_mib"], summary["median_anon_mib"] = max(anon), int(statistics.median(anon))
    (group / "memory.max_usage_in_bytes").write_text("0")
    history = out / "metrics.jsonl"
    if history.exists():  # (--curve) each validation: MRR against training seconds
        records = [json.loads(line) for line in history.read_text().splitlines() if line.strip()]
        summary["history"] = [{"epoch": r["epoch"], "wall_seconds": r["wall_seconds"], "mrr": r.get("mrr")}
                              for r in records if r.get("split") == "valid"]
    summary.update(evaluate(out))
    shutil.rmtree(out, ignore_errors=True)  # its checkpoint is a copy of the table
    return summary


def table_digest(store: Path) -> dict[str, str]:
    """sha256 of each file of a memory-mapped store (values, state: the trained table)."""
    digests = {}
    for path in sorted(store.iterdir()):
        if "version" in path.name:  # timestamps differ between a pipelined run and its replay by design
            continue
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
        digests[path.name] = digest.hexdigest()
    return digests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the harness")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-mib", type=int, help="the cap (default 900; --quick 700)")
    parser.add_argument("--entities", type=int)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--edges", type=int)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--negatives", type=int, default=128)
    parser.add_argument("--eval-triples", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=1, help="train.epochs of every run (its speed: all of them)")
    parser.add_argument("--out", help="the result file (default: by the options, under benchmarks/results)")
    parser.add_argument("--curve", action="store_true",
                        help="validate every epoch (sampled ranking) and report MRR against training seconds")
    parser.add_argument("--curve-negatives", type=int, default=1000,
                        help="with --curve: entities each validation query is ranked against (default 1000)")
    parser.add_argument("--staleness-bound", type=int, default=16, help="pipeline.staleness_bound (every strategy)")
    parser.add_argument("--no-replay", action="store_true", help="skip OAC's replay check")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="one more config override for every strategy (repeatable)")
    parser.add_argument("--latency-ms", metavar="MS[,MS...]",
                        help="serve the stores from a FUSE filesystem whose reads take MS per request "
                             "(benchmarks/slowfs.py), one sweep per latency; needs root and /dev/fuse")
    parser.add_argument("--mib-per-s", type=float, default=0.0,
                        help="with --latency-ms: the slow device's shared read bandwidth (0: unlimited)")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        help="a subset (diagnosis; the bars need all three)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:STRATEGY:KEY=VALUE[,KEY=VALUE]",
                        help="one more contender, interleaved with the strategies: STRATEGY with these "
                             "overrides (a diagnosis: e.g. oac-nocoalesce:oac:pipeline.coalesce_writes=false)")
    add_flag(parser)
    parser.add_argument("--resummarize", metavar="FILE",
                        help="recompute a complete result file's summaries, ratios and bars from its runs with this "
                             "commit's code (the runs and their provenance kept; this commit recorded as "
                             "'summarized')")
    args = parser.parse_args()
    if args.child:  # (a run of the parent's, which checked the tree)
        child(args.child[0], args.child[1:])
        return
    check(args)
    if args.resummarize:
        resummarize(Path(args.resummarize))
        return
    args.contenders = [(name, name, []) for name in args.strategies] + [parse_variant(text) for text in args.variant]
    why = usable()
    if why is not None:
        say(f"out_of_core: skipped: {why}")
        return
    entities = args.entities or (200_000 if args.quick else 2_000_000)
    edges = args.edges or (20_000 if args.quick else 150_000)
    cap = args.memory_mib or (700 if args.quick else 900)
    repeats = 1 if args.quick else args.repeats
    table_mib = entities * (args.dim + 1) * 4 / 2**20  # values + rowwise Adagrad state (+ versions below)
    table_mib += entities * 8 / 2**20
    common = ["data.dataset=synthetic", f"data.synthetic.num_entities={entities}",
              f"data.synthetic.num_edges={edges}", "data.synthetic.holdout=1000", "model.name=distmult",
              f"model.dim={args.dim}", f"train.epochs={args.epochs}", f"train.batch_size={args.batch}",
              f"train.negatives={args.negatives}", *(["eval.every=1", f"eval.negatives={args.curve_negatives}"]
                                                     if args.curve else ["eval.every=0"]), "eval.test=false",
              f"eval.max_triples={args.eval_triples}", "checkpoint.every=1",
              f"pipeline.staleness_bound={args.staleness_bound}", "store.backend=mmap", "threads=2", *args.set]
    results: dict = {
        "command": " ".join([".venv/bin/python", "benchmarks/out_of_core.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
        "setting": {"entities": entities, "dim": args.dim, "edges": edges, "batch_size": args.batch,
                    "negatives": args.negatives, "epochs": args.epochs, "eval_triples": args.eval_triples,
                    "memory_cap_mib": cap, "table_mib": round(table_mib), "overrides": common},
        "runs": {name: [] for name, _, _ in args.contenders},
    }
    if table_mib < 2 * cap:
        say(f"warning: the table ({table_mib:.0f} MiB) is less than twice the cap ({cap} MiB)")
    subset = len(args.strategies) < len(STRATEGIES) or bool(args.variant)  # a diagnosis: never the full results
    latencies = [float(x) for x in args.latency_ms.split(",")] if args.latency_ms else []
    if latencies and slowfs.usable() is not None:
        say(f"out_of_core: skipped: {slowfs.usable()}")
        return
    stem = "out_of_core_slowfs" if latencies else "out_of_core"
    path = RESULTS / (f"{stem}_quick.json" if args.quick else f"{stem}_subset.json" if subset else f"{stem}.json")
    path = Path(args.out) if args.out else path
    RESULTS.mkdir(exist_ok=True)
    group = make_cgroup(cap)

    def save() -> None:
        path.write_text(json.dumps(stamp(results), indent=1) + "\n")

    try:
        with tempfile.TemporaryDirectory(prefix="cadence-ooc-", dir=os.environ.get("CADENCE_BENCH_DIR")) as scratch:
            work = Path(scratch)
            if not latencies:
                sweep(group, work, work, work, common, args, repeats, results, save)
            else:
                results["slowfs"] = {"mib_per_s": args.mib_per_s, "latencies": {}}
                del results["runs"]
                for latency in latencies:
                    part = results["slowfs"]["latencies"][str(latency)] = {"runs": {n: [] for n, _, _ in args.contenders}}
                    backing, mount = work / f"backing-{latency}", work / f"slow-{latency}"
                    say(f"-- reads served {latency} ms per request (slowfs)")
                    with slowfs.SlowMount(backing, mount, latency, args.mib_per_s) as slow:
                        sweep(group, work, mount, backing, common, args, repeats, part, save)
                    part["served"] = slow.stats()
                    say(f"   served: {part['served']}")
                    save()
    finally:
        remove_cgroup(group)
    if subset:
        return
    finish(results, save)
    print(f"wrote {path}")


def resummarize(path: Path) -> None:
    """``finish`` again over the runs of a complete result file: what was measured stays as it was
    (its ``provenance``: the commit the runs ran at); ``summarized`` records this commit."""
    results = json.loads(path.read_text())
    if not results.get("complete"):
        raise SystemExit(f"out_of_core: error: {path}: not a complete result file (its runs were cut short)")
    measured = results["provenance"]
    summarized = stamp({})["provenance"]

    def save() -> None:
        path.write_text(json.dumps({**results, "provenance": measured, "summarized": summarized}, indent=1) + "\n")

    finish(results, save)
    print(f"wrote {path}")


def finish(results: dict, save: Callable[[], None]) -> None:
    """Summaries, ratios and bars of a complete set of runs (each latency's, and across them), saved
    and printed."""
    if "slowfs" not in results:
        results.update(summarize(results), complete=True)
        save()
        report(results)
    else:
        for latency, part in results["slowfs"]["latencies"].items():
            part.update(summarize(part))
            say(f"-- {latency} ms per read request")
            report(part)
        speedups = [part["ratios"]["async_over_sync"] for part in results["slowfs"]["latencies"].values()]
        slowest_latency = max(results["slowfs"]["latencies"], key=float)
        slowest = results["slowfs"]["latencies"][slowest_latency]
        if "time_to_accuracy" in slowest:
            reach = slowest["time_to_accuracy"]
            ratio = reach["mean_curve"]["sync_over"]["oac"]
            results["slowfs"]["time_to_accuracy_bar"] = {
                "bar": f"{float(slowest_latency)} ms a read: on the mean curves (the paper's figure), OAC reaches sync's best "
                       "MRR >= 1.5x sooner than sync",
                "value": ratio, "per_repetition": reach["sync_over"]["oac"],
                "passed": ratio is not None and ratio >= 1.5}
            near = reach["mean_curve"]["within_noise"]
            if near is not None:
                ratio = near["sync_over"]["oac"]
                results["slowfs"]["time_to_accuracy_within_noise_bar"] = {
                    "bar": f"{float(slowest_latency)} ms a read: on the mean curves, OAC reaches sync's best MRR less "
                           f"the repetitions' paired noise ({near['tolerance']:.4f}) >= 1.5x sooner than sync",
                    "value": ratio, "passed": ratio is not None and ratio >= 1.5}
        results["slowfs"]["bars"] = {
            "oac_0.9x_async_at_every_latency": {
                "values": [part["ratios"]["oac_over_async"] for part in results["slowfs"]["latencies"].values()],
                "passed": all(part["bars"]["oac_0.9x_async"]["passed"]
                              for part in results["slowfs"]["latencies"].values())},
            "oac_bit_identical_at_every_latency": {
                "passed": all(part["bars"]["oac_bit_identical_to_replay"]["passed"]
                              for part in results["slowfs"]["latencies"].values())},
            "async_lead_grows_with_latency": {"values": speedups,
                                              "passed": all(b > a for a, b in zip(speedups, speedups[1:]))},
        }
        results["complete"] = True
        save()
        for name, bar in results["slowfs"]["bars"].items():
            print(f"{'PASS' if bar['passed'] else 'FAIL'} {name}: {bar.get('values', '')}")
        if "time_to_accuracy_bar" in results["slowfs"]:
            bar = results["slowfs"]["time_to_accuracy_bar"]
            print(f"{'PASS' if bar['passed'] else 'FAIL'} {bar['bar']}: {bar['value']} "
                  f"(per repetition, each against its own sync run's best: {bar['per_repetition']})")
        if "time_to_accuracy_within_noise_bar" in results["slowfs"]:
            bar = results["slowfs"]["time_to_accuracy_within_noise_bar"]
            print(f"{'PASS' if bar['passed'] else 'FAIL'} {bar['bar']}: {bar['value']}")


def sweep(group: Path, work: Path, stores: Path, backing: Path, common: list[str], args, repeats: int,
          into: dict, save) -> None:
    """``repeats`` rounds of the strategies, interleaved (machine noise hits every contender alike);
    the stores in ``stores`` (whose files are ``backing``'s: the same directory, or the slow mount's);
    OAC's first run replayed by sync unless ``--no-replay``. Runs go into ``into["runs"]``."""
    for repeat in range(repeats):
        for name, strategy, overrides in args.contenders:
            store = stores / f"store-{name}-{repeat}"
            extra = [f"strategy={strategy}", f"seed={repeat}", f"store.path={store}", *overrides]
            replayed = name == "oac" and repeat == 0 and not args.no_replay
            if replayed:
                extra.append(f"record_order={work / 'oac.order.jsonl'}")
            summary = run(group, work / f"run-{name}-{repeat}", common + extra)
            into["runs"][name].append(summary)
            say(f"[{repeat}] {name:5}: {summary['examples_per_second']:,.0f} edges/s, train "
                f"{summary['train_seconds']:.1f}s, test MRR {summary['mrr']:.4f}, major faults "
                f"{summary['major_page_faults']:,}, peak {summary['peak_memory_mib']} MiB"
                + (f" (anonymous: peak {summary['peak_anon_mib']}, median {summary['median_anon_mib']})"
                   if "peak_anon_mib" in summary else "")
                + "".join(f", {k} {summary[k]}" for k in COUNTERS if k in summary))
            if replayed:
                replay_store = stores / "store-replay"
                replay = run(group, work / "run-replay", common + [
                    "strategy=sync", f"seed={repeat}", f"store.path={replay_store}",
                    f"batch_order={work / 'oac.order.jsonl'}"])
                same = table_digest(backing / store.name) == table_digest(backing / replay_store.name)
                into["oac_replay"] = {"bit_identical": same, "replay_mrr": replay["mrr"], "oac_mrr": summary["mrr"],
                                      "replay_edges_per_second": replay["examples_per_second"]}
                say(f"oac vs its sync replay: {'bit-identical' if same else 'DIFFERENT'}")
                shutil.rmtree(replay_store, ignore_errors=True)
            shutil.rmtree(store, ignore_errors=True)
            save()


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """``NAME:STRATEGY:KEY=VALUE[,KEY=VALUE]`` as (name, strategy, overrides)."""
    parts = text.split(":", 2)
    if len(parts) != 3 or parts[1] not in STRATEGIES or not parts[0] or parts[0] in STRATEGIES:
        raise SystemExit(f"out_of_core: error: --variant {text}: want NAME:STRATEGY:KEY=VALUE[,KEY=VALUE] with a new "
                         f"NAME and STRATEGY one of {', '.join(STRATEGIES)}")
    return parts[0], parts[1], [item for item in parts[2].split(",") if item]


def summarize(results: dict) -> dict:
    """Per strategy: edges/s and test MRR over the repetitions; the ratios; the bars."""
    table = {}
    for name, runs in results["runs"].items():
        speeds = [r["examples_per_second"] for r in runs]
        table[name] = {"edges_per_second": speeds, "edges_per_second_median": statistics.median(speeds),
                       "test_mrr": mean_ci([r["mrr"] for r in runs]),
                       "major_page_faults": [r["major_page_faults"] for r in runs],
                       **{k: [r[k] for r in runs] for k in COUNTERS if k in runs[0]}}
    speed = {name: table[name]["edges_per_second_median"] for name in table}
    ratios = {"async_over_sync": speed["async"] / speed["sync"], "oac_over_async": speed["oac"] / speed["async"],
              "oac_over_sync": speed["oac"] / speed["sync"]}
    gaps = [o["mrr"] - s["mrr"] for o, s in zip(results["runs"]["oac"], results["runs"]["sync"])]
    gap = mean_ci(gaps)
    noise = gap["half_width"]
    bars = {
        "async_2x_sync": {"value": ratios["async_over_sync"], "passed": ratios["async_over_sync"] >= 2.0},
        "oac_0.9x_async": {"value": ratios["oac_over_async"], "passed": ratios["oac_over_async"] >= 0.9},
        "oac_mrr_equals_sync_within_noise": {
            "oac_minus_sync": gap, "passed": noise is not None and abs(gap["mean"]) <= noise},
        "oac_bit_identical_to_replay": {"passed": bool(results.get("oac_replay", {}).get("bit_identical"))},
    }
    out = {"strategies": table, "ratios": ratios, "bars": bars}
    if all("history" in r for runs in results["runs"].values() for r in runs):
        out["time_to_accuracy"] = time_to_accuracy(results["runs"])
    return out


def time_to_accuracy(runs: dict[str, list[dict]]) -> dict:
    """Per repetition, the target (that repetition's sync run's best validation MRR) and each
    strategy's training seconds to its first validation at or above it (None: never); the ratios of
    sync's time to each other strategy's, per repetition."""
    targets = [max(r["mrr"] for r in run["history"]) for run in runs["sync"]]

    def reached(run: dict, target: float) -> float | None:
        return next((r["wall_seconds"] for r in run["history"] if r["mrr"] is not None and r["mrr"] >= target), None)

    seconds = {name: [reached(run, target) for run, target in zip(mine, targets)] for name, mine in runs.items()}
    ratios = {name: [None if s is None or o is None or o == 0 else s / o for s, o in zip(seconds["sync"], values)]
              for name, values in seconds.items() if name != "sync"}
    curves = {name: mean_curve(mine) for name, mine in runs.items()}
    best = {name: [max(r["mrr"] for r in run["history"]) for run in mine] for name, mine in runs.items()}
    target = max(mrr for _, mrr in curves["sync"])
    # what the repetitions can tell apart: the 95% half-width of OAC's best minus sync's, paired by seed
    gap = mean_ci([o - s for o, s in zip(best["oac"], best["sync"])]) if "oac" in best else {"half_width": None}
    tolerance = gap["half_width"]
    return {"targets": targets, "seconds": seconds, "sync_over": ratios, "best_mrr": best,
            "mean_curve": {"curves": curves, **_reaching(curves, target),
                           "within_noise": None if tolerance is None else {
                               "tolerance": tolerance, "oac_minus_sync_best": gap,
                               **_reaching(curves, target - tolerance)}}}


def _reaching(curves: dict[str, list[tuple[float, float]]], target: float) -> dict:
    """The target, each curve's first seconds at or above it (None: never), sync's over each other's."""
    first = {name: next((t for t, mrr in curve if mrr >= target), None) for name, curve in curves.items()}
    return {"target": target, "seconds": first,
            "sync_over": {name: None if t is None or first["sync"] is None else first["sync"] / t
                          for name, t in first.items() if name != "sync"}}


def mean_curve(runs: list[dict]) -> list[tuple[float, float]]:
    """The paper's figure for one strategy: after each epoch (up to the shortest run), the mean over
    the repetitions of the training seconds and of the validation MRR."""
    epochs = min(len(run["history"]) for run in runs)
    return [(sum(run["history"][e]["wall_seconds"] for run in runs) / len(runs),
             sum(run["history"][e]["mrr"] for run in runs) / len(runs)) for e in range(epochs)]


def report(results: dict) -> None:
    for name, row in results["strategies"].items():
        print(f"{name:5} {row['edges_per_second_median']:>9,.0f} edges/s  test MRR {row['test_mrr']['mean']:.4f}"
              + (f" ± {row['test_mrr']['half_width']:.4f}" if row["test_mrr"]["half_width"] else ""))
    for name, bar in results["bars"].items():
        print(f"{'PASS' if bar['passed'] else 'FAIL'} {name}: {bar.get('value', bar.get('oac_minus_sync', ''))}")
    if "time_to_accuracy" in results:
        reach = results["time_to_accuracy"]
        print(f"time to sync's best validation MRR (per repetition, targets {reach['targets']}): {reach['seconds']}")
        mean = reach["mean_curve"]
        print(f"on the mean curves: sync's best {mean['target']:.4f}, reached after {mean['seconds']} s")


if __name__ == "__main__":
    main()
