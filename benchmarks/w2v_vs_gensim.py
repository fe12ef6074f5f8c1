#!/usr/bin/env python
"""cadence's word2vec (skip-gram, negative sampling) vs gensim 4.4.0 ``Word2Vec(sg=1)``, side by side.

    .venv/bin/python benchmarks/w2v_vs_gensim.py [--quick] [--seeds N] [--max-wait S] [--out FILE]
        [--conditions quiet,busy]

Every contender trains on the same file, the registered corpus's ``corpus.txt`` in the cadence cache
(``gcide``: 5.4M tokens, one sentence per line; ``--quick``: ``enwiki-excerpt``, 1 seed, 1 epoch),
with one setting (gensim's reference run): d100, window 5, 5 negatives, 3 epochs, min_count 5,
sample 1e-3, alpha 0.025 -> 1e-4, 2 threads. For each seed, each contender runs in a fresh process:

- ``cadence``: ``configs/w2v.yaml``, what a user gets: its ``w2v.update`` is the default, ``auto``,
  which under ``sync`` is word2vec's own loop (``pair``: gensim's algorithm), in batches of 1,024
  centres; with ``--seed s --set threads=2`` through the CLI of ``.venv`` (checkpoints off, which
  changes neither the model nor the timing);
- ``cadence-pair``: ``configs/w2v-pair.yaml``, the same loop in batches of 8,192 centres;
- ``cadence-batch``: ``configs/w2v-batch.yaml``, the same setting with batch updates (every strategy);
- ``gensim``: ``benchmarks/peers/gensim_contender.py`` in ``.venv-bench-gensim``, ``--seed s --workers 2``
  (gensim with 2 workers is not deterministic even with a seed).

Conditions: ``quiet``, and ``busy``: another process spins on one core for the whole run
(``peer_stats.BusyCore``; users share machines), for ``cadence`` and ``gensim`` (the batch updates
are not rerun busy: they take minutes). Per seed, the quiet runs, then the busy ones.

Quality: WordSim353 and SimLex-999 (Spearman) and analogy accuracy, gensim's own evaluation for
gensim, cadence's summary for cadence (``cadence.evaluation.word_vectors`` computes what gensim
computes: the two agree to 1e-16 on the same vectors). Speed: *effective* words per second: tokens
that are in the vocabulary and kept by subsampling, over all epochs, per second of training alone
(gensim's own count over ``train()``; cadence's ``examples_per_second``, whose examples are exactly
the centre words kept by subsampling, over the seconds inside the epochs).

The machine is shared (2 cores): runs alternate cadence, gensim, cadence, gensim; before each run the
script waits (at most ``--max-wait`` seconds) until the 1-minute load average is below
``LOAD_THRESHOLD`` and records the load seen, and the share of the CPUs other processes used during
the run. A speed claim is the per-seed ratio cadence/gensim of runs made seconds apart, and its median.
Results: ``benchmarks/results/w2v_vs_gensim.json`` (``w2v_vs_gensim_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from provenance import check, stamp  # same folder: every result traces to a commit

from kge_throughput import loadavg, machine_info, others_busy  # same folder: the shared machine record
from peer_stats import BusyCore, OthersMeter, peer_parser, peer_run

from cadence.config import load_config
from cadence.data.corpus import CORPORA, CORPUS_FILE

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"cadence": REPO / "configs" / "w2v.yaml", "cadence-pair": REPO / "configs" / "w2v-pair.yaml",
           "cadence-batch": REPO / "configs" / "w2v-batch.yaml"}
CADENCE_CLI = REPO / ".venv" / "bin" / "cadence"
GENSIM_PYTHON = REPO / ".venv-bench-gensim" / "bin" / "python"
GENSIM_CONTENDER = REPO / "benchmarks" / "peers" / "gensim_contender.py"

THREADS = 2
LOAD_THRESHOLD = 1.5  # 1-minute load average below which a run may start
QUALITY = ("wordsim353", "simlex999", "analogy")
# configs/w2v.yaml's setting, in the contender's flags (checked against the config in main)
GENSIM_SETTING = {"dim": 100, "window": 5, "negatives": 5, "epochs": 3, "min-count": 5, "sample": 1e-3,
                  "alpha": 0.025, "min-alpha": 1e-4, "workers": THREADS}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class LoadGate:
    """Wait (at most ``max_wait`` seconds per run) for the 1-minute load average to drop below the
    threshold; report what was seen. The load average lags by about a minute, so each run also
    records the instantaneous share of the CPUs others used just before it and during it."""

    def __init__(self, max_wait: float, threshold: float = LOAD_THRESHOLD):
        self.max_wait, self.threshold = max_wait, threshold
        self.waited_s = 0.0

    def wait(self) -> dict[str, Any]:
        started = time.perf_counter()
        while os.getloadavg()[0] >= self.threshold and time.perf_counter() - started < self.max_wait:
            time.sleep(2.0)
        waited = time.perf_counter() - started
        self.waited_s += waited
        load = loadavg()
        return {"waited_s": round(waited, 1), "loadavg_1_5_15": load, "below_threshold": load[0] < self.threshold,
                "others_busy_before": others_busy(0.5)}


def check_setting() -> None:
    """gensim's flags say what each cadence config says (a drifted config would compare two settings)."""
    for path in CONFIGS.values():
        config = load_config(path)
        w2v = config.w2v
        cadence = {"dim": config.model.dim, "window": w2v.window, "negatives": w2v.negatives,
                   "epochs": config.train.epochs, "min-count": w2v.min_count, "sample": w2v.sample,
                   "alpha": config.optimizer.lr, "min-alpha": w2v.min_lr, "workers": THREADS}
        if cadence != GENSIM_SETTING or not w2v.shrink_window or config.optimizer.entity != "sgd":
            raise SystemExit(f"{path.name} no longer matches GENSIM_SETTING: {cadence} vs {GENSIM_SETTING}")


# ---- contenders ----------------------------------------------------------------------------------
def cadence_command(config: Path, seed: int | str, out: Path, dataset: str, epochs: int) -> list[str]:
    command = [str(CADENCE_CLI), "train", "--config", str(config), "--set", f"seed={seed}",
               "--set", f"threads={THREADS}", "--set", "checkpoint.every=0", "--no-progress",
               "--out", str(out), "--overwrite"]
    if dataset != "gcide":
        command += ["--set", f"data.dataset={dataset}"]
    if epochs != GENSIM_SETTING["epochs"]:
        command += ["--epochs", str(epochs)]
    return command


def run_cadence(config: Path, seed: int, out: Path, dataset: str, epochs: int) -> dict[str, Any]:
    subprocess.run(cadence_command(config, seed, out, dataset, epochs), check=True, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    return {**{k: summary[k] for k in QUALITY},
            "wordsim353_pairs": summary["wordsim353_pairs"], "simlex999_pairs": summary["simlex999_pairs"],
            "analogy_questions": summary["analogy_questions"],
            "effective_words": summary["examples_seen"], "train_seconds": summary["train_seconds"],
            "words_per_second": summary["examples_per_second"], "epochs": summary["epochs"]}


def gensim_command(seed: int | str, corpus: Path, epochs: int) -> list[str]:
    flags = [f"--{k}={v}" for k, v in {**GENSIM_SETTING, "epochs": epochs}.items()]
    return [str(GENSIM_PYTHON), str(GENSIM_CONTENDER), "--corpus", str(corpus), "--seed", str(seed), *flags]


def run_gensim(seed: int, corpus: Path, epochs: int) -> dict[str, Any]:
    done = subprocess.run(gensim_command(seed, corpus, epochs), check=True, capture_output=True, text=True)
    result = json.loads(done.stdout)
    return {**{k: result[k] for k in QUALITY},
            "wordsim353_oov_percent": result["wordsim353_oov_percent"],
            "simlex999_oov_percent": result["simlex999_oov_percent"], "analogy_questions": result["analogy_questions"],
            "effective_words": result["effective_words"], "train_seconds": result["train_seconds"],
            "words_per_second": result["words_per_second"], "epochs": result["settings"]["epochs"],
            "vocabulary": result["vocabulary"], "raw_words_per_second": result["raw_words_per_second"],
            "versions": result["versions"]}


# ---- driver --------------------------------------------------------------------------------------
def run_seed(seed: int, contenders: dict[str, Callable[[int], dict[str, Any]]], gate: LoadGate,
             condition: str = "quiet") -> dict[str, Any]:
    record: dict[str, Any] = {"seed": seed, "condition": condition, "order": list(contenders), "contenders": {}}
    for name, contender in contenders.items():
        seen = gate.wait()
        with OthersMeter() as meter:
            if condition == "busy":
                with BusyCore():
                    result = contender(seed)
            else:
                result = contender(seed)
        result.update(load=seen, loadavg_after=loadavg(), others_cpu_share_during=round(meter.share, 3))
        record["contenders"][name] = result
        say(f"seed {seed} {condition} {name:13s}: wordsim353 {result['wordsim353']:.4f}  "
            f"simlex999 {result['simlex999']:.4f}  analogy {result['analogy']:.4f}  "
            f"{result['words_per_second']:,.0f} effective words/s ({result['train_seconds']:.1f} s; load "
            f"{seen['loadavg_1_5_15'][0]:.2f} before, others used {meter.share:.0%} of the CPUs during)")
    speeds = {name: result["words_per_second"] for name, result in record["contenders"].items()}
    for name in speeds:
        if name != "gensim":
            record[ratio_key(name)] = speeds[name] / speeds["gensim"]
    return record


def ratio_key(name: str) -> str:
    return f"speed_ratio_{name.replace('-', '_')}_over_gensim"


def summarize(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    names = list(per_seed[0]["contenders"])
    for name in names:
        runs = [seed["contenders"][name] for seed in per_seed]
        table[name] = {metric: {"mean": statistics.fmean(r[metric] for r in runs),
                                "per_seed": [r[metric] for r in runs]}
                       for metric in (*QUALITY, "words_per_second", "train_seconds", "effective_words")}
        table[name]["words_per_second"]["median"] = statistics.median(r["words_per_second"] for r in runs)
    for name in names:
        if name == "gensim":
            continue
        ratios = [seed[ratio_key(name)] for seed in per_seed]
        table[ratio_key(name)] = {"per_seed": ratios, "median": statistics.median(ratios)}
        table[f"quality_{name.replace('-', '_')}_minus_gensim"] = {
            metric: table[name][metric]["mean"] - table["gensim"][metric]["mean"] for metric in QUALITY}
    return table


def print_table(summary: dict[str, Any], condition: str = "quiet") -> None:
    names = [name for name in summary if not name.startswith(("speed_ratio", "quality_", "busy"))]
    say(f"{condition:13s} {'wordsim353':>10s} {'simlex999':>10s} {'analogy':>8s} {'eff. words/s':>13s}  "
        "(means; speed: median)")
    for name in names:
        row = summary[name]
        say(f"{name:13s} {row['wordsim353']['mean']:10.4f} {row['simlex999']['mean']:10.4f} "
            f"{row['analogy']['mean']:8.4f} {row['words_per_second']['median']:13,.0f}")
    for name in names:
        if name != "gensim":
            ratio = summary[ratio_key(name)]
            say(f"speed ratio {name}/gensim ({condition}): median {ratio['median']:.3f}, per seed "
                f"{[round(r, 3) for r in ratio['per_seed']]}")
    if "busy" in summary:
        print_table(summary["busy"], "busy")


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = peer_parser(__doc__, "enwiki-excerpt, 1 seed, 1 epoch", 2, "seconds to wait, before each run, for the "
                         "load average to drop (default 120)", max_wait=120.0)
    parser.add_argument("--conditions", default="quiet,busy", help="comma-separated: quiet, busy")
    parser.add_argument("--contenders", default=None,
                        help=f"comma-separated cadence contenders beside gensim (default all: {', '.join(CONFIGS)})")
    args = parser.parse_args(argv)
    conditions = args.conditions.split(",")
    if not conditions or set(conditions) - {"quiet", "busy"}:
        raise SystemExit("w2v_vs_gensim.py: --conditions takes quiet, busy")
    check(args)
    seeds, out_path, command = peer_run(args, "w2v_vs_gensim", 2)
    dataset, epochs = ("enwiki-excerpt", 1) if args.quick else ("gcide", GENSIM_SETTING["epochs"])
    if not GENSIM_PYTHON.exists():
        raise SystemExit(f"{GENSIM_PYTHON} is missing: see benchmarks/peers/gensim_contender.py")
    check_setting()
    chosen = [name.strip() for name in args.contenders.split(",")] if args.contenders else list(CONFIGS)
    if set(chosen) - set(CONFIGS) or "cadence" not in chosen:
        raise SystemExit(f"w2v_vs_gensim.py: --contenders takes cadence and any of {', '.join(CONFIGS)}")
    corpus = CORPORA.get(dataset).fetch() / CORPUS_FILE
    gate = LoadGate(args.max_wait)
    started_all = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "cadence w2v (skip-gram, negative sampling) vs gensim 4.4.0 Word2Vec(sg=1) "
                     "(benchmarks/w2v_vs_gensim.py)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": command,
        "quick": args.quick, "machine": machine_info(), "seeds": seeds, "conditions": conditions,
        "corpus": {"dataset": dataset, "file": str(corpus).replace(str(Path.home()), "~"),
                   "sha256": file_sha256(corpus), "bytes": corpus.stat().st_size},
        "settings": {
            "shared": {**GENSIM_SETTING, "epochs": epochs, "threads": THREADS},
            **{name: " ".join(shlex.quote(a) for a in cadence_command(config, "SEED", Path("RUN_DIR"), dataset, epochs))
               .replace(str(REPO) + "/", "") for name, config in CONFIGS.items() if name in chosen},
            "gensim": " ".join(shlex.quote(a) for a in gensim_command("SEED", corpus, epochs))
                         .replace(str(REPO) + "/", "").replace(str(Path.home()), "~"),
            "speed": "effective words/s: in-vocabulary tokens kept by subsampling, over all epochs, per second of "
                     "training alone (gensim: its own count over train(); cadence: examples_per_second, the centre "
                     "words kept by subsampling over the seconds inside the epochs)",
            "quality": "gensim: its own evaluate_word_pairs / evaluate_word_analogies; cadence: its summary "
                       "(cadence.evaluation.word_vectors, the same computation)",
            "gate": f"before each run, wait up to {args.max_wait:g} s for the 1-minute load average < {LOAD_THRESHOLD}",
            "busy": "another process spinning on one core for the whole run (cadence and gensim only)",
        },
    }
    say(f"corpus {corpus} ({dataset}), seeds {seeds}, {epochs} epoch(s)")
    with tempfile.TemporaryDirectory(prefix="cadence-w2v-bench-") as scratch:
        work = Path(scratch)
        contenders = {name: (lambda seed, name=name, config=config:
                             run_cadence(config, seed, work / f"{name}-{seed}", dataset, epochs))
                      for name, config in CONFIGS.items() if name in chosen}
        contenders["gensim"] = lambda seed: run_gensim(seed, corpus, epochs)
        busy_contenders = {name: contenders[name] for name in ("cadence", "gensim")}
        per_seed, busy = [], []
        for seed in seeds:
            if "quiet" in conditions:
                per_seed.append(run_seed(seed, contenders, gate))
            if "busy" in conditions:
                busy.append(run_seed(seed, busy_contenders, gate, "busy"))
        per_seed = per_seed or busy
    report["versions"] = {"gensim": per_seed[0]["contenders"]["gensim"]["versions"],
                          "cadence": report["machine"].get("cadence_version"),
                          "torch": report["machine"].get("torch_version")}
    report["summary"] = summarize(per_seed)
    report["per_seed"] = per_seed
    if busy and per_seed is not busy:
        report["summary"]["busy"] = summarize(busy)
        report["per_seed_busy"] = busy
    report["wall_seconds"] = round(time.perf_counter() - started_all, 1)
    report["waited_for_load_seconds"] = round(gate.waited_s, 1)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(stamp(report), indent=2) + "\n")
    say(f"wrote {out_path}")
    print_table(report["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
