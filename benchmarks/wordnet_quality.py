#!/usr/bin/env python
"""Link-prediction quality on WordNet: cadence's shipped configs vs PyKEEN 1.11.1 on the same split.

    .venv/bin/python benchmarks/wordnet_quality.py [--models complex,rotate] [--seeds N] [--epochs E]
        [--dataset wordnet-rr] [--test-triples N] [--contenders cadence,pykeen] [--out FILE] [--dirty]

For each model, ``configs/wordnet-rr-MODEL.yaml`` is trained by cadence (its CLI, in a fresh process,
``threads=2``) and the same model by PyKEEN (``benchmarks/peers/pykeen_contender.py`` in
``.venv-bench-pykeen``, CPU, 2 threads), for seeds 0 .. N-1, interleaved: cadence seed 0, PyKEEN
seed 0, cadence seed 1, ... Both train on cadence's own split of the data set: the train, valid and
test triples cadence reads (valid/test triples with an entity unseen in train already dropped) are
written as names to a scratch directory that PyKEEN reads, so both rank against the same 102,065
entities. The split is cadence's seeded 80/10/10 split by entity pair (docs/data.md), not the
official WN18RR split: published WN18RR numbers are orientation only.

The test: both rank the same ``--test-triples`` test triples (default 2,000, drawn once with seed 0,
the same for every run; 0: all of them) against every entity, head and tail queries, filtered on
train+valid+the whole test split, ties counted half (PyKEEN: its realistic rank); MRR and Hits@1/3/10
of the model each run ends with. A subset because exact ranking is slow on 2 cores where the score
of a query against all 102,065 entities is not one matrix product: PyKEEN broadcasts [batch,
entities, dim] for ComplEx and RotatE alike (the whole test split: ~13 min for ComplEx, over an
hour for RotatE at dim 256), cadence for RotatE. cadence's run itself skips its own test
(``eval.test=false``); the benchmark ranks the subset with the run's final checkpoint.

The PyKEEN side takes the config's setting where PyKEEN has one: the model, ``model.dim`` (floats
per entity; complex models have dim / 2 complex components on both sides), batch size, Adagrad with
the same learning rate, the softmax cross entropy of each positive against its negatives (PyKEEN's
``CrossEntropyLoss`` on sLCWA scores). What differs, because PyKEEN's sLCWA loop has no counterpart:
cadence scores each batch against negatives shared by the batch (``train.negatives`` per side) and
trains reciprocal relations with N3; PyKEEN draws ``PYKEEN_NEGATIVES`` corruptions of its own for
each positive (head or tail) and runs without regulariser (``--variant plain``: PyKEEN's default L2
regulariser on ComplEx triples its epoch time here, 311 s against 103 s on a loaded machine, in a
comparison at equal training time; RotatE keeps its unit-modulus relations). PyKEEN's sLCWA epoch on this graph takes tens of
times cadence's (a dense Adagrad step over the whole entity table per batch, negatives scored
elementwise), so equal epochs would take hours: PyKEEN trains for the training seconds cadence took
with the same seed (``--max-train-seconds``, the epoch that crosses it finishes; at most the
config's epochs) and the record says how many epochs that was. ``--epochs`` sets both sides' epochs
(PyKEEN's as a cap).

Per contender and model: mean and 95% t-interval over the seeds of the test metrics, training
seconds (evaluation excluded), epochs, the whole run's wall seconds, the load average before and
after each run and the share of the CPUs other processes took meanwhile. Without
``.venv-bench-pykeen`` (``make .venv-bench-pykeen/bin/python``) PyKEEN is recorded as skipped.
Results: ``benchmarks/results/wordnet_quality.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

from kge_throughput import loadavg, machine_info  # same folder: the shared machine record
from peer_stats import OthersMeter, mean_ci

import torch

from cadence import api
from cadence.config import load_config
from cadence.data.datasets import load_graph
from cadence.evaluation.ranking import FilteredRankingMetric

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CONFIGS = REPO / "configs"
PYKEEN_PYTHON = REPO / ".venv-bench-pykeen" / "bin" / "python"
PYKEEN_CONTENDER = REPO / "benchmarks" / "peers" / "pykeen_contender.py"
MODELS = ("complex", "rotate")
CONTENDERS = ("cadence", "pykeen")
METRICS = ("mrr", "hits@1", "hits@3", "hits@10")
THREADS = 2
# PyKEEN's corruptions per positive (sLCWA): its negatives are scored one positive at a time
# ([batch, negatives, dim] elementwise), not as one matrix product per batch as cadence's shared ones
PYKEEN_NEGATIVES = {"complex": 64, "rotate": 64}
# PyKEEN's evaluation batch: ComplEx and RotatE score [batch, entities, dim / 2] complex numbers
# elementwise (256 queries of ComplEx at dim 256: a 26 GB tensor; 16: 1.7 GB)
PYKEEN_EVAL_BATCH = {"complex": 16, "rotate": 16}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def config_path(model: str) -> Path:
    return CONFIGS / f"wordnet-rr-{model}.yaml"


def cadence_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    # the final checkpoint is what the benchmark ranks; one at the last epoch only
    items = ["--seed", str(seed), "--set", f"threads={THREADS}", "--set", "eval.test=false",
             "--set", "checkpoint.every=1000000", "--no-progress"]
    if args.dataset != "wordnet-rr":
        items += ["--dataset", args.dataset]
    if args.epochs:
        items += ["--epochs", str(args.epochs)]
    return items


def shown(command: list[str]) -> str:
    """A command as a reader would type it: paths relative to the repository, venvs by name."""
    text = " ".join(shlex.quote(part) for part in command)
    return text.replace(str(REPO) + "/", "").replace(sys.executable, ".venv/bin/python")


# ---- the split, as names ----------------------------------------------------------------------------
def write_split(graph, directory: Path) -> dict[str, Any]:
    """cadence's train/valid/test triples as tab-separated names, the files PyKEEN reads."""
    directory.mkdir(parents=True, exist_ok=True)
    entities, relations = graph.entity_names, graph.relation_names
    info: dict[str, Any] = {"entities": graph.num_entities, "relations": graph.num_relations}
    for split in ("train", "valid", "test"):
        triples = graph.split(split).tolist()
        text = "".join(f"{entities[h]}\t{relations[r]}\t{entities[t]}\n" for h, r, t in triples)
        (directory / f"{split}.txt").write_text(text, encoding="utf-8")
        info[f"{split}_triples"] = len(triples)
        info[f"{split}_sha256"] = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return info


def write_test_subset(graph, count: int, path: Path) -> tuple[torch.Tensor, dict[str, Any]]:
    """``count`` test triples drawn with seed 0 (all of them for 0), in test order; as ids and as names."""
    size = graph.test.shape[0]
    if count and count < size:
        rows = torch.randperm(size, generator=torch.Generator().manual_seed(0))[:count].sort().values
    else:
        rows = torch.arange(size)
    triples = graph.test[rows]
    entities, relations = graph.entity_names, graph.relation_names
    text = "".join(f"{entities[h]}\t{relations[r]}\t{entities[t]}\n" for h, r, t in triples.tolist())
    path.write_text(text, encoding="utf-8")
    return triples, {"test_triples_ranked": int(triples.shape[0]), "of": size,
                     "drawn": "torch.randperm(test, seed 0)[:N], sorted" if rows.shape[0] < size else "all",
                     "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]}


# ---- contenders -------------------------------------------------------------------------------------
def measured(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``command`` to its end; the process and the load around it."""
    before, started = loadavg(), time.perf_counter()
    with OthersMeter() as meter:
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
    return proc, {"wall_seconds": round(time.perf_counter() - started, 1), "loadavg_before": before,
                  "loadavg_after": loadavg(), "others_cpu_share": round(meter.share, 3)}


def cadence_command(args: argparse.Namespace, model: str, seed: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "cadence.cli", "train", "--config", str(config_path(model)),
            *cadence_overrides(args, seed), "--out", str(out), "--overwrite"]


def rank_subset(run_dir: Path, triples: torch.Tensor, names: list[str]) -> dict[str, Any]:
    """The run's final model's filtered test metrics on ``triples`` (ids of the benchmark's graph,
    checked against the run's own by name), filtered on the run's whole train+valid+test."""
    config, task, view, dense = api.load_model(run_dir)
    graph = task.graph
    if graph.entity_names[:len(names)] != names or graph.num_entities != len(names):
        raise RuntimeError("the run's entity ids differ from the benchmark's graph")
    started = time.perf_counter()
    dense.eval()
    with torch.no_grad():
        metrics = FilteredRankingMetric(graph, config.train.reciprocal)(
            dense, view.values(torch.arange(graph.num_entities)), triples)
    return {**metrics, "seconds": round(time.perf_counter() - started, 1)}


def run_cadence(args: argparse.Namespace, model: str, seed: int, scratch: Path, triples: torch.Tensor,
                names: list[str]) -> dict[str, Any]:
    out = scratch / f"cadence-{model}-{seed}"
    command = cadence_command(args, model, seed, out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    proc, load = measured(command, env)
    record: dict[str, Any] = {"seed": seed, **load}
    if proc.returncode != 0 or not (out / "summary.json").exists():
        record["error"] = f"cadence exited {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-5:])
        return record
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    test = rank_subset(out, triples, names)
    record.update({"test": {name: test[name] for name in (*METRICS, "mean_rank")},
                   "test_eval_seconds": test["seconds"],
                   "train_seconds": summary["train_seconds"], "epochs": summary["epochs"],
                   "best_epoch": summary.get("best_epoch"), "best_valid_mrr": summary.get("best_valid_mrr"),
                   "valid_curve": [{"epoch": r["epoch"], "train_seconds": r["wall_seconds"], "mrr": r["mrr"]}
                                   for r in rows if r.get("split") == "valid"]})
    return record


def pykeen_command(args: argparse.Namespace, model: str, seed: int, data: Path, out: Path,
                   budget: float | None) -> list[str]:
    config = load_config(config_path(model), ["data.dataset=" + args.dataset])
    epochs = args.epochs or config.train.epochs
    command = [str(PYKEEN_PYTHON), str(PYKEEN_CONTENDER), "--data-dir", str(data), "--model", model,
               "--dim", str(config.model.dim), "--negatives", str(PYKEEN_NEGATIVES[model]),
               "--batch-size", str(config.train.batch_size), "--epochs", str(epochs),
               "--lr", str(config.optimizer.lr), "--seed", str(seed), "--loss", "softmax", "--variant", "plain",
               "--eval-every", "0", "--test", "--test-model", "final", "--test-triples", str(data / "test_ranked.txt"),
               *(["--max-train-seconds", f"{budget:.1f}"] if budget else []),
               "--eval-batch-size", str(PYKEEN_EVAL_BATCH[model]), "--threads", str(THREADS), "--json", str(out)]
    return command


def run_pykeen(args: argparse.Namespace, model: str, seed: int, data: Path, scratch: Path,
               budget: float | None) -> dict[str, Any]:
    if not PYKEEN_PYTHON.exists():
        return {"seed": seed, "skipped": f"{PYKEEN_PYTHON.relative_to(REPO)} not found: build it with "
                                         "`make .venv-bench-pykeen/bin/python`"}
    out = scratch / f"pykeen-{model}-{seed}.json"
    proc, load = measured(pykeen_command(args, model, seed, data, out, budget))
    record: dict[str, Any] = {"seed": seed, "max_train_seconds": budget, **load}
    if proc.returncode != 0 or not out.exists():
        record["error"] = (f"pykeen_contender.py exited {proc.returncode}: "
                           + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:]))
        return record
    found = json.loads(out.read_text())
    test = found["test"]
    record.update({"test": {name: test[name] for name in (*METRICS, "mean_rank")},
                   "train_seconds": round(found["train_seconds"], 2), "epochs": found["epochs_run"],
                   "epoch_seconds": [round(b["train_seconds_cumulative"] - a, 1) for a, b in zip(
                       [0.0] + [e["train_seconds_cumulative"] for e in found["per_epoch"]], found["per_epoch"])],
                   "losses": [round(e["loss"], 4) for e in found["per_epoch"]],
                   "test_eval_seconds": round(test["seconds"], 1), "versions": {
                       "pykeen": found["pykeen_version"], "torch": found["torch_version"]},
                   "setting": {k: found[k] for k in ("model_class", "embedding_dim", "negatives", "batch_size", "lr",
                                                     "loss", "variant", "threads", "test_model")}})
    return record


# ---- the report -------------------------------------------------------------------------------------
def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in runs if "test" in r]
    if not done:
        reasons = sorted({r.get("skipped") or r.get("error") or "no run" for r in runs})
        return {"skipped": "; ".join(reasons)}
    summary = {name: mean_ci([r["test"][name] for r in done]) for name in METRICS}
    summary["train_seconds"] = mean_ci([r["train_seconds"] for r in done])
    summary["epochs"] = mean_ci([r["epochs"] for r in done])
    summary["wall_seconds"] = mean_ci([r["wall_seconds"] for r in done])
    summary["runs"] = f"{len(done)}/{len(runs)}"
    return summary


def print_table(report: dict[str, Any]) -> None:
    def cell(entry: dict[str, Any]) -> str:
        half = entry["half_width"]
        return f"{entry['mean']:.3f}" + (f" ± {half:.3f}" if half is not None else "")

    print("| model | contender | test MRR | Hits@1 | Hits@3 | Hits@10 | epochs | train s | run wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, contenders in report["summary"].items():
        for name, entry in contenders.items():
            if "skipped" in entry:
                print(f"| {model} | {name} | skipped: {entry['skipped']} | | | | | | |")
                continue
            print(f"| {model} | {name} | " + " | ".join(cell(entry[m]) for m in METRICS)
                  + f" | {entry['epochs']['mean']:.1f} | {entry['train_seconds']['mean']:.0f}"
                  f" | {entry['wall_seconds']['mean']:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0 .. N-1 (default 2)")
    parser.add_argument("--epochs", type=int, default=None, help="both sides' epochs (default: the config's)")
    parser.add_argument("--dataset", default="wordnet-rr", help="cadence data set (default wordnet-rr)")
    parser.add_argument("--test-triples", type=int, default=2000,
                        help="test triples both rank (drawn once with seed 0; 0: all; default 2000)")
    parser.add_argument("--pykeen-seconds", type=float, default=600.0,
                        help="PyKEEN's training budget where cadence did not run first (default 600)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated, of: cadence, pykeen")
    parser.add_argument("--out", type=Path, default=RESULTS / "wordnet_quality.json")
    add_flag(parser)
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if not models or set(models) - set(MODELS):
        parser.error(f"--models takes some of {', '.join(MODELS)} (got {args.models!r})")
    if not contenders or set(contenders) - set(CONTENDERS):
        parser.error(f"--contenders takes some of {', '.join(CONTENDERS)} (got {args.contenders!r})")
    if args.seeds < 1 or (args.epochs is not None and args.epochs < 1) or args.test_triples < 0:
        parser.error("--seeds and --epochs must be positive, --test-triples not negative")
    provenance = check(args, "wordnet_quality.py")
    # the configs are what this benchmark measures: uncommitted changes to them count as a dirty tree
    changed = subprocess.run(["git", "status", "--porcelain", "--", *(str(config_path(m)) for m in models)],
                             cwd=REPO, capture_output=True, text=True).stdout.split("\n")
    changed = [line[3:] for line in changed if line.strip()]
    if changed and not args.dirty:
        raise SystemExit(f"wordnet_quality.py: uncommitted changes to {', '.join(changed)}: commit them first, "
                         "or pass --dirty (the result file is then marked dirty)")
    started = time.perf_counter()
    seeds = list(range(args.seeds))
    report: dict[str, Any] = {
        "benchmark": "link-prediction quality on WordNet: cadence's shipped configs vs PyKEEN on the same split "
                     "(benchmarks/wordnet_quality.py)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shown([sys.executable, "benchmarks/wordnet_quality.py", *sys.argv[1:]]),
        "commit": provenance["commit"], "configs_dirty": changed, "machine": machine_info(), "dataset": args.dataset, "seeds": seeds,
        "loadavg_start": loadavg(),
        "protocol": "the same test triples (see test_subset) ranked by both against every entity, filtered on "
                    "train+valid+the whole test split, head and tail queries, ties counted half (PyKEEN: "
                    "realistic rank), the model each run ends with; the split is cadence's own seeded 80/10/10 "
                    "split by entity pair (docs/data.md), not the official WN18RR split; PyKEEN trains for the "
                    "training seconds cadence took with the same seed (at most the same epochs)",
    }
    graph = load_graph(load_config(None, [f"data.dataset={args.dataset}"]).data, 0)
    with tempfile.TemporaryDirectory(prefix="wordnet-quality-") as tmp:
        scratch = Path(tmp)
        data = scratch / "split"
        report["split"] = write_split(graph, data)
        triples, report["test_subset"] = write_test_subset(graph, args.test_triples, data / "test_ranked.txt")
        names = list(graph.entity_names)
        del graph
        report["settings"] = {}
        for model in models:
            config = load_config(config_path(model))
            report["settings"][model] = {
                "config": str(config_path(model).relative_to(REPO)),
                "cadence": shown(cadence_command(args, model, 0, Path("RUN_DIR"))).replace("--seed 0", "--seed SEED"),
                "pykeen": shown(pykeen_command(args, model, 0, Path("SPLIT_DIR"), Path("OUT.json"), None))
                .replace("--seed 0", "--seed SEED") + " --max-train-seconds <cadence's train_seconds, same seed>",
                "pykeen_negatives_per_positive": PYKEEN_NEGATIVES[model],
                "epochs": args.epochs or config.train.epochs,
            }
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {c: [] for c in contenders} for m in models}
        for model in models:
            for seed in seeds:
                budget = None
                for name in contenders:
                    say(f"[{model}] {name} seed {seed} (load {loadavg()})")
                    if name == "cadence":
                        record = run_cadence(args, model, seed, scratch, triples, names)
                        budget = record.get("train_seconds")
                    else:
                        record = run_pykeen(args, model, seed, data, scratch, budget or args.pykeen_seconds)
                    runs[model][name].append(record)
                    say(f"[{model}] {name} seed {seed}: "
                        + (json.dumps(record["test"]) + f", {record['train_seconds']:.0f} s training, "
                           f"{record['wall_seconds']:.0f} s in all" if "test" in record
                           else record.get("skipped") or record.get("error", "")))
    report["summary"] = {m: {c: summarize(runs[m][c]) for c in contenders} for m in models}
    report["runs"] = runs
    report["loadavg_end"] = loadavg()
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp(report), indent=2) + "\n")
    say(f"wrote {args.out}")
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
