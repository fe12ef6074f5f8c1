#!/usr/bin/env python
"""The table of every task against its strongest peer, generated from the result files (never typed).

    python3 benchmarks/peers_table.py            # print the table
    python3 benchmarks/peers_table.py --write    # put it into docs/benchmarks.md between its markers

Each row reads one result file of ``benchmarks/results/`` (written by ``make bench-peers``) and names
the commit it was measured at (``provenance.commit``; files from before provenance was recorded say
so, with their date). ``tests/benchmarks/test_peers_table.py`` fails when the table in
docs/benchmarks.md differs from what this script renders from the committed files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import doc_tables  # same folder

RESULTS = Path(__file__).resolve().parent / "results"
NAME, SCRIPT = "peers-table", "peers_table.py"
HEADER = ("| task | comparison | cadence | peer | cadence / peer | quality (cadence vs peer) | measured at |\n"
          "|---|---|---|---|---|---|---|")


def _k(value: float) -> str:
    return f"{value / 1000:,.1f}k" if value >= 1000 else f"{value:,.0f}"


def _ratio(stats: dict[str, Any]) -> str:
    text = f"**{stats['median']:.2f}x**"
    if "min" in stats and len(stats.get("per_rep", [])) > 1:
        text += f" ({stats['min']:.2f}-{stats['max']:.2f})"
    elif len(stats.get("per_seed", [])) > 1:
        text += f" ({min(stats['per_seed']):.2f}-{max(stats['per_seed']):.2f})"
    return text


def _where(report: dict[str, Any], name: str) -> str:
    commit = (report.get("provenance") or {}).get("commit")
    at = f"`{commit[:7]}`" if commit else f"before provenance ({report.get('date', '?')[:10]})"
    return f"{at}, `results/{name}`"


KGE_PEERS = (("pbg", "PyTorch-BigGraph 1.0.0"), ("torchkge", "torchkge 0.17.7"))


def kge(report: dict[str, Any], name: str) -> list[str]:
    rows, summary = [], report["summary"]
    graph = report["graph"]
    model = {"distmult": "DistMult", "complex": "ComplEx"}[report["setting"].get("model", "distmult")]
    shape = f"{model} d100, {graph['entities'] / 1e6:g}M entities, {graph['training_edges'] / 1e6:.1f}M edges"
    for (peer_name, peer_label), (condition, label) in [(p, c) for p in KGE_PEERS for c in (
            ("quiet", "edges/s"), ("busy", "edges/s, one core taken"))]:
        table = summary.get(condition, {})
        if "cadence" not in table or peer_name not in table:
            continue
        ratio = table[f"cadence/{peer_name}"]
        mine, peer = table["cadence"], table[peer_name]
        quality = f"sampled MRR {mine['sampled_mrr']['mean']:.3f} vs {peer['sampled_mrr']['mean']:.3f}"
        partial = [r for r in report["runs"] if r.get("contender") == peer_name and r.get("condition") == condition
                   and r.get("complete_epoch") is False]
        if partial:  # a peer stopped after part of the epoch: its MRR is of that part
            quality += f" (after {partial[0]['edges_trained'] / graph['training_edges']:.0%} of the epoch)"
        rows.append(f"| kge | {shape}: {label} vs {peer_label} | {_k(mine['edges_per_second']['mean'])} | "
                    f"{_k(peer['edges_per_second']['mean'])} | {_ratio(ratio['edges_per_second'])} | {quality} | "
                    f"{_where(report, name)} |")
        if condition == "quiet":
            rows.append(f"| kge | the same: peak PSS of the process tree (MiB; lower is better) | "
                        f"{mine['peak_pss_mib']['mean']:,.0f} | {peer['peak_pss_mib']['mean']:,.0f} | "
                        f"{_ratio(ratio['peak_pss_mib'])} | | {_where(report, name)} |")
    return rows


def kge_epochs(report: dict[str, Any], name: str) -> list[str]:
    """Time to PBG's sampled MRR after its first epoch (and, on a graph with communities, after its
    last), from runs of several epochs (``--epochs``)."""
    rows, graph, epochs = [], report["graph"], report["epochs"]
    model = {"distmult": "DistMult", "complex": "ComplEx"}[report["setting"].get("model", "distmult")]
    structure = f", {graph['communities']:,} communities" if graph.get("communities") else ""
    targets = [1, epochs] if graph.get("communities") and epochs > 1 else [1]
    ordinal = {1: "first", 2: "2nd", 3: "3rd"}
    for (condition, label), epoch in [(c, e) for c in (("quiet", ""), ("busy", ", one core taken")) for e in targets]:
        runs = [r for r in report["runs"] if r.get("condition") == condition and "epochs" in r]
        pairs = [(r, p) for r in runs for p in runs if r["contender"] == "cadence" and p["contender"] == "pbg"
                 and r["rep"] == p["rep"]]
        if not pairs:
            continue
        ratio = report["summary"][condition]["cadence/pbg"]["time_to_target"][f"pbg_epoch_{epoch}"]
        target = [p["epochs"][epoch - 1] for _, p in pairs]
        reached = [next((e for e in r["epochs"] if e["sampled_mrr"] >= t["sampled_mrr"]), None)
                   for (r, _), t in zip(pairs, target)]
        got = [e for e in reached if e is not None]
        mine = f"{sum(e['train_seconds'] for e in got) / len(got):.1f} s" if got else "not reached"
        if len(got) < len(reached):  # reps where cadence never reached the peer's MRR: say so
            mine += f" ({len(reached) - len(got)} of {len(reached)} reps: not reached)"
        per_rep = [r for r in ratio["per_rep"] if r is not None]
        stats = {"median": statistics.median(per_rep), "min": min(per_rep), "max": max(per_rep),
                 "per_rep": per_rep} if per_rep else None
        shown = _ratio(stats) if stats else "never"
        if stats and len(per_rep) < len(ratio["per_rep"]):
            shown += f" in {len(per_rep)} of {len(ratio['per_rep'])} reps"
        which = ordinal.get(epoch, f"{epoch}th")
        quality = (f"target: PBG's epoch-{epoch} MRR {sum(t['sampled_mrr'] for t in target) / len(target):.3f}; "
                   f"best {max(e['sampled_mrr'] for r, _ in pairs for e in r['epochs']):.3f} vs "
                   f"{max(e['sampled_mrr'] for _, p in pairs for e in p['epochs']):.3f} in {epochs} epochs")
        rows.append(f"| kge | {model} d100, {graph['entities'] / 1e6:g}M entities{structure}: seconds to PBG's MRR "
                    f"after its {which} epoch{label} (lower is better; ratio: PBG's / cadence's) | {mine} | "
                    f"{sum(t['train_seconds'] for t in target) / len(target):.1f} s | "
                    f"{shown} | {quality} | {_where(report, name)} |")
    return rows


def w2v(report: dict[str, Any], name: str) -> list[str]:
    s = report["summary"]
    peer = s["gensim"]
    # (since w2v.update: auto, "cadence" is configs/w2v.yaml, the default: word2vec's loop, and
    # "cadence-pair" configs/w2v-pair.yaml; from w2v.update: pair to then, "cadence" was
    # configs/w2v-pair.yaml and "cadence-batch" configs/w2v.yaml; before, "cadence" was the batch updates)
    if "cadence-pair" in s:
        labels = {"cadence": ("skip-gram words/s, the default (`configs/w2v.yaml`: word2vec's loop)", "cadence_over_gensim"),
                  "cadence-pair": ("word2vec's loop in batches of 8,192 (`configs/w2v-pair.yaml`)",
                                   "cadence_pair_over_gensim")}
        if "cadence-batch" in s:
            labels["cadence-batch"] = ("batch updates (`configs/w2v-batch.yaml`)", "cadence_batch_over_gensim")
    elif "cadence-batch" in s:
        labels = {"cadence": ("skip-gram words/s, word2vec's update (`w2v.update: pair`)", "cadence_over_gensim"),
                  "cadence-batch": ("the same with batch updates (`configs/w2v.yaml`)", "cadence_batch_over_gensim")}
    else:
        labels = {"cadence": ("skip-gram words/s", "cadence_over_gensim")}
    rows = []
    for contender, (label, ratio) in labels.items():
        mine = s[contender]
        quality = f"WS353 {mine['wordsim353']['mean']:.3f} vs {peer['wordsim353']['mean']:.3f}"
        rows.append(f"| w2v | {label} vs gensim 4.4.0 | {_k(mine['words_per_second']['mean'])} | "
                    f"{_k(peer['words_per_second']['mean'])} | {_ratio(s['speed_ratio_' + ratio])} | {quality} | "
                    f"{_where(report, name)} |")
    busy = s.get("busy")
    if busy is not None:
        mine, peer = busy["cadence"], busy["gensim"]
        quality = f"WS353 {mine['wordsim353']['mean']:.3f} vs {peer['wordsim353']['mean']:.3f}"
        rows.insert(1, f"| w2v | the same (`w2v.update: pair`), one core taken vs gensim 4.4.0 | "
                       f"{_k(mine['words_per_second']['mean'])} | {_k(peer['words_per_second']['mean'])} | "
                       f"{_ratio(busy['speed_ratio_cadence_over_gensim'])} | {quality} | {_where(report, name)} |")
    return rows


def mf(report: dict[str, Any], name: str) -> list[str]:
    s = report["summary"]
    mine, peer = s["cadence"], s["surprise_default"]
    quality = f"RMSE {mine['rmse']['mean']:.4f} vs {peer['rmse']['mean']:.4f}"
    rows = [f"| mf | ML-100k ratings/s vs Surprise 1.1.5 SVD | {_k(mine['ratings_per_second']['mean'])} | "
            f"{_k(peer['ratings_per_second']['mean'])} | {_ratio(s['speed_ratio_cadence_over_surprise_default'])} | "
            f"{quality} | {_where(report, name)} |"]
    if "cadence_rating" in s:  # Surprise's own loop (mf.update: rating), against both Surprise settings
        mine = s["cadence_rating"]
        for peer_name, label in (("surprise_default", "SVD defaults"), ("surprise_tuned", "SVD, the same setting")):
            peer = s[peer_name]
            quality = f"RMSE {mine['rmse']['mean']:.4f} vs {peer['rmse']['mean']:.4f}"
            rows.append(f"| mf | ML-100k, Surprise's loop (`mf.update: rating`) ratings/s vs Surprise 1.1.5 {label} | "
                        f"{_k(mine['ratings_per_second']['mean'])} | {_k(peer['ratings_per_second']['mean'])} | "
                        f"{_ratio(s['speed_ratio_cadence_rating_over_' + peer_name])} | {quality} | "
                        f"{_where(report, name)} |")
    return rows


def mf_synthetic(report: dict[str, Any], name: str) -> list[str]:
    """The rating loop on the synthetic Zipf matrix (``--synthetic``) against Surprise's defaults."""
    s, size = report["summary"], report["synthetic"]
    if "cadence_rating" not in s:  # (the first synthetic files ran ML-100k's configs only)
        return []
    mine, peer = s["cadence_rating"], s["surprise_default"]
    config = report["settings"]["cadence_rating"]["config"]
    quality = f"RMSE {mine['rmse']['mean']:.4f} vs {peer['rmse']['mean']:.4f}"
    return [f"| mf | synthetic Zipf, {size['ratings'] / 1e6:g}M ratings, Surprise's loop (`{config}`) ratings/s vs "
            f"Surprise 1.1.5 SVD defaults | {_k(mine['ratings_per_second']['mean'])} | "
            f"{_k(peer['ratings_per_second']['mean'])} | "
            f"{_ratio(s['speed_ratio_cadence_rating_over_surprise_default'])} | {quality} | {_where(report, name)} |"]


CTR_PEERS = {"deepctr": "DeepCTR-Torch 0.3.0", "torchrec": "TorchRec 1.9.2 (fused fbgemm tables)"}


def ctr(report: dict[str, Any], name: str) -> list[str]:
    s = report["summary"]
    peer_name = report.get("peer", "deepctr")  # (results before --peer: DeepCTR)
    mine, peer = s["cadence_pipeline"], s[peer_name]
    quality = f"AUC {mine['auc']['mean']:.4f} vs {peer['auc']['mean']:.4f}"
    return [f"| ctr | DeepFM examples/s vs {CTR_PEERS[peer_name]} | {_k(mine['examples_per_second']['mean'])} | "
            f"{_k(peer['examples_per_second']['mean'])} | "
            f"{_ratio(s[f'speed_ratio_cadence_pipeline_over_{peer_name}'])} | {quality} | {_where(report, name)} |"]


SOURCES: tuple[tuple[str, Callable[[dict[str, Any], str], list[str]]], ...] = (
    ("kge_vs_pbg.json", kge), ("kge_vs_pbg_epochs3.json", kge_epochs),
    ("kge_vs_pbg_epochs3_communities4096.json", kge_epochs), ("kge_vs_pbg_complex.json", kge),
    ("kge_vs_torchkge.json", kge),
    ("w2v_vs_gensim.json", w2v), ("mf_vs_surprise.json", mf), ("mf_vs_surprise_synthetic.json", mf_synthetic),
    ("ctr_vs_deepctr.json", ctr),
    ("ctr_vs_torchrec.json", ctr))


def render(results: Path = RESULTS) -> str:
    rows = [HEADER]
    for name, rows_of in SOURCES:
        path = results / name
        if path.exists():
            rows.extend(rows_of(json.loads(path.read_text()), name))
        else:
            rows.append(f"| {name.split('_')[0]} | `results/{name}` not measured yet | | | | | |")
    return "\n".join(rows)


def block(text: str) -> str | None:
    """The table between the markers of a document, or None where it has none."""
    return doc_tables.block(text, NAME, SCRIPT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {doc_tables.DOC.name} between its markers")
    args = parser.parse_args()
    doc_tables.emit(render(), args.write, NAME, SCRIPT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
