"""GBA and its baselines under real stale-gradient stragglers on MovieLens-100k CTR (DeepFM): the
GBA paper's claim that GBA keeps synchronous training's accuracy at asynchronous speed when a
worker straggles, with the same hyperparameters for every mode.

What runs: configs/ml100k-deepfm.yaml as shipped (DeepFM, 4 parameter-server workers x local batch
256, tolerance 2, eval every epoch) for ``--epochs`` epochs, strategies ``sync``, ``gba`` and
``hop_bw`` (1 backup worker) at every straggler severity, and ``async`` at 4x only (a reference).
Severities: worker 0 none (1x), 1.5x, 2x, 4x, 8x slower for the whole run, and a transient 8x
straggler in epochs 2-3 (``0:8@2-3``). Nothing is tuned per mode.

How a straggler is made, ``--cause cpu_quota`` (the real cause): the workers are Ray actors
(``ps.engine=ray``, a local cluster), and the straggler's process runs its slowed epochs in a
cgroup-v1 CPU quota (``ps.straggler_cause=cpu_quota``): ``--quota relative`` (the default) its own
CPU rate, measured unthrottled in its first half second, over s; ``--quota absolute`` 1 / s
cores. The kernel throttles everything it does, nothing sleeps, no latency is emulated
(``--latency`` defaults to 0). The results go to gba_stragglers_quota.json
(gba_stragglers_quota_absolute.json with ``--quota absolute``). Needs root (otherwise it says so and exits 0).

``--cause sleep`` (the fast emulation, the default for the file of record
gba_stragglers.json): the workers are threads of one process on a 2-core machine. Every batch
spends ``--latency`` seconds off-CPU (``ps.emulated_latency``), as if each worker had a machine of
its own (the latency dominates the few milliseconds of compute, so 4 threads behave like 4
machines rather than 4 threads fighting for 2 cores). A straggler with slowdown s takes s x
(latency + compute) per batch, and the extra time is spent BETWEEN its pull and its push: it holds
parameters while the others keep applying steps, so the gradient it pushes really is stale. Sync
waits for it at every step; GBA aggregates the first M = 4 gradients that arrive and drops those
whose token staleness exceeds the tolerance (2); hop_bw applies the first 3 gradients of each step
and drops the late one.

Measured per mode x severity, mean and 95% t-interval over seeds (runs are interleaved seed-major,
so machine noise hits all modes alike):

- time to target: the first cumulative training ``wall_seconds`` (evaluation excluded) at which
  the validation AUC reaches the target (None: never). A seed draws its own random split, and the
  best validation AUC differs by ~0.01 between splits, so the target is per seed: that seed's
  no-straggler sync run's best validation AUC minus ``TARGET_MARGIN``, computed in the same
  invocation. The pooled variant (mean over seeds of those best AUCs minus the margin, one
  target for all seeds) is also reported (``pooled_target``): a split whose AUCs all lie below it
  never reaches it, whatever the mode;
- applied examples/s: gradients_applied x 256 / train_seconds (dropped gradients do not count);
- token staleness mean / max (what GBA drops on), gradients dropped and their fraction;
- final test AUC.

- which gradients a rule dropped: the token staleness of kept and dropped gradients, and whose
  (``token_staleness_kept`` / ``_dropped``, ``applied_by_worker`` / ``dropped_by_worker``).

Bars (printed PASS/FAIL and written in the JSON, at 4x and 8x: ``bars_by_severity``; ``bars`` is
4x's): (1) GBA reaches the target >= 2x faster than sync (ratio of means and every seed: a seed
that never reaches it fails); (2) GBA's final test AUC >= sync's - 0.001 (mean of the per-seed
differences, with its interval); (3) hop_bw reaches the target faster than sync; (4) GBA's test
AUC >= hop_bw's (mean of the per-seed differences).

``--modes ... gba_iota11`` adds an ablation: GBA with ``ps.tolerance=11`` (every severity but 1x),
which keeps the straggler's stale gradients that the default tolerance, 2, drops.

    .venv/bin/python benchmarks/gba_stragglers.py [--quick] [--seeds 0 1 2] [--epochs 6] [--latency 0.02]
    sudo .venv/bin/python benchmarks/gba_stragglers.py --cause cpu_quota --seeds 0 1 2 3 4 5 6 7 8 9 --epochs 8 \
        --severities 1x 4x 8x --modes sync gba hop_bw async gba_iota11   # the file of record (issue 49)
    .venv/bin/python benchmarks/gba_stragglers.py --seeds 3 4 5 --severities 1x 4x --modes sync gba --append
                                                   # more seeds for the 4x bars, added to the runs on record
    .venv/bin/python benchmarks/gba_stragglers.py --reaggregate [--quick]  # targets, tables and bars
                                                   # recomputed from the runs already in the JSON

Writes benchmarks/results/gba_stragglers.json (``--quick``: gba_stragglers_quick.json), rewritten
after every run (``complete: false`` until the end).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

from kge_throughput import loadavg, machine_info  # same folder: the shared machine record
from peer_stats import _machine_jiffies, mean_ci

from cadence import api
from cadence.config import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "ml100k-deepfm.yaml"
RESULTS = Path(__file__).parent / "results"
LOCAL_BATCH = 256  # configs/ml100k-deepfm.yaml's train.batch_size
TARGET_MARGIN = 0.003  # target = best valid AUC of sync without a straggler (same seed) - this
MODES = ("sync", "gba", "hop_bw")
REFERENCE = ("async", "4x")  # async runs at this severity only
# an ablation, run only when named in --modes: GBA with iota = 11, keeping a 4x-8x straggler's
# stale gradients (iota = 2, the default, drops them)
ABLATIONS = {"gba_iota11": ("gba", ["ps.tolerance=11"])}
BAR_SEVERITIES = ("4x", "8x")  # the bars hold at each
# --protocol switch (the paper's evaluation, continual training): MovieLens-100k in PERIODS time-ordered
# periods ("days"); sync trains periods 0..SWITCH_AT - 1, then every mode continues from that model on
# SWITCH_AT..PERIODS - 2, each evaluated on the period after it
PERIODS = 10
SWITCH_AT = 5
# epochs per period: a period is ~10k ratings, ~10 batches a worker an epoch; 4 make the straggler's
# unthrottled probe (engines.cgroups.PROBE_S) a small part of its run (benchmarks/ps_training.py's switch: 2)
SWITCH_EPOCHS = 4
# severity label -> ps.stragglers entry (None: no straggler)
SEVERITIES = {"1x": None, "1.5x": "0:1.5", "2x": "0:2", "4x": "0:4", "8x": "0:8", "8x@2-3": "0:8@2-3"}
QUICK_SEVERITIES = ("1x", "4x", "8x@2-3")
SUMMARY_KEYS = ("auc", "train_seconds", "examples_seen", "examples_per_second", "global_steps",
                "gradients_applied", "gradients_dropped", "token_staleness_mean", "token_staleness_max",
                "staleness_mean", "staleness_max", "worker_examples_per_second", "worker_throttled_seconds",
                "token_staleness_kept", "token_staleness_dropped", "applied_by_worker", "dropped_by_worker")


def train(out: Path, *overrides: str) -> api.TrainResult:
    config = load_config(CONFIG, ["progress=false", *overrides])
    config.out = str(out)
    return api.train(config, overwrite=True)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_overrides(mode: str, severity: str, seed: int, common: list[str], cause: list[str]) -> list[str]:
    """The settings of one run: the mode's strategy (an ablation's own keys), the seed, what every run
    shares, and the straggler with how it is slowed (read only where there is one: 1x leaves it out)."""
    straggler = SEVERITIES[severity]
    strategy, extra = ABLATIONS.get(mode, (mode, []))
    overrides = [f"strategy={strategy}", *extra, f"seed={seed}", *common]
    if straggler is not None:
        overrides += [f'ps.stragglers=["{straggler}"]', *cause]
    return overrides


def switch_base_overrides(seed: int, common: list[str]) -> list[str]:
    """``--protocol switch``: the run every mode switches from, sync on the periods before the switch
    (no straggler: the cluster was healthy then)."""
    return ["strategy=sync", f"seed={seed}", *common, f"ctr.last_period={SWITCH_AT - 1}"]


def switched(overrides: list[str], base: Path) -> list[str]:
    """A run's settings continued from ``base`` on the periods after the switch."""
    return [*overrides, f"ctr.first_period={SWITCH_AT}", f"ctr.last_period={PERIODS - 2}", f"train.init_from={base}"]


def shared_overrides(epochs: int, latency: float, quota: str | None, switch: bool) -> tuple[list[str], list[str]]:
    """(what every run sets, what a run with a straggler adds: how it is slowed); ``quota``: the
    cgroup quota's kind (``--cause cpu_quota``, the workers Ray processes), None for sleeps."""
    common = [f"train.epochs={epochs}", "eval.every=1", f"ps.emulated_latency={latency}", "ps.workers=4",
              *(["ps.engine=ray"] if quota else []),
              *(["ctr.split=periods", f"ctr.num_periods={PERIODS}"] if switch else [])]
    return common, (["ps.straggler_cause=cpu_quota", f"ps.straggler_quota={quota}"] if quota else [])


def plan_runs(seeds: list[int], severities: tuple[str, ...], modes: list[str] | None) -> list[tuple[int, str, str]]:
    """(seed, severity, mode), seed-major: every mode at every severity (async at 4x only), an ablation
    (every severity but 1x) only where ``modes`` names it; ``modes``: only these."""
    return [(seed, severity, mode) for seed in seeds for severity in severities
            for mode in (*MODES, *((REFERENCE[0],) if severity == REFERENCE[1] else ()),
                         *(ABLATIONS if severity != "1x" else ()))
            if (modes is None and mode not in ABLATIONS) or (modes is not None and mode in modes)]


def run_once(work: Path, mode: str, severity: str, seed: int, common: list[str],
             cause: list[str], base: Path | None = None) -> dict[str, Any]:
    overrides = run_overrides(mode, severity, seed, common, cause)
    if base is not None:
        overrides = switched(overrides, base)
    load = loadavg()
    busy0, total0 = _machine_jiffies()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    result = train(work / f"{mode}-{severity}", *overrides)
    wall = time.perf_counter() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    busy1, total1 = _machine_jiffies()
    own = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) * os.sysconf("SC_CLK_TCK")
    summary = result.summary
    # validation: the valid split (from scratch), or the next period after each trained one (switch)
    valid = [{"epoch": m["epoch"], "wall_seconds": m["wall_seconds"], "auc": m["auc"]}
             for m in result.metrics if m.get("split") == ("valid" if base is None else "next_period")]
    applied, dropped = summary["gradients_applied"], summary["gradients_dropped"]
    # a CPU-quota straggler that the kernel never throttled was not slowed (its epochs too short for
    # the quota's probe once did that): said, and kept in the record
    throttled = sum(summary.get("worker_throttled_seconds") or [0.0])
    unslowed = bool(cause) and SEVERITIES[severity] is not None and throttled <= 0.0
    if unslowed:
        say(f"warning: seed {seed} {severity} {mode}: the straggler's quota throttled nothing: it was not slowed")
    return {
        "mode": mode, "severity": severity, "seed": seed, "overrides": overrides,
        "summary": {k: summary.get(k) for k in SUMMARY_KEYS},
        "valid": valid,
        "best_valid_auc": max(v["auc"] for v in valid) if valid else None,
        "applied_examples_per_second": applied * LOCAL_BATCH / summary["train_seconds"],
        "straggler_unslowed": unslowed,
        "drop_fraction": dropped / max(1, applied + dropped),
        "run_wall_seconds": round(wall, 2),  # training + evaluation + setup
        "loadavg_before": load,
        # share of all CPUs that other processes used during the run (machine busy - this process)
        "others_cpu_share": round(max(0.0, (busy1 - busy0 - own) / max(1, total1 - total0)), 3),
    }


def time_to_target(record: dict[str, Any], target: float) -> float | None:
    return next((v["wall_seconds"] for v in record["valid"] if v["auc"] >= target), None)


def stats(values: list[float]) -> dict[str, Any] | None:
    return mean_ci(values) if values else None


def aggregate(records: list[dict[str, Any]], ttt: str = "time_to_target") -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for mode in (*MODES, REFERENCE[0], *ABLATIONS):
        for severity in SEVERITIES:
            runs = [r for r in records if r["mode"] == mode and r["severity"] == severity]
            if not runs:
                continue
            times = [r[ttt] for r in runs]
            reached = [t for t in times if t is not None]
            table.setdefault(mode, {})[severity] = {
                "seeds": [r["seed"] for r in runs],
                "time_to_target": stats(reached),  # over the seeds that reached it
                "time_to_target_per_seed": times,
                "reached": f"{len(reached)}/{len(runs)}",
                "train_seconds": stats([r["summary"]["train_seconds"] for r in runs]),
                "applied_examples_per_second": stats([r["applied_examples_per_second"] for r in runs]),
                "examples_per_second": stats([r["summary"]["examples_per_second"] for r in runs]),
                "token_staleness_mean": stats([r["summary"]["token_staleness_mean"] for r in runs]),
                "token_staleness_max": max(r["summary"]["token_staleness_max"] for r in runs),
                "gradients_dropped": stats([r["summary"]["gradients_dropped"] for r in runs]),
                "drop_fraction": stats([r["drop_fraction"] for r in runs]),
                "best_valid_auc": stats([r["best_valid_auc"] for r in runs]),
                "test_auc": stats([r["summary"]["auc"] for r in runs]),
            }
    return table


def paired(records: list[dict[str, Any]], severity: str, a: str, b: str, key) -> list[tuple[int, Any, Any]]:
    """(seed, key(a's run), key(b's run)) for every seed with both runs at ``severity``."""
    runs = {(r["mode"], r["seed"]): r for r in records if r["severity"] == severity}
    seeds = sorted({seed for (mode, seed) in runs if mode == a} & {seed for (mode, seed) in runs if mode == b})
    return [(s, key(runs[(a, s)]), key(runs[(b, s)])) for s in seeds]


def speedup(records: list[dict[str, Any]], severity: str, fast: str, ttt: str = "time_to_target") -> dict[str, Any]:
    """sync's time to target over ``fast``'s: ratio of means and per seed (None where one never
    reached the target: a run that never reaches it counts as infinitely slow)."""
    pairs = paired(records, severity, "sync", fast, lambda r: r[ttt])
    per_seed = [None if f is None or s is None else s / f for _, s, f in pairs]
    sync_times = [s for _, s, _ in pairs]
    fast_times = [f for _, _, f in pairs]
    complete = pairs and None not in sync_times and None not in fast_times
    ratio = (sum(sync_times) / sum(fast_times)) if complete else None
    return {"severity": severity, "seeds": [seed for seed, _, _ in pairs], "sync_time_to_target": sync_times,
            f"{fast}_time_to_target": fast_times, "ratio_of_means": ratio, "per_seed_ratio": per_seed,
            "never_reached": {"sync": sync_times.count(None), fast: fast_times.count(None)}}


def bars(records: list[dict[str, Any]], severity: str = "4x", ttt: str = "time_to_target",
         goal: str = "reaches the target") -> dict[str, Any]:
    one = speedup(records, severity, "gba", ttt)
    ok = (one["ratio_of_means"] is not None and one["ratio_of_means"] >= 2.0
          and all(r is not None and r >= 2.0 for r in one["per_seed_ratio"]))
    one.update(bar=f"{severity}: GBA {goal} >= 2x faster than sync (ratio of means and every seed)",
               passed=bool(one["per_seed_ratio"]) and ok)
    gaps = [g - s for _, s, g in paired(records, severity, "sync", "gba", lambda r: r["summary"]["auc"])]
    two = {"bar": f"{severity}: GBA test AUC >= sync's - 0.001 (mean of the per-seed differences)",
           "gba_minus_sync_test_auc": stats(gaps), "passed": bool(gaps) and sum(gaps) / len(gaps) >= -0.001}
    three = speedup(records, severity, "hop_bw", ttt)
    three.update(bar=f"{severity}: hop_bw {goal} faster than sync (ratio of means > 1)",
                 passed=three["ratio_of_means"] is not None and three["ratio_of_means"] > 1.0)
    over = [g - h for _, h, g in paired(records, severity, "hop_bw", "gba", lambda r: r["summary"]["auc"])]
    four = {"bar": f"{severity}: GBA test AUC >= hop_bw's (mean of the per-seed differences)",
            "gba_minus_hop_bw_test_auc": stats(over), "passed": bool(over) and sum(over) / len(over) >= 0.0}
    return {"1_gba_2x_faster_than_sync": one, "2_gba_test_auc_at_least_sync_minus_0.001": two,
            "3_hop_bw_faster_than_sync": three, "4_gba_test_auc_at_least_hop_bw": four}


def gaps_by_severity(records: list[dict[str, Any]], ttt: str = "time_to_target") -> dict[str, Any]:
    out = {}
    for severity in SEVERITIES:
        for mode in ("gba", "hop_bw", *ABLATIONS):
            gaps = [m - s for _, s, m in paired(records, severity, "sync", mode, lambda r: r["summary"]["auc"])]
            if gaps:
                out.setdefault(severity, {})[f"{mode}_minus_sync_test_auc"] = stats(gaps)
        for mode in ("gba", "hop_bw"):
            ratio = speedup(records, severity, mode, ttt)
            if ratio["seeds"]:
                out.setdefault(severity, {})[f"sync_over_{mode}_{ttt}"] = {
                    "ratio_of_means": ratio["ratio_of_means"], "per_seed": ratio["per_seed_ratio"]}
    return out


def fmt(cell: dict[str, Any] | None, digits: int = 1, scale: float = 1.0) -> str:
    if cell is None:
        return "-"
    mean = cell["mean"] * scale
    half = cell["half_width"]
    return f"{mean:.{digits}f}" + (f"±{half * scale:.{digits}f}" if half is not None else "")


def table_text(table: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'mode':7} {'sev':7} {'t→target s':>12} {'reach':>5} {'applied ex/s':>13} {'tok.stal':>8} "
             f"{'max':>3} {'drop %':>9} {'test AUC':>15}"]
    for mode, rows in table.items():
        for severity, row in rows.items():
            lines.append(f"{mode:7} {severity:7} {fmt(row['time_to_target']):>12} {row['reached']:>5} "
                         f"{fmt(row['applied_examples_per_second'], 0):>13} {fmt(row['token_staleness_mean'], 2):>8} "
                         f"{row['token_staleness_max']:>3} {fmt(row['drop_fraction'], 1, 100.0):>9} "
                         f"{fmt(row['test_auc'], 4):>15}")
    return "\n".join(lines)


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    return {"commit": git("rev-parse", "HEAD"), "dirty_files": git("status", "--short", "src").splitlines()}


SWITCH_TIME = "time_to_train"  # --protocol switch: a run's training seconds for the periods after the switch


def finish_switch(results: dict[str, Any]) -> None:
    """``--protocol switch``: every mode trains the same periods after the switch, so speed is the
    training seconds they take (sync's over GBA's, the paper's 2.4x), and quality the mean AUC on the
    period after each (the summary's ``auc``, in the bars' test-AUC slot)."""
    records = results["runs"]
    for record in records:
        record[SWITCH_TIME] = record["summary"]["train_seconds"]
    goal = "trains the periods after the switch"
    results.update(
        quality="summary auc: the mean AUC on the period after each trained one (the paper's next-day AUC)",
        aggregates=aggregate(records, SWITCH_TIME), by_severity=gaps_by_severity(records, SWITCH_TIME),
        bars=bars(records, ttt=SWITCH_TIME, goal=goal),
        bars_by_severity={sev: bars(records, sev, SWITCH_TIME, goal) for sev in BAR_SEVERITIES
                          if any(r["severity"] == sev for r in records)})


def finish(results: dict[str, Any]) -> None:
    """Targets, times to target, aggregates and bars from ``results["runs"]``."""
    results["unslowed_stragglers"] = [f"seed {r['seed']} {r['severity']} {r['mode']}" for r in results["runs"]
                                      if r.get("straggler_unslowed")]
    if results.get("protocol") == "switch":
        finish_switch(results)
        return
    records = results["runs"]
    best = {r["seed"]: r["best_valid_auc"] for r in records if r["mode"] == "sync" and r["severity"] == "1x"}
    targets = {seed: auc - TARGET_MARGIN for seed, auc in best.items()}
    pooled = sum(best.values()) / len(best) - TARGET_MARGIN
    for record in records:
        target = targets.get(record["seed"])
        record["target_valid_auc"] = target
        record["time_to_target"] = None if target is None else time_to_target(record, target)
        record["time_to_target_pooled"] = time_to_target(record, pooled)
    results.update(
        target={"definition": f"per seed: best valid AUC of that seed's sync run at 1x - {TARGET_MARGIN}",
                "valid_auc_by_seed": targets, "sync_1x_best_valid_auc_by_seed": best},
        aggregates=aggregate(records), by_severity=gaps_by_severity(records), bars=bars(records),
        # the same bars at every severity the issue names (``bars`` is 4x's, as in earlier files)
        bars_by_severity={sev: bars(records, sev) for sev in BAR_SEVERITIES
                          if any(r["severity"] == sev for r in records)},
        pooled_target={"definition": f"mean over seeds of sync 1x best valid AUC - {TARGET_MARGIN}, one target "
                                     "for every seed", "valid_auc": pooled,
                       "time_to_target": {mode: {sev: {"mean": (cell["time_to_target"] or {}).get("mean"),
                                                       "per_seed": cell["time_to_target_per_seed"],
                                                       "reached": cell["reached"]} for sev, cell in rows.items()}
                                          for mode, rows in aggregate(records, "time_to_target_pooled").items()},
                       "bars": {k: v for k, v in bars(records, ttt="time_to_target_pooled").items()
                                if "ratio_of_means" in v}})


def report(results: dict[str, Any], path: Path) -> None:
    if "target" in results:
        print(f"target valid AUC per seed {({s: round(t, 4) for s, t in results['target']['valid_auc_by_seed'].items()})}"
              f" (pooled {results['pooled_target']['valid_auc']:.4f}); ", end="")
    else:
        print(f"switched from sync after period {SWITCH_AT - 1}; quality: {results['quality']}; ", end="")
    print(f"{len(results['seeds'])} seed(s), {results['epochs']} epochs, latency {results['latency_seconds']}s")
    print(table_text(results["aggregates"]))
    groups = [(f"{sev}: ", group) for sev, group in results.get("bars_by_severity", {"4x": results["bars"]}).items()]
    pooled = [("pooled target: ", results["pooled_target"]["bars"])] if "pooled_target" in results else []
    for label, group in (*groups, *pooled):
        for name, bar in group.items():
            if "ratio_of_means" in bar:
                numbers = (f"ratio of means {bar['ratio_of_means']}, per seed {bar['per_seed_ratio']}, "
                           f"sync {bar['sync_time_to_target']}")
            else:
                key = next(k for k in bar if k.endswith("_test_auc"))
                gap = bar[key]
                numbers = f"{key[:-len('_test_auc')].replace('_minus_', ' - ')} {fmt(gap, 4)} (CI {gap['ci95'] if gap else None})"
            print(f"{label}{'PASS' if bar['passed'] else 'FAIL'} {name}: {bar['bar']}: {numbers}")
    if results.get("unslowed_stragglers"):
        print(f"WARNING: {len(results['unslowed_stragglers'])} run(s) whose straggler the quota never throttled: "
              + ", ".join(results["unslowed_stragglers"]))
    print(f"wrote {path.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seed 0, severities 1x/4x/8x@2-3, 3 epochs")
    parser.add_argument("--seeds", type=int, nargs="+", help="default 0 1 2 (--quick: 0)")
    parser.add_argument("--epochs", type=int, help="default 6 (--quick: 3)")
    parser.add_argument("--cause", choices=("sleep", "cpu_quota"), default="sleep",
                        help="how a straggler is slowed: sleep (threads, emulated latency) or cpu_quota (a Ray "
                             "worker process under a cgroup CPU quota)")
    parser.add_argument("--quota", choices=("relative", "absolute"), default="relative",
                        help="with --cause cpu_quota: ps.straggler_quota (default relative)")
    parser.add_argument("--latency", type=float, default=None,
                        help="ps.emulated_latency, seconds per batch (default 0.02 with --cause sleep, 0 with "
                             "cpu_quota)")
    parser.add_argument("--severities", nargs="+", choices=tuple(SEVERITIES),
                        help="run only these severities (1x is each seed's target: keep it)")
    parser.add_argument("--modes", nargs="+", choices=(*MODES, REFERENCE[0], *ABLATIONS),
                        help="run only these modes (an ablation runs only when named: gba_iota11 is GBA with "
                             "ps.tolerance=11, at every severity but 1x)")
    parser.add_argument("--protocol", choices=("scratch", "switch"), default="scratch",
                        help="scratch: every mode trains from scratch on a random split (time to a target AUC); "
                             f"switch: the paper's continual training: sync trains periods 0-{SWITCH_AT - 1} of "
                             f"{PERIODS}, every mode continues from it on periods {SWITCH_AT}-{PERIODS - 2}, each "
                             f"evaluated on the next (--epochs per period, default {SWITCH_EPOCHS})")
    parser.add_argument("--append", action="store_true",
                        help="add the runs to those already in the JSON (same epochs and latency), "
                             "replacing any with the same seed, severity and mode")
    parser.add_argument("--reaggregate", action="store_true",
                        help="train nothing: recompute targets, aggregates and bars from the runs in the JSON")
    add_flag(parser)
    args = parser.parse_args()
    check(args)
    quota = args.cause == "cpu_quota"
    if args.latency is None:
        args.latency = 0.0 if quota else 0.02
    if quota:
        from cadence.engines import cgroups

        if cgroups.unavailable() is not None:
            print(f"gba_stragglers --cause cpu_quota: skipped: {cgroups.unavailable()}")
            return
    name = ("gba_stragglers" + (f"_quota{'_absolute' if args.quota == 'absolute' else ''}" if quota else "")
            + ("_switch" if args.protocol == "switch" else ""))
    path = RESULTS / (f"{name}_quick.json" if args.quick else f"{name}.json")
    command = " ".join([".venv/bin/python", "benchmarks/gba_stragglers.py", *sys.argv[1:]])
    if args.reaggregate:
        results = json.loads(path.read_text())
        results["reaggregated"] = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        finish(results)
        path.write_text(json.dumps(stamp(results), indent=1) + "\n")
        report(results, path)
        return
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    switch = args.protocol == "switch"
    epochs = args.epochs or (SWITCH_EPOCHS if switch else 3 if args.quick else 6)
    severities = args.severities or (QUICK_SEVERITIES if args.quick else tuple(SEVERITIES))
    common, cause = shared_overrides(epochs, args.latency, args.quota if quota else None, switch)
    plan = plan_runs(seeds, severities, args.modes)
    earlier: list[dict[str, Any]] = []
    if args.append:
        if not path.exists():
            parser.error(f"--append: {path.relative_to(REPO)} does not exist yet")
        previous = json.loads(path.read_text())
        if (previous["epochs"] != epochs or previous["latency_seconds"] != args.latency
                or previous.get("protocol", "scratch") != args.protocol):
            parser.error(f"--append: {path.relative_to(REPO)} has epochs {previous['epochs']}, latency "
                         f"{previous['latency_seconds']} and protocol {previous.get('protocol', 'scratch')}; these "
                         "runs would not be comparable")
        fresh = {(seed, severity, mode) for seed, severity, mode in plan}
        earlier = [r for r in previous["runs"] if (r["seed"], r["severity"], r["mode"]) not in fresh]
        seeds = sorted({*previous["seeds"], *seeds})
        severities = tuple(s for s in SEVERITIES if s in {*previous["severities"], *severities})
    results: dict[str, Any] = {
        "command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "complete": False,
        "config": str(CONFIG.relative_to(REPO)), "common_overrides": common, "straggler_overrides": cause,
        "severities": {s: SEVERITIES[s] for s in severities}, "seeds": seeds, "epochs": epochs,
        "latency_seconds": args.latency, "straggler_cause": args.cause, "local_batch": LOCAL_BATCH, "target_margin": TARGET_MARGIN,
        "protocol": args.protocol,
        **({"switch": {"periods": PERIODS, "sync_trained": [0, SWITCH_AT - 1], "switched": [SWITCH_AT, PERIODS - 2],
                       "epochs_per_period": epochs}, "bases": {}} if switch else {}),
        "machine": machine_info(), "git": git_state(), "runs": earlier,
    }
    if args.append:
        additions = [*previous.get("appended", []), {"command": command, "date": results["date"],
                                                     "runs": len(plan), "git": results["git"]}]
        results.update({k: previous[k] for k in ("command", "date", "machine", "git", "bases") if k in previous})
        results["appended"] = additions
    RESULTS.mkdir(exist_ok=True)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cadence-gba-") as scratch:
        base = None
        for index, (seed, severity, mode) in enumerate(plan, 1):
            if switch and (base is None or base.name != f"base-{seed}"):  # the seed's model before the switch
                base = Path(scratch) / f"base-{seed}"
                summary = train(base, *switch_base_overrides(seed, common)).summary
                results["bases"][str(seed)] = {k: summary.get(k) for k in ("auc", "next_period_auc", "train_seconds")}
                say(f"seed {seed}: sync on periods 0-{SWITCH_AT - 1}: next-period AUC "
                    f"{[round(a, 4) for a in summary['next_period_auc']]}")
            record = run_once(Path(scratch), mode, severity, seed, common, cause, base)
            results["runs"].append(record)
            path.write_text(json.dumps(stamp(results), indent=1) + "\n")
            s = record["summary"]
            say(f"[{index}/{len(plan)} {time.perf_counter() - began:.0f}s] seed {seed} {severity:6} {mode:6}: "
                f"train {s['train_seconds']:.1f}s, valid AUC {[round(v['auc'], 4) for v in record['valid']]}, "
                f"test {s['auc']:.4f}, applied {record['applied_examples_per_second']:,.0f} ex/s, "
                f"dropped {s['gradients_dropped']}, token staleness {s['token_staleness_mean']:.2f}/"
                f"{s['token_staleness_max']}, others' CPU {record['others_cpu_share']:.2f}")
    results.update(complete=True, total_wall_seconds=round(time.perf_counter() - began, 1))
    finish(results)
    path.write_text(json.dumps(stamp(results), indent=1) + "\n")
    report(results, path)


if __name__ == "__main__":
    main()
