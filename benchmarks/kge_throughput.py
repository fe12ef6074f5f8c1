#!/usr/bin/env python
"""Training-throughput benchmark of cadence, all contenders side by side in one invocation.

    .venv/bin/python benchmarks/kge_throughput.py [--quick] [--only pykeen|bare|store]
        [--reps N] [--pairs N] [--max-wait S] [--mmap-dir DIR] [--out FILE]

Three parts (how to run them: docs/benchmarks.md; the measured results: results/kge_throughput.json,
shown in docs/tasks/kge.md "Measured"):

1. ``pykeen``: cadence vs PyKEEN 1.11.1 on Kinships, DistMult dim 128, 16 negatives, batch 1024,
   Adagrad lr 0.1, logistic (softplus) loss: positives/second of training and training seconds to a
   common validation MRR. PyKEEN runs in its own environment (``.venv-bench``) through
   ``benchmarks/peers/pykeen_contender.py``; without that environment the contender is recorded as skipped.
2. ``bare``: cadence vs a bare PyTorch loop with the same math (written below), interleaved.
3. ``store``: ``EmbeddingStore.pull`` + ``set`` on a table over 2 GiB (memory and mmap backends) vs
   plain ``index_select`` + ``index_copy_`` on an in-memory tensor of the same shape and ids.

Results go to ``benchmarks/results/kge_throughput.json`` (``kge_throughput-quick.json`` with
``--quick``); ``--only`` replaces that part in the existing file and keeps the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import hashlib
import json
import logging
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

import numpy as np
import torch
import torch.nn.functional as F

import cadence
from cadence import api
from cadence.config import SyntheticGraphConfig, load_config
from cadence.data.datasets import DATASETS
from cadence.data.synthetic import power_law_graph
from cadence.evaluation.ranking import FilteredRankingMetric
from cadence.store import create_store
from cadence.training.trainer import TrainerHook

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
BENCH_PYTHON = REPO / ".venv-bench" / "bin" / "python"
PYKEEN_CONTENDER = REPO / "benchmarks" / "peers" / "pykeen_contender.py"
PARTS = ("pykeen", "bare", "store")

# Part 1 and the first setting of part 2: the headline settings.
KINSHIPS_DISTMULT = dict(
    dataset="kinships", model="distmult", dim=128, negatives=16, batch_size=1024, lr=0.1,
    loss="logistic", scoring="sampled", reciprocal=False,
)
# Second setting of part 2: the UMLS ComplEx demo configuration's training math.
UMLS_COMPLEX = dict(
    dataset="umls", model="complex", dim=256, negatives=0, batch_size=1000, lr=0.1,
    loss="softmax", scoring="all", reciprocal=True,
)

log = logging.getLogger("bench")
DEFAULT_THREADS = torch.get_num_threads()


# ---- helpers --------------------------------------------------------------------------------------
def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "cadence_version": getattr(cadence, "__version__", None),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "memory_gib": _memory_gib(),
    }
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        info["git_dirty"] = bool(subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        info["git_commit"] = None
    info["src_sha256"] = src_fingerprint()
    return info


def src_fingerprint() -> str:
    """sha256 over the cadence package's source files: says exactly which code was measured."""
    digest = hashlib.sha256()
    root = Path(cadence.__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def dataset_dir(name: str) -> Path:
    path = DATASETS.get(name).fetch()
    assert path is not None
    return Path(path)


def cadence_config(setting: dict[str, Any], epochs: int, out: str, *, eval_every: int,
                   extra: list[str] = ()) -> Any:
    items = [
        f"data.dataset={setting['dataset']}",
        f"model.name={setting['model']}",
        f"model.dim={setting['dim']}",
        f"train.batch_size={setting['batch_size']}",
        f"train.loss={setting['loss']}",
        f"train.scoring={setting['scoring']}",
        f"train.reciprocal={str(setting['reciprocal']).lower()}",
        f"optimizer.lr={setting['lr']}",
        f"train.epochs={epochs}",
        f"eval.every={eval_every}",
        "eval.test=false",
        "checkpoint.every=0",
        "seed=0",
    ]
    if setting["scoring"] == "sampled":
        items.append(f"train.negatives={setting['negatives']}")
    config = load_config(None, items + list(extra))
    config.out = out
    config.progress = False
    return config


def run_cadence(setting: dict[str, Any], epochs: int, *, eval_every: int = 0, extra: list[str] = (),
                hooks: list[TrainerHook] = ()) -> api.TrainResult:
    try:
        with tempfile.TemporaryDirectory(prefix="cadence-bench-") as tmp:
            config = cadence_config(setting, epochs, str(Path(tmp) / "run"), eval_every=eval_every, extra=extra)
            result = api.train(config, overwrite=True, hooks=hooks)
    finally:
        torch.set_num_threads(DEFAULT_THREADS)  # a threads=N config sets it process-wide
    return result


class Meter:
    """Wall time, this process's CPU time and page faults over a timed region.

    ``cpu_share`` = CPU seconds / (wall seconds x torch threads): about 1 when our threads had the
    cores to themselves, about 0.5 on this 2-core machine when another process took one core."""

    def __enter__(self) -> "Meter":
        self.usage = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu_started = time.process_time()  # precise (CLOCK_PROCESS_CPUTIME_ID), all threads
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.started
        self.cpu_seconds = time.process_time() - self.cpu_started
        after = resource.getrusage(resource.RUSAGE_SELF)
        self.user = after.ru_utime - self.usage.ru_utime
        self.system = after.ru_stime - self.usage.ru_stime
        self.minor_faults = after.ru_minflt - self.usage.ru_minflt
        self.major_faults = after.ru_majflt - self.usage.ru_majflt

    @property
    def cpu_share(self) -> float:
        return self.cpu_seconds / max(1e-9, self.seconds * DEFAULT_THREADS)


CLEAN_CPU_SHARE = 0.85  # a measurement below this share ran while another process held a core


def _cpu_times() -> tuple[int, int] | None:
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def others_busy(window: float = 0.5) -> float | None:
    """Fraction of all CPUs busy over ``window`` seconds while this process sleeps: other load."""
    first = _cpu_times()
    time.sleep(window)
    second = _cpu_times()
    if first is None or second is None or second[1] == first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1])


class QuietGate:
    """Before a measurement, wait (within a total budget) until other processes leave the CPUs idle.

    The machine is shared: another process taking one of the 2 cores slows 2-thread torch code 2-5x.
    The gate only lowers the odds of that; each measurement also records its own CPU share."""

    def __init__(self, budget_s: float, threshold: float = 0.15):
        self.budget_s = budget_s
        self.threshold = threshold
        self.waited_s = 0.0

    def wait(self) -> dict[str, Any]:
        started = time.perf_counter()
        busy = others_busy(0.3)
        while busy is not None and busy > self.threshold:
            if self.waited_s + time.perf_counter() - started >= self.budget_s:
                break
            busy = others_busy(1.0)
        waited = time.perf_counter() - started
        self.waited_s += waited
        return {"waited_s": round(waited, 2), "others_busy": None if busy is None else round(busy, 3)}


GATE = QuietGate(0.0)


def clean_median(values: list[float], clean: list[bool]) -> tuple[float | None, str]:
    """Median over the uncontended measurements when there are at least 3, else over all."""
    kept = [v for v, ok in zip(values, clean) if ok]
    if len(kept) >= 3:
        return median(kept), f"{len(kept)} of {len(values)} uncontended"
    return median(values), f"all {len(values)} (only {len(kept)} uncontended)"


def first_reaching(curve: list[tuple[float, float, int]], target: float) -> dict[str, Any] | None:
    """(train seconds, mrr, epoch) records -> the first one at or above ``target``."""
    for seconds, mrr, epoch in curve:
        if mrr >= target:
            return {"train_seconds": seconds, "epoch": epoch, "mrr": mrr}
    return None


# ---- part 1: cadence vs PyKEEN --------------------------------------------------------------------
class PykeenProtocolMRR(TrainerHook):
    """Valid MRR filtered on train+valid only (PyKEEN's protocol; cadence's own also filters on test).

    Runs in ``on_epoch_end``, outside the trainer's timed region (train_seconds)."""

    def __init__(self) -> None:
        self.metric: FilteredRankingMetric | None = None
        self.curve: list[tuple[float, float, int]] = []

    def on_epoch_end(self, trainer, epoch: int) -> None:
        graph = trainer.task.graph
        if self.metric is None:
            self.metric = FilteredRankingMetric(dataclasses.replace(graph, test=graph.test[:0]),
                                                trainer.config.train.reciprocal)
        model = trainer.runtime.dense()
        model.eval()
        with torch.no_grad():
            mrr = self.metric(model, trainer.runtime.store.values, graph.valid)["mrr"]
        model.train()
        self.curve.append((trainer.progress.train_seconds, mrr, epoch))


def _epoch_seconds(cumulative: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0] + cumulative[:-1], cumulative)]


def cadence_part1_run(setting: dict[str, Any], epochs: int, extra: list[str] = ()) -> dict[str, Any]:
    gate = GATE.wait()
    hook = PykeenProtocolMRR()
    with Meter() as meter:
        result = run_cadence(setting, epochs, eval_every=1, extra=extra, hooks=[hook])
    valid = [m for m in result.metrics if m["split"] == "valid"]
    epoch_seconds = _epoch_seconds([m["wall_seconds"] for m in valid])
    per_epoch = result.summary["examples_seen"] / max(1, result.summary["epochs"])
    return {
        "examples_per_second": result.summary["examples_per_second"],
        "train_seconds": result.summary["train_seconds"],
        "epochs": result.summary["epochs"],
        "examples_seen": result.summary["examples_seen"],
        "epoch_seconds": epoch_seconds,
        "median_epoch_examples_per_second": per_epoch / median(epoch_seconds),
        "best_valid_mrr": result.summary["best_valid_mrr"],
        "best_valid_mrr_pykeen_filter": max(r for _, r, _ in hook.curve),
        "curve": [{"epoch": m["epoch"], "train_seconds": m["wall_seconds"], "mrr": m["mrr"]} for m in valid],
        "curve_pykeen_filter": [{"epoch": e, "train_seconds": s, "mrr": r} for s, r, e in hook.curve],
        "cpu_share_whole_call": meter.cpu_share,
        "gate": gate,
    }


def pykeen_run(setting: dict[str, Any], epochs: int, data: Path, threads: int | None = None) -> dict[str, Any]:
    """One PyKEEN run in its own interpreter; returns its JSON, or {'skipped': reason}."""
    if not BENCH_PYTHON.exists():
        return {"skipped": f"{BENCH_PYTHON.relative_to(REPO)} not found (create it with: python3 -m venv "
                           ".venv-bench && .venv-bench/bin/pip install -r benchmarks/peers/requirements-pykeen.txt)"}
    gate = GATE.wait()
    with tempfile.TemporaryDirectory(prefix="pykeen-bench-") as tmp:
        out = Path(tmp) / "pykeen.json"
        command = [
            str(BENCH_PYTHON), str(PYKEEN_CONTENDER), "--data-dir", str(data),
            "--model", setting["model"], "--dim", str(setting["dim"]),
            "--negatives", str(setting["negatives"]), "--batch-size", str(setting["batch_size"]),
            "--epochs", str(epochs), "--lr", str(setting["lr"]), "--seed", "0",
            "--variant", "plain", "--loss", "softplus", "--threads", str(threads or DEFAULT_THREADS),
            "--json", str(out),
        ]
        try:
            proc = subprocess.run(command, capture_output=True, text=True)
        except OSError as err:
            return {"skipped": f"could not start {BENCH_PYTHON}: {err}"}
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            return {"skipped": f"pykeen_contender.py exited {proc.returncode}: " + " | ".join(tail)}
        record = json.loads(out.read_text())
    record["command"] = " ".join(
        [".venv-bench/bin/python", "benchmarks/peers/pykeen_contender.py", "--data-dir", "<kinships dir>"]
        + [shlex.quote(c) for c in command[4:-1]] + ["<tmp>.json"])
    per_epoch = record["per_epoch"]
    record["epoch_seconds"] = _epoch_seconds([e["train_seconds_cumulative"] for e in per_epoch])
    record["aggregate_positives_per_second"] = (
        record["num_train_triples"] * len(per_epoch) / per_epoch[-1]["train_seconds_cumulative"])
    record["median_epoch_positives_per_second"] = record["num_train_triples"] / median(record["epoch_seconds"])
    record["best_valid_mrr"] = max(r["valid_mrr"] for r in per_epoch)
    record["gate"] = gate
    return record


def _time_to_target(curves: list[list[tuple[float, float, int]]], epoch_seconds: list[list[float]],
                    target: float) -> dict[str, Any]:
    """Measured training seconds to first reach ``target`` (median over runs), and a noise-robust
    estimate: epochs needed x the median epoch time over all epochs of all runs (warm-up excluded)."""
    hits = [first_reaching(curve, target) for curve in curves]
    reached = [h for h in hits if h is not None]
    steady = median([s for run in epoch_seconds for s in run])
    epochs = median([h["epoch"] for h in reached])
    return {
        "reached": f"{len(reached)}/{len(hits)}",
        "train_seconds": median([h["train_seconds"] for h in reached]),
        "epochs": epochs,
        "median_epoch_seconds": steady,
        "estimated_seconds": epochs * steady if epochs is not None else None,
        "per_run": hits,
    }


def part_pykeen(args: argparse.Namespace) -> dict[str, Any]:
    setting = KINSHIPS_DISTMULT
    epochs = 3 if args.quick else 30
    reps = 1 if args.quick else args.reps
    data = dataset_dir(setting["dataset"])
    say(f"[pykeen] Kinships DistMult, {epochs} epochs, {reps} interleaved repetitions")
    run_cadence(setting, 1)  # warm-up (imports, allocator, first-call kernels), not recorded
    cadence_runs, pykeen_runs = [], []
    for rep in range(reps):
        cadence_runs.append(cadence_part1_run(setting, epochs))
        c = cadence_runs[-1]
        say(f"  cadence rep {rep}: {c['examples_per_second']:,.0f} pos/s (median epoch "
            f"{c['median_epoch_examples_per_second']:,.0f}), best valid MRR {c['best_valid_mrr']:.4f} "
            f"(train+valid filter {c['best_valid_mrr_pykeen_filter']:.4f})")
        pykeen_runs.append(pykeen_run(setting, epochs, data))
        pk = pykeen_runs[-1]
        if "skipped" in pk:
            say(f"  pykeen skipped: {pk['skipped']}")
        else:
            say(f"  pykeen  rep {rep}: {pk['aggregate_positives_per_second']:,.0f} pos/s (median epoch "
                f"{pk['median_epoch_positives_per_second']:,.0f}), best valid MRR {pk['best_valid_mrr']:.4f}")
    ok_pykeen = [r for r in pykeen_runs if "skipped" not in r]

    # Variants: element-wise Adagrad on entity rows (PyKEEN's optimizer), one thread, larger batches.
    variants: dict[str, Any] = {}
    for name, extra in (("elementwise_adagrad", ["optimizer.entity=adagrad"]), ("threads_1", ["threads=1"])):
        run = cadence_part1_run(setting, epochs, extra=extra)
        variants[name] = {k: run[k] for k in ("examples_per_second", "median_epoch_examples_per_second",
                                               "best_valid_mrr", "best_valid_mrr_pykeen_filter")}
        say(f"  cadence {name}: {run['examples_per_second']:,.0f} pos/s")
    for batch in (4096, 8544):
        for threads in (0, 1):
            big = dict(setting, batch_size=batch)
            speeds = []
            for _ in range(reps):
                GATE.wait()
                speeds.append(run_cadence(big, epochs * 2, extra=[f"threads={threads}"]).summary[
                    "examples_per_second"])
            key = f"batch_{batch}_threads_{threads or DEFAULT_THREADS}_no_eval"
            variants[key] = {"examples_per_second_reps": speeds, "examples_per_second": median(speeds),
                             "epochs": epochs * 2}
            say(f"  cadence {key}: {median(speeds):,.0f} pos/s")
    if ok_pykeen and not args.quick:  # PyKEEN at one thread too, once
        one = pykeen_run(setting, epochs, data, threads=1)
        if "skipped" not in one:
            variants["pykeen_threads_1"] = {k: one[k] for k in (
                "aggregate_positives_per_second", "median_epoch_positives_per_second", "best_valid_mrr")}
            say(f"  pykeen threads=1: {one['aggregate_positives_per_second']:,.0f} pos/s")

    out: dict[str, Any] = {
        "settings": dict(setting, epochs=epochs, reps=reps, seed=0, threads=DEFAULT_THREADS,
                         cadence_train_config=cadence_config(setting, epochs, "-", eval_every=1).train.__dict__,
                         cadence_entity_optimizer="rowwise_adagrad (cadence default)",
                         pykeen_variant="plain (entity_constrainer=None, regularizer=None), SoftplusLoss, "
                                        "BasicNegativeSampler, torch.optim.Adagrad"),
        "cadence": {
            "examples_per_second_reps": [r["examples_per_second"] for r in cadence_runs],
            "examples_per_second": median([r["examples_per_second"] for r in cadence_runs]),
            "median_epoch_examples_per_second": median(
                [r["median_epoch_examples_per_second"] for r in cadence_runs]),
            "best_valid_mrr": cadence_runs[0]["best_valid_mrr"],
            "best_valid_mrr_pykeen_filter": cadence_runs[0]["best_valid_mrr_pykeen_filter"],
            "runs": cadence_runs,
        },
        "cadence_variants": variants,
    }
    if not ok_pykeen:
        out["pykeen"] = {"skipped": pykeen_runs[0]["skipped"]}
        return out
    out["pykeen"] = {
        "positives_per_second_reps": [r["aggregate_positives_per_second"] for r in ok_pykeen],
        "positives_per_second": median([r["aggregate_positives_per_second"] for r in ok_pykeen]),
        "median_epoch_positives_per_second": median([r["median_epoch_positives_per_second"] for r in ok_pykeen]),
        "best_valid_mrr": max(r["best_valid_mrr"] for r in ok_pykeen),
        "runs": ok_pykeen,
    }
    out["throughput_ratio"] = out["cadence"]["examples_per_second"] / out["pykeen"]["positives_per_second"]
    out["median_epoch_throughput_ratio"] = (out["cadence"]["median_epoch_examples_per_second"]
                                            / out["pykeen"]["median_epoch_positives_per_second"])

    target = 0.9 * out["pykeen"]["best_valid_mrr"]
    pk = _time_to_target([[(e["train_seconds_cumulative"], e["valid_mrr"], e["epoch"]) for e in r["per_epoch"]]
                          for r in ok_pykeen], [r["epoch_seconds"] for r in ok_pykeen], target)
    cadence_seconds = [r["epoch_seconds"] for r in cadence_runs]
    same = _time_to_target([[(c["train_seconds"], c["mrr"], c["epoch"]) for c in r["curve_pykeen_filter"]]
                            for r in cadence_runs], cadence_seconds, target)
    own = _time_to_target([[(c["train_seconds"], c["mrr"], c["epoch"]) for c in r["curve"]]
                           for r in cadence_runs], cadence_seconds, target)
    tt: dict[str, Any] = {
        "target_mrr": target,
        "target_rule": "0.9 x best valid MRR PyKEEN reaches (filtered on train+valid, both sides, realistic rank)",
        "pykeen": pk,
        "cadence": same,
        "cadence_own_metric": own,
        "note": "cadence: valid MRR recomputed after every epoch (outside the timed region) with PyKEEN's "
                "filter (train+valid); cadence_own_metric uses cadence's metrics.jsonl MRR, which also "
                "filters test triples and reads higher on Kinships",
    }
    for key in ("train_seconds", "estimated_seconds"):
        if pk[key] and same[key]:
            tt[f"speedup_{key}"] = pk[key] / same[key]
        if pk[key] and own[key]:
            tt[f"speedup_{key}_cadence_own_metric"] = pk[key] / own[key]
    out["time_to_target"] = tt
    return out


# ---- part 2: cadence vs a bare PyTorch loop --------------------------------------------------------
def bare_sampled_distmult(train: torch.Tensor, num_entities: int, num_relations: int, s: dict[str, Any],
                          epochs: int, eps: float = 1e-10, init_std: float = 1e-3) -> dict[str, Any]:
    """DistMult, shared sampled negatives on both sides, logistic loss, row-wise Adagrad: no framework."""
    gen = torch.Generator().manual_seed(1)
    entities = torch.randn(num_entities, s["dim"], generator=gen).mul_(init_std)
    state = torch.zeros(num_entities, 1)
    relations = torch.nn.Parameter(torch.randn(num_relations, s["dim"], generator=gen).mul_(init_std))
    dense = torch.optim.Adagrad([relations], lr=s["lr"], eps=eps)
    lr, batch_size, negatives = s["lr"], s["batch_size"], s["negatives"]
    n = train.shape[0]
    seconds, loss_sum = 0.0, 0.0
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)  # outside the timed region, like cadence's plan_epoch
        started = time.perf_counter()
        total = torch.zeros(())
        for start in range(0, n, batch_size):
            triples = train.index_select(0, order[start:start + batch_size])
            heads, rels, tails = triples.unbind(1)
            size = heads.shape[0]
            sampled = torch.randint(num_entities, (negatives,), generator=gen)
            ids, local = torch.unique(torch.cat([heads, tails, sampled]), return_inverse=True)
            rows = entities.index_select(0, ids).requires_grad_(True)
            row_state = state.index_select(0, ids)
            # index_select rather than rows[idx]: its backward (index_add_) is much cheaper on CPU
            # than advanced indexing's (index_put_ with accumulate)
            h = rows.index_select(0, local[:size])
            t = rows.index_select(0, local[size:2 * size])
            c = rows.index_select(0, local[2 * size:])
            r = relations.index_select(0, rels)
            positive = F.softplus(-(h * r * t).sum(-1)).mean()
            tail_side = positive + F.softplus((h * r) @ c.t()).mean()
            head_side = positive + F.softplus((r * t) @ c.t()).mean()
            loss = (tail_side + head_side) / 2
            dense.zero_grad(set_to_none=True)
            loss.backward()
            with torch.no_grad():
                grad = rows.grad
                row_state.add_(grad.square().mean(dim=1, keepdim=True))
                rows.addcdiv_(grad, row_state.sqrt().add_(eps), value=-lr)
                entities.index_copy_(0, ids, rows)
                state.index_copy_(0, ids, row_state)
            dense.step()
            total += loss.detach() * size
        seconds += time.perf_counter() - started
        loss_sum = float(total) / n
    return {"examples_per_second": n * epochs / seconds, "train_seconds": seconds, "last_epoch_loss": loss_sum}


def _complex_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ar, ai = a.chunk(2, dim=-1)
    br, bi = b.chunk(2, dim=-1)
    return torch.cat([ar * br - ai * bi, ar * bi + ai * br], dim=-1)


def bare_all_complex(train: torch.Tensor, num_entities: int, num_relations: int, s: dict[str, Any],
                     epochs: int, eps: float = 1e-10, init_std: float = 1e-3) -> dict[str, Any]:
    """ComplEx, reciprocal relations, softmax over every entity, row-wise Adagrad: no framework.

    Every row is touched by every batch, so the table itself is the leaf (no gather / scatter)."""
    gen = torch.Generator().manual_seed(1)
    edges = train.shape[0]
    inverse = torch.stack([train[:, 2], train[:, 1] + num_relations, train[:, 0]], dim=1)
    triples_all = torch.cat([train, inverse])
    entities = torch.randn(num_entities, s["dim"], generator=gen).mul_(init_std).requires_grad_(True)
    state = torch.zeros(num_entities, 1)
    relations = torch.nn.Parameter(torch.randn(2 * num_relations, s["dim"], generator=gen).mul_(init_std))
    dense = torch.optim.Adagrad([relations], lr=s["lr"], eps=eps)
    lr, batch_size = s["lr"], s["batch_size"]
    n = triples_all.shape[0]
    seconds, loss_sum = 0.0, 0.0
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        started = time.perf_counter()
        total = torch.zeros(())
        for start in range(0, n, batch_size):
            triples = triples_all.index_select(0, order[start:start + batch_size])
            heads, rels, tails = triples.unbind(1)
            h, r = entities.index_select(0, heads), relations.index_select(0, rels)
            scores = _complex_product(h, r) @ entities.t()
            loss = F.cross_entropy(scores, tails)
            dense.zero_grad(set_to_none=True)
            entities.grad = None
            loss.backward()
            with torch.no_grad():
                grad = entities.grad
                state.add_(grad.square().mean(dim=1, keepdim=True))
                entities.addcdiv_(grad, state.sqrt().add_(eps), value=-lr)
            dense.step()
            total += loss.detach() * heads.shape[0]
        seconds += time.perf_counter() - started
        loss_sum = float(total) / n
    # examples count edges, not reciprocal copies (as cadence's summary does)
    return {"examples_per_second": edges * epochs / seconds, "train_seconds": seconds, "last_epoch_loss": loss_sum}


def part_bare(args: argparse.Namespace) -> dict[str, Any]:
    from cadence.data.datasets import load_graph

    pairs = 1 if args.quick else args.pairs
    settings = [("kinships_distmult_sampled", KINSHIPS_DISTMULT, bare_sampled_distmult, 8 if args.quick else 40),
                ("umls_complex_all_reciprocal", UMLS_COMPLEX, bare_all_complex, 4 if args.quick else 30)]
    out: dict[str, Any] = {}
    for name, setting, bare, epochs in settings:
        say(f"[bare] {name}: {epochs} epochs per measurement, {pairs} interleaved pairs")
        config = cadence_config(setting, epochs, "-", eval_every=0)
        graph = load_graph(config.data, config.seed)
        run_cadence(setting, 2)  # warm-ups, not recorded
        bare(graph.train, graph.num_entities, graph.num_relations, setting, 2)
        records = []
        for rep in range(pairs):
            record: dict[str, Any] = {"gate": GATE.wait()}
            # alternate which contender goes first, so an order effect cancels out across pairs
            for who in (("cadence", "bare") if rep % 2 == 0 else ("bare", "cadence")):
                with Meter() as meter:
                    if who == "cadence":
                        summary = run_cadence(setting, epochs).summary
                        record["cadence"] = summary["examples_per_second"]
                        record["cadence_train_seconds"] = summary["train_seconds"]
                    else:
                        measured = bare(graph.train, graph.num_entities, graph.num_relations, setting, epochs)
                        record["bare"] = measured["examples_per_second"]
                        record["bare_train_seconds"] = measured["train_seconds"]
                        record["bare_last_epoch_loss"] = measured["last_epoch_loss"]
                record[f"{who}_cpu_share"] = meter.cpu_share
            record["ratio"] = record["cadence"] / record["bare"]
            record["uncontended"] = min(record["cadence_cpu_share"], record["bare_cpu_share"]) >= CLEAN_CPU_SHARE
            records.append(record)
            say(f"  pair {rep}: cadence {record['cadence']:,.0f}/s  bare {record['bare']:,.0f}/s  "
                f"ratio {record['ratio']:.3f}  (cpu share {record['cadence_cpu_share']:.2f} / "
                f"{record['bare_cpu_share']:.2f})")
        clean = [r["uncontended"] for r in records]
        cadence_speed, used = clean_median([r["cadence"] for r in records], clean)
        bare_speed, _ = clean_median([r["bare"] for r in records], clean)
        paired, _ = clean_median([r["ratio"] for r in records], clean)
        out[name] = {
            "settings": dict(setting, epochs_per_measurement=epochs, pairs=pairs,
                             train_triples=int(graph.train.shape[0]), entities=graph.num_entities,
                             threads=DEFAULT_THREADS),
            "pairs": records,
            "medians_over": used,
            "cadence_examples_per_second": cadence_speed,
            "bare_examples_per_second": bare_speed,
            "ratio_of_medians": cadence_speed / bare_speed,
            "median_of_paired_ratios": paired,
            "all_pairs_ratio_of_medians": (median([r["cadence"] for r in records])
                                           / median([r["bare"] for r in records])),
        }
    return out


# ---- part 3: store gather/scatter at scale --------------------------------------------------------
def power_law_batches(num_rows: int, batch_triples: int, num_batches: int, negatives: int,
                      seed: int = 0) -> list[torch.Tensor]:
    """Unique row ids per batch: power-law heads and tails (cadence's synthetic generator) plus
    uniformly sampled shared negatives, as a training batch would touch."""
    graph = power_law_graph(SyntheticGraphConfig(num_entities=num_rows, num_relations=1,
                                                 num_edges=batch_triples * num_batches + 2, holdout=1), seed)
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(num_batches):
        triples = graph.train[b * batch_triples:(b + 1) * batch_triples]
        sampled = torch.randint(num_rows, (negatives,), generator=gen)
        batches.append(torch.unique(torch.cat([triples[:, 0], triples[:, 2], sampled])))
    return batches


def time_store(store, batches: list[torch.Tensor]) -> Meter:
    with Meter() as meter:
        for ids in batches:
            block = store.pull(ids)
            store.set(ids, block)
    return meter


def time_ceiling(values: torch.Tensor, state: torch.Tensor, batches: list[torch.Tensor]) -> Meter:
    with Meter() as meter:
        for ids in batches:
            v = torch.index_select(values, 0, ids)
            s = torch.index_select(state, 0, ids)
            values.index_copy_(0, ids, v)
            state.index_copy_(0, ids, s)
    return meter


def _pass_record(meter: Meter, rows: int) -> dict[str, float]:
    return {"rows_per_second": rows / meter.seconds, "seconds": meter.seconds, "cpu_share": meter.cpu_share,
            "user_cpu_s": meter.user, "system_cpu_s": meter.system,
            "minor_faults": meter.minor_faults, "major_faults": meter.major_faults}


def part_store(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        num_rows, dim, batch_triples, num_batches, negatives, pairs = 200_000, 64, 5_000, 10, 1_000, 2
    else:
        num_rows, dim, batch_triples, num_batches, negatives, pairs = (
            2_200_000, 256, 25_000, 40, 1_000, args.pairs)
    state_width = 1
    table_bytes = num_rows * (dim + state_width) * 4
    say(f"[store] {num_rows:,} rows x {dim} float32 (+{state_width} state) = {table_bytes / 2**30:.2f} GiB per "
        f"table; {pairs} interleaved pairs of passes, {num_batches} batches per pass")
    batches = power_law_batches(num_rows, batch_triples, num_batches, negatives)
    sizes = [int(b.shape[0]) for b in batches]
    rows_per_pass = sum(sizes)
    out: dict[str, Any] = {
        "settings": {
            "num_rows": num_rows, "dim": dim, "state_width": state_width,
            "values_plus_state_gib": table_bytes / 2**30, "values_plus_state_gb": table_bytes / 1e9,
            "id_pattern": f"per batch: heads and tails of {batch_triples:,} power-law triples "
                          f"(cadence.data.synthetic.power_law_graph, exponent "
                          f"{SyntheticGraphConfig().exponent}) + {negatives:,} uniform negatives, unique'd",
            "batches_per_pass": num_batches, "ids_per_batch_median": median(sizes),
            "ids_per_batch_min": min(sizes), "ids_per_batch_max": max(sizes),
            "ids_per_pass": rows_per_pass, "pairs": pairs, "threads": DEFAULT_THREADS,
            "timed_operation": "store.pull(ids) then store.set(ids, block): values and state, no versions",
            "ceiling_operation": "torch.index_select + Tensor.index_copy_ on in-memory values and state "
                                 "tensors of the same shape, same ids",
            "mmap_dir": args.mmap_dir or tempfile.gettempdir(),
        }
    }
    gen = torch.Generator().manual_seed(0)
    ceiling_values = torch.empty(num_rows, dim).normal_(0.0, 1e-3, generator=gen)  # touches every page
    ceiling_state = torch.zeros(num_rows, state_width).fill_(0.5)
    time_ceiling(ceiling_values, ceiling_state, batches[:2])  # warm-up
    for backend in ("memory", "mmap"):
        tmp = tempfile.mkdtemp(prefix="cadence-store-bench-", dir=args.mmap_dir) if backend == "mmap" else None
        try:
            started = time.perf_counter()
            store = create_store(num_rows, dim, state_width, backend, str(Path(tmp) / "store") if tmp else None)
            store.initialize(1e-3, 0)
            create_seconds = time.perf_counter() - started
            time_store(store, batches[:2])  # warm-up
            records = []
            for rep in range(pairs):  # interleaved pairs; which one goes first alternates
                record: dict[str, Any] = {"gate": GATE.wait()}
                for who in (("ceiling", "store") if rep % 2 == 0 else ("store", "ceiling")):
                    if who == "ceiling":
                        record["ceiling"] = _pass_record(time_ceiling(ceiling_values, ceiling_state, batches),
                                                         rows_per_pass)
                    else:
                        record["store"] = _pass_record(time_store(store, batches), rows_per_pass)
                record["fraction"] = record["store"]["rows_per_second"] / record["ceiling"]["rows_per_second"]
                # judged by the ceiling pass only: an mmap pass can sit below 1 on its own account
                # (threads blocked in page faults while the kernel writes dirty pages back)
                record["uncontended"] = record["ceiling"]["cpu_share"] >= CLEAN_CPU_SHARE
                records.append(record)
                say(f"  {backend} pair {rep}: store {record['store']['rows_per_second']:,.0f} rows/s  "
                    f"ceiling {record['ceiling']['rows_per_second']:,.0f} rows/s  ({record['fraction']:.0%}; "
                    f"cpu share {record['store']['cpu_share']:.2f} / {record['ceiling']['cpu_share']:.2f}; "
                    f"store faults {record['store']['minor_faults']:,})")
            flush_seconds = None
            if backend == "mmap":
                started = time.perf_counter()
                store.flush()
                flush_seconds = time.perf_counter() - started
            clean = [r["uncontended"] for r in records]
            store_speed, used = clean_median([r["store"]["rows_per_second"] for r in records], clean)
            ceiling_speed, _ = clean_median([r["ceiling"]["rows_per_second"] for r in records], clean)
            paired, _ = clean_median([r["fraction"] for r in records], clean)
            out[backend] = {
                "medians_over": used,
                "rows_per_second": store_speed,
                "ceiling_rows_per_second": ceiling_speed,
                "fraction_of_ceiling": store_speed / ceiling_speed,
                "median_paired_fraction": paired,
                "pairs": records,
                "create_and_initialize_seconds": create_seconds,
                **({"flush_seconds_after_benchmark": flush_seconds} if flush_seconds is not None else {}),
            }
            del store
            gc.collect()
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    del ceiling_values, ceiling_state
    gc.collect()
    return out


# ---- driver --------------------------------------------------------------------------------------
PART_FUNCTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "pykeen": part_pykeen, "bare": part_bare, "store": part_store,
}


def headline(parts: dict[str, Any]) -> dict[str, Any]:
    h: dict[str, Any] = {}
    p = parts.get("pykeen", {}).get("result", {})
    if "throughput_ratio" in p:
        tt = p["time_to_target"]
        h["pykeen"] = {
            "cadence_positives_per_second": p["cadence"]["examples_per_second"],
            "pykeen_positives_per_second": p["pykeen"]["positives_per_second"],
            "throughput_ratio": p["throughput_ratio"],
            "median_epoch_throughput_ratio": p["median_epoch_throughput_ratio"],
            "goal": "throughput_ratio >= 10",
            "target_mrr": tt["target_mrr"],
            "seconds_to_target_pykeen": tt["pykeen"]["train_seconds"],
            "seconds_to_target_cadence": tt["cadence"]["train_seconds"],
            "time_to_target_speedup": tt.get("speedup_train_seconds"),
            "time_to_target_speedup_estimated": tt.get("speedup_estimated_seconds"),
            "epochs_to_target_pykeen_cadence": [tt["pykeen"]["epochs"], tt["cadence"]["epochs"]],
        }
    elif p:
        h["pykeen"] = p.get("pykeen")
    b = parts.get("bare", {}).get("result", {})
    for name, entry in b.items():
        h[f"bare_{name}"] = {"ratio_of_medians": entry["ratio_of_medians"],
                             "median_of_paired_ratios": entry["median_of_paired_ratios"],
                             "over": entry["medians_over"], "goal": ">= 0.9"}
    s = parts.get("store", {}).get("result", {})
    for backend in ("memory", "mmap"):
        if backend in s:
            h[f"store_{backend}"] = {"rows_per_second": s[backend]["rows_per_second"],
                                     "fraction_of_ceiling": s[backend]["fraction_of_ceiling"],
                                     "median_paired_fraction": s[backend]["median_paired_fraction"],
                                     "over": s[backend]["medians_over"], "goal": ">= 0.5"}
    return h


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test in well under a minute")
    parser.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable)")
    parser.add_argument("--reps", type=int, default=3, help="part 1: interleaved cadence/PyKEEN repetitions")
    parser.add_argument("--pairs", type=int, default=7,
                        help="parts 2 and 3: interleaved (contender, reference) measurement pairs")
    parser.add_argument("--max-wait", type=float, default=None,
                        help="total seconds to wait for other processes to go idle before measurements "
                             "(default 150, 0 with --quick)")
    parser.add_argument("--mmap-dir", default=None, help="where the mmap table goes (default: the temp dir)")
    parser.add_argument("--out", default=None, help="result JSON (default: benchmarks/results/...)")
    add_flag(parser)
    args = parser.parse_args(argv)
    check(args)
    logging.getLogger("cadence").setLevel(logging.WARNING)
    GATE.budget_s = args.max_wait if args.max_wait is not None else (0.0 if args.quick else 150.0)

    out_path = Path(args.out) if args.out else RESULTS_DIR / (
        "kge_throughput-quick.json" if args.quick else "kge_throughput.json")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/kge_throughput.py", *sys.argv[1:]])
    previous: dict[str, Any] = {}
    if args.only and out_path.exists():
        previous = json.loads(out_path.read_text())
    parts: dict[str, Any] = dict(previous.get("parts", {}))
    machine_at_start = machine_info()
    started_all = time.perf_counter()
    for name in args.only or PARTS:
        waited = GATE.waited_s
        record: dict[str, Any] = {"started_at": now(), "command": command, "quick": args.quick,
                                  "loadavg_before": loadavg()}
        started = time.perf_counter()
        record["result"] = PART_FUNCTIONS[name](args)
        record["wall_seconds"] = time.perf_counter() - started
        record["waited_for_quiet_seconds"] = GATE.waited_s - waited
        record["loadavg_after"] = loadavg()
        parts[name] = record
    report = {
        "benchmark": "cadence KGE training throughput (benchmarks/kge_throughput.py)",
        "date": now(),
        "command": command,
        "interpreter": sys.executable,
        "machine": machine_at_start,
        "src_changed_during_run": src_fingerprint() != machine_at_start["src_sha256"],
        "wall_seconds": time.perf_counter() - started_all,
        "headline": headline(parts),
        "parts": {k: parts[k] for k in PARTS if k in parts},
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(stamp(report), indent=2) + "\n")
    say(f"wrote {out_path.relative_to(REPO) if out_path.is_relative_to(REPO) else out_path}")
    say(json.dumps(report["headline"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
