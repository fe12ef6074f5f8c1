#!/usr/bin/env python
"""Importing a large edge list (issue 28): cadence's graph reader against pandas, side by side.

    .venv/bin/python benchmarks/import_edges.py [--edges N] [--entities N] [--reps R] [--quick] [--out FILE]

The data: a seeded power-law graph (``cadence.data.synthetic``, ``--edges`` training edges over
``--entities`` entities, 50 relations, 10,000 held out for each of valid and test) written as a graph
directory of ``head<TAB>relation<TAB>tail`` text files with Wikidata-style names (``Q123``, ``P7``),
once, under ``$CADENCE_HOME/bench/``. Every contender reads the same three files into id triples
(names given ids in sorted order over train, the other splits looked up), each run in a fresh
process, contenders interleaved rep after rep; the files are read once beforehand (page cache warm:
this measures parsing, not the disk):

- ``cadence``: ``cadence.data.triples.read_graph_directory`` (the column reader; duplicates and unseen
  names dropped, as it always does; its progress bar off);
- ``cadence-lines``: the line reader alone (what every graph was read with before the column reader,
  and still reads anything irregular);
- ``pandas``: ``benchmarks/peers/pandas_contender.py`` in ``.venv-bench-pandas`` (pandas 2.2.3,
  ``read_csv`` with the C engine, then ``factorize(sort=True)``): ``seconds`` to id triples, and
  ``read_seconds``, the files alone.

Per run: rows (lines) per second to id triples, and the process's peak RSS. The summary: medians and
the per-rep ratios cadence / pandas. Writes ``benchmarks/results/import_edges.json``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from peer_stats import mean_ci, peer_parser, peer_run, write_report
from provenance import check

from cadence.config import SyntheticGraphConfig
from cadence.data.fetch import cadence_home
from cadence.data.synthetic import power_law_graph

REPO = Path(__file__).resolve().parents[1]
PANDAS_PY = REPO / ".venv-bench-pandas" / "bin" / "python"
HOLDOUT = 10_000

CADENCE_SIDE = """
import json, resource, sys, time
from pathlib import Path
from cadence.data import triples
started = time.perf_counter()
read = triples._read_lines if sys.argv[2] == "lines" else (lambda d, s, n: triples.read_graph_directory(d, s, n, False))
graph = read(Path(sys.argv[1]), False, None)
seconds = time.perf_counter() - started
rows = sum(sum(1 for _ in open(Path(sys.argv[1]) / f"{s}.txt", "rb")) for s in triples.SPLITS)
print(json.dumps({"rows": rows, "seconds": seconds, "entities": graph.num_entities, "relations": graph.num_relations,
                  "kept": int(graph.train.shape[0] + graph.valid.shape[0] + graph.test.shape[0]),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def edge_list(edges: int, entities: int) -> Path:
    """The graph directory (written once): Q-named entities, P-named relations."""
    directory = cadence_home() / "bench" / f"edges-{edges}-{entities}"
    if (directory / "done").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    graph = power_law_graph(SyntheticGraphConfig(num_entities=entities, num_relations=50, num_edges=edges + 2 * HOLDOUT,
                                                 holdout=HOLDOUT), 0)
    for split in ("train", "valid", "test"):
        triples = graph.split(split).numpy()
        with open(directory / f"{split}.txt", "w", encoding="utf-8") as handle:
            for start in range(0, len(triples), 1 << 20):
                block = triples[start:start + (1 << 20)]
                handle.writelines(f"Q{h}\tP{r}\tQ{t}\n" for h, r, t in block.tolist())
    (directory / "done").write_text("")
    return directory


def run(contender: str, directory: Path) -> dict:
    if contender == "pandas":
        command = [str(PANDAS_PY), str(REPO / "benchmarks" / "peers" / "pandas_contender.py"), str(directory)]
    else:
        command = [sys.executable, "-c", CADENCE_SIDE, str(directory), "lines" if contender == "cadence-lines" else "columns"]
    load = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    if done.returncode != 0:
        raise SystemExit(f"import_edges.py: {contender} failed:\n{done.stderr[-2000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    record.update(contender=contender, loadavg_before=load, rows_per_second=record["rows"] / record["seconds"])
    return record


def main() -> int:
    parser = peer_parser(__doc__, "1M edges, 1 rep", 3, "unused here")
    parser.add_argument("--edges", type=int, default=5_000_000)
    parser.add_argument("--entities", type=int, default=1_000_000)
    parser.add_argument("--contenders", default="cadence,cadence-lines,pandas")
    args = parser.parse_args()
    provenance = check(args, "import_edges.py")
    reps, out, command = peer_run(args, "import_edges", 3)
    edges, entities = (1_000_000, 200_000) if args.quick else (args.edges, args.entities)
    if not PANDAS_PY.exists():
        raise SystemExit("import_edges.py: no .venv-bench-pandas: make .venv-bench-pandas/bin/python")
    started = time.perf_counter()
    directory = edge_list(edges, entities)
    size = sum((directory / f"{s}.txt").stat().st_size for s in ("train", "valid", "test"))
    for split in ("train", "valid", "test"):  # the page cache warm for every contender alike
        (directory / f"{split}.txt").read_bytes()
    say(f"import_edges at {provenance['commit']}: {directory} ({size / 2**20:.0f} MiB)")
    contenders = [name.strip() for name in args.contenders.split(",")]
    runs = []
    for rep in reps:
        for contender in contenders:
            record = run(contender, directory)
            record["rep"] = rep
            runs.append(record)
            say(f"rep {rep} {contender:14s} {record['rows_per_second']:>12,.0f} rows/s  {record['seconds']:6.2f} s  "
                f"peak {record['peak_rss_mib']:,.0f} MiB" + (f"  (read alone {record['read_seconds']:.2f} s)"
                                                           if "read_seconds" in record else ""))
    summary = {name: {"rows_per_second": mean_ci([r["rows_per_second"] for r in runs if r["contender"] == name]),
                      "peak_rss_mib": mean_ci([r["peak_rss_mib"] for r in runs if r["contender"] == name])}
               for name in contenders}
    for name in contenders:
        if name != "pandas" and "pandas" in contenders:
            ratios = [mine["rows_per_second"] / theirs["rows_per_second"] for mine, theirs in zip(
                [r for r in runs if r["contender"] == name], [r for r in runs if r["contender"] == "pandas"])]
            summary[name]["speed_ratio_over_pandas"] = {"median": statistics.median(ratios), "per_rep": ratios}
    report = {"command": command, "edges": edges, "entities": entities, "bytes": size, "cpus": os.cpu_count(),
              "runs": runs, "summary": summary}
    write_report(report, out, started, 0.0)
    say(json.dumps(summary, indent=1))
    say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
