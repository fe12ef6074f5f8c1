#!/usr/bin/env python
"""Growing a trained model onto changed data (``train.init_from``, docs/grow.md) against training the
new data from scratch: time to 99% of the scratch run's best metric, and final quality, per task.

    .venv/bin/python benchmarks/grow.py [--tasks kge,mf,w2v,ctr] [--reps N] [--frozen] [--quick]
        [--seed S] [--vary-seed] [--work DIR] [--keep] [--out FILE] [--dirty]

Per task, the *partial* data hides part of the *full* data, and these contenders run (each a fresh
process, ``cadence.api.train`` on the task's shipped config plus the overrides recorded per run):

- ``old``: the partial data, from scratch;
- ``grown``: the full data, ``train.init_from=<this rep's old run>`` (every id both know keeps its
  trained row and optimizer state, new ids start from their seeded initial rows);
- ``scratch``: the full data, from scratch;
- ``grown-frozen`` (with ``--frozen``): as ``grown``, with ``train.freeze=known`` (only new rows train);
- ``cold`` (CTR only): grown's schedule (periods k-1.. of the full file) from scratch: what the old
  model is worth. (CTR's old run trains exactly scratch's first periods, with the same seed, so grown
  continues scratch's own run: their next-period AUCs are expected equal, bit for bit, and the result
  says whether they were; the cold run is the informative comparison of quality there.)

Contenders are interleaved: every rep runs each once, in an order rotated from rep to rep among the
orders that put ``old`` before the runs that start from it.

The data (``HIDDEN_FRACTION`` = 15% hidden; the counts are printed and recorded under ``data``):

- ``kge``: UMLS (``configs/umls-complex.yaml``, ``data.dataset=umls``); partial: a graph directory
  written from UMLS's own train/valid/test files with a seeded 15% of its entities hidden: every
  triple touching one is removed from all three splits. The partial splits are subsets of the full
  ones (the old run never trains on a full valid/test triple; its early stopping reads a subset of
  the full valid split, as the full runs' does).
- ``mf``: MovieLens-100k (``configs/ml100k-mf.yaml``); partial: a ratings file (raw ids, timestamps)
  of the full run's *training split* alone (``random_split(seed)``), less the ratings of a seeded 15%
  of the users. The old run splits that file 80/10/10 again: its train, valid and test are all inside
  the full train split (checked), so no rating of the full valid or test split reaches it.
- ``w2v``: enwiki-excerpt (``configs/w2v.yaml`` with ``data.dataset=enwiki-excerpt``; the registered
  corpus is read from its ``corpus.txt`` exactly as a text file is: ``read_text_corpus``, lowercase,
  whitespace split); partial: a text file of the first half of those lines (checked to be their
  exact prefix, so both runs see identical tokens in the first half). Metric: WordSim353 (the
  task's primary; valid and test are the same word-similarity sets, nothing of them is trained on).
- ``ctr``: a seeded Criteo-format file (``write_ctr``: ``CTR_PERIODS`` periods of
  ``CTR_LINES_PER_PERIOD`` lines, a planted additive + pairwise signal in 4 fields whose vocabularies
  grow: each period brings new values, drawn often in that period and the next), with ``ctr.split:
  periods`` (train on period d, evaluate on d + 1). ``old``: the first ``CTR_OLD_PERIODS`` periods'
  lines with ``ctr.num_periods=CTR_OLD_PERIODS`` (period boundaries coincide: every period has the
  same number of lines); it trains periods 0..k-2 and evaluates 1..k-1. ``grown``: the full file from
  ``ctr.first_period=k-1`` (the first period old did not train). ``scratch``: the full file from
  period 0. Compared on the next-period AUC of the periods both evaluate (k..P-1); no later period's
  line reaches the old run. Model: ``configs/ml100k-deepfm.yaml`` on the pipeline (``ps.workers=1``),
  ``model.dim=8``, ``ctr.hidden=[32,16]``, ``ctr.dropout=0``.

Measured per run, from metrics.jsonl (``wall_seconds``: training wall time so far, evaluation and
checkpoints excluded) and summary.json: the valid curve; scratch's best valid metric (CTR: best
next-period AUC over the common periods); the training seconds until the metric first reaches 99% of
this rep's scratch best (MF's RMSE is lower-is-better: "99%" means rmse <= best / 0.99, within 1%);
for ``grown`` also that time plus the old run's training seconds; the final test metrics (CTR: the
mean next-period AUC over the common periods); epochs; ``os.getloadavg()`` before and after each run
and the share of the CPUs other processes took meanwhile. The resolution of a time to target is one
evaluation (every epoch; CTR: every period): a grown model already at target before training is
counted at its first evaluation. Summary: medians over reps. Writes ``benchmarks/results/grow.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from peer_stats import OthersMeter
from provenance import add_flag, check, stamp

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CONFIGS = REPO / "configs"
TASK_NAMES = ("kge", "mf", "w2v", "ctr")
HIDDEN_FRACTION = 0.15  # of the entities (kge), users (mf); w2v hides the second half, ctr the last periods
TARGET = 0.99  # time to 99% of scratch's best valid metric

# Epochs: each task's full measurement (2 reps x 3 contenders, each a fresh process) in about 1-5
# minutes on a quiet 2-core machine, and long enough that scratch's curve flattens, so "99% of its
# best" is a point on the curve and not its last epoch.
KGE_EPOCHS = 40  # the shipped config's (UMLS ComplEx-256: a fraction of a second an epoch, the umls part of
#                  results/pipeline_throughput.json; its patience of 5 validations stops most runs earlier)
MF_EPOCHS = 40  # the shipped config's (ml-100k: ~0.03 s an epoch at ~2.7M ratings/s, results/mf_vs_surprise.json)
W2V_EPOCHS = 5  # the shipped 3 are GCIDE's (5.4M tokens); enwiki-excerpt is 12x smaller and its WordSim353 still
#                 climbs after 3: 5 epochs of ~5 s (~65k words/s, results/w2v_vs_gensim.json) per full run
CTR_EPOCHS_PER_PERIOD = 2  # GBA's continual protocol (2 epochs per period, as the switch part of ps_training.py)
QUICK_EPOCHS = {"kge": 2, "mf": 2, "w2v": 1, "ctr": 1}  # --quick: a smoke run, numbers meaningless

# the CTR data (write_ctr)
CTR_PERIODS = 20
CTR_OLD_PERIODS = 17  # the old run sees the first 17 of 20 periods: 15% of the lines hidden
CTR_LINES_PER_PERIOD = 5000  # 100k lines: a few seconds of DeepFM training per full run
CTR_QUICK_LINES_PER_PERIOD = 400
CTR_SIGNAL_FIELDS = 4  # C1..C4 carry the planted signal; their vocabularies grow
CTR_NOISE_FIELDS = 8  # C5..C12: uniform noise over fixed vocabularies; C13..C26 empty
CTR_BASE_VALUES = 150  # values of a signal field in period 0
CTR_NEW_VALUES = 40  # values each later period adds to each signal field
CTR_RECENT_SHARE = 0.4  # share of a signal field's draws from the values of this and the last period
CTR_COMMON = ["ps.workers=1", "model.name=deepfm", "model.dim=8", "ctr.hidden=[32,16]", "ctr.dropout=0",
              "ctr.split=periods"]

# what the table prints of each task's data (all of it is in the result file)
HIDDEN_KEYS = {
    "kge": ("hidden_fraction", "entities", "entities_hidden", "triples_hidden_share"),
    "mf": ("hidden_fraction", "users", "users_hidden", "ratings_full", "ratings_partial"),
    "w2v": ("hidden_fraction", "sentences", "sentences_partial", "tokens", "tokens_partial", "vocabulary",
            "vocabulary_partial", "words_new_in_full"),
    "ctr": ("hidden_fraction", "periods", "periods_old", "lines", "lines_partial", "signal_field_values",
            "signal_field_values_old"),
}

CHILD = r"""
import json, sys, time
from cadence import api, load_config
path, out, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
config = load_config(path, overrides)
config.out = out
config.progress = False
started = time.perf_counter()
result = api.train(config)
print("GROW-SUMMARY " + json.dumps({**result.summary, "process_train_call_seconds": time.perf_counter() - started}))
"""


def say(message: str = "") -> None:
    print(message, file=sys.stderr, flush=True)


# ---- the data ---------------------------------------------------------------------------------------
def cadence_imports():
    sys.path.insert(0, str(REPO / "src"))
    import cadence  # noqa: F401

    if not Path(cadence.__file__).resolve().is_relative_to(REPO / "src"):
        raise SystemExit(f"grow.py: cadence imported from {cadence.__file__}, not {REPO / 'src'}")


def choose(names: list[str], fraction: float, seed: int, salt: str) -> set[str]:
    """A seeded ``fraction`` of ``names`` (sorted first: the choice does not depend on their order)."""
    ordered = sorted(names)
    return set(random.Random(f"{salt}-{seed}").sample(ordered, round(fraction * len(ordered))))


def prepare_kge(work: Path, seed: int, epochs: int) -> dict[str, Any]:
    from cadence.data.datasets import DATASETS

    source = DATASETS.get("umls").fetch()
    splits = {s: [line.split("\t") for line in (source / f"{s}.txt").read_text(encoding="utf-8").splitlines()
                  if line.strip()] for s in ("train", "valid", "test")}
    entities = sorted({t[0].strip() for rows in splits.values() for t in rows} |
                      {t[2].strip() for rows in splits.values() for t in rows})
    hidden = choose(entities, HIDDEN_FRACTION, seed, "kge")
    target = work / f"umls-partial-{seed}"
    target.mkdir(parents=True, exist_ok=True)
    kept: dict[str, list[list[str]]] = {}
    for split, rows in splits.items():
        kept[split] = [t for t in rows if t[0].strip() not in hidden and t[2].strip() not in hidden]
        (target / f"{split}.txt").write_text("".join("\t".join(t) + "\n" for t in kept[split]), encoding="utf-8")
    partial_train = {t[0].strip() for t in kept["train"]} | {t[2].strip() for t in kept["train"]}
    common = ["train.epochs=%d" % epochs, "eval.every=1", "checkpoint.every=100000", f"seed={seed}"]
    return {
        "config": str(CONFIGS / "umls-complex.yaml"), "higher_is_better": True, "metric": "mrr", "split": "valid",
        "test_metrics": ["mrr", "hits@1", "hits@10"],
        "old": [f"data.dataset={target}", *common], "full": ["data.dataset=umls", *common],
        "data": {"source": str(source), "partial": str(target), "hidden_fraction": HIDDEN_FRACTION,
                 "entities": len(entities), "entities_hidden": len(hidden),
                 "entities_in_partial_train": len(partial_train), "hidden_entities": sorted(hidden),
                 "triples_full": {s: len(r) for s, r in splits.items()}, "triples_partial": {s: len(r) for s, r in kept.items()},
                 "triples_hidden_share": 1 - sum(map(len, kept.values())) / sum(map(len, splits.values()))},
    }


def prepare_mf(work: Path, seed: int, epochs: int) -> dict[str, Any]:
    from cadence import api, load_config
    from cadence.tasks import TASKS

    config_path = CONFIGS / "ml100k-mf.yaml"
    common = ["train.epochs=%d" % epochs, "eval.every=1", "checkpoint.every=100000", f"seed={seed}"]
    full = ["data.dataset=ml-100k", *common]
    config = api.prepare_config(load_config(config_path, full))
    task = TASKS.get("mf")(config)
    data, train = task.dataset, task.splits["train"]
    hidden = choose(list(data.user_ids), HIDDEN_FRACTION, seed, "mf")
    hidden_index = {i for i, name in enumerate(data.user_ids) if name in hidden}
    users, items = train.users.tolist(), train.items.tolist()
    values, stamps = train.values.tolist(), train.timestamps.tolist()
    lines = [f"{data.user_ids[u]}\t{data.item_ids[i]}\t{v:g}\t{t}\n"
             for u, i, v, t in zip(users, items, values, stamps) if u not in hidden_index]
    path = work / f"ml100k-partial-{seed}.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    # the old run's own split: all of it inside the full train split, none in the full valid or test
    old_config = api.prepare_config(load_config(config_path, [f"data.dataset={path}", *common]))
    old_task = TASKS.get("mf")(old_config)

    def cells(dataset, ratings) -> set[tuple[str, str]]:
        return {(dataset.user_ids[u], dataset.item_ids[i]) for u, i in zip(ratings.users.tolist(), ratings.items.tolist())}

    full_train = cells(data, train)
    full_held = cells(data, task.splits["valid"]) | cells(data, task.splits["test"])
    old_cells = {split: cells(old_task.dataset, part) for split, part in old_task.splits.items()}
    inside = all(c <= full_train for c in old_cells.values())
    leaked = sum(len(c & full_held) for c in old_cells.values())
    if not inside or leaked:
        raise SystemExit(f"grow.py: mf: the partial file's splits are not inside the full train split ({leaked} leaked)")
    return {
        "config": str(config_path), "higher_is_better": False, "metric": "rmse", "split": "valid",
        "test_metrics": ["rmse", "mae"], "old": [f"data.dataset={path}", *common], "full": full,
        "data": {"partial": str(path), "hidden_fraction": HIDDEN_FRACTION, "users": data.num_users,
                 "users_hidden": len(hidden), "items": data.num_items, "items_in_partial": old_task.dataset.num_items,
                 "ratings_full": len(data.ratings), "full_split": {s: len(p) for s, p in task.splits.items()},
                 "ratings_partial": len(lines), "partial_split": {s: len(p) for s, p in old_task.splits.items()},
                 "partial_inside_full_train": inside, "partial_ratings_in_full_valid_or_test": leaked},
    }


def prepare_w2v(work: Path, seed: int, epochs: int) -> dict[str, Any]:
    from cadence import load_config
    from cadence.data.corpus import CORPORA, CORPUS_FILE, read_text_corpus

    config_path = CONFIGS / "w2v.yaml"
    min_count = load_config(config_path).w2v.min_count
    source = CORPORA.get("enwiki-excerpt").fetch() / CORPUS_FILE
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.split()]
    half = len(lines) // 2
    path = work / "enwiki-excerpt-first-half.txt"
    path.write_text("".join(line + "\n" for line in lines[:half]), encoding="utf-8")
    full, partial = read_text_corpus(source, min_count), read_text_corpus(path, min_count)
    # identical tokens: the partial corpus's raw tokens are the full corpus's first ones
    first = sum(len(line.lower().split()) for line in lines[:half])
    if partial.total_words != first:
        raise SystemExit("grow.py: w2v: the first half's tokens differ from the full corpus's")
    common = ["train.epochs=%d" % epochs, "eval.every=1", "checkpoint.every=100000", f"seed={seed}"]
    return {
        "config": str(config_path), "higher_is_better": True, "metric": "wordsim353", "split": "valid",
        "test_metrics": ["wordsim353", "simlex999", "analogy"],
        "old": [f"data.dataset={path}", *common], "full": ["data.dataset=enwiki-excerpt", *common],
        "data": {"source": str(source), "partial": str(path), "hidden_fraction": 1 - half / len(lines),
                 "sentences": len(lines), "sentences_partial": half, "tokens": full.total_words,
                 "tokens_partial": partial.total_words, "tokens_hidden_share": 1 - partial.total_words / full.total_words,
                 "vocabulary": len(full.words), "vocabulary_partial": len(partial.words),
                 "words_new_in_full": len(set(full.words) - set(partial.words)),
                 "words_dropped_from_partial": len(set(partial.words) - set(full.words))},
    }


def write_ctr(path: Path, periods: int, per_period: int, seed: int) -> dict[str, Any]:
    """A Criteo-format TSV file, time-ordered: ``periods`` blocks of ``per_period`` lines. The label
    is Bernoulli(sigmoid(logit)) with logit = the sum of planted weights of the values of fields
    C1..C4 + <z(C1), z(C2)> (a pairwise term an FM learns) + a little of I1, centred; each period
    adds ``CTR_NEW_VALUES`` values to each of C1..C4, drawn often in their first two periods."""
    import numpy as np

    rng = np.random.default_rng(seed)
    most = CTR_BASE_VALUES + CTR_NEW_VALUES * (periods - 1)
    weight = rng.normal(0.0, 0.8, size=(CTR_SIGNAL_FIELDS, most))
    latent = rng.normal(0.0, 0.7, size=(2, most, 2))
    noise_vocab = 60
    lines, seen_by_period, labels = [], [], []
    for period in range(periods):
        known = CTR_BASE_VALUES + CTR_NEW_VALUES * period
        recent_low = max(0, known - 2 * CTR_NEW_VALUES) if period else 0
        recent = rng.random((per_period, CTR_SIGNAL_FIELDS)) < CTR_RECENT_SHARE
        values = np.where(recent, rng.integers(recent_low, known, (per_period, CTR_SIGNAL_FIELDS)),
                          rng.integers(0, known, (per_period, CTR_SIGNAL_FIELDS)))
        ints = rng.poisson(3.0, (per_period, 13))
        logit = (weight[np.arange(CTR_SIGNAL_FIELDS), values].sum(1)
                 + (latent[0, values[:, 0]] * latent[1, values[:, 1]]).sum(1) + 0.15 * (ints[:, 0] - 3) - 0.8)
        label = (rng.random(per_period) < 1 / (1 + np.exp(-logit))).astype(int)
        noise = rng.integers(0, noise_vocab, (per_period, CTR_NOISE_FIELDS))
        empty = ["" for _ in range(26 - CTR_SIGNAL_FIELDS - CTR_NOISE_FIELDS)]
        for row in range(per_period):
            cats = ([f"{(f << 24) | v:08x}" for f, v in enumerate(values[row].tolist())]
                    + [f"{((CTR_SIGNAL_FIELDS + f) << 24) | v:08x}" for f, v in enumerate(noise[row].tolist())] + empty)
            lines.append("\t".join([str(label[row]), *map(str, ints[row].tolist()), *cats]) + "\n")
        seen_by_period.append(known)
        labels.append(float(label.mean()))
    path.write_text("".join(lines), encoding="utf-8")
    return {"values_per_signal_field_by_period": seen_by_period, "click_rate_by_period": labels}


def prepare_ctr(work: Path, seed: int, epochs: int, quick: bool) -> dict[str, Any]:
    per_period = CTR_QUICK_LINES_PER_PERIOD if quick else CTR_LINES_PER_PERIOD
    full = work / f"ctr-{seed}.tsv"
    made = write_ctr(full, CTR_PERIODS, per_period, seed)
    lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
    old_lines = CTR_OLD_PERIODS * per_period
    partial = work / f"ctr-{seed}-first-{CTR_OLD_PERIODS}-periods.tsv"
    partial.write_text("".join(lines[:old_lines]), encoding="utf-8")
    common = [*CTR_COMMON, f"train.epochs={epochs}", "checkpoint.every=100000", f"seed={seed}"]
    known_old = made["values_per_signal_field_by_period"][CTR_OLD_PERIODS - 1]
    return {
        "config": str(CONFIGS / "ml100k-deepfm.yaml"), "higher_is_better": True, "metric": "auc",
        "split": "next_period", "test_metrics": [],
        # old trains periods 0..k-2 (evaluating 1..k-1); grown k-1..P-2 (evaluating k..P-1)
        "old": [f"data.dataset={partial}", f"ctr.num_periods={CTR_OLD_PERIODS}", *common],
        "grown": [f"data.dataset={full}", f"ctr.num_periods={CTR_PERIODS}", f"ctr.first_period={CTR_OLD_PERIODS - 1}",
                  *common],
        "full": [f"data.dataset={full}", f"ctr.num_periods={CTR_PERIODS}", *common],
        "common_from_period": CTR_OLD_PERIODS - 1,  # records with period >= this evaluate periods both see
        "data": {"full": str(full), "partial": str(partial), "periods": CTR_PERIODS, "periods_old": CTR_OLD_PERIODS,
                 "lines": len(lines), "lines_per_period": per_period, "lines_partial": old_lines,
                 "hidden_fraction": 1 - old_lines / len(lines),
                 "signal_field_values": made["values_per_signal_field_by_period"][-1] * CTR_SIGNAL_FIELDS,
                 "signal_field_values_old": known_old * CTR_SIGNAL_FIELDS,
                 "click_rate_by_period": [round(x, 3) for x in made["click_rate_by_period"]],
                 "compared_periods": list(range(CTR_OLD_PERIODS, CTR_PERIODS))},
    }


def prepare(task: str, work: Path, seed: int, quick: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    epochs = QUICK_EPOCHS[task] if quick else {"kge": KGE_EPOCHS, "mf": MF_EPOCHS, "w2v": W2V_EPOCHS,
                                               "ctr": CTR_EPOCHS_PER_PERIOD}[task]
    if task == "ctr":
        spec = prepare_ctr(work, seed, epochs, quick)
    else:
        spec = {"kge": prepare_kge, "mf": prepare_mf, "w2v": prepare_w2v}[task](work, seed, epochs)
    spec["epochs"] = epochs
    return spec


# ---- a run ------------------------------------------------------------------------------------------
def overrides_of(spec: dict[str, Any], contender: str, old_run: Path | None) -> list[str]:
    if contender == "old":
        return list(spec["old"])
    if contender == "scratch":
        return list(spec["full"])
    if contender == "cold":
        return list(spec["grown"])
    base = list(spec.get("grown", spec["full"]))
    grown = [*base, f"train.init_from={old_run}"]
    return [*grown, "train.freeze=known"] if contender == "grown-frozen" else grown


def run_one(spec: dict[str, Any], contender: str, out: Path, old_run: Path | None) -> dict[str, Any]:
    overrides = overrides_of(spec, contender, old_run)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    load_before = os.getloadavg()
    started = time.perf_counter()
    with OthersMeter() as meter:
        done = subprocess.run([sys.executable, "-c", CHILD, spec["config"], str(out), json.dumps(overrides)],
                              capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    load_after = os.getloadavg()
    if done.returncode != 0:
        raise SystemExit(f"grow.py: {contender} failed ({spec['config']} {' '.join(overrides)}):\n{done.stderr[-3000:]}")
    summary = json.loads(next(line for line in reversed(done.stdout.splitlines())
                              if line.startswith("GROW-SUMMARY "))[len("GROW-SUMMARY "):])
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"contender": contender, "run_dir": str(out), "overrides": overrides, "summary": summary,
            "history": history, "process_wall_seconds": round(wall, 2), "loadavg_before": list(load_before),
            "loadavg_after": list(load_after), "others_cpu_share": round(meter.share, 3)}


def curve(spec: dict[str, Any], run: dict[str, Any], common_only: bool = False) -> list[tuple[float, float]]:
    """(training seconds so far, metric) of each validation, in order (CTR: optionally only the
    evaluations of periods both full-data contenders evaluate)."""
    points = []
    for record in run["history"]:
        if record.get("split") != spec["split"] or record.get(spec["metric"]) is None:
            continue
        if common_only and "common_from_period" in spec and record.get("period", -1) < spec["common_from_period"]:
            continue
        points.append((record["wall_seconds"], record[spec["metric"]]))
    return points


def best(spec: dict[str, Any], points: list[tuple[float, float]]) -> float | None:
    values = [v for _, v in points]
    return (max(values) if spec["higher_is_better"] else min(values)) if values else None


def target_of(spec: dict[str, Any], scratch_best: float) -> float:
    return scratch_best * TARGET if spec["higher_is_better"] else scratch_best / TARGET


def seconds_to(spec: dict[str, Any], points: list[tuple[float, float]], target: float) -> float | None:
    for seconds, value in points:
        if (value >= target) if spec["higher_is_better"] else (value <= target):
            return seconds
    return None


def measure_rep(spec: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The rep's numbers: scratch's best, the target, and per full-data contender its time to target."""
    scratch_points = curve(spec, runs["scratch"], common_only=True)
    scratch_best = best(spec, scratch_points)
    target = target_of(spec, scratch_best)
    old_seconds = runs["old"]["summary"]["train_seconds"]
    out: dict[str, Any] = {"scratch_best": scratch_best, "target": target}
    for name, run in runs.items():
        points = curve(spec, run, common_only=name != "old")
        row = {"best_valid": best(spec, points), "train_seconds": run["summary"]["train_seconds"],
               "epochs": run["summary"]["epochs"], "test": final_quality(spec, run),
               "loadavg_before": run["loadavg_before"][0], "loadavg_after": run["loadavg_after"][0],
               "others_cpu_share": run["others_cpu_share"]}
        if name != "old":
            reached = seconds_to(spec, points, target)
            row["seconds_to_target"] = reached
            if name.startswith("grown"):
                row["seconds_to_target_with_old"] = None if reached is None else reached + old_seconds
                row["init_from"] = run["summary"].get("init_from")
        out[name] = row
    if "common_from_period" in spec:  # CTR: the old run's periods are scratch's first ones, seeded alike
        out["grown_equals_scratch"] = ([v for _, v in curve(spec, runs["grown"], True)] ==
                                       [v for _, v in curve(spec, runs["scratch"], True)])
    return out


def final_quality(spec: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    summary = run["summary"]
    if spec["metric"] == "auc" and "common_from_period" in spec:  # CTR periods: no test split
        aucs = [v for _, v in curve(spec, run, common_only=True)] if run["contender"] != "old" else \
            [v for _, v in curve(spec, run)]
        return {"mean_next_period_auc": statistics.fmean(aucs) if aucs else None, "next_period_auc": aucs}
    return {k: summary.get(k) for k in spec["test_metrics"]}


# ---- the summary ------------------------------------------------------------------------------------
def median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(spec: dict[str, Any], reps: list[dict[str, Any]], contenders: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"scratch_best": median([r["scratch_best"] for r in reps]),
                           "target": median([r["target"] for r in reps]),
                           "target_rule": (f"valid {spec['metric']} >= {TARGET} x scratch's best" if spec["higher_is_better"]
                                           else f"valid {spec['metric']} <= scratch's best / {TARGET} (lower is better: within 1%)")}
    if "common_from_period" in spec:
        out["grown_equals_scratch"] = sum(r["grown_equals_scratch"] for r in reps)
    for name in contenders:
        rows = [r[name] for r in reps]
        first_test = rows[0]["test"]
        item = {"best_valid": median([r["best_valid"] for r in rows]),
                "train_seconds": median([r["train_seconds"] for r in rows]),
                "epochs": median([r["epochs"] for r in rows]),
                "test": {k: median([r["test"][k] for r in rows]) for k in first_test
                         if all(isinstance(r["test"].get(k), (int, float)) or r["test"].get(k) is None for r in rows)},
                "loadavg_before": [r["loadavg_before"] for r in rows], "loadavg_after": [r["loadavg_after"] for r in rows],
                "others_cpu_share": [r["others_cpu_share"] for r in rows]}
        if name != "old":
            item["seconds_to_target"] = median([r["seconds_to_target"] for r in rows])
            item["reached_target"] = sum(r["seconds_to_target"] is not None for r in rows)
            if name.startswith("grown"):
                item["seconds_to_target_with_old"] = median([r["seconds_to_target_with_old"] for r in rows])
        out[name] = item
    return out


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(results: dict[str, Any]) -> str:
    lines = []
    for task, result in results.items():
        spec, summary, data = result["spec"], result["summary"], result["spec"]["data"]
        hidden = {k: data[k] for k in HIDDEN_KEYS[task] if k in data}
        lines.append(f"\n{task}: {Path(spec['config']).name}, {spec['epochs']} epochs{' per period' if task == 'ctr' else ''}, "
                     f"{len(result['reps'])} reps; hidden: " + ", ".join(
                         f"{k} {round(v, 3) if isinstance(v, float) else v}" for k, v in hidden.items()))
        lines.append(f"  scratch best valid {spec['metric']} {fmt(summary['scratch_best'])}; target: "
                     f"{summary['target_rule']} = {fmt(summary['target'])}"
                     + ("; CTR: on the periods both evaluate " + str(data["compared_periods"]) if task == "ctr" else ""))
        if "grown_equals_scratch" in summary:
            lines.append(f"  grown's next-period AUCs equal scratch's, bit for bit, in {summary['grown_equals_scratch']}/"
                         f"{len(result['reps'])} reps (old trained scratch's first periods with the same seed)")
        quality = "mean next-period AUC" if task == "ctr" else "test " + ", ".join(spec["test_metrics"])
        lines.append(f"  {'contender':13s} {'best valid':>10s} {'s to target':>11s} {'+ old s':>8s} {'train s':>8s} "
                     f"{'epochs':>6s}  {quality:30s} {'load before/after, others CPU (per rep)':s}")
        for name, item in summary.items():
            if not isinstance(item, dict) or "train_seconds" not in item:
                continue
            tests = item["test"]
            test_text = (fmt(tests.get("mean_next_period_auc")) if task == "ctr"
                         else " ".join(fmt(tests.get(k)) for k in spec["test_metrics"]))
            loads = "  ".join(f"{b:.1f}/{a:.1f} {o:.0%}" for b, a, o in
                              zip(item["loadavg_before"], item["loadavg_after"], item["others_cpu_share"]))
            reached = "" if name == "old" else f" ({item['reached_target']}/{len(result['reps'])})"
            lines.append(f"  {name:13s} {fmt(item['best_valid']):>10s} "
                         f"{fmt(item.get('seconds_to_target'), 2) + reached if name != 'old' else '-':>11s} "
                         f"{fmt(item.get('seconds_to_target_with_old'), 2):>8s} {fmt(item['train_seconds'], 2):>8s} "
                         f"{fmt(item['epochs'], 1):>6s}  {test_text:30s} {loads}")
    lines.append("\n(medians over reps; seconds: training wall time from metrics.jsonl, evaluation and checkpoints "
                 "excluded; '+ old s': grown's time to target plus the old run's whole training; (n/N): reps that "
                 "reached the target; old's best valid is on its own, partial data; others CPU: the share of all CPUs other "
                 "processes took during the run: a time is only worth reading where it is near 0%)")
    return "\n".join(lines)


def order_for(rep: int, contenders: list[str]) -> list[str]:
    """Rep ``rep``'s order: the contenders rotated by rep // 2, reversed in odd reps, then ``old``
    moved before the runs grown from it."""
    shift = (rep // 2) % len(contenders)
    order = contenders[shift:] + contenders[:shift]
    if rep % 2:
        order = order[::-1]
    grown = [i for i, name in enumerate(order) if name.startswith("grown")]
    if grown and order.index("old") > min(grown):
        order.remove("old")
        order.insert(min(grown), "old")
    return order


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASK_NAMES), help="comma-separated, of " + ", ".join(TASK_NAMES))
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 2, 1 with --quick)")
    parser.add_argument("--frozen", action="store_true", help="add the grown-frozen contender (train.freeze=known)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny epochs and data, numbers meaningless")
    parser.add_argument("--seed", type=int, default=0, help="config seed, and the seed of the hidden choice")
    parser.add_argument("--vary-seed", action="store_true", help="rep r uses seed + r (data, split, model)")
    parser.add_argument("--work", default=None, help="directory for the data and runs (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", default=None, help="result JSON (default benchmarks/results/grow.json, "
                                                    "grow_quick.json with --quick)")
    add_flag(parser)
    args = parser.parse_args()
    args.reps = args.reps if args.reps is not None else (1 if args.quick else 2)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(TASK_NAMES))
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)} (choose from {', '.join(TASK_NAMES)})")
    provenance = check(args, "grow.py")
    out = Path(args.out) if args.out else RESULTS / ("grow_quick.json" if args.quick else "grow.json")
    cadence_imports()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="cadence-grow-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    base = ["old", "grown", "scratch", *(["grown-frozen"] if args.frozen else [])]
    say(f"grow at {provenance['commit']}{' (dirty)' if provenance['dirty'] else ''}: tasks {', '.join(tasks)}, "
        f"{args.reps} reps, contenders {', '.join(base)} (ctr: and cold), work {work}")
    results: dict[str, Any] = {}
    try:
        for task in tasks:
            task_started = time.perf_counter()
            specs: dict[int, dict[str, Any]] = {}
            contenders = [*base, "cold"] if task == "ctr" else base
            reps = []
            for rep in range(args.reps):
                seed = args.seed + rep if args.vary_seed else args.seed
                if seed not in specs:
                    specs[seed] = prepare(task, work / task, seed, args.quick)
                    say(f"{task} (seed {seed}): " + json.dumps({k: v for k, v in specs[seed]["data"].items()
                                                               if k not in ("hidden_entities",)}))
                spec = specs[seed]
                order = order_for(rep, contenders)
                runs: dict[str, dict[str, Any]] = {}
                for contender in order:
                    run_dir = work / task / f"rep{rep}-{contender}"
                    if run_dir.exists():
                        shutil.rmtree(run_dir)
                    old_run = Path(runs["old"]["run_dir"]) if contender.startswith("grown") else None
                    runs[contender] = run_one(spec, contender, run_dir, old_run)
                    s = runs[contender]["summary"]
                    say(f"  {task} rep {rep} {contender:12s} {s['epochs']:3d} epochs {s['train_seconds']:7.2f} s training, "
                        f"process {runs[contender]['process_wall_seconds']:6.1f} s, load "
                        f"{runs[contender]['loadavg_before'][0]:.2f}->{runs[contender]['loadavg_after'][0]:.2f}, "
                        f"best valid {spec['metric']} {fmt(best(spec, curve(spec, runs[contender])))}"
                        + (f"  [{', '.join(f'{k} {v}' for k, v in s['init_from'].items() if isinstance(v, dict))}]"
                           if s.get("init_from") else ""))
                measured = measure_rep(spec, {c: runs[c] for c in contenders})
                measured.update(rep=rep, seed=seed, order=order,
                                runs={c: {k: v for k, v in runs[c].items()} for c in contenders})
                reps.append(measured)
            spec = specs[args.seed]
            results[task] = {"spec": spec, "data_by_seed": {seed: s["data"] for seed, s in specs.items()},
                             "reps": reps, "summary": summarise(spec, reps, contenders),
                             "wall_seconds": round(time.perf_counter() - task_started, 1)}
            say(f"{task}: {results[task]['wall_seconds']:.0f} s")
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/grow.py", *sys.argv[1:]])
    report = {"command": command, "quick": args.quick, "reps": args.reps, "contenders": base,
              "target": TARGET, "hidden_fraction": HIDDEN_FRACTION, "cpus": os.cpu_count(),
              "epochs": {"kge": KGE_EPOCHS, "mf": MF_EPOCHS, "w2v": W2V_EPOCHS, "ctr_per_period": CTR_EPOCHS_PER_PERIOD}
              if not args.quick else QUICK_EPOCHS,
              "tasks": results, "wall_seconds": round(time.perf_counter() - started, 1)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamp(report), indent=1) + "\n")
    text = table(results)
    print(text)
    say(f"\nwrote {out} ({report['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
