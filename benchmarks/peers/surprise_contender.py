#!/usr/bin/env python
"""scikit-surprise 1.1.5 contender for the matrix-factorization benchmark.

Run with its own venv (see benchmarks/peers/requirements-surprise.txt); it imports neither cadence nor torch::

    .venv-bench-surprise/bin/python benchmarks/peers/surprise_contender.py --train TRAIN.tsv --test TEST.tsv \
        --factors 100 --epochs 20 --lr 0.005 --reg 0.02 --init-std 0.1 --seed 0

TRAIN and TEST hold ``user<TAB>item<TAB>rating[<TAB>timestamp]`` lines (a timestamp is ignored).
Fits ``surprise.SVD`` (biased: global mean + user and item biases + dot product of factors; plain
SGD over the shuffled ratings, single-threaded; SVD's other defaults kept), times ``fit`` alone,
and prints one JSON object on stdout: rmse, mae (predictions clipped to --rating-scale, surprise's
default), fit_seconds, ratings_per_second (train ratings x epochs / fit_seconds) and versions.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
import surprise
from surprise import SVD, Dataset, Reader, accuracy
from surprise.model_selection import PredefinedKFold


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, help="TSV: user, item, rating[, timestamp]")
    parser.add_argument("--test", required=True, help="TSV: user, item, rating[, timestamp]")
    parser.add_argument("--factors", type=int, default=100, help="SVD n_factors")
    parser.add_argument("--epochs", type=int, default=20, help="SVD n_epochs")
    parser.add_argument("--lr", type=float, default=0.005, help="SVD lr_all")
    parser.add_argument("--reg", type=float, default=0.02, help="SVD reg_all")
    parser.add_argument("--init-std", type=float, default=0.1, help="SVD init_std_dev")
    parser.add_argument("--seed", type=int, default=0, help="SVD random_state")
    parser.add_argument("--rating-scale", type=float, nargs=2, default=(1.0, 5.0), metavar=("LOW", "HIGH"),
                        help="predictions are clipped to this range")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    reader = Reader(line_format="user item rating", sep="\t", rating_scale=tuple(args.rating_scale))
    data = Dataset.load_from_folds([(args.train, args.test)], reader=reader)
    trainset, testset = next(PredefinedKFold().split(data))
    algorithm = SVD(n_factors=args.factors, n_epochs=args.epochs, biased=True, lr_all=args.lr,
                    reg_all=args.reg, init_std_dev=args.init_std, random_state=args.seed)
    start = time.perf_counter()
    algorithm.fit(trainset)
    fit_seconds = time.perf_counter() - start
    predictions = algorithm.test(testset)
    result = {
        "contender": "surprise.SVD",
        "train_ratings": trainset.n_ratings,
        "test_ratings": len(testset),
        "users": trainset.n_users,
        "items": trainset.n_items,
        "factors": args.factors, "epochs": args.epochs, "lr": args.lr, "reg": args.reg,
        "init_std": args.init_std, "seed": args.seed,
        "rmse": accuracy.rmse(predictions, verbose=False),
        "mae": accuracy.mae(predictions, verbose=False),
        "fit_seconds": fit_seconds,
        "ratings_per_second": trainset.n_ratings * args.epochs / fit_seconds,
        "versions": {"scikit-surprise": surprise.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
    }
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
