#!/usr/bin/env python
"""torchkge 0.17.7's side of ``benchmarks/kge_vs_pbg.py`` (the second KGE peer); runs in
``.venv-bench-torchkge`` (never imports cadence).

    torchkge_contender.py --data DIR --out DIR --entities N --dim D --negatives K --batch-size B --lr LR
                          --threads T --epochs E [--model distmult|complex] [--max-batches M]

``DIR/train.tsv`` holds ``head<TAB>relation<TAB>tail`` lines of integer ids (the file PBG imports). They
become a ``torchkge.data_structures.KnowledgeGraph`` (ids as they are, shuffled once with seed 0;
torchkge's ``DataLoader`` takes the facts in order; not timed), then torchkge's own training loop as
its documentation writes it: ``DataLoader`` batches of ``B`` facts, ``UniformNegativeSampler`` with
``K`` negatives per fact (each corrupts the head or the tail), the model's ``forward`` over facts and
negatives, ``BinaryCrossEntropyLoss`` (logistic), ``torch.optim.Adagrad`` at ``LR`` over the model's
(dense) embeddings, ``normalize_parameters`` after each epoch; ``T`` torch threads in one process.
DistMult is torchkge's ``DistMultModel`` (its entities normalised in the score, as torchkge writes
it); ComplEx its ``ComplExModel`` of ``D / 2`` complex dimensions (``D`` reals, as cadence's).

``--max-batches M``: stop after ``M`` batches (a table of 1M dense rows makes every step touch every
row: a whole epoch can take longer than a benchmark can wait); ``edges`` says how many were trained.

Writes ``OUT/result.json`` (``train_seconds``: the wall time of the batches; ``edges``;
``edges_per_second``; the config), ``OUT/entities.npy`` (row i: entity i, ``[real | imaginary]`` for
ComplEx; normalised for DistMult, as torchkge's ``get_embeddings`` gives them) and
``OUT/relations.npy``.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

from kge_contender_flags import kge_contender_parser  # same folder: the flags both KGE peers take

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torchkge.data_structures import KnowledgeGraph  # noqa: E402
from torchkge.models import ComplExModel, DistMultModel  # noqa: E402
from torchkge.sampling import UniformNegativeSampler  # noqa: E402
from torchkge.utils import BinaryCrossEntropyLoss, DataLoader  # noqa: E402


def main() -> int:
    parser = kge_contender_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--entities", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", choices=("distmult", "complex"), default="distmult")
    parser.add_argument("--max-batches", type=int, default=0, help="stop after this many batches (0: the epochs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    triples = pd.read_csv(args.data / "train.tsv", sep="\t", header=None, dtype=np.int64).to_numpy()
    triples = triples[np.random.default_rng(0).permutation(len(triples))]
    relations = int(triples[:, 1].max()) + 1
    heads, rels, tails = (torch.from_numpy(np.ascontiguousarray(triples[:, i])) for i in range(3))
    kg = KnowledgeGraph(kg={"heads": heads, "tails": tails, "relations": rels},
                        ent2ix={i: i for i in range(args.entities)}, rel2ix={i: i for i in range(relations)})
    if args.model == "distmult":
        model = DistMultModel(args.dim, args.entities, relations)
    else:
        model = ComplExModel(args.dim // 2, args.entities, relations)
    sampler = UniformNegativeSampler(kg, n_neg=args.negatives)
    criterion = BinaryCrossEntropyLoss()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr)
    loader = DataLoader(kg, batch_size=args.batch_size)

    edges, batches, started = 0, 0, time.perf_counter()
    for _ in range(args.epochs):
        for h, t, r in loader:
            n_h, n_t = sampler.corrupt_batch(h, t, r, n_neg=args.negatives)
            optimizer.zero_grad()
            positive, negative = model(h, t, r, n_h, n_t)
            loss = criterion(positive, negative)
            loss.backward()
            optimizer.step()
            edges += h.shape[0]
            batches += 1
            if batches == args.max_batches:
                break
        model.normalize_parameters()
        if batches == args.max_batches:
            break
    seconds = time.perf_counter() - started

    args.out.mkdir(parents=True, exist_ok=True)
    if args.model == "distmult":
        entities, relation_vectors = model.get_embeddings()
    else:
        re_e, im_e, re_r, im_r = model.get_embeddings()
        entities, relation_vectors = torch.cat([re_e, im_e], 1), torch.cat([re_r, im_r], 1)
    np.save(args.out / "entities.npy", entities.numpy())
    np.save(args.out / "relations.npy", relation_vectors.numpy())
    result = {"train_seconds": round(seconds, 3), "edges": edges, "batches": batches,
              "edges_per_second": edges / seconds, "complete_epochs": batches >= len(loader) * args.epochs,
              "torch": torch.__version__, "threads": args.threads, "config": vars(args) | {
                  "data": str(args.data), "out": str(args.out)}}
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    print(f"torchkge: {edges} edges in {seconds:.1f} s ({edges / seconds:,.0f} edges/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
