#!/usr/bin/env python
"""DeepCTR-Torch 0.3.0 DeepFM on cadence's MovieLens-100k CTR split (the peer of configs/ml100k-deepfm.yaml).

Runs in its own environment (benchmarks/peers/requirements-deepctr.txt, ``.venv-bench-deepctr``) and never
imports cadence; the split comes from ``benchmarks/ctr_split_export.py``::

    .venv/bin/python benchmarks/ctr_split_export.py --out DIR --seed 0
    .venv-bench-deepctr/bin/python benchmarks/peers/deepctr_contender.py --data DIR \
        --dim 16 --hidden 64,32 --dropout 0.2 --epochs 8 --batch-size 1024 \
        --optimizer cadence --lr 0.05 --dense-lr 0.001 --init-std 0.001 --seed 0 --threads 2

Model: ``deepctr_torch.models.DeepFM`` with one ``SparseFeat`` per single-valued field (vocabulary
from meta.json, ``embedding_dim=--dim``) and a ``VarLenSparseFeat`` per bag (``combiner="sum"``,
no length column: index 0 is the mask, so bag indices are shifted by one and the vocabulary grows
by one), the same columns in the linear and the DNN parts, ``dnn_hidden_units=--hidden``,
``dnn_dropout=--dropout`` (0 unless given), ``l2_reg_linear = l2_reg_embedding = l2_reg_dnn = 0``
(``--l2-*`` flags), ``init_std=--init-std``, ``seed=--seed``, loss ``binary_crossentropy``.
``model.fit`` runs ``--epochs`` epochs (shuffled, ``--batch-size``, no validation inside fit,
``verbose=0``); ``train_seconds`` is the wall time of that one ``fit`` call. Then valid and test
are predicted and scored with sklearn's ``roc_auc_score`` and ``log_loss``. One JSON object goes to
stdout (DeepCTR's own prints go to stderr).

Optimizers (``--optimizer``): ``adagrad`` (default): ``torch.optim.Adagrad(all, lr=--lr)``;
``adam``: ``torch.optim.Adam(all, lr=--lr)``; ``cadence``: the split cadence's config uses, i.e.
row-wise Adagrad (``--lr``, one accumulator per row: the mean of the row's squared gradient, as
``cadence.optim.RowwiseAdagrad``) on every embedding table, Adam (``--dense-lr``) on the dense
parameters (MLP, output bias), handed to DeepCTR's ``compile`` as one optimizer object.

``--init cadence`` (default) re-initialises what DeepCTR sets differently from cadence, after the
model is built: the linear part's 1-wide embedding tables to N(0, init_std^2) (DeepCTR ignores
``init_std`` there and uses 1e-4) and the DNN's hidden ``nn.Linear`` weights with PyTorch's default
(``reset_parameters``; DeepCTR draws them from N(0, init_std^2), which with init_std=1e-3 all but
switches the deep part off at the start). ``--init deepctr`` keeps DeepCTR's initialisation.

Differences from cadence's DeepFM (configs/ml100k-deepfm.yaml, src/cadence/models/ctr.py) that
remain:

1. Runtime: one process taking one optimizer step per batch of ``--batch-size`` (1024) examples;
   cadence's sync strategy has 4 parameter-server workers each computing the gradient of 256
   examples and applies their average once per step (the same global batch of 1024, the same math
   up to float summation order), but through its PS runtime, so examples/s compare the runtimes.
2. Batch order: DeepCTR shuffles with torch's global RNG (DataLoader), cadence with its own
   seeded plan (``plan_epoch``); dropout masks and initial values are different draws from the
   same distributions (cadence hashes (seed, key) into N(0, init_std^2) per row).
3. Loss scale: DeepCTR sums the per-example BCE over the batch, cadence averages it. Adagrad and
   Adam are invariant to that constant factor except through eps (1e-10 / 1e-8), i.e. in practice.
4. Linear weights: DeepCTR keeps a key's first-order weight w in a separate 1-wide table, cadence
   stores it as the last column of the key's [v | w] row; under row-wise Adagrad cadence's
   [v | w] shares one accumulator (mean over dim+1 squared gradients), here v and w each have
   their own (for the 1-wide w table row-wise equals element-wise Adagrad).
5. Biases: DeepCTR has one output bias (``PredictionLayer``) and a bias-free last DNN layer;
   cadence has the linear term's bias plus the last MLP layer's bias. Their sum is one free
   scalar in both, so the function class is the same; Adam sees one parameter instead of two.
6. Dense embedding gradients (``sparse=False``): each optimizer step visits every table row. With
   Adagrad (both variants) a row whose gradient is zero does not move, as in cadence; with
   ``--optimizer adam`` rows absent from a batch still move through Adam's momentum (cadence never
   uses Adam on embedding rows).
7. ``--optimizer adagrad`` (the default) differs from the config: element-wise Adagrad with one
   learning rate for embeddings and MLP alike. ``--optimizer cadence`` is the config's choice.
8. Per-batch input handling: DeepCTR concatenates all inputs into one float tensor and casts the
   indices back to long per feature; cadence deduplicates the batch's keys and pulls their rows.
   This is part of what examples/s measures.
9. Evaluation: cadence validates every epoch (``eval.every: 1``) and reports test after the last
   epoch; here valid and test are scored once after training, outside ``train_seconds``, which is
   the model of the last epoch either way (no early stopping in the config).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
import types
from pathlib import Path

# deepctr_torch/__init__.py calls utils.check_version, which starts a thread that GETs PyPI and may
# print to stdout. Register a stand-in for that module first, so importing the package stays offline
# and quiet (nothing else in deepctr_torch imports deepctr_torch.utils).
_stub = types.ModuleType("deepctr_torch.utils")
_stub.check_version = lambda version: None
sys.modules.setdefault("deepctr_torch.utils", _stub)

import numpy as np  # noqa: E402
import sklearn  # noqa: E402
import torch  # noqa: E402
from sklearn.metrics import log_loss, roc_auc_score  # noqa: E402
from torch import nn  # noqa: E402

import deepctr_torch  # noqa: E402
from deepctr_torch.inputs import SparseFeat, VarLenSparseFeat  # noqa: E402
from deepctr_torch.models import DeepFM  # noqa: E402

from ctr_contender_flags import ctr_contender_parser, parse, report  # noqa: E402  (same folder)


class RowwiseAdagrad(torch.optim.Optimizer):
    """Adagrad with one accumulator per row of a 2-D parameter (cadence.optim.RowwiseAdagrad):
    s += mean_j g_ij^2;  p_i -= lr g_i / (sqrt(s) + eps)."""

    def __init__(self, params, lr: float, eps: float = 1e-10):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], 1, dtype=p.dtype)
                state["sum"].add_(grad.square().mean(dim=1, keepdim=True))
                p.addcdiv_(grad, state["sum"].sqrt().add_(group["eps"]), value=-group["lr"])


class OptimizerPair:
    """Two optimizers behind the two calls DeepCTR's fit makes (zero_grad, step)."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()


def load_split(directory: Path, name: str, meta: dict) -> tuple[dict[str, np.ndarray], np.ndarray]:
    arrays = np.load(directory / f"{name}.npz")
    inputs = {field: arrays["fields"][:, f].astype(np.int64) for f, field in enumerate(meta["field_names"])}
    for bag in meta["bag_names"]:
        values = arrays[bag].astype(np.int64)
        inputs[bag] = np.where(values == meta["pad"], 0, values + 1)  # 0 = padding for DeepCTR's mask
    return inputs, arrays["labels"].astype(np.float32)


def build_model(args: argparse.Namespace, meta: dict) -> DeepFM:
    vocab = meta["vocab_sizes"]
    columns = [SparseFeat(field, vocabulary_size=vocab[field], embedding_dim=args.dim)
               for field in meta["field_names"]]
    columns += [VarLenSparseFeat(SparseFeat(bag, vocabulary_size=vocab[bag] + 1, embedding_dim=args.dim),
                                 maxlen=meta["bag_width"], combiner="sum")
                for bag in meta["bag_names"]]
    model = DeepFM(columns, columns, dnn_hidden_units=tuple(args.hidden), l2_reg_linear=args.l2_linear,
                   l2_reg_embedding=args.l2_embedding, l2_reg_dnn=args.l2_dnn, init_std=args.init_std,
                   seed=args.seed, dnn_dropout=args.dropout, task="binary", device="cpu")
    if args.init == "cadence":
        with torch.no_grad():
            for table in model.linear_model.embedding_dict.values():
                nn.init.normal_(table.weight, mean=0.0, std=args.init_std)
            for layer in model.dnn.linears:
                layer.reset_parameters()
    return model


def make_optimizer(args: argparse.Namespace, model: DeepFM):
    if args.optimizer == "adagrad":
        return torch.optim.Adagrad(model.parameters(), lr=args.lr)
    if args.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=args.lr)
    tables = list(model.embedding_dict.parameters()) + list(model.linear_model.embedding_dict.parameters())
    table_ids = {id(p) for p in tables}
    dense = [p for p in model.parameters() if id(p) not in table_ids]
    return OptimizerPair(RowwiseAdagrad(tables, lr=args.lr), torch.optim.Adam(dense, lr=args.dense_lr))


def score(model: DeepFM, inputs: dict[str, np.ndarray], labels: np.ndarray) -> tuple[float, float]:
    probabilities = model.predict(inputs, batch_size=4096).reshape(-1)
    return float(roc_auc_score(labels, probabilities)), float(log_loss(labels, probabilities, labels=[0, 1]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = ctr_contender_parser(__doc__.splitlines()[0], ("adagrad", "adam", "cadence"), "adagrad",
                                  "the optimizers (module docstring)")
    parser.add_argument("--init", choices=("cadence", "deepctr"), default="cadence")
    parser.add_argument("--l2-linear", type=float, default=0.0)
    parser.add_argument("--l2-embedding", type=float, default=0.0)
    parser.add_argument("--l2-dnn", type=float, default=0.0)
    return parse(parser, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    meta = json.loads((args.data / "meta.json").read_text())
    train_x, train_y = load_split(args.data, "train", meta)
    valid_x, valid_y = load_split(args.data, "valid", meta)
    test_x, test_y = load_split(args.data, "test", meta)

    model = build_model(args, meta)
    model.compile(make_optimizer(args, model), "binary_crossentropy", metrics=None)
    with contextlib.redirect_stdout(sys.stderr):
        start = time.perf_counter()
        history = model.fit(train_x, train_y, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
                            shuffle=True)
        train_seconds = time.perf_counter() - start
        valid_auc, valid_logloss = score(model, valid_x, valid_y)
        test_auc, test_logloss = score(model, test_x, test_y)

    result = {
        "contender": "deepctr-torch DeepFM",
        "dataset": meta["dataset"],
        "auc": test_auc,
        "logloss": test_logloss,
        "valid_auc": valid_auc,
        "valid_logloss": valid_logloss,
        "train_seconds": train_seconds,
        "examples_per_second": len(train_y) * args.epochs / train_seconds,
        "train_examples": len(train_y),
        "train_loss_per_epoch": [float(v) for v in history.history.get("loss", [])],
        "versions": {"deepctr_torch": deepctr_torch.__version__, "torch": torch.__version__,
                     "sklearn": sklearn.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "threads": torch.get_num_threads(),
    }
    return report(args, result)


if __name__ == "__main__":
    raise SystemExit(main())
