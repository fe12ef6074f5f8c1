#!/usr/bin/env python
"""cadence's DeepFM vs a peer's DeepFM (DeepCTR-Torch 0.3.0, or TorchRec 1.9.2) on MovieLens-100k CTR, side by side in one invocation.

    .venv/bin/python benchmarks/ctr_vs_deepctr.py [--peer deepctr|torchrec] [--quick] [--seeds N] [--max-wait S] [--out FILE]

``--peer torchrec`` runs ``benchmarks/peers/torchrec_contender.py`` in ``.venv-bench-torchrec`` (its
docstring: TorchRec's ``FusedEmbeddingBagCollection`` with fbgemm's row-wise Adagrad fused into the
backward pass, the same DeepFM and optimizers) in the peer's place below; it takes the same flags
and prints the same JSON, and the result goes to ``ctr_vs_torchrec.json``. The peer's contender
names are ``deepctr`` / ``torchrec`` (and ``*_1_thread``).

For each seed s (0, 1, 2; ``--quick``: seed 0 and 2 epochs) cadence's CTR split is exported with
``benchmarks/ctr_split_export.py --seed s`` (exactly the ``random_split(s)`` that ``task: ctr``
trains on), and three contenders train with ``configs/ml100k-deepfm.yaml``'s setting (dim 16,
MLP 64,32, dropout 0.2, init std 0.001, row-wise Adagrad 0.05 on embedding rows + Adam 0.001 on
the dense part, 8 epochs, global batch 1024), each in a fresh process with 2 threads:

- ``cadence_ps``: the config as shipped (strategy ``sync`` on the parameter server, 4 workers x
  256), ``.venv/bin/cadence train --config ... --seed s --set threads=2``;
- ``cadence_pipeline``: the same with ``--workers 1 --set train.batch_size=1024``: one worker, so
  ``sync`` runs on the one-process pipeline, same global batch and math;
- ``deepctr``: ``benchmarks/peers/deepctr_contender.py --optimizer cadence`` in ``.venv-bench-deepctr``
  on the exported split (its docstring lists what still differs from cadence), batch 1024, seed s.

Both cadence runs use ``checkpoint.every=0`` (no checkpoint files; neither the model nor
``train_seconds`` changes). Speed is examples/s of training only: cadence's
``examples_per_second`` (evaluation excluded), DeepCTR's train examples x epochs / seconds in
``fit``. The contenders run interleaved, cadence, deepctr, cadence (reversed every other seed),
so a ratio compares runs made seconds apart. The machine is shared: before each run the script
waits (within ``--max-wait`` seconds in all) for the CPUs to go idle and records the share of the
CPUs other processes used *during* the run; a seed is uncontended when that share stayed under
``CLEAN_OTHERS_SHARE`` for all its runs.

A 2-thread torch process loses most of its speed when another process holds one of the 2 cores
(OpenMP threads wait on each other at every parallel region), so after the three 2-thread runs each
seed also runs the same three with 1 thread (``*_1_thread``, cheap): a ratio that moves far between
the two groups was made under contention.

Results: per seed, means with 95% t-intervals over seeds, per-seed AUC gaps (cadence - deepctr),
per-seed examples/s ratios (cadence / deepctr) and their medians, machine info and the command, in
``benchmarks/results/ctr_vs_deepctr.json`` (``ctr_vs_deepctr_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from provenance import check  # same folder: every result traces to a commit

from kge_throughput import QuietGate, loadavg, machine_info  # same folder: the shared machine record
from peer_stats import OthersMeter, mean_ci, peer_parser, peer_run, write_report

from cadence.config import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "ml100k-deepfm.yaml"
CADENCE_PYTHON = REPO / ".venv" / "bin" / "python"
CADENCE_CLI = REPO / ".venv" / "bin" / "cadence"
EXPORTER = REPO / "benchmarks" / "ctr_split_export.py"
PEER_NAMES = {"deepctr": "DeepCTR-Torch 0.3.0", "torchrec": "TorchRec 1.9.2"}
# per peer: its virtualenv's python and its contender script (same flags, same JSON)
PEERS = {peer: (REPO / f".venv-bench-{peer}" / "bin" / "python", REPO / "benchmarks" / "peers" / f"{peer}_contender.py")
         for peer in ("deepctr", "torchrec")}

THREADS = 2
QUICK_EPOCHS = 2
RUN_TIMEOUT_S = 3600
CLEAN_OTHERS_SHARE = 0.15  # a run during which other processes used more of the CPUs counts as contended
# two-sided 95% quantiles of Student's t by degrees of freedom (no scipy in .venv)
METRICS = ("auc", "logloss", "examples_per_second")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def relative(text: str) -> str:
    return text.replace(str(REPO) + "/", "")


def run(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise SystemExit(f"{relative(' '.join(command))} exited {done.returncode}: {tail}")
    return done


# ---- the setting, read from the config so that the contenders cannot drift apart -----------------
def shared_setting(epochs: int | None) -> dict[str, Any]:
    config = load_config(CONFIG, [])
    if (config.optimizer.entity, config.optimizer.dense) != ("rowwise_adagrad", "adam"):
        raise SystemExit(f"{CONFIG.name}: expected rowwise_adagrad + adam (deepctr_contender --optimizer cadence)")
    return {"dim": config.model.dim, "hidden": list(config.ctr.hidden), "dropout": config.ctr.dropout,
            "init_std": config.model.init_std, "lr": config.optimizer.lr, "dense_lr": config.optimizer.dense_lr,
            "epochs": epochs or config.train.epochs, "workers": config.ps.workers,
            "local_batch": config.train.batch_size,
            "global_batch": config.ps.workers * config.train.batch_size, "strategy": config.strategy}


# ---- data ----------------------------------------------------------------------------------------
def export_split(seed: int, directory: Path) -> dict[str, Any]:
    run([str(CADENCE_PYTHON), str(EXPORTER), "--out", str(directory), "--seed", str(seed)])
    meta = json.loads((directory / "meta.json").read_text())
    hashes = {f"{name}_sha256": hashlib.sha256((directory / f"{name}.npz").read_bytes()).hexdigest()[:16]
              for name in ("train", "valid", "test")}
    return {"sizes": meta["sizes"], "positive_rate": meta["positive_rate"], "vocab_sizes": meta["vocab_sizes"],
            **hashes}


# ---- contenders ----------------------------------------------------------------------------------
def cadence_command(seed: int | str, threads: int, out: Path, setting: dict[str, Any], pipeline: bool,
                    quick: bool) -> list[str]:
    command = [str(CADENCE_CLI), "train", "--config", str(CONFIG), "--set", f"seed={seed}",
               "--set", f"threads={threads}", "--set", "checkpoint.every=0", "--no-progress",
               "--out", str(out), "--overwrite"]
    if pipeline:
        command += ["--workers", "1", "--set", f"train.batch_size={setting['global_batch']}"]
    if quick:
        command += ["--epochs", str(setting["epochs"])]
    return command


def run_cadence(seed: int, threads: int, out: Path, setting: dict[str, Any], pipeline: bool,
                quick: bool) -> dict[str, Any]:
    run(cadence_command(seed, threads, out, setting, pipeline, quick))
    summary = json.loads((out / "summary.json").read_text())
    expected = "pipeline" if pipeline else "parameter_server"
    if summary["runtime"] != expected:
        raise SystemExit(f"cadence ran on the {summary['runtime']} runtime, expected {expected}")
    return {"auc": summary["auc"], "logloss": summary["logloss"],
            "examples_per_second": summary["examples_per_second"], "train_seconds": summary["train_seconds"],
            "epochs": summary["epochs"], "examples_seen": summary["examples_seen"], "runtime": summary["runtime"],
            "workers": summary.get("workers", 1), "global_steps": summary.get("global_steps"),
            "best_valid_auc_over_epochs": summary["best_valid_auc"], "threads": threads}


def peer_command(peer: str, split: Path | str, seed: int | str, threads: int, setting: dict[str, Any]) -> list[str]:
    python, contender = PEERS[peer]
    return [str(python), str(contender), "--data", str(split), "--dim", str(setting["dim"]),
            "--hidden", ",".join(map(str, setting["hidden"])), "--dropout", str(setting["dropout"]),
            "--epochs", str(setting["epochs"]), "--batch-size", str(setting["global_batch"]),
            "--optimizer", "cadence", "--lr", str(setting["lr"]), "--dense-lr", str(setting["dense_lr"]),
            "--init-std", str(setting["init_std"]), "--seed", str(seed), "--threads", str(threads)]


def run_peer(peer: str, split: Path, seed: int, threads: int, setting: dict[str, Any]) -> dict[str, Any]:
    result = json.loads(run(peer_command(peer, split, seed, threads, setting)).stdout)
    return {"auc": result["auc"], "logloss": result["logloss"], "examples_per_second": result["examples_per_second"],
            "train_seconds": result["train_seconds"], "epochs": result["settings"]["epochs"],
            "examples_seen": result["train_examples"] * result["settings"]["epochs"],
            "valid_auc_last_epoch": result["valid_auc"], "train_loss_per_epoch": result["train_loss_per_epoch"],
            "threads": result["threads"], "versions": result["versions"]}


# ---- driver --------------------------------------------------------------------------------------
def groups(peer: str) -> dict[str, tuple[tuple[str, str], str]]:
    """Per group: (cadence contenders, the peer's contender they are divided by)."""
    return {"2_threads": (("cadence_ps", "cadence_pipeline"), peer),
            "1_thread": (("cadence_ps_1_thread", "cadence_pipeline_1_thread"), f"{peer}_1_thread")}


def contenders(peer: str, work: Path, splits: dict[int, Path], setting: dict[str, Any],
               quick: bool) -> dict[str, Callable[[int], dict[str, Any]]]:
    table: dict[str, Callable[[int], dict[str, Any]]] = {}
    for threads, suffix in ((THREADS, ""), (1, "_1_thread")):
        table[f"cadence_ps{suffix}"] = lambda s, t=threads, n=f"ps{suffix}": run_cadence(
            s, t, work / f"cadence-{n}-{s}", setting, False, quick)
        table[f"{peer}{suffix}"] = lambda s, t=threads: run_peer(peer, splits[s], s, t, setting)
        table[f"cadence_pipeline{suffix}"] = lambda s, t=threads, n=f"pipeline{suffix}": run_cadence(
            s, t, work / f"cadence-{n}-{s}", setting, True, quick)
    return table


def run_seed(peer: str, seed: int, index: int, runners: dict[str, Callable[[int], dict[str, Any]]],
             gate: QuietGate) -> dict[str, Any]:
    record: dict[str, Any] = {"seed": seed, "order": [], "contenders": {}}
    for cadence_names, peer_name in groups(peer).values():
        first, second = cadence_names if index % 2 == 0 else cadence_names[::-1]
        for name in (first, peer_name, second):  # the peer between the two cadence runs
            waited, load = gate.wait(), loadavg()
            with OthersMeter() as meter:
                result = runners[name](seed)
            result.update(gate=waited, loadavg_before=load, others_cpu_share_during=round(meter.share, 3))
            record["order"].append(name)
            record["contenders"][name] = result
            say(f"seed {seed} {name:26s} auc {result['auc']:.4f}  logloss {result['logloss']:.4f}  "
                f"{result['examples_per_second']:>9,.0f} examples/s  (others used {meter.share:.0%} of the CPUs)")
    for group, (cadence_names, peer_name) in groups(peer).items():
        names = (*cadence_names, peer_name)
        record[f"uncontended_{group}"] = all(record["contenders"][n]["others_cpu_share_during"] < CLEAN_OTHERS_SHARE
                                             for n in names)
    speed = {name: result["examples_per_second"] for name, result in record["contenders"].items()}
    record["ratios"] = {f"{c}_over_{d}": speed[c] / speed[d] for cs, d in groups(peer).values() for c in cs}
    record["ratios"]["cadence_pipeline_over_cadence_ps"] = speed["cadence_pipeline"] / speed["cadence_ps"]
    record["ratios"]["cadence_pipeline_1_thread_over_cadence_pipeline"] = (
        speed["cadence_pipeline_1_thread"] / speed["cadence_pipeline"])
    record["ratios"][f"{peer}_1_thread_over_{peer}"] = speed[f"{peer}_1_thread"] / speed[peer]
    return record


def summarize(peer: str, per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(per_seed[0]["contenders"])
    table: dict[str, Any] = {name: {metric: mean_ci([s["contenders"][name][metric] for s in per_seed])
                                    for metric in METRICS} for name in names}
    for group, (cadence_names, peer_name) in groups(peer).items():
        for name in cadence_names:
            # paired by seed: the split's own difficulty cancels out
            gaps = [s["contenders"][name]["auc"] - s["contenders"][peer_name]["auc"] for s in per_seed]
            table[f"auc_{name}_minus_{peer_name}"] = mean_ci(gaps)
            ratios = [s["ratios"][f"{name}_over_{peer_name}"] for s in per_seed]
            clean = [r for r, s in zip(ratios, per_seed) if s[f"uncontended_{group}"]]
            table[f"speed_ratio_{name}_over_{peer_name}"] = {
                "per_seed": ratios, "median": statistics.median(ratios),
                "median_uncontended": statistics.median(clean) if clean else None, "uncontended_seeds": len(clean)}
    for key in ("cadence_pipeline_over_cadence_ps", "cadence_pipeline_1_thread_over_cadence_pipeline",
                f"{peer}_1_thread_over_{peer}"):
        ratios = [s["ratios"][key] for s in per_seed]
        table[f"speed_ratio_{key}"] = {"per_seed": ratios, "median": statistics.median(ratios)}
    return table


def settings_record(peer: str, setting: dict[str, Any], quick: bool) -> dict[str, Any]:
    def shown(command: list[str]) -> str:
        return relative(" ".join(shlex.quote(a) for a in command))

    return {
        "shared": setting,
        "cadence_ps": shown(cadence_command("SEED", THREADS, Path("RUN_DIR"), setting, False, quick)),
        "cadence_pipeline": shown(cadence_command("SEED", THREADS, Path("RUN_DIR"), setting, True, quick)),
        peer: shown(peer_command(peer, "SPLIT_DIR", "SEED", THREADS, setting)),
        "split": shown([str(CADENCE_PYTHON), str(EXPORTER), "--out", "SPLIT_DIR", "--seed", "SEED"]),
        "1_thread_twins": "the same commands with threads=1 / --threads 1",
        "speed": "examples/s of training only (cadence examples_per_second, evaluation excluded; the peer: "
                 "train examples x epochs / seconds of its training loop, DeepCTR's fit)",
        "auc_logloss": "test split after the last epoch (cadence: its own evaluation; DeepCTR: sklearn "
                       "roc_auc_score / log_loss on model.predict; TorchRec: the contender's rank AUC and log loss)",
    }


def print_table(report: dict[str, Any]) -> None:
    summary = report["summary"]
    for name in report["per_seed"][0]["contenders"]:
        row = summary[name]
        say(f"{name:26s} " + "  ".join(
            f"{metric} {row[metric]['mean']:.4g}"
            + (f" ± {row[metric]['half_width']:.2g}" if row[metric]["half_width"] is not None else "")
            for metric in METRICS))
    for key, value in summary.items():
        if key.startswith("auc_"):
            say(f"{key}: {value['mean']:+.4f}" + (f" ± {value['half_width']:.4f}" if value["half_width"] is not None
                                                  else "") + f"  per seed {[round(g, 4) for g in value['per_seed']]}")
        if key.startswith("speed_ratio"):
            say(f"{key}: median {value['median']:.3f}  per seed {[round(r, 3) for r in value['per_seed']]}")


def main(argv: list[str] | None = None) -> int:
    parser = peer_parser(__doc__, f"1 seed, {QUICK_EPOCHS} epochs", 3, "total seconds to wait for other processes "
                         "to go idle before runs (default 300, 0 with --quick)")
    parser.add_argument("--peer", choices=sorted(PEERS), default="deepctr",
                        help="the library cadence is timed against (default deepctr)")
    args = parser.parse_args(argv)
    check(args)
    peer = args.peer
    seeds, out_path, command = peer_run(args, f"ctr_vs_{peer}", 3)
    if not PEERS[peer][0].exists():
        raise SystemExit(f"{relative(str(PEERS[peer][0]))} is missing: see benchmarks/peers/requirements-{peer}.txt")
    setting = shared_setting(QUICK_EPOCHS if args.quick else None)
    gate = QuietGate(args.max_wait if args.max_wait is not None else (0.0 if args.quick else 300.0))
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": f"cadence DeepFM vs {PEER_NAMES[peer]} DeepFM on MovieLens-100k CTR (benchmarks/ctr_vs_deepctr.py)",
        "peer": peer,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command, "quick": args.quick, "machine": machine_info(), "seeds": seeds,
        "settings": settings_record(peer, setting, args.quick)}
    with tempfile.TemporaryDirectory(prefix="cadence-ctr-bench-") as scratch:
        work = Path(scratch)
        splits = {seed: work / f"split-{seed}" for seed in seeds}
        report["splits"] = {seed: export_split(seed, path) for seed, path in splits.items()}
        runners = contenders(peer, work, splits, setting, args.quick)
        per_seed = [run_seed(peer, seed, index, runners, gate) for index, seed in enumerate(seeds)]
    report["versions"] = {peer: per_seed[0]["contenders"][peer]["versions"],
                          "cadence": report["machine"].get("cadence_version"),
                          "torch": report["machine"].get("torch_version")}
    report["summary"] = summarize(peer, per_seed)
    report["per_seed"] = per_seed
    say(f"wrote {relative(str(write_report(report, out_path, started, gate.waited_s)))}")
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
