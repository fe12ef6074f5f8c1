#!/usr/bin/env python
"""ShadowSync (SPEC section 5, seed 004) on synthetic CTR data: background dense sync against Hogwild
without sync and against the same sync rules in the foreground every k batches, in one invocation.

What runs: ``configs/ml100k-deepfm.yaml``'s hyperparameters (dim 16, MLP 64-32, dropout 0.2,
row-wise Adagrad 0.05 on embedding rows, Adam on the dense replicas, batch 256 per worker thread)
with two changes, DLRM instead of DeepFM and a dense learning rate of 0.01 instead of 0.001, on
``synthetic-ctr`` (``ctr.synthetic.num_examples`` examples, a random 80/10/10 split drawn by the
seed), one pass (``train.epochs=1``), 2 trainers (``ps.workers``) x 2 Hogwild worker threads each
(``shadow.threads``), ``threads=1`` torch intra-op thread: the worker threads are the parallelism,
and 4 of them already cover the machine's 2 cores twice. Why the two changes: the synthetic labels
follow a planted factorization machine, which DeepFM learns in its FM term, i.e. in the embeddings
that all trainers share, so its replicated MLP hardly matters (in single-run probes hogwild's,
fr-easgd-5's and fr-easgd-100's test loglosses lay within about 0.001 of each other); DLRM's logit
passes through the replicated top MLP, as in the paper's models, and at dense lr 0.01
unsynchronised replicas drift apart (probe: hogwild 0.619 against fr-easgd-5 and -100 0.605 and
0.604), so the sync has something to do. Contenders:
``hogwild`` (no dense sync), ``shadow-easgd``, ``shadow-ma``, ``shadow-bmuf`` (a shadow thread per
trainer, unthrottled: the default), the same three with the paper's CPU share for the shadow thread
(``shadow-*@share``: a free loop, as the paper's, at ``shadow.cpu_share`` = cores / trainers / 25,
the paper's shadow thread being one of a trainer's 25 threads; the plain ``shadow-*`` wait for an
update of the replica between rounds, ``shadow.wait_for_update``, the shipped config's setting),
``fr-easgd``/``fr-ma``/``fr-bmuf`` at k = 5 (``shadow.every``) and
``fr-easgd`` at k = 10, 30, 100. Everything else is the library's default (alpha = 0.9 / trainers,
BMUF block lr 1 and momentum 0.875).

Measured per run (summary.json and metrics.jsonl of the run): EPS (``examples_per_second``,
training only), ``sync_gap`` (the seed's equation 2: EPS / batch / syncs per second, batches of a
trainer between two syncs of its replica), ``syncs_per_second``, ELP (``examples_in_flight`` =
batch x threads x trainers), the epoch's training loss (mean batch loss of the pass), eval logloss,
NE and AUC on the test split, training seconds, the shadow threads' mean share of a core
(``shadow_cpu_share``), and the share of the CPUs that other processes used
meanwhile (the machine is shared: a ratio from a contended run means little). A short hogwild run
first pays the process's one-time costs and is not kept. Seeds run one after
the other; within a seed every contender runs once (the order reversed every other seed), so
machine noise hits all alike. Per seed each contender's EPS is divided by hogwild's of the same
seed; per contender the mean and 95% t-interval over seeds of every metric and of that ratio.

Bars (the issue's; PASS/FAIL printed and in the JSON under ``bars``):
(a) every shadow-* contender's EPS >= 0.95 x hogwild's: the mean over seeds of its per-seed ratio
    to hogwild >= 0.95 (the interval is reported beside it);
(b) shadow-easgd's eval logloss <= the best fr-easgd's within the CI: the best fr-easgd is the k
    with the lowest mean eval logloss; the per-seed paired difference d = shadow-easgd - that
    fr-easgd (same seed, same data) gets a 95% t-interval, and the bar passes when its lower bound
    is <= 0 (shadow-easgd is not worse beyond seed-to-seed noise; with one seed: d <= 0). Choosing
    the best k on the same runs favours fr-easgd slightly. The same for every other shadow-*
    contender (``b_<name>_logloss``).

Also, each on the first seed only: a sweep like the paper's scaling figures (trainers 1, 2, 4 x
worker threads per trainer 1, 2, 4; shadow-easgd, fr-easgd k=5 and hogwild as the no-sync ceiling:
EPS, sync gap, syncs per second, ELP), and the cap on a shadow thread's rounds
(``shadow.max_syncs_per_second`` 0 = off, 5, 50) on shadow-easgd and shadow-ma (EPS and its ratio
to a hogwild run made beside them, sync gap, eval logloss).

    .venv/bin/python benchmarks/shadowsync.py [--quick] [--seeds N] [--max-wait S] [--out FILE]
    .venv/bin/python benchmarks/shadowsync.py --seeds 5 --main-only   # Figure 5's quality over 5 seeds (issue 49)
    .venv/bin/python benchmarks/shadowsync.py --eps-only --seeds 6 --out benchmarks/results/shadowsync_eps.json

``--quick``: 100,000 examples instead of 600,000 and 1 seed (a few seconds a run, 2-3 minutes in
all), to check the harness; the full run takes about 15 minutes on a quiet machine (more when it
waits for one). Writes benchmarks/results/shadowsync.json (``--quick``:
shadowsync_quick.json) with the command, the machine, every contender's settings and every run.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provenance import check  # same folder: every result traces to a commit

from kge_throughput import QuietGate, loadavg, machine_info  # same folder: the shared machine record
from peer_stats import mean_ci, peer_parser, peer_run, train_measured, write_report

from cadence import api
from cadence.config import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "ml100k-deepfm.yaml"
NUM_EXAMPLES = {False: 600_000, True: 100_000}  # by --quick
MODEL, DENSE_LR = "dlrm", 0.01  # a dense part that matters on planted-FM data (see the docstring)
THREADS = 1  # torch intra-op threads: the Hogwild worker threads are the parallelism
CONTENDED = 0.15  # a run during which other processes used more of the CPUs than this is contended
TRAINERS, WORKER_THREADS = 2, 2
EPS_BAR = 0.95
SWEEP_TRAINERS, SWEEP_THREADS = (1, 2, 4), (1, 2, 4)
CAPS = (0.0, 5.0, 50.0)  # shadow.max_syncs_per_second; 0 = no cap
# shadow.cpu_share of the shared contenders: the paper's shadow thread is one of 25 threads (24 Hogwild
# workers) of a trainer; here a trainer's threads have about cores / trainers of the machine
PAPER_THREADS = 25
PAPER_SHARE = round(len(os.sched_getaffinity(0)) / TRAINERS / PAPER_THREADS, 4)
METRICS = ("examples_per_second", "sync_gap", "syncs_per_second", "examples_in_flight", "train_loss",
           "eval_logloss", "ne", "auc", "train_seconds", "shadow_cpu_share", "others_cpu_share")
SUMMARY_KEYS = {"examples_per_second": "examples_per_second", "sync_gap": "sync_gap",  # record: summary key
                "syncs_per_second": "syncs_per_second", "examples_in_flight": "examples_in_flight",
                "dense_syncs": "dense_syncs", "eval_logloss": "logloss", "ne": "ne", "auc": "auc",
                "train_seconds": "train_seconds", "examples_seen": "examples_seen",
                "shadow_cpu_share": "shadow_cpu_share"}


@dataclass(frozen=True)
class Contender:
    name: str
    strategy: str
    every: int | None = None  # fr-*: a foreground sync every k batches of a trainer
    cap: float = 0.0  # shadow-*: shadow.max_syncs_per_second (0: off, the default)
    share: float = 0.0  # shadow-*: shadow.cpu_share (0: off, the default)
    settings: tuple[str, ...] = ()  # any other keys (the BMUF ablation's block momentum and alpha)

    def overrides(self) -> list[str]:
        # shadow-*: a round waits for an update of the replica (the shipped config's setting), or,
        # with a CPU share, the thread loops freely at that share (the paper's loop, on its share of
        # the machine). (Only shadow-* reads these: a key a strategy does not read is an error)
        background = ([f"shadow.wait_for_update={'false' if self.share else 'true'}"]
                      if self.strategy.startswith("shadow-") else [])
        return [f"strategy={self.strategy}", *background, *([f"shadow.every={self.every}"] if self.every else []),
                *([f"shadow.max_syncs_per_second={self.cap:g}"] if self.cap else []),
                *([f"shadow.cpu_share={self.share:g}"] if self.share else []), *self.settings]


HOGWILD = Contender("hogwild", "hogwild")
SHADOW = tuple(Contender(f"shadow-{rule}", f"shadow-{rule}") for rule in ("easgd", "ma", "bmuf"))
# the shadow-* contenders with the paper's share of the CPU for their shadow thread (shadow.cpu_share)
SHADOW_SHARED = tuple(Contender(f"shadow-{rule}@share", f"shadow-{rule}", share=PAPER_SHARE)
                      for rule in ("easgd", "ma", "bmuf"))
FOREGROUND = (*(Contender(f"fr-{rule}-5", f"fr-{rule}", 5) for rule in ("easgd", "ma", "bmuf")),
              *(Contender(f"fr-easgd-{k}", "fr-easgd", k) for k in (10, 30, 100)))
CONTENDERS = (HOGWILD, *SHADOW, *SHADOW_SHARED, *FOREGROUND)
# --bmuf: BMUF's block momentum and the elastic parameter, under ShadowSync and in the foreground. The
# library's default momentum is fairseq's 0.875 (sized for its 8-GPU blocks); BMUF's paper (Chen & Huo
# 2016) sets it to 1 - 1/N for N learners: 0.5 for 2 trainers; 0 is the ShadowSync paper's Algorithm 4 as
# printed (momentum a comment); its Figure 7 runs S-BMUF with a larger alpha as well (here twice the
# default 0.9 / trainers)
ALPHA = 0.9 / TRAINERS
BMUF_MOMENTA = (0.875, round(1 - 1 / TRAINERS, 4), 0.0)
BMUF_SHADOW = (*(Contender(f"shadow-bmuf-mu{mu:g}", "shadow-bmuf", settings=(f"shadow.block_momentum={mu:g}",))
                 for mu in BMUF_MOMENTA),
               *(Contender(f"shadow-bmuf-mu{mu:g}-alpha{2 * ALPHA:g}", "shadow-bmuf",
                           settings=(f"shadow.block_momentum={mu:g}", f"shadow.alpha={2 * ALPHA:g}"))
                 for mu in BMUF_MOMENTA[:2]))
BMUF_FOREGROUND = tuple(Contender(f"fr-bmuf-5-mu{mu:g}", "fr-bmuf", 5, settings=(f"shadow.block_momentum={mu:g}",))
                        for mu in BMUF_MOMENTA[:2])
BMUF_CONTENDERS = (HOGWILD, SHADOW[0], *BMUF_SHADOW, *(c for c in FOREGROUND if c.strategy == "fr-easgd"),
                   *BMUF_FOREGROUND)
SWEEP_CONTENDERS = (SHADOW[0], FOREGROUND[0], HOGWILD)
CAPPED = SHADOW[:2]  # shadow-easgd, shadow-ma
SHARED_TEXT = f" with the paper's CPU share (shadow.cpu_share {PAPER_SHARE:g} cores)"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def base_overrides(quick: bool) -> list[str]:
    """What every run shares on top of CONFIG (the seed, strategy and scale come per run)."""
    return ["data.dataset=synthetic-ctr", f"ctr.synthetic.num_examples={NUM_EXAMPLES[quick]}", f"model.name={MODEL}",
            f"optimizer.dense_lr={DENSE_LR}", "train.epochs=1", "eval.every=1", "checkpoint.every=0",
            "progress=false", f"threads={THREADS}"]


def scale(trainers: int, threads: int) -> list[str]:
    return [f"ps.workers={trainers}", f"shadow.threads={threads}"]


# ---- one run ---------------------------------------------------------------------------------------
def run_one(contender: Contender, seed: int, overrides: list[str], gate: QuietGate,
            **labels: Any) -> dict[str, Any]:
    """Train ``contender`` once into a temporary directory; its record (``error`` if it raised)."""
    waited, load = gate.wait(), loadavg()
    config = load_config(CONFIG, [*overrides, *contender.overrides(), f"seed={seed}"])
    record: dict[str, Any] = {"contender": contender.name, "strategy": contender.strategy, "seed": seed,
                              "trainers": config.ps.workers, "worker_threads": config.shadow.threads,
                              "every": contender.every, "cap": config.shadow.max_syncs_per_second, **labels}
    result = train_measured(config, record, "cadence-shadowsync-")
    record.update(loadavg_before=load, gate=waited)
    if "error" not in record:
        record.update(measurements(result))
    say(describe(record))
    return record


def measurements(result: api.TrainResult) -> dict[str, Any]:
    """The per-run numbers from the summary and the epoch's record; keys the summary lacks are None
    and listed under ``missing``."""
    summary = result.summary
    values: dict[str, Any] = {name: summary.get(key) for name, key in SUMMARY_KEYS.items()}
    missing = [key for key in SUMMARY_KEYS.values() if key not in summary]
    epoch = [m for m in result.metrics if m.get("split") == "valid" and "loss" in m]
    values["train_loss"] = epoch[-1]["loss"] if epoch else None  # mean batch loss of the pass
    if not epoch:
        missing.append("metrics.jsonl: loss")
    return {**values, "missing": missing}


def describe(record: dict[str, Any]) -> str:
    head = (f"seed {record['seed']} {record['contender']:13s} {record['trainers']}x{record['worker_threads']}"
            + (f" cap {record['cap']:g}" if record["cap"] else ""))
    if "error" in record:
        return f"{head}: FAILED {record['error']}"
    gap = record["sync_gap"]
    return (f"{head}: {record['examples_per_second']:>8,.0f} ex/s  gap {'-' if gap is None else f'{gap:.3g}'}  "
            f"syncs/s {record['syncs_per_second']}  train loss {number(record['train_loss'])}  "
            f"eval logloss {number(record['eval_logloss'])}  ne {number(record['ne'])}  auc {number(record['auc'])}"
            f"  ({number(record['train_seconds'], 1)} s training, others used {record['others_cpu_share']:.0%} of the "
            "CPUs)")


def number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# ---- the three sections ---------------------------------------------------------------------------
def main_runs(seeds: list[int], overrides: list[str], gate: QuietGate,
              contenders: tuple[Contender, ...] = CONTENDERS) -> list[dict[str, Any]]:
    """Every contender once per seed, seed by seed; the order reversed every other seed."""
    runs = []
    for index, seed in enumerate(seeds):
        order = contenders if index % 2 == 0 else contenders[::-1]
        runs += [run_one(c, seed, [*overrides, *scale(TRAINERS, WORKER_THREADS)], gate) for c in order]
    return runs


def sweep_runs(seed: int, overrides: list[str], gate: QuietGate) -> list[dict[str, Any]]:
    return [run_one(c, seed, [*overrides, *scale(trainers, threads)], gate, section="sweep")
            for trainers in SWEEP_TRAINERS for threads in SWEEP_THREADS for c in SWEEP_CONTENDERS]


def cap_runs(seed: int, overrides: list[str], gate: QuietGate) -> list[dict[str, Any]]:
    common = [*overrides, *scale(TRAINERS, WORKER_THREADS)]
    runs = [run_one(HOGWILD, seed, common, gate, section="cap")]  # the no-sync reference beside them
    for cap in CAPS:
        runs += [run_one(c, seed, [*common, f"shadow.max_syncs_per_second={cap}"], gate, section="cap")
                 for c in CAPPED]
    return runs


# ---- statistics and bars ---------------------------------------------------------------------------
def stats(values: list[float | None]) -> dict[str, Any] | None:
    present = [v for v in values if v is not None]
    return mean_ci(present) if present else None


def by_seed(runs: list[dict[str, Any]], name: str, key: str) -> dict[int, float]:
    return {r["seed"]: r[key] for r in runs if r["contender"] == name and r.get(key) is not None}


def summarize(runs: list[dict[str, Any]], contenders: tuple[Contender, ...] = CONTENDERS) -> dict[str, dict[str, Any]]:
    """Per contender: mean and 95% interval over seeds of each metric and of the EPS ratio to hogwild
    (and that ratio's median: a seed that the shared host disturbed moves it least)."""
    hogwild = by_seed(runs, HOGWILD.name, "examples_per_second")
    table = {}
    for contender in contenders:
        mine = [r for r in runs if r["contender"] == contender.name]
        eps = by_seed(runs, contender.name, "examples_per_second")
        table[contender.name] = {
            "runs": len(mine), "failed": sum("error" in r for r in mine),
            **{metric: stats([r.get(metric) for r in mine]) for metric in METRICS},
            "eps_ratio_to_hogwild": stats(ratios := [eps[s] / hogwild[s] for s in sorted(eps) if s in hogwild]),
            "eps_ratio_to_hogwild_median": statistics.median(ratios) if ratios else None,
        }
    return table


def eps_bar(table: dict[str, dict[str, Any]], contenders=SHADOW, which: str = "") -> dict[str, Any]:
    ratios = {c.name: table[c.name]["eps_ratio_to_hogwild"] for c in contenders}
    return {"bar": f"every shadow-*{which} EPS >= {EPS_BAR} x hogwild's",
            "rule": f"per contender, the mean over seeds of its per-seed EPS / hogwild's EPS (same seed) >= {EPS_BAR}",
            "ratios": {name: r and {"mean": r["mean"], "ci95": r["ci95"],
                                    "median": table[name]["eps_ratio_to_hogwild_median"]} for name, r in ratios.items()},
            "passed": all(r is not None and r["mean"] >= EPS_BAR for r in ratios.values())}


def logloss_bar(runs: list[dict[str, Any]], table: dict[str, dict[str, Any]], name: str = "shadow-easgd") -> dict[str, Any]:
    fr_easgd = [c.name for c in FOREGROUND if c.strategy == "fr-easgd" and table[c.name]["eval_logloss"]]
    result: dict[str, Any] = {
        "bar": f"{name}'s eval logloss <= the best fr-easgd's, within the CI",
        "rule": f"best fr-easgd = the k with the lowest mean test logloss over seeds; d = {name} - best "
                "fr-easgd test logloss, paired by seed; PASS when the 95% t-interval of mean d has its lower "
                "bound <= 0 (with one seed: d <= 0)", "passed": False}
    shadow = by_seed(runs, name, "eval_logloss")
    if not fr_easgd or not shadow:
        return {**result, "note": f"no finished {name} or fr-easgd run"}
    best = min(fr_easgd, key=lambda name: table[name]["eval_logloss"]["mean"])
    other = by_seed(runs, best, "eval_logloss")
    gaps = stats([shadow[s] - other[s] for s in sorted(shadow) if s in other])
    if gaps is None:
        return {**result, "best_fr_easgd": best, "note": "no seed with both runs"}
    lower = gaps["ci95"][0] if gaps["ci95"] else gaps["mean"]
    return {**result, "best_fr_easgd": best, "shadow_minus_best": gaps, "lower_bound": lower,
            "passed": lower <= 0, "significantly_better": gaps["ci95"] is not None and gaps["ci95"][1] < 0}


def ratio_to(runs: list[dict[str, Any]], reference: dict[str, Any] | None) -> None:
    """Add each run's EPS over ``reference``'s (a hogwild run of the same section and scale)."""
    base = (reference or {}).get("examples_per_second")
    for run in runs:
        eps = run.get("examples_per_second")
        run["eps_ratio_to_hogwild"] = eps / base if eps is not None and base else None


def sweep_ratios(runs: list[dict[str, Any]]) -> None:
    for trainers in SWEEP_TRAINERS:
        for threads in SWEEP_THREADS:
            here = [r for r in runs if (r["trainers"], r["worker_threads"]) == (trainers, threads)]
            ratio_to(here, next((r for r in here if r["contender"] == HOGWILD.name), None))


# ---- output ----------------------------------------------------------------------------------------
def cell(stat: dict[str, Any] | None, digits: int = 4) -> str:
    if stat is None:
        return "-"
    half = stat["half_width"]
    return f"{stat['mean']:.{digits}f}" + (f"±{half:.{digits}f}" if half is not None else "")


def print_main(table: dict[str, dict[str, Any]], bars: dict[str, Any]) -> None:
    print(f"{'contender':15} {'EPS':>13} {'EPS/hogwild':>13} {'sync gap':>15} {'syncs/s':>15} {'ELP':>5} "
          f"{'train loss':>15} {'eval logloss':>15} {'NE':>15} {'AUC':>15} {'others CPU':>10}")
    for name, row in table.items():
        failed = f"  ({row['failed']} of {row['runs']} runs failed)" if row["failed"] else ""
        elp = "-" if row["examples_in_flight"] is None else f"{row['examples_in_flight']['mean']:.0f}"
        print(f"{name:15} {cell(row['examples_per_second'], 0):>13} {cell(row['eps_ratio_to_hogwild'], 3):>13} "
              f"{cell(row['sync_gap'], 2):>15} {cell(row['syncs_per_second'], 1):>15} {elp:>5} "
              f"{cell(row['train_loss']):>15} {cell(row['eval_logloss']):>15} {cell(row['ne']):>15} "
              f"{cell(row['auc']):>15} {number(row['others_cpu_share'] and row['others_cpu_share']['mean'], 2):>10}"
              f"{failed}")
    for eps in (bar for key, bar in bars.items() if key.startswith("a_")):
        print(f"{'PASS' if eps['passed'] else 'FAIL'} (a) {eps['bar']}: " + ", ".join(
            f"{name} {number(r and r['mean'], 3)}" for name, r in eps["ratios"].items()))
    for key, loss in bars.items():
        if not key.startswith("b_"):
            continue
        gaps = loss.get("shadow_minus_best")
        interval = gaps and gaps["ci95"] and "[" + ", ".join(f"{x:+.4f}" for x in gaps["ci95"]) + "]"
        print(f"{'PASS' if loss['passed'] else 'FAIL'} (b) {loss['bar']}: best fr-easgd {loss.get('best_fr_easgd')}, "
              f"the difference {cell(gaps)} (95% CI {interval or '-'})")


def print_runs(title: str, runs: list[dict[str, Any]]) -> None:
    print(title)
    print(f"{'contender':15} {'trainers':>8} {'threads':>7} {'cap':>4} {'EPS':>8} {'/hogwild':>8} {'sync gap':>9} "
          f"{'syncs/s':>8} {'ELP':>5} {'eval logloss':>12} {'others CPU':>10}")
    for r in runs:
        if "error" in r:
            print(f"{r['contender']:13} {r['trainers']:>8} {r['worker_threads']:>7} {r['cap']:>4g} FAILED {r['error']}")
            continue
        print(f"{r['contender']:13} {r['trainers']:>8} {r['worker_threads']:>7} {r['cap']:>4g} "
              f"{r['examples_per_second']:>8,.0f} {number(r.get('eps_ratio_to_hogwild'), 3):>8} "
              f"{number(r['sync_gap'], 3):>9} {number(r['syncs_per_second'], 1):>8} {r['examples_in_flight']:>5} "
              f"{number(r['eval_logloss']):>12} {r['others_cpu_share']:>10.0%}")


def settings(quick: bool) -> dict[str, Any]:
    common = [*base_overrides(quick), *scale(TRAINERS, WORKER_THREADS)]
    return {
        "config": str(CONFIG.relative_to(REPO)), "common_overrides": common,
        "resolved_config": load_config(CONFIG, common).to_dict(),
        "contenders": {c.name: {"overrides": c.overrides()} for c in CONTENDERS},
        "sweep": {"seed": "the first seed", "trainers": SWEEP_TRAINERS, "worker_threads": SWEEP_THREADS,
                  "contenders": [c.name for c in SWEEP_CONTENDERS]},
        "cap": {"seed": "the first seed", "max_syncs_per_second": CAPS, "contenders": [c.name for c in CAPPED],
                "reference": HOGWILD.name},
        "definitions": {
            "examples_per_second": "summary.json: training examples / training seconds (evaluation excluded)",
            "sync_gap": "summary.json: EPS / batch / syncs per second (seed 004, equation 2); null without syncs",
            "examples_in_flight": "ELP = batch x worker threads x trainers",
            "train_loss": "metrics.jsonl, the epoch's record: mean batch loss over the one pass",
            "eval_logloss_ne_auc": "test split after the pass (NE: logloss / entropy of the train split's CTR)",
            "others_cpu_share": f"share of all CPUs that other processes used during the run (> {CONTENDED}: "
                                "contended)",
        },
    }


def eps_only(report: dict[str, Any], seeds: list[int], overrides: list[str], gate: QuietGate, out_path: Path,
             started: float) -> int:
    """Bar (a) alone, over more seeds: hogwild and every shadow-*, uncapped and at the paper's share."""
    contenders = (HOGWILD, *SHADOW, *SHADOW_SHARED)
    runs = main_runs(seeds, overrides, gate, contenders)
    table = summarize(runs, contenders)
    report["main"] = {"runs": runs, "summary": table,
                      "bars": {"a_shadow_eps": eps_bar(table),
                               "a_shadow_eps_shared": eps_bar(table, SHADOW_SHARED, SHARED_TEXT)}}
    report["complete"] = True
    write_report(report, out_path, started, gate.waited_s)
    for bar in report["main"]["bars"].values():
        print(f"{'PASS' if bar['passed'] else 'FAIL'} (a) {bar['bar']}: " + ", ".join(
            f"{name} mean {number(r and r['mean'], 3)} median {number(r and r['median'], 3)}"
            for name, r in bar["ratios"].items()))
    print(f"wrote {out_path}")
    return 0


def bmuf_only(report: dict[str, Any], seeds: list[int], overrides: list[str], gate: QuietGate, out_path: Path,
              started: float) -> int:
    """BMUF's block momentum and alpha (``BMUF_CONTENDERS``): each one's eval logloss against the best
    fr-easgd, paired by seed, as bar (b)."""
    runs = main_runs(seeds, overrides, gate, BMUF_CONTENDERS)
    table = summarize(runs, BMUF_CONTENDERS)
    report["settings"]["contenders"] = {c.name: {"overrides": c.overrides()} for c in BMUF_CONTENDERS}
    report["main"] = {"runs": runs, "summary": table,
                      "bars": {f"b_{c.name}_logloss": logloss_bar(runs, table, c.name)
                               for c in (SHADOW[0], *BMUF_SHADOW, *BMUF_FOREGROUND)}}
    report["complete"] = True
    write_report(report, out_path, started, gate.waited_s)
    print_main(table, {"a_shadow_eps": eps_bar(table, (SHADOW[0], *BMUF_SHADOW)), **report["main"]["bars"]})
    print(f"wrote {out_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = peer_parser(__doc__, f"{NUM_EXAMPLES[True]:,} examples instead of {NUM_EXAMPLES[False]:,}, 1 seed", 3,
                         "total seconds to wait for other processes to go idle before runs (default 300, 0 with "
                         "--quick)")
    parser.add_argument("--eps-only", action="store_true",
                        help="bar (a) alone: hogwild and the shadow-* contenders (uncapped and at the paper's CPU "
                             "share), no sweep")
    parser.add_argument("--main-only", action="store_true",
                        help="the main comparison and its bars only (every contender, every seed): no sweep and "
                             "no cap section")
    parser.add_argument("--bmuf", action="store_true",
                        help="BMUF's block momentum (0.875, 1 - 1/trainers, 0) and a larger alpha, shadow and "
                             "foreground, against hogwild, shadow-easgd and fr-easgd-k: eval logloss over the seeds")
    args = parser.parse_args(argv)
    check(args)
    seeds, out_path, command = peer_run(args, "shadowsync", 3)
    logging.getLogger("cadence").setLevel(logging.WARNING)
    gate = QuietGate(args.max_wait if args.max_wait is not None else (0.0 if args.quick else 300.0))
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "ShadowSync vs hogwild and foreground sync on synthetic CTR (benchmarks/shadowsync.py)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": command,
        "quick": args.quick, "complete": False, "machine": machine_info(), "seeds": seeds,
        "settings": settings(args.quick)}
    # (shadow-* rounds wait for an update of the replica: ``Contender.overrides``;
    # benchmarks/shadowsync_capacity.py measures the free loop against sync servers of limited capacity)
    overrides = base_overrides(args.quick)
    run_one(HOGWILD, seeds[0], [*overrides, *scale(1, 1)], gate, section="warm-up")  # one-time costs, not kept
    if args.eps_only:
        return eps_only(report, seeds, overrides, gate, out_path, started)
    if args.bmuf:
        return bmuf_only(report, seeds, overrides, gate, out_path, started)
    runs = main_runs(seeds, overrides, gate)
    table = summarize(runs)
    report["main"] = {"runs": runs, "summary": table,
                      "bars": {"a_shadow_eps": eps_bar(table),
                               "a_shadow_eps_shared": eps_bar(table, SHADOW_SHARED, SHARED_TEXT),
                               "b_shadow_easgd_logloss": logloss_bar(runs, table),
                               **{f"b_{c.name}_logloss": logloss_bar(runs, table, c.name)
                                  for c in (*SHADOW[1:], *SHADOW_SHARED)}}}
    write_report(report, out_path, started, gate.waited_s)
    if args.main_only:
        report["complete"] = True
        write_report(report, out_path, started, gate.waited_s)
        print_main(table, report["main"]["bars"])
        print(f"wrote {out_path}")
        return 0
    report["sweep"] = sweep_runs(seeds[0], overrides, gate)
    sweep_ratios(report["sweep"])
    write_report(report, out_path, started, gate.waited_s)
    report["cap"] = cap_runs(seeds[0], overrides, gate)
    ratio_to(report["cap"], report["cap"][0])
    every = [*runs, *report["sweep"], *report["cap"]]
    report.update(complete=True, failures=[r for r in every if "error" in r],
                  missing_summary_keys=sorted({k for r in every for k in r.get("missing", [])}))
    write_report(report, out_path, started, gate.waited_s)
    print_main(table, report["main"]["bars"])
    print_runs(f"\nscaling sweep (seed {seeds[0]}): EPS / hogwild of the same trainers x threads", report["sweep"])
    print_runs(f"\ncap on syncs per second (seed {seeds[0]}, 0 = off): EPS / the hogwild run beside them",
               report["cap"])
    contended = [r for r in every if r.get("others_cpu_share", 0) > CONTENDED]
    if contended:
        print(f"\n{len(contended)} of {len(every)} runs were contended (other processes used > {CONTENDED:.0%} of "
              "the CPUs meanwhile): their EPS and ratios are unreliable")
    if report["failures"] or report["missing_summary_keys"]:
        print(f"\n{len(report['failures'])} run(s) failed; summary keys missing: {report['missing_summary_keys']}")
    print(f"wrote {out_path.relative_to(REPO) if out_path.is_relative_to(REPO) else out_path} "
          f"({report['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
