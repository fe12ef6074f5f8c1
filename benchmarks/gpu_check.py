#!/usr/bin/env python
"""The GPU path measured (``make gpu-check``, on a machine with a CUDA device): each task's shipped
config trained on the GPU and on the CPU, contenders interleaved rep by rep in one invocation.

Parts (``--parts``, default all):

- ``image``: Fashion-MNIST, the MLP (2 epochs) and the CNN (1 epoch) of ``configs/fashion-mnist-*.yaml``:
  ``sync`` on the CPU (every core), ``sync`` on the GPU, ``pdasgd-bu`` and ``pdasgd`` (K = 2 backward
  threads, each on its own CUDA stream) on the GPU: pdASGD's own setting (seed 003 trains on a GPU);
- ``kge``: ``configs/umls-complex.yaml`` (1-vs-all ComplEx, 10 epochs): ``sync`` on the CPU, ``sync``,
  ``async`` and ``oac`` on the GPU (the pipeline's upload/compute/download streams);
- ``kge-large``: issue 9's setting: a synthetic power-law graph of 10M entities and 4M edges, DistMult
  d=100, 100 shared negatives, batch 1000, one epoch; ``sync``, ``async`` and ``oac`` on the GPU (rows in
  host memory, batches through the pipeline's streams); filtered test MRR on 500 held-out edges;
- ``kge-fb15k``: issue 46's GPU user's setting, next to Marius's published figures (OSDI'21, Table 2:
  FB15k on one V100, 1,000 negatives, batch 10,000: ComplEx d=400 ~0.52M edges/s, DistMult ~0.59M):
  a synthetic graph of FB15k's size (14,951 entities, 1,345 relations, 483,142 training edges),
  ComplEx d=400 and DistMult d=400, 1,000 shared negatives, batch 10,000, logistic loss, row-wise
  Adagrad, one epoch; ``sync``, ``async`` and ``oac`` on the GPU; the record's ``marius_edges_per_second``
  is the published figure of the same model;
- ``ctr``: ``configs/ml100k-deepfm.yaml`` (2 epochs): ``sync`` on the CPU, ``sync`` and ``gba`` on the GPU
  (the parameter-server workers compute on the GPU).

Per contender: examples/s (mean and 95% interval over ``--reps``), the task's metric, and the GPU's
peak memory. Ratios are against ``sync`` on the GPU of the same part. Nothing here is a bar: the
numbers record what the GPU path does (results/gpu_check*.json; docs/results.md, OAC). How to run it
on a GPU machine: docs/benchmarks.md, "The GPU path".

    make gpu-check                      # every CUDA test, then this
    python3 benchmarks/gpu_check.py [--reps N] [--parts image,kge,ctr] [--quick] [--out FILE]

Writes ``benchmarks/results/gpu_check.json`` (``gpu_check_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from provenance import check  # same folder: every result traces to a commit

import torch

from peer_stats import mean_ci, peer_parser, peer_run, train_measured, write_report

from cadence import api
from cadence.config import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


@dataclass(frozen=True)
class Contender:
    name: str
    device: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Part:
    name: str
    config: str
    epochs: int
    contenders: tuple[Contender, ...]
    overrides: tuple[str, ...] = ()


CPU_THREADS = f"threads={os.cpu_count() or 1}"
IMAGE = (
    Contender("sync", "cpu", ("strategy=sync", CPU_THREADS)),
    Contender("sync", "cuda", ("strategy=sync",)),
    Contender("pdasgd-bu", "cuda", ("strategy=pdasgd-bu", "pdasgd.backward_threads=2")),
    Contender("pdasgd", "cuda", ("strategy=pdasgd", "pdasgd.backward_threads=2")),
)
# FB15k's size (Marius's benchmark graph: 14,951 entities, 1,345 relations, 483,142 training edges)
# and Marius's setting of it: d=400, 1,000 negatives, batch 10,000
FB15K_SIZED = ("data.dataset=synthetic", "data.synthetic.num_entities=14951", "data.synthetic.num_relations=1345",
               "data.synthetic.num_edges=484142", "data.synthetic.holdout=500", "model.dim=400",
               "train.scoring=sampled", "train.negatives=1000", "train.negative_chunk=0", "train.loss=logistic",
               "train.batch_size=10000", "train.reciprocal=false", "train.regularizer=none", "train.reg_weight=0",
               "optimizer.entity=rowwise_adagrad", "eval.every=0", "eval.test=true", "eval.max_triples=500")
MARIUS_EDGES_PER_SECOND = {"kge-fb15k-complex": 520_000, "kge-fb15k-distmult": 590_000}  # OSDI'21 Table 2, one V100
PARTS = {
    "image": (
        Part("image-mlp", "fashion-mnist-mlp.yaml", 2, IMAGE, ("optimizer.warmup_epochs=1",)),
        Part("image-cnn", "fashion-mnist-cnn.yaml", 1, IMAGE, ("optimizer.warmup_epochs=0", "optimizer.warmup_lr=null")),
    ),
    "kge": (Part("kge-umls", "umls-complex.yaml", 10, (
        Contender("sync", "cpu", ("strategy=sync", CPU_THREADS)),
        Contender("sync", "cuda", ("strategy=sync",)),
        Contender("async", "cuda", ("strategy=async",)),
        Contender("oac", "cuda", ("strategy=oac",)),
    ), ("eval.every=10", "eval.patience=0")),),
    # issue 9's setting on the GPU: a 10M-entity table (4 GB of rows in host memory), batches gathered,
    # uploaded, computed and scattered back by the pipeline's streams; one epoch, sampled filtered MRR
    "kge-large": (Part("kge-10m", "umls-complex.yaml", 1, (
        Contender("sync", "cuda", ("strategy=sync",)),
        Contender("async", "cuda", ("strategy=async",)),
        Contender("oac", "cuda", ("strategy=oac",)),
    ), ("data.dataset=synthetic", "data.synthetic.num_entities=10000000", "data.synthetic.num_edges=4000000",
        "data.synthetic.holdout=500", "model.name=distmult", "model.dim=100", "train.scoring=sampled",
        "train.negatives=100", "train.loss=logistic", "train.batch_size=1000", "train.reciprocal=false",
        "train.regularizer=none", "train.reg_weight=0", "optimizer.entity=rowwise_adagrad", "eval.every=0",
        "eval.test=true")),),
    "kge-fb15k": tuple(Part(f"kge-fb15k-{model}", "umls-complex.yaml", 1, (
        Contender("sync", "cuda", ("strategy=sync",)),
        Contender("async", "cuda", ("strategy=async",)),
        Contender("oac", "cuda", ("strategy=oac",)),
    ), (*FB15K_SIZED, f"model.name={model}")) for model in ("complex", "distmult")),
    "ctr": (Part("ctr-deepfm", "ml100k-deepfm.yaml", 2, (
        Contender("sync", "cpu", ("strategy=sync", CPU_THREADS)),
        Contender("sync", "cuda", ("strategy=sync",)),
        Contender("gba", "cuda", ("strategy=gba",)),
    )),),
}
METRICS = ("accuracy", "mrr", "auc", "logloss")
COUNTERS = ("stale_reads", "lost_updates", "repaired_rows", "skipped_writes", "coalesced_writes",
            "write_lock_wait_seconds", "inline_epochs", "pipelined_epochs", "intra_op_threads")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_one(part: Part, contender: Contender, epochs: int, rep: int) -> dict[str, Any]:
    config = load_config(CONFIGS / part.config, [*part.overrides, *contender.overrides, f"device={contender.device}",
                                                 f"train.epochs={epochs}", f"seed={rep}", "progress=false",
                                                 "checkpoint.every=0"])
    record: dict[str, Any] = {"part": part.name, "contender": contender.name, "device": contender.device, "rep": rep,
                              "loadavg_before": list(os.getloadavg())}
    if part.name in MARIUS_EDGES_PER_SECOND:
        record["marius_edges_per_second"] = MARIUS_EDGES_PER_SECOND[part.name]
    if contender.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # a GPU contender first trains a few discarded batches: the Triton kernels' compilation and CUDA's
    # start-up are paid once a process, by whichever run comes first (FB15k sync 78k then 644k edges/s:
    # results/gpu_check_fb15k_10m_reps2_946ccb1.log)
    result = train_measured(config, record, "cadence-gpu-check-",
                            api.WARM_UP_BATCHES if contender.device == "cuda" else 0)
    if result is not None:
        summary = result.summary
        record.update({key: summary[key] for key in ("examples_per_second", "train_seconds", *METRICS)
                       if key in summary})
        # where the time went: the strategy's counters (busy seconds per pipeline stage, stale reads,
        # repaired rows, epochs run inline, intra-op threads)
        record["counters"] = {key: value for key, value in summary.items() if key in COUNTERS or key.endswith("_busy_seconds")}
        if contender.device == "cuda":
            record["cuda_peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)
    say(describe(record))
    return record


def describe(record: dict[str, Any]) -> str:
    head = f"{record['part']:10s} {record['contender']:9s} {record['device']:4s} rep {record['rep']}"
    if "error" in record:
        return f"{head}: FAILED {record['error']}"
    quality = "  ".join(f"{key} {record[key]:.4f}" for key in METRICS if key in record)
    counters = " ".join(f"{key.removesuffix('_seconds')}={value:g}" for key, value in record.get("counters", {}).items())
    return (f"{head}: {record['examples_per_second']:>10,.0f} ex/s  {quality}  ({record['train_seconds']:.1f} s)"
            + (f"  [{counters}]" if counters else ""))


def summarize(records: list[dict[str, Any]], part: Part) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for contender in part.contenders:
        key = f"{contender.name}@{contender.device}"
        mine = [r for r in records if r["contender"] == contender.name and r["device"] == contender.device
                and "error" not in r]
        if not mine:
            table[key] = {"error": next((r["error"] for r in records if r["contender"] == contender.name
                                         and r["device"] == contender.device), "no runs")}
            continue
        table[key] = {"examples_per_second": mean_ci([r["examples_per_second"] for r in mine])}
        for metric in METRICS:
            if metric in mine[0]:
                table[key][metric] = mean_ci([r[metric] for r in mine])
    base = table.get("sync@cuda", {}).get("examples_per_second", {}).get("mean")
    for row in table.values():
        if base and "examples_per_second" in row:
            row["throughput_vs_sync_cuda"] = row["examples_per_second"]["mean"] / base
    return table


def summary_table(report: dict[str, Any]) -> str:
    """One table of every part's contenders: examples/s (mean over reps), the metric, the ratio to
    sync on the GPU, and Marius's published edges/s where the part has one."""
    lines = [f"{'part':20s} {'contender':12s} {'examples/s':>12s} {'metric':>16s} {'vs sync@cuda':>12s} {'Marius':>9s}"]
    for name, part in report["parts"].items():
        for key, row in part["summary"].items():
            if "error" in row:
                lines.append(f"{name:20s} {key:12s} FAILED {row['error'][:60]}")
                continue
            metric = next((f"{m} {row[m]['mean']:.4f}" for m in METRICS if m in row), "")
            ratio = row.get("throughput_vs_sync_cuda")
            marius = MARIUS_EDGES_PER_SECOND.get(name)
            lines.append(f"{name:20s} {key:12s} {row['examples_per_second']['mean']:>12,.0f} {metric:>16s} "
                         f"{'' if ratio is None else f'{ratio:.2f}x':>12s} {'' if marius is None else f'{marius:,}':>9s}")
    return "\n".join(lines)


def with_variants(part: Part, variants: list[str]) -> Part:
    """``part`` with the ``--variant`` contenders named for it added (on the GPU)."""
    extra = []
    for variant in variants:
        try:
            where, name, overrides = variant.split(":", 2)
        except ValueError:
            raise SystemExit(f"gpu_check.py: --variant {variant!r}: expected PART:NAME:KEY=VALUE[,KEY=VALUE]")
        if where == part.name:
            extra.append(Contender(name, "cuda", tuple(overrides.split(","))))
    return replace(part, contenders=(*part.contenders, *extra)) if extra else part


def device_record() -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "cpu_count": os.cpu_count(), "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
    return info


def main() -> int:
    parser = peer_parser(__doc__, "1 rep, 1 epoch per part: a smoke test of the harness", 2,
                         "unused (a GPU machine is not shared)")
    parser.add_argument("--reps", type=int, default=2, help="interleaved repetitions (seeds 0..N-1; default 2)")
    parser.add_argument("--parts", default="image,kge,kge-large,kge-fb15k,ctr",
                        help="comma-separated: image, kge, ctr, kge-large, kge-fb15k")
    parser.add_argument("--variant", action="append", default=[], metavar="PART:NAME:KEY=VALUE[,KEY=VALUE]",
                        help="one more GPU contender in PART (e.g. kge-10m:async-wide:strategy=async,"
                             "pipeline.loader_threads=8), repeatable: a diagnosis inside one lease")
    args = parser.parse_args()
    provenance = check(args)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check.py: no CUDA device here (torch.cuda.is_available() is False)")
    _, out, command = peer_run(args, "gpu_check", 1)
    wanted = [name.strip() for name in args.parts.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(PARTS))
    if unknown:
        raise SystemExit(f"gpu_check.py: --parts: unknown {', '.join(unknown)} (known: {', '.join(PARTS)})")
    parts = {name: [with_variants(part, args.variant) for part in PARTS[name]] for name in wanted}
    reps = 1 if args.quick else args.reps
    started = time.perf_counter()
    say(f"gpu_check at {provenance['commit']}: {device_record()}")
    report: dict[str, Any] = {"command": command, "machine": device_record(), "reps": reps, "parts": {}}
    for name in wanted:
        for part in parts[name]:
            epochs = 1 if args.quick else part.epochs
            records = [run_one(part, contender, epochs, rep) for rep in range(reps) for contender in part.contenders]
            report["parts"][part.name] = {"config": f"configs/{part.config}", "epochs": epochs,
                                          "overrides": list(part.overrides), "runs": records,
                                          "summary": summarize(records, part)}
    path = write_report(report, out, started, 0.0)
    print(summary_table(report))
    say(f"wrote {path}")
    failed = [r for part in report["parts"].values() for r in part["runs"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
