#!/usr/bin/env python
"""cadence's biased MF vs scikit-surprise 1.1.5 ``SVD`` on MovieLens-100k, side by side in one invocation.

    .venv/bin/python benchmarks/mf_vs_surprise.py [--quick] [--seeds N] [--max-wait S] [--out FILE]
        [--synthetic USERS,ITEMS,RATINGS] [--rating-config FILE] [--contenders NAME,...]

For each seed, cadence's own split (``RatingDataset.random_split(seed)``: train 80% / valid 10% /
test 10%) is written to TSV files, and every contender trains on that train part and is scored on
that test part, each in a fresh process:

- ``cadence``: ``configs/ml100k-mf.yaml`` with that seed and ``threads=2``, through the CLI of
  ``.venv`` (cadence trains on the same ``random_split(seed)`` of ml-100k; checkpoints off, which
  changes neither the model nor the timing: ``train_seconds`` excludes evaluation and checkpoints);
- ``cadence_1_thread``: the same with ``threads=1``, Surprise's thread count;
- ``cadence_rating``: ``configs/ml100k-mf-rating.yaml``, Surprise's own loop (``mf.update: rating``:
  per-rating SGD in place, Hogwild on 2 threads) with the setting the search below picks for
  ``surprise_tuned`` (128 factors, 80 epochs, lr 0.005, reg 0.1), ``threads=2``;
- ``surprise_default``: ``SVD()`` defaults (100 factors, 20 epochs, lr 0.005, reg 0.02, init std 0.1)
  through ``benchmarks/peers/surprise_contender.py`` in ``.venv-bench-surprise``;
- ``surprise_tuned``: ``SVD`` with cadence-like capacity (128 factors, heavier L2, more epochs): lr,
  reg and epochs picked by RMSE on the *validation* part of the first seed (never on test), then
  kept for every seed. ``--quick`` skips the search and uses ``TUNED_FALLBACK``.

``--synthetic U,I,R``: instead of ML-100k, each seed's ``synthetic-zipf`` matrix of that size
(``cadence.data.ratings.synthetic_zipf``: Zipf-skewed users and items, planted low-rank ratings; the
seed draws the matrix and its split, and cadence generates the same one from ``--set
data.dataset=synthetic-zipf --set mf.synthetic.*``), contenders ``cadence``, ``cadence_rating`` and
``surprise_default`` only (no search), results in ``mf_vs_surprise_synthetic.json``;
``cadence_rating`` there runs ``configs/zipf-mf-rating.yaml`` (the rating loop with a setting picked
on the 10M-rating matrix's validation part, not ML-100k's).

``--rating-config FILE``: ``cadence_rating``'s config instead. ``--contenders a,b``: run only those
(default: every contender of the setting).

Contenders run interleaved (the order reverses every other seed), so a speed ratio compares runs made
seconds apart on the same machine. The machine is shared: before each run the script waits (within
``--max-wait`` seconds in all) for other processes to leave the CPUs idle, records the share of the
CPUs other processes used *during* the run, and calls a seed uncontended when that share stayed
under ``CLEAN_OTHERS_SHARE`` for all its runs; ratios are given over all seeds and over those.

Speed is ratings/s of training alone: cadence's
``examples_per_second`` (ratings x epochs / seconds in the epochs), Surprise's ratings x epochs /
seconds in ``fit``. Results: per seed, mean with a 95% t-interval over seeds, the per-seed ratios
of cadence's ratings/s to Surprise's and their median, in ``benchmarks/results/mf_vs_surprise.json``
(``mf_vs_surprise_quick.json`` with ``--quick``).
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
from typing import Any

from provenance import check  # same folder: every result traces to a commit

from kge_throughput import QuietGate, loadavg, machine_info  # same folder: the shared machine record
from peer_stats import OthersMeter, mean_ci, peer_parser, peer_run, write_report

from cadence.task_config import SyntheticRatingsConfig
from cadence.data.ratings import RatingDataset, Ratings, load_rating_dataset

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "ml100k-mf.yaml"
RATING_CONFIG = REPO / "configs" / "ml100k-mf-rating.yaml"
SYNTHETIC_RATING_CONFIG = REPO / "configs" / "zipf-mf-rating.yaml"
CADENCE_CONTENDERS = ("cadence", "cadence_1_thread", "cadence_rating")
CADENCE_CLI = REPO / ".venv" / "bin" / "cadence"
SURPRISE_PYTHON = REPO / ".venv-bench-surprise" / "bin" / "python"
SURPRISE_CONTENDER = REPO / "benchmarks" / "peers" / "surprise_contender.py"

SURPRISE_DEFAULT = {"factors": 100, "epochs": 20, "lr": 0.005, "reg": 0.02, "init_std": 0.1}
TUNED_GRID = {"factors": [128], "epochs": [40, 80], "lr": [0.005, 0.01], "reg": [0.05, 0.1, 0.15], "init_std": [0.1]}
TUNED_FALLBACK = {"factors": 128, "epochs": 80, "lr": 0.005, "reg": 0.1, "init_std": 0.1}
CLEAN_OTHERS_SHARE = 0.15  # a run during which other processes used more of the CPUs counts as contended
QUICK_EPOCHS = {"cadence": 4, "cadence_rating": 8, "surprise_default": 5, "surprise_tuned": 10}
# two-sided 95% quantiles of Student's t by degrees of freedom (no scipy in .venv)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_tsv(path: Path, dataset: RatingDataset, part: Ratings) -> None:
    """``raw user id<TAB>raw item id<TAB>rating`` lines: Surprise maps raw ids itself."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(f"{dataset.user_ids[u]}\t{dataset.item_ids[i]}\t{r:g}\n" for u, i, r in
                          zip(part.users.tolist(), part.items.tolist(), part.values.tolist()))


def write_split(dataset: RatingDataset, seed: int, directory: Path) -> dict[str, Any]:
    directory.mkdir(parents=True)
    train, valid, test = dataset.random_split(seed)
    info: dict[str, Any] = {}
    for name, part in (("train", train), ("valid", valid), ("test", test)):
        write_tsv(directory / f"{name}.tsv", dataset, part)
        info[f"{name}_ratings"] = len(part)
        info[f"{name}_sha256"] = hashlib.sha256((directory / f"{name}.tsv").read_bytes()).hexdigest()[:16]
    seen_users, seen_items = set(train.users.tolist()), set(train.items.tolist())
    # Surprise predicts these from the global mean and the known side's bias; cadence from rows
    # that kept their random initialization
    info["test_ratings_with_user_or_item_unseen_in_train"] = sum(
        u not in seen_users or i not in seen_items for u, i in zip(test.users.tolist(), test.items.tolist()))
    return info


# ---- contenders ----------------------------------------------------------------------------------
def cadence_command(seed: int | str, threads: int, out: Path, quick: bool, config: Path = CONFIG,
                    data: tuple[str, ...] = ()) -> list[str]:
    command = [str(CADENCE_CLI), "train", "--config", str(config), "--seed", str(seed), "--set", f"threads={threads}",
               "--set", "checkpoint.every=0", "--no-progress", "--out", str(out), "--overwrite", *data]
    if quick:
        epochs = QUICK_EPOCHS["cadence" if config == CONFIG else "cadence_rating"]
        command += ["--epochs", str(epochs), "--set", f"eval.every={epochs}"]
    return command


def run_cadence(seed: int, threads: int, out: Path, quick: bool, config: Path = CONFIG,
                data: tuple[str, ...] = ()) -> dict[str, Any]:
    subprocess.run(cadence_command(seed, threads, out, quick, config, data), check=True, capture_output=True,
                   text=True)
    summary = json.loads((out / "summary.json").read_text())
    return {"rmse": summary["rmse"], "mae": summary["mae"], "ratings_per_second": summary["examples_per_second"],
            "train_seconds": summary["train_seconds"], "epochs": summary["epochs"], "threads": threads,
            "best_valid_rmse": summary["best_valid_rmse"]}


def surprise_command(split: Path, test: str, seed: int, settings: dict[str, Any]) -> list[str]:
    return [str(SURPRISE_PYTHON), str(SURPRISE_CONTENDER), "--train", str(split / "train.tsv"),
            "--test", str(split / f"{test}.tsv"), "--seed", str(seed),
            "--factors", str(settings["factors"]), "--epochs", str(settings["epochs"]), "--lr", str(settings["lr"]),
            "--reg", str(settings["reg"]), "--init-std", str(settings["init_std"])]


def run_surprise(split: Path, seed: int, settings: dict[str, Any], test: str = "test") -> dict[str, Any]:
    done = subprocess.run(surprise_command(split, test, seed, settings), check=True, capture_output=True, text=True)
    result = json.loads(done.stdout)
    return {"rmse": result["rmse"], "mae": result["mae"], "ratings_per_second": result["ratings_per_second"],
            "train_seconds": result["fit_seconds"], "epochs": result["epochs"], "threads": 1,
            "settings": settings, "versions": result["versions"]}


def tune_surprise(split: Path, seed: int) -> dict[str, Any]:
    """The grid point with the lowest validation RMSE on ``split`` (the first seed's)."""
    keys = list(TUNED_GRID)
    points = [dict(zip(keys, values)) for values in _product([TUNED_GRID[k] for k in keys])]
    scan = []
    for settings in points:
        scan.append({**settings, "valid_rmse": run_surprise(split, seed, settings, test="valid")["rmse"]})
        say(f"  tune {settings}: valid rmse {scan[-1]['valid_rmse']:.4f}")
    best = min(scan, key=lambda row: row["valid_rmse"])
    return {"chosen": {k: best[k] for k in keys}, "chosen_on": f"valid part of seed {seed}", "scan": scan}


def _product(lists: list[list[Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for values in lists:
        out = [prefix + (v,) for prefix in out for v in values]
    return out


# ---- driver --------------------------------------------------------------------------------------
def summarize(per_seed: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for name in names:
        table[name] = {metric: mean_ci([seed["contenders"][name][metric] for seed in per_seed])
                       for metric in ("rmse", "mae", "ratings_per_second")}
    for name in names:
        if name.startswith("surprise"):
            # paired by seed: the split's own difficulty (it moves RMSE by ~0.03) cancels out
            for metric in ("rmse", "mae"):
                for who in ("cadence", "cadence_rating"):
                    if who not in names:
                        continue
                    gaps = [seed["contenders"][who][metric] - seed["contenders"][name][metric] for seed in per_seed]
                    table[f"{metric}_{who}_minus_{name}"] = {**mean_ci(gaps), "per_seed": gaps}
            for who in (who for who in CADENCE_CONTENDERS if who in names):
                ratios = [seed["ratios"][f"{who}_over_{name}"] for seed in per_seed]
                clean = [r for r, seed in zip(ratios, per_seed) if seed["uncontended"]]
                table[f"speed_ratio_{who}_over_{name}"] = {
                    **mean_ci(ratios), "per_seed": ratios, "median": statistics.median(ratios),
                    "median_uncontended": statistics.median(clean) if clean else None,
                    "uncontended_seeds": len(clean)}
    return table


def run_seed(seed: int, order: list[str], contenders: dict[str, Any], gate_keeper: QuietGate) -> dict[str, Any]:
    """One seed: every contender in ``order``, each after the quiet gate, then the speed ratios."""
    record: dict[str, Any] = {"seed": seed, "order": order, "contenders": {}}
    for name in order:
        gate, load = gate_keeper.wait(), loadavg()
        with OthersMeter() as meter:
            result = contenders[name](seed)
        result.update(gate=gate, loadavg_before=load, others_cpu_share_during=round(meter.share, 3))
        record["contenders"][name] = result
        say(f"seed {seed} {name}: rmse {result['rmse']:.4f}  mae {result['mae']:.4f}  "
            f"{result['ratings_per_second']:,.0f} ratings/s  (others used {meter.share:.0%} of the CPUs)")
    speeds = {name: result["ratings_per_second"] for name, result in record["contenders"].items()}
    record["uncontended"] = all(result["others_cpu_share_during"] < CLEAN_OTHERS_SHARE
                                for result in record["contenders"].values())
    record["ratios"] = {f"{who}_over_{name}": speeds[who] / speeds[name]
                        for who in CADENCE_CONTENDERS if who in speeds for name in speeds if name.startswith("surprise")}
    return record


def print_summary(summary: dict[str, Any], names: list[str]) -> None:
    def pm(entry: dict[str, Any], digits: str) -> str:
        half = entry["half_width"]
        return f"{entry['mean']:{digits}}" + (f" ± {half:.2g}" if half is not None else "")

    for name in names:
        say(f"{name:18s} " + "  ".join(f"{metric} {pm(summary[name][metric], '.4g')}" for metric in summary[name]))
    for key, value in summary.items():
        if key.startswith(("rmse_", "mae_")):
            say(f"{key}: {pm(value, '+.4f')}  per seed {[round(g, 4) for g in value['per_seed']]}")
        if key.startswith("speed_ratio"):
            say(f"{key}: median {value['median']:.3f} (uncontended: {value['median_uncontended']})  "
                f"per seed {[round(r, 3) for r in value['per_seed']]}")


def synthetic_sizes(text: str) -> SyntheticRatingsConfig:
    try:
        users, items, ratings = (int(part) for part in text.split(","))
    except ValueError:
        raise SystemExit(f"mf_vs_surprise.py: --synthetic takes USERS,ITEMS,RATINGS, got {text!r}") from None
    return SyntheticRatingsConfig(users=users, items=items, ratings=ratings)


def main(argv: list[str] | None = None) -> int:
    parser = peer_parser(__doc__, "1 seed, a few epochs, no tuning search", 3, "total seconds to wait for other "
                         "processes to go idle before runs (default 300, 0 with --quick)")
    parser.add_argument("--synthetic", metavar="USERS,ITEMS,RATINGS",
                        help="each seed's synthetic-zipf matrix of that size instead of ML-100k")
    parser.add_argument("--rating-config", type=Path, default=None,
                        help="cadence_rating's config (default configs/ml100k-mf-rating.yaml; with --synthetic "
                             "configs/zipf-mf-rating.yaml)")
    parser.add_argument("--contenders", default=None, help="comma-separated: run only these contenders")
    args = parser.parse_args(argv)
    check(args)
    sizes = synthetic_sizes(args.synthetic) if args.synthetic else None
    rating_config = (args.rating_config.resolve() if args.rating_config
                     else SYNTHETIC_RATING_CONFIG if sizes is not None else RATING_CONFIG)
    if not rating_config.is_file():
        raise SystemExit(f"mf_vs_surprise.py: --rating-config {args.rating_config}: no such file")
    if sizes is not None and args.out is None:
        args.out = str(Path(__file__).resolve().parent / "results" /
                       f"mf_vs_surprise_synthetic{'_quick' if args.quick else ''}.json")
    seeds, out_path, command = peer_run(args, "mf_vs_surprise", 3)
    if not SURPRISE_PYTHON.exists():
        raise SystemExit(f"{SURPRISE_PYTHON} is missing: see benchmarks/peers/requirements-surprise.txt")
    gate_keeper = QuietGate(args.max_wait if args.max_wait is not None else (0.0 if args.quick else 300.0))
    started_all = time.perf_counter()
    report: dict[str, Any] = {"benchmark": "cadence biased MF vs scikit-surprise SVD on MovieLens-100k "
                                           "(benchmarks/mf_vs_surprise.py)",
                              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                              "command": command, "quick": args.quick, "machine": machine_info(), "seeds": seeds}
    data: tuple[str, ...] = ()
    if sizes is not None:
        data = ("--set", "data.dataset=synthetic-zipf", "--set", f"mf.synthetic.users={sizes.users}", "--set",
                f"mf.synthetic.items={sizes.items}", "--set", f"mf.synthetic.ratings={sizes.ratings}")
        report["benchmark"] = report["benchmark"].replace("on MovieLens-100k", "on a synthetic Zipf matrix")
        report["synthetic"] = {"users": sizes.users, "items": sizes.items, "ratings": sizes.ratings,
                               "exponent": sizes.exponent}
    with tempfile.TemporaryDirectory(prefix="cadence-mf-bench-") as scratch:
        work = Path(scratch)
        splits = {seed: work / f"split-{seed}" for seed in seeds}
        report["splits"] = {}
        for seed, path in splits.items():
            dataset = (load_rating_dataset("ml-100k", 0) if sizes is None else
                       load_rating_dataset("synthetic-zipf", seed, sizes))
            report["splits"][seed] = write_split(dataset, seed, path)
        default = dict(SURPRISE_DEFAULT)
        if sizes is not None:
            tuning = {"chosen": None, "chosen_on": "not run (--synthetic: no search)"}
        elif args.quick:
            default["epochs"] = QUICK_EPOCHS["surprise_default"]
            tuning = {"chosen": {**TUNED_FALLBACK, "epochs": QUICK_EPOCHS["surprise_tuned"]},
                      "chosen_on": "fixed (--quick: no search)"}
        else:
            say(f"tuning surprise_tuned on the valid part of seed {seeds[0]}")
            tuning = tune_surprise(splits[seeds[0]], seeds[0])
        report["surprise_tuned_selection"] = tuning
        contenders = {
            "cadence": lambda seed: run_cadence(seed, 2, work / f"cadence-{seed}", args.quick, CONFIG, data),
            "cadence_1_thread": lambda seed: run_cadence(seed, 1, work / f"cadence1-{seed}", args.quick),
            "cadence_rating": lambda seed: run_cadence(seed, 2, work / f"cadence-rating-{seed}", args.quick,
                                                       rating_config, data),
            "surprise_default": lambda seed: run_surprise(splits[seed], seed, default),
            "surprise_tuned": lambda seed: run_surprise(splits[seed], seed, tuning["chosen"]),
        }
        if sizes is not None:
            contenders = {name: contenders[name] for name in ("cadence", "cadence_rating", "surprise_default")}
        if args.contenders:
            chosen = [name.strip() for name in args.contenders.split(",") if name.strip()]
            unknown = [name for name in chosen if name not in contenders]
            if unknown or not any(name.startswith("surprise") for name in chosen):
                raise SystemExit(f"mf_vs_surprise.py: --contenders takes some of {', '.join(contenders)}, a Surprise "
                                 f"one among them (got {args.contenders!r})")
            contenders = {name: contenders[name] for name in chosen}
        names = list(contenders)
        per_seed = [run_seed(seed, names if index % 2 == 0 else names[::-1], contenders, gate_keeper)
                    for index, seed in enumerate(seeds)]
    surprise = next(name for name in names if name.startswith("surprise"))
    report["versions"] = {"scikit-surprise": per_seed[0]["contenders"][surprise]["versions"],
                          "cadence": report["machine"].get("cadence_version"),
                          "torch": report["machine"].get("torch_version")}
    report["settings"] = {
        "cadence": {"config": str(CONFIG.relative_to(REPO)), "threads": 2, "checkpoint.every": 0,
                    "command": " ".join(shlex.quote(a) for a in cadence_command("SEED", 2, Path("RUN_DIR"), args.quick,
                                                                                CONFIG, data))
                    .replace(str(REPO) + "/", "")},
        "cadence_rating": {"config": str(rating_config.relative_to(REPO)) if rating_config.is_relative_to(REPO)
                           else str(rating_config), "threads": 2, "checkpoint.every": 0},
        "surprise_default": default, "surprise_tuned": tuning["chosen"],
        "speed": "ratings/s of training only (cadence examples_per_second; Surprise ratings x epochs / fit seconds); "
                 "Surprise SVD is single-threaded",
    }
    report["summary"] = summarize(per_seed, names)
    report["per_seed"] = per_seed
    say(f"wrote {write_report(report, out_path, started_all, gate_keeper.waited_s)}")
    print_summary(report["summary"], names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
