#!/usr/bin/env python
"""TorchRec DeepFM on cadence's MovieLens-100k CTR split (a peer of configs/ml100k-deepfm.yaml).

Runs in its own environment (benchmarks/peers/requirements-torchrec.txt, ``.venv-bench-torchrec``) and
never imports cadence; the split comes from ``benchmarks/ctr_split_export.py``, and the flags and
the JSON printed are those of ``benchmarks/peers/deepctr_contender.py``, so ``benchmarks/ctr_vs_deepctr.py
--peer torchrec`` drives it the same way::

    .venv/bin/python benchmarks/ctr_split_export.py --out DIR --seed 0
    .venv-bench-torchrec/bin/python benchmarks/peers/torchrec_contender.py --data DIR \\
        --dim 16 --hidden 64,32 --dropout 0.2 --epochs 8 --batch-size 1024 \\
        --optimizer cadence --lr 0.05 --dense-lr 0.001 --init-std 0.001 --seed 0 --threads 2

What a TorchRec user builds on a CPU: the embedding tables are one
``torchrec.modules.fused_embedding_modules.FusedEmbeddingBagCollection`` (fbgemm's batched
table kernels, ``fbgemm-gpu-cpu``; the optimizer fused into the backward pass), fed a
``KeyedJaggedTensor`` per batch (one key per field; a bag field's values are its present
entries, sum-pooled by the kernel); the dense part is plain torch:

- a table per field (single-valued fields and the ``genres`` bag alike) of rows ``[v | w | 0 0 0]``:
  the field's vector ``v`` (``--dim``), its first-order weight ``w``, and three zero columns,
  because fbgemm's kernels need a width divisible by 4 (``--dim`` + 1 = 17 is not). The three
  columns never get a gradient and stay zero, so the model reads ``[v | w]`` exactly as cadence
  stores it (one row per key, one accumulator per row);
- logit = b + sum_f w_f + sum_{i<j} <v_i, v_j> + MLP([v_1 .. v_F]) (Linear-ReLU-Dropout per
  ``--hidden`` width, then Linear to 1), as ``cadence.models.ctr.DeepFM``; loss: the batch's mean
  binary cross-entropy on logits.

Optimizers: ``--optimizer cadence`` (the only one): row-wise Adagrad fused into the tables
(``torchrec.optim.RowWiseAdagrad``, fbgemm's ``EXACT_ROWWISE_ADAGRAD``: s += mean of the row's
squared gradient, p -= lr g / (sqrt(s) + eps), eps 1e-10) and Adam (``--dense-lr``) on the dense
parameters. The mean runs over the padded width (20) where cadence's runs over 17 columns, so s is
17/20 of cadence's; the learning rate given to fbgemm is ``--lr`` x sqrt(17/20), which makes the
update the same (up to eps). Rows start N(0, init_std^2) (``--init-std``; the padding at 0), the
MLP with PyTorch's default initialisation, as cadence's.

Differences from cadence's DeepFM that remain: one process taking one step per batch of
``--batch-size`` (cadence's sync: 4 parameter-server workers x 256, the same global batch and math);
batch order and dropout masks and initial values are other draws from the same distributions;
evaluation once after training (cadence validates every epoch, outside its training time).
``train_seconds``: the wall time of the training epochs (building each batch's KeyedJaggedTensor
included); AUC (ties counted half) and log loss on valid and test after training.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

import fbgemm_gpu  # noqa: F401  (registers the CPU kernels)
import torchrec
import torchrec.optim as trec_optim
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.modules.embedding_configs import PoolingType
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

from ctr_contender_flags import ctr_contender_parser, parse, report  # same folder: the flags of every CTR contender

ALIGN = 4  # fbgemm's table kernels: row widths divisible by 4


class Fields:
    """A split as per-field value columns: ``single`` [n, F] and each bag's [n, L] (pad -1)."""

    def __init__(self, directory: Path, name: str, meta: dict):
        arrays = np.load(directory / f"{name}.npz")
        self.single = torch.from_numpy(arrays["fields"].astype(np.int64))
        self.bags = [torch.from_numpy(arrays[bag].astype(np.int64)) for bag in meta["bag_names"]]
        self.labels = torch.from_numpy(arrays["labels"].astype(np.float32))

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, keys: list[str], index: torch.Tensor) -> KeyedJaggedTensor:
        """The examples ``index`` as one KeyedJaggedTensor: each single field one value per example,
        each bag its present entries."""
        single = self.single[index]
        values = [single.t().reshape(-1)]
        lengths = [torch.ones(single.numel(), dtype=torch.int64)]
        for bag in self.bags:
            rows = bag[index]
            present = rows >= 0
            values.append(rows[present])
            lengths.append(present.sum(1))
        return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))


class DeepFM(nn.Module):
    def __init__(self, names: list[str], vocab: dict[str, int], dim: int, hidden: list[int], dropout: float,
                 lr: float, init_std: float):
        super().__init__()
        self.names, self.dim = names, dim
        width = -(-(dim + 1) // ALIGN) * ALIGN
        tables = [EmbeddingBagConfig(name=f"t_{name}", embedding_dim=width, num_embeddings=vocab[name],
                                     feature_names=[name], pooling=PoolingType.SUM) for name in names]
        # the mean of squared gradients runs over ``width`` columns, cadence's over dim + 1: same update
        fused_lr = lr * math.sqrt((dim + 1) / width)
        self.tables = FusedEmbeddingBagCollection(
            tables=tables, optimizer_type=trec_optim.RowWiseAdagrad,
            optimizer_kwargs={"lr": fused_lr, "eps": 1e-10}, device=torch.device("cpu"))
        with torch.no_grad():
            for name, weight in self.tables.state_dict().items():
                weight.zero_()
                weight[:, : dim + 1].normal_(0.0, init_std)
        self.bias = nn.Parameter(torch.zeros(1))
        layers: list[nn.Module] = []
        width_in = len(names) * dim
        for out in hidden:
            layers += [nn.Linear(width_in, out), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width_in = out
        layers.append(nn.Linear(width_in, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.tables(features).to_dict()
        rows = torch.stack([pooled[name] for name in self.names], dim=1)  # [B, F, width]
        vectors, weights = rows[..., : self.dim], rows[..., self.dim]
        linear = self.bias + weights.sum(1)
        square_of_sum = vectors.sum(1).square()
        sum_of_squares = vectors.square().sum(1)
        fm = 0.5 * (square_of_sum - sum_of_squares).sum(-1)
        return linear + fm + self.mlp(vectors.flatten(1)).squeeze(-1)

    def dense_parameters(self) -> list[nn.Parameter]:
        return [self.bias, *self.mlp.parameters()]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by ranks (Mann-Whitney U), tied scores sharing their average rank."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    positives = labels > 0.5
    count_pos, count_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - count_pos * (count_pos + 1) / 2) / (count_pos * count_neg))


def log_loss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    p = np.clip(probabilities, 1e-15, 1 - 1e-15)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


@torch.no_grad()
def score(model: DeepFM, data: Fields, keys: list[str]) -> tuple[float, float]:
    model.eval()
    outputs = [torch.sigmoid(model(data.batch(keys, index)))
               for index in torch.arange(len(data)).split(4096)]
    model.train()
    probabilities = torch.cat(outputs).double().numpy()
    labels = data.labels.double().numpy()
    return auc(labels, probabilities), log_loss(labels, probabilities)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return parse(ctr_contender_parser(__doc__.splitlines()[0], ("cadence",), "cadence",
                                      "row-wise Adagrad on the tables (fused), Adam on the dense part"), argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    meta = json.loads((args.data / "meta.json").read_text())
    names = [*meta["field_names"], *meta["bag_names"]]
    vocab = meta["vocab_sizes"]
    train, valid, test = (Fields(args.data, name, meta) for name in ("train", "valid", "test"))
    model = DeepFM(names, vocab, args.dim, args.hidden, args.dropout, args.lr, args.init_std)
    dense = torch.optim.Adam(model.dense_parameters(), lr=args.dense_lr)
    losses: list[float] = []
    started = time.perf_counter()
    for _ in range(args.epochs):
        total, batches = 0.0, 0
        for index in torch.randperm(len(train)).split(args.batch_size):
            features = train.batch(names, index)
            loss = nn.functional.binary_cross_entropy_with_logits(model(features), train.labels[index])
            dense.zero_grad(set_to_none=True)
            loss.backward()  # the tables' rows are updated inside the backward pass (fused)
            dense.step()
            total, batches = total + float(loss.detach()), batches + 1
        losses.append(total / batches)
    seconds = time.perf_counter() - started
    valid_auc, valid_loss = score(model, valid, names)
    test_auc, test_loss = score(model, test, names)
    result = {
        "peer": "torchrec", "auc": test_auc, "logloss": test_loss, "valid_auc": valid_auc, "valid_logloss": valid_loss,
        "train_seconds": seconds, "train_examples": len(train),
        "examples_per_second": len(train) * args.epochs / seconds, "train_loss_per_epoch": losses,
        "threads": torch.get_num_threads(),
        "versions": {"torchrec": torchrec.__version__ if hasattr(torchrec, "__version__") else None,
                     "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", None), "torch": torch.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
    }
    return report(args, result)


if __name__ == "__main__":
    raise SystemExit(main())
