#!/usr/bin/env python
"""PyKEEN 1.11.1 contender for cadence's benchmarks (kge_throughput.py, wordnet_quality.py).

Run with the dedicated bench venv (see benchmarks/peers/requirements-pykeen.txt), e.g.::

    .venv-bench-pykeen/bin/python benchmarks/peers/pykeen_contender.py --data-dir DIR \
        --model distmult --dim 128 --negatives 16 --batch-size 1024 --epochs 5 \
        --lr 0.1 --seed 0 --target-mrr 0.0 --json OUT.json

DIR must hold train.txt, valid.txt, test.txt (tab-separated head, relation, tail).

Trains PyKEEN's own model class with the sLCWA loop, BasicNegativeSampler
(num_negs_per_pos=--negatives), Adagrad(lr) on CPU with 2 threads.  Epochs are
run one at a time (``train(num_epochs=e, continue_training=e > 1)``) and each
``train`` call is timed; evaluation runs between calls and is excluded from the
training time.  After every epoch the filtered (train+valid) validation MRR
(both sides, realistic rank) is computed with RankBasedEvaluator.

``--eval-every N`` validates every N epochs only (0: never; default 1, every epoch). ``--test``
adds the test metrics of the model a run ends with (``--test-model final``) or of the one with the
best validation MRR (``--test-model best``, cadence's ``eval.patience``): MRR and Hits@1/3/10,
both sides, realistic rank (ties count half), filtered on train+valid+test, as cadence's.

``--test-triples FILE`` ranks the triples of FILE (tab-separated names, e.g. a subset of test.txt)
instead of test.txt, still filtered on train+valid+test of the data dir. ``--max-train-seconds S``
ends training after the first epoch that brings the training seconds to S or more (a time budget;
``epochs_run`` says how many ran).

``--loss softmax`` is PyKEEN's CrossEntropyLoss on sLCWA scores: the softmax cross entropy of each
positive against its own ``--negatives`` corruptions (cadence's ``train.loss: softmax`` against
negatives shared by the batch).

``--dim`` is the entity row width in floats: complex/rotate get
``embedding_dim=dim // 2`` (complex-valued), distmult/transe get ``dim``.

``--variant pykeen`` (default) keeps the model class defaults as shipped; note that
DistMult's defaults (unit-norm entities + L2 relation regularizer) with SoftplusLoss
barely learn on small data.  ``--variant plain`` removes those extras.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings

# Keep PyKEEN / tqdm quiet before importing anything heavy.
os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pykeen  # noqa: E402
from pykeen.evaluation import RankBasedEvaluator  # noqa: E402
from pykeen.losses import CrossEntropyLoss, SoftplusLoss  # noqa: E402
from pykeen.models import ComplEx, DistMult, RotatE, TransE  # noqa: E402
from pykeen.sampling import BasicNegativeSampler  # noqa: E402
from pykeen.training import SLCWATrainingLoop  # noqa: E402
from pykeen.triples import TriplesFactory  # noqa: E402
from pykeen.utils import set_random_seed  # noqa: E402

MODELS = {
    # name -> (class, divisor applied to --dim to get embedding_dim)
    "distmult": (DistMult, 1),
    "transe": (TransE, 1),
    "complex": (ComplEx, 2),
    "rotate": (RotatE, 2),
}

# "--variant plain": drop PyKEEN's extra per-model defaults that are not part of the
# bare scoring function (entity unit-norm constraint, Lp regularizer).  RotatE's
# unit-modulus relation constraint is intrinsic to the model and is kept.
PLAIN_KWARGS = {
    "distmult": dict(entity_constrainer=None, regularizer=None),
    "transe": dict(entity_constrainer=None),
    "complex": dict(regularizer=None),
    "rotate": dict(),
}

MRR_KEY = "both.realistic.inverse_harmonic_mean_rank"
# the test metrics of ``--test``: name in the output -> PyKEEN's metric key (both sides, realistic rank)
TEST_KEYS = {
    "mrr": MRR_KEY,
    "hits@1": "both.realistic.hits_at_1",
    "hits@3": "both.realistic.hits_at_3",
    "hits@10": "both.realistic.hits_at_10",
    "mean_rank": "both.realistic.arithmetic_mean_rank",
}


def _quiet() -> None:
    for name in ("pykeen", "torch_max_mem", "class_resolver", "pystow"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _load(path: str) -> np.ndarray:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n").rstrip("\r")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise ValueError(f"{path}: expected 3 tab-separated fields, got {parts!r}")
            rows.append(parts)
    return np.asarray(rows, dtype=str).reshape(-1, 3)


def build_factories(data_dir: str) -> tuple[TriplesFactory, TriplesFactory, TriplesFactory]:
    train, valid, test = (_load(os.path.join(data_dir, f"{s}.txt")) for s in ("train", "valid", "test"))
    # Shared entity / relation maps over all three splits.
    full = TriplesFactory.from_labeled_triples(np.concatenate([train, valid, test]), create_inverse_triples=False)
    maps = dict(entity_to_id=full.entity_to_id, relation_to_id=full.relation_to_id, create_inverse_triples=False)
    return (
        TriplesFactory.from_labeled_triples(train, **maps),
        TriplesFactory.from_labeled_triples(valid, **maps),
        TriplesFactory.from_labeled_triples(test, **maps),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--model", required=True, type=str.lower, choices=sorted(MODELS))
    p.add_argument("--dim", type=int, default=128, help="entity row width in floats")
    p.add_argument("--negatives", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-mrr", type=float, default=0.0, help="stop once valid MRR >= this (if > 0)")
    p.add_argument(
        "--loss",
        choices=("softplus", "softmax", "default"),
        default="softplus",
        help="softplus = pykeen SoftplusLoss; softmax = pykeen CrossEntropyLoss (each positive against its "
        "negatives); default = the model's PyKEEN default loss",
    )
    p.add_argument(
        "--variant",
        choices=("pykeen", "plain"),
        default="pykeen",
        help="pykeen = model class defaults as shipped (DistMult: unit-norm entities + L2 relation "
        "regularizer; TransE: unit-norm entities; ComplEx: L2 regularizer); plain = those removed",
    )
    p.add_argument("--eval-every", type=int, default=1, help="validate every N epochs (0: never)")
    p.add_argument("--test", action="store_true", help="also report the test metrics (see above)")
    p.add_argument(
        "--test-model",
        choices=("final", "best"),
        default="final",
        help="the model --test ranks: the last epoch's, or the one with the best validation MRR",
    )
    p.add_argument("--test-triples", default=None, help="rank these triples (a file of names) instead of test.txt")
    p.add_argument("--max-train-seconds", type=float, default=0.0, help="stop after the epoch reaching this (0: off)")
    p.add_argument("--eval-batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", required=True, help="output JSON path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    _quiet()
    torch.set_num_threads(args.threads)
    set_random_seed(args.seed)
    device = torch.device("cpu")

    train_tf, valid_tf, test_tf = build_factories(args.data_dir)
    num_train = train_tf.num_triples

    model_cls, div = MODELS[args.model]
    if args.dim % div:
        raise SystemExit(f"--dim {args.dim} must be divisible by {div} for {args.model}")
    model_kwargs: dict = dict(triples_factory=train_tf, embedding_dim=args.dim // div, random_seed=args.seed)
    if args.variant == "plain":
        model_kwargs.update(PLAIN_KWARGS[args.model])
    if args.loss == "softplus":
        model_kwargs["loss"] = SoftplusLoss()
    elif args.loss == "softmax":
        model_kwargs["loss"] = CrossEntropyLoss()
    model = model_cls(**model_kwargs).to(device)
    loss_name = type(model.loss).__name__

    optimizer = torch.optim.Adagrad(params=model.get_grad_params(), lr=args.lr)
    loop = SLCWATrainingLoop(
        model=model,
        triples_factory=train_tf,
        optimizer=optimizer,
        negative_sampler=BasicNegativeSampler,
        negative_sampler_kwargs=dict(num_negs_per_pos=args.negatives),
        automatic_memory_optimization=False,
    )

    evaluator = RankBasedEvaluator(filtered=True)
    filter_triples = [train_tf.mapped_triples, valid_tf.mapped_triples]

    per_epoch = []
    train_seconds = 0.0
    eval_seconds = 0.0
    seconds_to_target = None
    best = None  # (valid MRR, epoch, a copy of the parameters) with --test-model best
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        loop.train(
            triples_factory=train_tf,
            num_epochs=epoch,
            batch_size=args.batch_size,
            continue_training=epoch > 1,
            use_tqdm=False,
            use_tqdm_batch=False,
            pin_memory=False,
        )
        dt = time.perf_counter() - t0
        train_seconds += dt
        rec = dict(
            epoch=epoch,
            train_seconds_cumulative=train_seconds,
            positives_per_second=num_train / dt,
            loss=float(loop.losses_per_epochs[-1]),
        )
        per_epoch.append(rec)
        if not args.eval_every or epoch % args.eval_every:
            print(f"epoch {epoch}: {rec['positives_per_second']:.0f} pos/s  train_s={train_seconds:.2f}  "
                  f"loss={rec['loss']:.4f}", file=sys.stderr)
            if args.max_train_seconds > 0 and train_seconds >= args.max_train_seconds:
                break
            continue

        t1 = time.perf_counter()
        result = evaluator.evaluate(
            model=model,
            mapped_triples=valid_tf.mapped_triples,
            additional_filter_triples=filter_triples,
            batch_size=args.eval_batch_size,
            use_tqdm=False,
        )
        eval_seconds += time.perf_counter() - t1
        mrr = float(result.get_metric(MRR_KEY))
        rec["valid_mrr"] = mrr
        print(
            f"epoch {epoch}: {rec['positives_per_second']:.0f} pos/s  "
            f"train_s={train_seconds:.2f}  valid_mrr={mrr:.4f}  loss={rec['loss']:.4f}",
            file=sys.stderr,
        )
        if args.test_model == "best" and (best is None or mrr > best[0]):
            best = (mrr, epoch, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if args.target_mrr > 0 and mrr >= args.target_mrr:
            seconds_to_target = train_seconds
            break
        if args.max_train_seconds > 0 and train_seconds >= args.max_train_seconds:
            break

    test = None
    if args.test:
        tested_epoch = len(per_epoch)
        if best is not None:
            model.load_state_dict(best[2])
            tested_epoch = best[1]
        ranked = test_tf
        if args.test_triples:
            ranked = TriplesFactory.from_labeled_triples(
                _load(args.test_triples),
                entity_to_id=train_tf.entity_to_id,
                relation_to_id=train_tf.relation_to_id,
                create_inverse_triples=False,
            )
        t1 = time.perf_counter()
        result = evaluator.evaluate(
            model=model,
            mapped_triples=ranked.mapped_triples,
            additional_filter_triples=[*filter_triples, test_tf.mapped_triples],
            batch_size=args.eval_batch_size,
            use_tqdm=False,
        )
        test = {name: float(result.get_metric(key)) for name, key in TEST_KEYS.items()}
        test.update(epoch=tested_epoch, triples=ranked.num_triples, seconds=time.perf_counter() - t1,
                    source=args.test_triples or "test.txt", filter="train+valid+test")
        print(f"test (epoch {tested_epoch}): " + "  ".join(f"{k}={test[k]:.4f}" for k in TEST_KEYS), file=sys.stderr)

    out = dict(
        contender="pykeen",
        pykeen_version=pykeen.get_version(),
        torch_version=torch.__version__,
        model=args.model,
        model_class=model_cls.__name__,
        embedding_dim=args.dim // div,
        dim=args.dim,
        negatives=args.negatives,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        threads=torch.get_num_threads(),
        num_train_triples=num_train,
        epochs_run=len(per_epoch),
        positives_per_second=statistics.median(r["positives_per_second"] for r in per_epoch),
        train_seconds=train_seconds,
        valid_eval_seconds=eval_seconds,
        num_entities=train_tf.num_entities,
        test=test,
        test_model=args.test_model if args.test else None,
        max_train_seconds=args.max_train_seconds or None,
        per_epoch=per_epoch,
        target_mrr=args.target_mrr,
        seconds_to_target=seconds_to_target,
        loss=loss_name,
        mrr_metric=MRR_KEY + " (filtered on train+valid)",
        variant=args.variant,
        variant_overrides={k: None for k in PLAIN_KWARGS[args.model]} if args.variant == "plain" else {},
    )
    with open(args.json, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()
