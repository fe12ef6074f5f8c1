#!/usr/bin/env python
"""PyTorch-BigGraph 1.0.0's side of ``benchmarks/kge_vs_pbg.py``; runs in ``.venv-bench-pbg`` (never
imports cadence).

    pbg_contender.py --data DIR --out DIR --entities N --dim D --negatives K --batch-size B --lr LR
                     --workers W --epochs E [--operator diagonal|complex_diagonal] [--loss logistic|softmax]

``DIR/train.tsv`` and ``DIR/test.tsv`` hold ``head<TAB>relation<TAB>tail`` lines of integer ids. They are
imported with PBG's own importer (one partition; not timed), then ``train()`` runs with PBG's
chunked negatives: ``num_uniform_negs = K`` uniformly drawn entities per chunk of ``K`` edges
(``num_batch_negs = 0``), a batch of ``B`` edges, logistic loss (``--loss softmax``: PBG's softmax
loss_fn), ``dot`` comparator with the
``diagonal`` operator on the right-hand side (DistMult; ``complex_diagonal``: ComplEx), row-wise
Adagrad, ``W`` Hogwild worker processes of one torch thread each (PBG's own layout), no global
embeddings, no held-out evaluation during training.

Writes ``OUT/result.json`` (``train_seconds``: the seconds of PBG's buckets, ``train_call_seconds``:
the wall time of ``train()``; ``edges``; ``epoch_seconds``: each epoch's bucket seconds; the config)
and ``OUT/entities.npy`` (rows in cadence's id order: row i is the entity named ``i``; entities PBG
never saw are NaN), ``OUT/relations.npy`` and ``OUT/relations_lhs.npy`` (each relation's right- and
left-hand operator parameters, in id order: dynamic relations keep one operator per side): the
model after the last epoch. With ``--epochs E`` > 1 every epoch's model is kept
(``checkpoint_preservation_interval: 1``) and also written as ``OUT/entities.e{N}.npy`` and
``OUT/relations.e{N}.npy`` for epochs N = 1..E.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import warnings
from pathlib import Path

from kge_contender_flags import kge_contender_parser  # same folder: the flags both KGE peers take

warnings.filterwarnings("ignore")

import attr  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torchbiggraph.config import parse_config  # noqa: E402
from torchbiggraph.converters.import_from_tsv import convert_input_data  # noqa: E402
from torchbiggraph.train import train  # noqa: E402
from torchbiggraph.util import SubprocessInitializer, setup_logging  # noqa: E402


class BucketTimes(logging.Handler):
    """PBG's own report of each bucket it trained: "Processed N edges in S s"."""

    PATTERN = re.compile(r"Processed (\d+) edges in ([0-9.]+) s")

    def __init__(self):
        super().__init__(logging.INFO)
        self.buckets: list[tuple[int, float]] = []  # (edges, seconds) of each bucket, in order

    def emit(self, record: logging.LogRecord) -> None:
        found = self.PATTERN.search(record.getMessage())
        if found:
            self.buckets.append((int(found.group(1)), float(found.group(2))))

    @property
    def edges(self) -> int:
        return sum(edges for edges, _ in self.buckets)

    @property
    def seconds(self) -> float:
        return sum(seconds for _, seconds in self.buckets)


def vectors(model: Path, version: int, imported: Path) -> tuple[np.ndarray, dict[str, np.ndarray], str]:
    """The entity rows (in cadence's id order; NaN rows for entities PBG never saw) and the
    relation parameters (in id order) of each side's operator (``lhs``, ``rhs``: dynamic relations
    keep one per side) of checkpoint version ``version``, and the parameter's name."""
    names = json.loads((imported / "entities" / "entity_names_all_0.json").read_text())
    with h5py.File(model / f"embeddings_all_0.v{version}.h5", "r") as handle:
        embeddings = handle["embeddings"][...]
    entities = int(max(int(n) for n in names)) + 1
    ordered = np.full((entities, embeddings.shape[1]), np.nan, dtype=np.float32)
    ordered[np.array([int(n) for n in names])] = embeddings
    relation_names = json.loads((imported / "entities" / "dynamic_rel_names.json").read_text())
    sides, key = {}, ""
    with h5py.File(model / f"model.v{version}.h5", "r") as handle:
        for side in ("lhs", "rhs"):
            group = handle["model"]["relations"]["0"]["operator"][side]
            params = {name: group[name][...] for name in group}
            if {"real", "imag"} <= set(params):  # complex_diagonal: [real | imaginary] halves, as the evaluator reads them
                key, values = "real|imag", np.concatenate([params["real"], params["imag"]], axis=1)
            else:
                key = "diagonal" if "diagonal" in params else sorted(params)[0]
                values = params[key]  # [relations, ...] in PBG's relation order
            sides[side] = np.empty_like(values)
            sides[side][np.array([int(n) for n in relation_names])] = values
    return ordered, sides, key


def save(out: Path, suffix: str, entities: np.ndarray, relations: dict[str, np.ndarray]) -> None:
    """``entities{suffix}.npy``; ``relations{suffix}.npy``: the right-hand operators (head
    corruptions are scored with them), ``relations_lhs{suffix}.npy``: the left-hand ones (tails)."""
    np.save(out / f"entities{suffix}.npy", entities)
    np.save(out / f"relations{suffix}.npy", relations["rhs"])
    np.save(out / f"relations_lhs{suffix}.npy", relations["lhs"])


def main() -> int:
    parser = kge_contender_parser(__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--operator", default="diagonal")
    parser.add_argument("--loss", choices=("logistic", "softmax"), default="logistic")
    args = parser.parse_args()
    setup_logging(0)
    buckets = BucketTimes()
    logging.getLogger().addHandler(buckets)
    work = args.out / "pbg"
    imported = args.data / "pbg-import"  # PBG's HDF5 import of the TSVs, made once per data set (not timed)
    config = parse_config({
        "entity_path": str(imported / "entities"),
        "edge_paths": [str(imported / "train_partitioned"), str(imported / "test_partitioned")],
        "checkpoint_path": str(work / "model"),
        "entities": {"all": {"num_partitions": 1}},
        "relations": [{"name": "all_edges", "lhs": "all", "rhs": "all", "operator": args.operator}],
        "dynamic_relations": True,
        "dimension": args.dim,
        "global_emb": False,
        "comparator": "dot",
        "num_epochs": args.epochs,
        "batch_size": args.batch_size,
        "num_batch_negs": 0,
        "num_uniform_negs": args.negatives,
        "loss_fn": args.loss,
        "lr": args.lr,
        "eval_fraction": 0,
        "workers": args.workers,
        "verbose": 0,
        # keep every epoch's model (one partition, one chunk: version N is the model after epoch N)
        **({"checkpoint_preservation_interval": 1} if args.epochs > 1 else {}),
    })
    if not (imported / "done").exists():
        convert_input_data(config.entities, config.relations, config.entity_path, config.edge_paths,
                           [args.data / "train.tsv", args.data / "test.tsv"], lhs_col=0, rhs_col=2, rel_col=1,
                           dynamic_relations=config.dynamic_relations)
        (imported / "done").write_text("")
    train_config = attr.evolve(config, edge_paths=[config.edge_paths[0]])
    initializer = SubprocessInitializer()
    initializer.register(setup_logging, 0)
    started = time.perf_counter()
    train(train_config, subprocess_init=initializer)
    seconds = time.perf_counter() - started
    edges = sum(1 for _ in open(args.data / "train.tsv")) * args.epochs
    if buckets.edges != edges:
        raise SystemExit(f"pbg_contender: PBG reported {buckets.edges} edges trained, expected {edges}")

    if len(buckets.buckets) != args.epochs:
        raise SystemExit(f"pbg_contender: {len(buckets.buckets)} buckets for {args.epochs} epochs (one partition)")
    entities, relations, key = vectors(work / "model", args.epochs, imported)
    save(args.out, "", entities, relations)
    if args.epochs > 1:
        for epoch in range(1, args.epochs + 1):
            entities, relations, _ = vectors(work / "model", epoch, imported)
            save(args.out, f".e{epoch}", entities, relations)
    (args.out / "result.json").write_text(json.dumps({
        # PBG's own time of its buckets (what it reports as M/sec), and of train() as a whole (with
        # the workers' start, the model's initialisation and the checkpoint written)
        "train_seconds": buckets.seconds, "edges": edges, "edges_per_second": edges / buckets.seconds,
        "train_call_seconds": seconds, "epoch_seconds": [seconds for _, seconds in buckets.buckets],
        "torch": torch.__version__, "torch_threads_per_worker": 1, "relation_parameter": key,
        "config": {k: v for k, v in attr.asdict(train_config).items() if isinstance(v, (int, float, str, bool))},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
