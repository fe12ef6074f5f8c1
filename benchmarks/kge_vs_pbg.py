#!/usr/bin/env python
"""cadence vs PyTorch-BigGraph 1.0.0 on one machine, quiet and with a core taken, side by side.

    .venv/bin/python benchmarks/kge_vs_pbg.py [--quick] [--reps N] [--entities N] [--edges N]
        [--conditions quiet,busy] [--contenders cadence,pbg[,cadence-fixed]] [--model distmult|complex]
        [--loss logistic|softmax] [--lr LR] [--epochs E] [--communities C] [--out FILE] [--dirty]

One synthetic graph (``cadence.data.synthetic.power_law_graph``: Zipf-distributed endpoints, seed 0;
default 1M entities, 2M edges, 16 relations, the last 2 x 2,000 edges held out), written as TSV for
PBG (imported once with PBG's own importer, not timed) and generated in memory by cadence from the
same config and seed (``data.dataset=synthetic``): the same edges. One model (``--model``): DistMult
(default) or ComplEx (PBG's ``complex_diagonal`` operator), d=100, 100 negatives, batch 1000,
logistic loss (``--loss softmax``: softmax on both sides), row-wise Adagrad at lr 0.1, one epoch,
both cores:

- ``cadence``: ``cadence train`` (``.venv``), ``threads=2`` and the default ``adapt_threads`` (the
  compute thread's intra-op count chosen by measurement), the default negative layout
  (``train.negative_chunk: auto``: shared by the batch under logistic loss, per chunk of 100 edges
  under softmax; the record's ``negative_chunk`` says which);
- ``cadence-shared``: ``cadence`` with 100 negatives shared by the batch (``train.negative_chunk=0``);
- ``cadence-fixed``: the same at a fixed count of 2 (``adapt_threads=false``): the behaviour before
  the thread governor;
- ``cadence-chunked``: ``cadence`` with PBG's chunked negatives (``train.negative_chunk=100``: each
  chunk of 100 edges of a batch draws its own 100 negatives);
- ``cadence-reciprocal``: ``cadence`` with ``train.reciprocal=true``: a relation row per direction (heads
  are predicted as the tails of ``r^-1``), the model PBG's dynamic relations train (one operator per
  side); each side is ranked with its own rows (``QUERIES``, ``by_direction``);
- ``pbg``: ``benchmarks/peers/pbg_contender.py`` in ``.venv-bench-pbg``: 2 Hogwild worker processes of
  one torch thread each, PBG's chunked negatives (100 uniform entities per chunk of 100 edges);
- ``torchkge``: ``benchmarks/peers/torchkge_contender.py`` in ``.venv-bench-torchkge`` (the second peer):
  torchkge 0.17.7's own loop, one process of 2 torch threads, 100 uniform negatives per edge (head or
  tail), dense Adagrad over ``nn.Embedding`` tables; ``--torchkge-batches M`` stops it after ``M``
  batches (every step touches all 1M rows), and its MRR is then that of a part of the epoch.

Conditions: ``quiet``, and ``busy``: a busy loop (another process spinning on one core) started
before the contender and killed after it, as when a user shares the machine.

Per run: edges/s (cadence: its ``examples_per_second``, the epoch's edges over the seconds inside
the epoch; PBG: its own "Processed N edges in S s" over its buckets), the **peak PSS of the whole
process tree** (sampled every 50 ms from ``/proc/<pid>/smaps_rollup`` of the contender and every
descendant: PBG's worker processes count), and the quality of both by **one evaluator** here: each
run's entity rows and relation vectors are loaded, and 2,000 held-out edges are ranked (both sides,
unfiltered) against the same 1,000 uniformly drawn candidate entities (entities both sides know),
as PBG's own sampled evaluation does: sampled MRR and Hits@10.

Reps run interleaved (rep 1: every condition x contender, then rep 2, ...); ratios cadence/pbg
(and cadence/torchkge) are taken within a rep and condition, and summarised by their median and range.
Each side's scores are its own model's: cadence's ComplEx is ``Re(<h r, conj t>)`` on ``[real | imaginary]``
halves, PBG's applies the relation to the right-hand side, ``<h, r t>`` (the dot of the halves); the
evaluator ranks each side's vectors by its own formula.
**Time to a target MRR** (``--epochs E`` > 1): every contender trains E epochs and keeps each
epoch's model (cadence: ``checkpoint.keep=E``, each checkpoint's ``train_seconds``; PBG: every
version, its buckets' seconds), and each is ranked by the evaluator above. The targets are PBG's
sampled MRR after each of its epochs in the same rep and condition; a contender's time to a target
is its training seconds up to the end of its first epoch whose MRR reaches it (an upper bound at
epoch granularity, the same for both sides), and ``time_to_target`` in the summary is PBG's time
over the contender's (> 1: the contender gets there first), or ``null`` where it never does.

On the default graph the endpoints are independent, so both sides' held-out MRR peaks after about
one epoch; ``--communities C`` (``data.synthetic.communities``, docs/data.md) gives the graph
structure to learn, on which quality rises over several epochs.

Writes ``benchmarks/results/kge_vs_pbg.json`` (``kge_vs_pbg_complex.json`` for ComplEx; ``_epochsE``
with ``--epochs E`` > 1, ``_communitiesC`` with ``--communities C``, ``_softmax`` with ``--loss
softmax``; ``_lrLR`` with ``--lr`` other than 0.1; ``_quick`` with ``--quick``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from provenance import check  # same folder: every result traces to a commit

import numpy as np
import torch
import yaml

from kge_throughput import loadavg, machine_info
from peer_stats import BusyCore, OthersMeter, mean_ci, peer_parser, peer_run, write_report

from cadence import api
from cadence.config import SyntheticGraphConfig
from cadence.core import checkpoint as ckpt
from cadence.data.synthetic import power_law_graph

REPO = Path(__file__).resolve().parents[1]
CADENCE_CLI = REPO / ".venv" / "bin" / "cadence"
PBG_PYTHON = REPO / ".venv-bench-pbg" / "bin" / "python"
PBG_CONTENDER = REPO / "benchmarks" / "peers" / "pbg_contender.py"
PBG_OPERATORS = {"distmult": "diagonal", "complex": "complex_diagonal"}  # the relation operator on PBG's side
TORCHKGE_PYTHON = REPO / ".venv-bench-torchkge" / "bin" / "python"
TORCHKGE_CONTENDER = REPO / "benchmarks" / "peers" / "torchkge_contender.py"
SETTING = dict(dim=100, negatives=100, batch_size=1000, lr=0.1, threads=2, relations=16, holdout=2000, seed=0)
EVAL_EDGES, EVAL_CANDIDATES = 2000, 1000
CONTENDERS = ("cadence", "cadence-fixed", "cadence-shared", "cadence-chunked", "cadence-reciprocal", "pbg", "torchkge")
LAYOUTS = {"cadence": "auto", "cadence-fixed": "auto", "cadence-shared": 0, "cadence-chunked": SETTING["negatives"],
           "cadence-reciprocal": "auto"}
PEERS = ("pbg", "torchkge")  # the others are cadence's, each compared with every peer that ran


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- the process tree's memory -------------------------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                children = Path(f"/proc/{current}/task/{task}/children").read_text().split()
                stack.extend(int(c) for c in children)
        except OSError:
            continue
    return found


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeMemory:
    """The peak of the summed PSS of a process and all its descendants, sampled every ``every`` s."""

    def __init__(self, pid: int, every: float = 0.05):
        self.pid, self.every, self.peak_kib = pid, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, sum(_pss_kib(p) for p in _descendants(self.pid)))
            self._stop.wait(self.every)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak_kib / 1024, 1)


def run_tree(command: list[str], log: Path) -> tuple[int, float, float]:
    """(exit code, peak PSS MiB of the tree, wall seconds) of ``command``."""
    started = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        memory = TreeMemory(child.pid)
        code = child.wait()
    return code, memory.stop(), time.perf_counter() - started


# ---- the contenders ------------------------------------------------------------------------------------------
def graph_config(args) -> SyntheticGraphConfig:
    return SyntheticGraphConfig(num_entities=args.entities, num_relations=SETTING["relations"],
                                num_edges=args.edges, holdout=SETTING["holdout"], communities=args.communities)


def cadence_overrides(args, fixed: bool, layout: int | str = "auto", reciprocal: bool = False) -> list[str]:
    g, s = graph_config(args), SETTING
    return [f"seed={s['seed']}", "task=kge", "strategy=sync", "data.dataset=synthetic",
            f"data.synthetic.num_entities={g.num_entities}", f"data.synthetic.num_relations={g.num_relations}",
            f"data.synthetic.num_edges={g.num_edges}", f"data.synthetic.holdout={g.holdout}",
            f"data.synthetic.communities={g.communities}",
            f"model.name={args.model}", f"model.dim={s['dim']}", "train.scoring=sampled",
            f"train.negatives={s['negatives']}", f"train.loss={args.loss}", f"train.batch_size={s['batch_size']}",
            f"train.epochs={args.epochs}", "optimizer.entity=rowwise_adagrad", "optimizer.dense=adagrad", f"optimizer.lr={s['lr']}",
            f"threads={s['threads']}", f"adapt_threads={'false' if fixed else 'true'}", "eval.every=0",
            f"train.negative_chunk={layout}", f"train.reciprocal={'true' if reciprocal else 'false'}",
            "eval.test=false", "checkpoint.every=1", f"checkpoint.keep={max(2, args.epochs)}", "progress=false"]


def run_cadence(args, work: Path, fixed: bool, layout: int | str = "auto", reciprocal: bool = False) -> dict[str, Any]:
    out = work / "run"
    command = [str(CADENCE_CLI), "train", "--out", str(out), "--overwrite"]
    for item in cadence_overrides(args, fixed, layout, reciprocal):
        command += ["--set", item]
    code, peak, wall = run_tree(command, work / "log.txt")
    if code != 0:
        return {"error": f"exit {code}: {(work / 'log.txt').read_text()[-400:]}"}
    summary = json.loads((out / "summary.json").read_text())
    _, _, view, dense = api.load_model(out)
    entities = view.values(torch.arange(args.entities)).numpy()
    relations = by_direction(dense.relations.detach().numpy(), reciprocal)
    record = {"edges_per_second": summary["examples_per_second"], "train_seconds": summary["train_seconds"],
              "peak_pss_mib": peak, "process_wall_seconds": round(wall, 2),
              "negative_chunk": yaml.safe_load((out / "config.yaml").read_text())["train"]["negative_chunk"],
              "cadence_commit": summary.get("environment", {}).get("commit")}  # the checkout its cadence ran from
    record.update({k: summary[k] for k in ("intra_op_threads", "intra_op_switches", "intra_op_probes") if k in summary})
    if args.epochs > 1:
        record["_epochs"] = [epoch_vectors(path, args.entities, reciprocal) for path in ckpt.epoch_checkpoints(out)]
    return {**record, "_vectors": (entities, *relations)}


def by_direction(relations: np.ndarray, reciprocal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(the relation rows tails are predicted with, those heads are): a reciprocal run's inverse rows
    (``r^-1``, row R + r) predict heads."""
    if not reciprocal:
        return relations, relations
    half = relations.shape[0] // 2
    return relations[:half], relations[half:]


def epoch_vectors(path: Path, entities: int, reciprocal: bool = False
                  ) -> tuple[float, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """One epoch checkpoint of a cadence run: its training seconds so far, and its entity rows (in
    id order) and the relation rows of each direction (``by_direction``)."""
    tensors, state = ckpt.load_checkpoint(path)
    rows = np.zeros((entities, tensors["table.values"].shape[1]), dtype=np.float32)
    rows[tensors["table.keys"].numpy()] = tensors["table.values"].numpy()
    return state["progress"]["train_seconds"], (rows, *by_direction(tensors["dense.relations"].numpy(), reciprocal))


def run_peer(command: list[str], work: Path, fields: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """A peer's contender script as a process tree: its edges/s and seconds (its ``OUT/result.json``),
    the tree's peak PSS, its vectors (``OUT/entities.npy``, ``OUT/relations.npy``: the relation rows
    heads are predicted with, and tails too unless ``OUT/relations_lhs.npy`` holds those), and
    ``fields`` of its result; or ``error``."""
    code, peak, wall = run_tree(command, work / "log.txt")
    if code != 0:
        return {"error": f"exit {code}: {(work / 'log.txt').read_text()[-400:]}"}
    result = json.loads((work / "result.json").read_text())

    def relations(suffix: str = "") -> tuple[np.ndarray, np.ndarray]:
        heads = np.load(work / f"relations{suffix}.npy")
        tails = work / f"relations_lhs{suffix}.npy"
        return (np.load(tails) if tails.exists() else heads), heads

    entities = np.load(work / "entities.npy")
    record = {"edges_per_second": result["edges_per_second"], "train_seconds": result["train_seconds"],
              **fields(result), "peak_pss_mib": peak, "process_wall_seconds": round(wall, 2)}
    if len(result.get("epoch_seconds", [])) > 1:
        seconds = np.cumsum(result["epoch_seconds"])
        record["_epochs"] = [(float(seconds[e - 1]), (np.load(work / f"entities.e{e}.npy"), *relations(f".e{e}")))
                             for e in range(1, len(seconds) + 1)]
    return {**record, "_vectors": (entities, *relations())}


def run_pbg(args, work: Path, data: Path) -> dict[str, Any]:
    s = SETTING
    command = [str(PBG_PYTHON), str(PBG_CONTENDER), "--data", str(data), "--out", str(work), "--dim", str(s["dim"]),
               "--negatives", str(s["negatives"]), "--batch-size", str(s["batch_size"]), "--lr", str(s["lr"]),
               "--workers", str(s["threads"]), "--epochs", str(args.epochs), "--operator", PBG_OPERATORS[args.model],
               "--loss", args.loss]
    return run_peer(command, work, lambda result: {"train_call_seconds": round(result["train_call_seconds"], 2)})


def run_torchkge(args, work: Path, data: Path) -> dict[str, Any]:
    s = SETTING
    command = [str(TORCHKGE_PYTHON), str(TORCHKGE_CONTENDER), "--data", str(data), "--out", str(work),
               "--entities", str(args.entities), "--dim", str(s["dim"]), "--negatives", str(s["negatives"]),
               "--batch-size", str(s["batch_size"]), "--lr", str(s["lr"]), "--threads", str(s["threads"]),
               "--epochs", "1", "--model", args.model, "--max-batches", str(args.torchkge_batches)]
    return run_peer(command, work, lambda result: {"edges_trained": result["edges"],
                                                   "complete_epoch": result["complete_epochs"]})


# ---- one evaluator for all ----------------------------------------------------------------------------------
def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Complex products of ``[real | imaginary]`` halves."""
    ar, ai = a.chunk(2, dim=-1)
    br, bi = b.chunk(2, dim=-1)
    return torch.cat([ar * br - ai * bi, ar * bi + ai * br], dim=-1)


def _conjugate(a: torch.Tensor) -> torch.Tensor:
    real, imag = a.chunk(2, dim=-1)
    return torch.cat([real, -imag], dim=-1)


# (tail query(h, r), head query(r, t)): the vectors whose dot with a candidate entity is its score,
# r being the relation rows of that direction (a reciprocal run's r^-1 predicts heads; PBG's dynamic
# relations keep one operator per side: the left-hand one scores tail corruptions, g_r(h) . c, the
# right-hand one head corruptions, c . h_r(t))
QUERIES = {
    ("cadence", "distmult"): (lambda h, r: h * r, lambda r, t: r * t),
    ("cadence-reciprocal", "distmult"): (lambda h, r: h * r, lambda r, t: t * r),
    ("pbg", "distmult"): (lambda h, r: h * r, lambda r, t: r * t),
    # Re(<h r, conj c>) = (h r) . c;  Re(<c r, conj t>) = c . conj(r conj t)
    ("cadence", "complex"): (lambda h, r: _product(h, r), lambda r, t: _conjugate(_product(r, _conjugate(t)))),
    # the inverse relation's tail query from t: Re(<t r^-1, conj c>) = (t r^-1) . c
    ("cadence-reciprocal", "complex"): (lambda h, r: _product(h, r), lambda r, t: _product(t, r)),
    # PBG: (r_lhs h) . c;  c . (r_rhs t)
    ("pbg", "complex"): (lambda h, r: _product(r, h), lambda r, t: _product(r, t)),
}


def sampled_ranking(vectors: tuple[np.ndarray, np.ndarray, np.ndarray], test: torch.Tensor, candidates: torch.Tensor,
                    side: str = "cadence", model: str = "distmult") -> dict[str, float]:
    """Each held-out edge's tail (and head) ranked against the same candidates by ``side``'s own
    score of ``model`` (``QUERIES``) with the relation rows of that direction (``vectors``: entity
    rows, tail-side relation rows, head-side relation rows), unfiltered; ties count half. Entities a
    side never saw (NaN rows) score as zero vectors."""
    entities = torch.from_numpy(np.nan_to_num(vectors[0], nan=0.0)).double()
    tail_relations, head_relations = (torch.from_numpy(v).double() for v in vectors[1:])
    tail_query, head_query = QUERIES[(side, model)]
    h, r, t = test.unbind(1)
    cand = entities[candidates]  # [C, d]
    ranks = []
    for query, target in ((tail_query(entities[h], tail_relations[r]), t),
                          (head_query(head_relations[r], entities[t]), h)):
        true = (query * entities[target]).sum(1, keepdim=True)
        scores = query @ cand.T
        scores[candidates.unsqueeze(0) == target.unsqueeze(1)] = float("-inf")
        ranks.append(1 + (scores > true).sum(1) + 0.5 * (scores == true).sum(1))
    ranks = torch.cat(ranks).double()
    return {"sampled_mrr": float((1 / ranks).mean()), "sampled_hits@10": float((ranks <= 10).double().mean())}


def write_tsv(path: Path, triples: torch.Tensor) -> None:
    np.savetxt(path, triples.numpy(), fmt="%d", delimiter="\t")


def main() -> int:
    parser = peer_parser(__doc__, "300k entities, 600k edges, 1 rep: a smoke test", 3, "unused")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--entities", type=int, default=None, help="default 1,000,000 (--quick 300,000)")
    parser.add_argument("--edges", type=int, default=None, help="default 2,000,000 (--quick 600,000)")
    parser.add_argument("--conditions", default="quiet,busy", help="comma-separated: quiet, busy")
    parser.add_argument("--contenders", default="cadence,pbg", help="comma-separated: " + ", ".join(CONTENDERS))
    parser.add_argument("--model", choices=sorted(PBG_OPERATORS), default="distmult",
                        help="distmult (default) or complex")
    parser.add_argument("--loss", choices=("logistic", "softmax"), default="logistic",
                        help="the loss of every contender (default logistic; PBG's loss_fn of the same name)")
    parser.add_argument("--torchkge-batches", type=int, default=0,
                        help="stop torchkge after this many batches (default 0: the whole epoch)")
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs per run (default 1); > 1: each epoch's model is ranked, and the time to "
                             "PBG's MRR after each of its epochs is compared")
    parser.add_argument("--communities", type=int, default=0,
                        help="data.synthetic.communities of the graph (default 0: independent endpoints)")
    parser.add_argument("--lr", type=float, default=SETTING["lr"],
                        help=f"the learning rate of every contender (default {SETTING['lr']})")
    args = parser.parse_args()
    provenance = check(args)
    SETTING["lr"] = args.lr
    args.entities = args.entities or (300_000 if args.quick else 1_000_000)
    args.edges = args.edges or (600_000 if args.quick else 2_000_000)
    reps = 1 if args.quick else args.reps
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if set(conditions) - {"quiet", "busy"} or set(contenders) - set(CONTENDERS):
        raise SystemExit("kge_vs_pbg.py: --conditions takes quiet, busy; --contenders " + ", ".join(CONTENDERS))
    if "torchkge" in contenders and args.loss != "logistic":
        raise SystemExit("kge_vs_pbg.py: torchkge runs the logistic loss only")
    if args.epochs < 1 or (args.epochs > 1 and "torchkge" in contenders):
        raise SystemExit("kge_vs_pbg.py: --epochs takes a positive count (and > 1 not with torchkge)")
    if "pbg" in contenders and not PBG_PYTHON.exists():
        raise SystemExit(f"kge_vs_pbg.py: no {PBG_PYTHON}: make .venv-bench-pbg/bin/python "
                         "(benchmarks/peers/requirements-pbg.txt)")
    if "torchkge" in contenders and not TORCHKGE_PYTHON.exists():
        raise SystemExit(f"kge_vs_pbg.py: no {TORCHKGE_PYTHON}: make .venv-bench-torchkge/bin/python "
                         "(benchmarks/peers/requirements-torchkge.txt)")
    name = "kge_vs_pbg" + ("" if args.model == "distmult" else f"_{args.model}") + (
        f"_epochs{args.epochs}" if args.epochs > 1 else "") + (
        f"_communities{args.communities}" if args.communities else "") + (
        "" if args.loss == "logistic" else f"_{args.loss}") + (f"_lr{args.lr:g}" if args.lr != 0.1 else "")
    _, out, command = peer_run(args, name, 1)
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="cadence-kge-vs-pbg-"))
    try:
        graph = power_law_graph(graph_config(args), SETTING["seed"])
        data = root / "data"
        data.mkdir()
        write_tsv(data / "train.tsv", graph.train)
        write_tsv(data / "test.tsv", graph.test)
        seen = torch.zeros(args.entities, dtype=torch.bool)
        seen[torch.cat([graph.train[:, 0], graph.train[:, 2], graph.test[:, 0], graph.test[:, 2]])] = True
        known = seen.nonzero().squeeze(1)  # entities PBG's importer creates
        rng = torch.Generator().manual_seed(1)
        test = graph.test[torch.randperm(graph.test.shape[0], generator=rng)[:EVAL_EDGES]]
        candidates = known[torch.randint(known.shape[0], (EVAL_CANDIDATES,), generator=rng)]
        say(f"kge_vs_pbg at {provenance['commit']}: {args.entities:,} entities ({known.shape[0]:,} on some edge), "
            f"{graph.train.shape[0]:,} training edges")
        records = []
        for rep in range(reps):
            for condition in conditions:
                for contender in contenders:
                    work = root / f"{contender}-{condition}-{rep}"
                    work.mkdir()
                    record: dict[str, Any] = {"rep": rep, "condition": condition, "contender": contender,
                                              "loadavg_before": loadavg()}
                    busy = BusyCore() if condition == "busy" else None
                    with OthersMeter() as meter:
                        if busy:
                            busy.__enter__()
                        try:
                            result = (run_pbg(args, work, data) if contender == "pbg"
                                      else run_torchkge(args, work, data) if contender == "torchkge"
                                      else run_cadence(args, work, fixed=contender == "cadence-fixed",
                                                       layout=LAYOUTS[contender],
                                                       reciprocal=contender == "cadence-reciprocal"))
                        finally:
                            if busy:
                                busy.__exit__()
                    record["others_cpu_share"] = round(meter.share, 3)
                    vectors, epochs = result.pop("_vectors", None), result.pop("_epochs", None)
                    record.update(result)
                    side = contender if contender in ("pbg", "cadence-reciprocal") else "cadence"
                    if vectors is not None:
                        record.update(sampled_ranking(vectors, test, candidates, side, args.model))
                    if epochs is not None:
                        record["epochs"] = [{"epoch": e, "train_seconds": round(seconds, 3),
                                             **sampled_ranking(vecs, test, candidates, side, args.model)}
                                            for e, (seconds, vecs) in enumerate(epochs, 1)]
                    records.append(record)
                    say(describe(record))
                    shutil.rmtree(work, ignore_errors=True)
        report = {"command": command, "machine": machine_info(), "setting": {**SETTING, "model": args.model, "loss": args.loss},
                  "graph": {"entities": args.entities, "entities_on_edges": int(known.shape[0]),
                            "training_edges": int(graph.train.shape[0]), "relations": SETTING["relations"],
                            "exponent": graph_config(args).exponent, "communities": args.communities},
                  "evaluation": {"edges": EVAL_EDGES, "candidates": EVAL_CANDIDATES, "filtered": False},
                  "cadence_config": cadence_overrides(args, False), "epochs": args.epochs, "runs": records,
                  "summary": summarize(records, conditions, contenders)}
        path = write_report(report, out, started, 0.0)
        say(json.dumps(report["summary"], indent=1))
        say(f"wrote {path}")
        return 1 if any("error" in r for r in records) else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def describe(record: dict[str, Any]) -> str:
    head = f"rep {record['rep']} {record['condition']:5s} {record['contender']:13s}"
    if "error" in record:
        return f"{head} FAILED {record['error']}"
    line = (f"{head} {record['edges_per_second']:>10,.0f} edges/s  peak {record['peak_pss_mib']:>7,.0f} MiB  "
            f"MRR {record['sampled_mrr']:.4f}  others {record['others_cpu_share']:.2f}")
    for epoch in record.get("epochs", []):
        line += f"\n    epoch {epoch['epoch']}: {epoch['train_seconds']:8.1f} s  MRR {epoch['sampled_mrr']:.4f}"
    return line


def time_to_targets(mine: list[dict[str, Any]], peer: list[dict[str, Any]]) -> list[float | None]:
    """For each of the peer's epochs: the peer's training seconds to reach its MRR after that epoch,
    over ``mine``'s seconds to the end of its first epoch whose MRR reaches the same value (> 1:
    mine gets there first); ``None`` where mine never reaches it."""
    ratios: list[float | None] = []
    for target in peer:
        reached = next((e for e in mine if e["sampled_mrr"] >= target["sampled_mrr"]), None)
        ratios.append(None if reached is None else target["train_seconds"] / reached["train_seconds"])
    return ratios


def summarize(records: list[dict[str, Any]], conditions: list[str], contenders: list[str]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for condition in conditions:
        rows = {}
        for contender in contenders:
            mine = [r for r in records if r["condition"] == condition and r["contender"] == contender and "error" not in r]
            if mine:
                rows[contender] = {key: mean_ci([r[key] for r in mine])
                                   for key in ("edges_per_second", "peak_pss_mib", "sampled_mrr")}
        for peer_name in [c for c in contenders if c in PEERS]:
            for contender in [c for c in contenders if c not in PEERS]:
                ratios = {}
                for key in ("edges_per_second", "peak_pss_mib", "sampled_mrr"):
                    per_rep = []
                    for r in records:
                        if r["condition"] != condition or r["contender"] != contender or "error" in r:
                            continue
                        peer = next((p for p in records if p["condition"] == condition and p["contender"] == peer_name
                                     and p["rep"] == r["rep"] and "error" not in p), None)
                        if peer:
                            per_rep.append(r[key] / peer[key])
                    if per_rep:
                        ratios[key] = {"median": statistics.median(per_rep), "min": min(per_rep), "max": max(per_rep),
                                       "per_rep": per_rep}
                targets = [time_to_targets(r["epochs"], p["epochs"]) for r in records for p in records
                           if r["condition"] == p["condition"] == condition and r["rep"] == p["rep"]
                           and r["contender"] == contender and p["contender"] == peer_name and "epochs" in r
                           and "epochs" in p]
                if targets:  # per peer epoch: the ratio in each rep (None: never reached)
                    ratios["time_to_target"] = {
                        f"{peer_name}_epoch_{e + 1}": {"per_rep": [t[e] for t in targets],
                                               "median": (statistics.median([t[e] for t in targets])
                                                          if all(t[e] is not None for t in targets) else None)}
                        for e in range(len(targets[0]))}
                rows[f"{contender}/{peer_name}"] = ratios
        table[condition] = rows
    return table


if __name__ == "__main__":
    sys.exit(main())
