#!/usr/bin/env python
"""Write cadence's MovieLens-100k CTR split to a directory, for contenders outside cadence.

    .venv/bin/python benchmarks/ctr_split_export.py --out DIR [--seed 0] [--dataset ml-100k]

The split is exactly the one ``task: ctr`` trains on (``ctr.split: random``): the dataset from
``cadence.data.ctr.load_ctr_dataset(dataset, seed)`` cut by ``CtrDataset.random_split(seed)``
(80/10/10; each part keeps source order). Files:

- ``train.npz``, ``valid.npz``, ``test.npz``, each with
  - ``fields`` [n, F] int64: the value index of each single-valued field (columns in
    ``field_names`` order), i.e. ``key & (2**40 - 1)`` of cadence's feature key;
  - ``<bag>`` [n, L] int64 per bag field (ML-100k: ``genres``): the bag's value indices, padded
    with ``pad`` (-1) on the right;
  - ``labels`` [n] float32 in {0, 1} (rating >= 4).
- ``meta.json``: ``dataset``, ``seed``, ``field_names``, ``bag_names``, ``vocab_sizes`` (per
  single-valued field and per bag, in that order; ``max value index + 1`` over the *full* dataset,
  which equals the number of distinct values since MovieLens numbers them densely), ``bag_width``,
  ``pad``, ``sizes`` (examples per split) and ``positive_rate`` per split.

Value indices are per field (0-based, dense); a contender that reserves 0 for padding (DeepCTR's
``VarLenSparseFeat`` without a length column) must shift bag indices by one itself.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from cadence.data.ctr import MAX_VALUE_INDEX, PAD, VALUE_BITS, CtrExamples, load_ctr_dataset


def value_indices(keys: torch.Tensor) -> np.ndarray:
    """Value index of each key (PAD stays PAD)."""
    values = keys & MAX_VALUE_INDEX
    return torch.where(keys >= 0, values, torch.full_like(keys, PAD)).numpy().astype(np.int64)


def check_fields(keys: torch.Tensor, fields: torch.Tensor) -> None:
    """Every key of ``keys`` [n, C] must belong to ``fields`` (broadcast against it), PAD excepted."""
    if not bool((((keys >> VALUE_BITS) == fields) | (keys < 0)).all()):
        raise SystemExit("unexpected field index in the feature keys")


def split_arrays(examples: CtrExamples, bag_names: list[str]) -> dict[str, np.ndarray]:
    arrays = {"fields": value_indices(examples.keys)}
    for b, name in enumerate(bag_names):
        arrays[name] = value_indices(examples.bags[:, b, :])
    arrays["labels"] = examples.labels.numpy().astype(np.float32)
    return arrays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (configs/ml100k-deepfm.yaml: 0)")
    parser.add_argument("--dataset", default="ml-100k")
    args = parser.parse_args(argv)

    dataset = load_ctr_dataset(args.dataset, args.seed)
    examples = dataset.examples
    num_fields = len(dataset.field_names)
    if examples.dense.shape[1]:
        raise SystemExit(f"{args.dataset} has dense features; this exporter writes categorical ones only")
    check_fields(examples.keys, torch.arange(num_fields))  # column f holds field f
    for b in range(len(dataset.bag_names)):
        check_fields(examples.bags[:, b, :], torch.tensor(num_fields + b))

    full = value_indices(examples.keys)
    vocab_sizes = [int(full[:, f].max()) + 1 for f in range(num_fields)]
    for b in range(len(dataset.bag_names)):
        bag = value_indices(examples.bags[:, b, :])
        vocab_sizes.append(int(bag.max()) + 1)

    args.out.mkdir(parents=True, exist_ok=True)
    train, valid, test = dataset.random_split(args.seed)
    sizes, positive_rate = {}, {}
    for name, part in (("train", train), ("valid", valid), ("test", test)):
        np.savez(args.out / f"{name}.npz", **split_arrays(part, dataset.bag_names))
        sizes[name] = len(part)
        positive_rate[name] = float(part.labels.mean())
    meta = {
        "dataset": dataset.name,
        "seed": args.seed,
        "split": "cadence CtrDataset.random_split(seed), fractions 0.8/0.1/0.1",
        "field_names": dataset.field_names,
        "bag_names": dataset.bag_names,
        "vocab_sizes": dict(zip(dataset.field_names + dataset.bag_names, vocab_sizes)),
        "bag_width": int(examples.bags.shape[2]),
        "pad": PAD,
        "sizes": sizes,
        "positive_rate": positive_rate,
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({"out": str(args.out), "sizes": sizes, "vocab_sizes": meta["vocab_sizes"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
