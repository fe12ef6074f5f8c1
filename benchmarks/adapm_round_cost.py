#!/usr/bin/env python
"""What one AdaPM communication round costs as the model grows, at fixed activity (issue 25).

Two bare nodes (``cadence.pm.node.Node``, no threads) over N keys of width 8; each
round node 0's worker signals intent for the same number of keys (``--active``, fresh ones each
round, the clock advancing one step a round) and both nodes run a round: act on intents, build
every request, the destination handles it, the sender installs the answer. The time per round is
the median over ``--rounds`` rounds after a warm-up, for each N. A round that scans the key space
grows with N; one that visits only the keys with something to manage stays flat.

    .venv/bin/python benchmarks/adapm_round_cost.py [--sizes 10000,100000,1000000,4000000] [--active 200]

Prints one line per N and writes benchmarks/results/adapm_round_cost.json (``--out`` elsewhere),
with the commit of the tree whose ``src/`` was imported (``PYTHONPATH=<worktree>/src`` measures another
commit) and whether that ``src/`` had uncommitted changes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from cadence.pm import node as node_module
from cadence.pm.node import KeySpace, Node

REPO = Path(__file__).resolve().parents[1]


def one_round(nodes: list[Node]) -> None:
    for node in nodes:
        node.act_on_intents([clock + 1 for clock in node.clocks])
        for dest, request in enumerate(node.requests()):
            if request is not None:
                node.install(dest, nodes[dest].handle(request, lambda n, sub: nodes[n].handle(sub, forwarded=True)),
                             request)


def measure(size: int, active: int, rounds: int) -> dict:
    space = KeySpace(size, 8, True, lambda: torch.arange(size).split(1 << 16), lambda keys: torch.zeros(keys.shape[0], 8))
    nodes = [Node(index, 2, space, 4) for index in range(2)]
    generator = torch.Generator().manual_seed(0)
    times = []
    for step in range(rounds + 5):
        wanted = torch.randint(0, size, (active,), generator=generator).unique()
        clock = nodes[0].current_clock(0)
        nodes[0].intent(0, wanted, clock, clock + 2)
        started = time.perf_counter()
        one_round(nodes)
        elapsed = time.perf_counter() - started
        nodes[0].advance_clock(0)
        if step >= 5:
            times.append(elapsed)
    return {"keys": size, "active_per_round": active, "rounds": rounds,
            "median_ms": round(1000 * statistics.median(times), 3), "max_ms": round(1000 * max(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000,4000000")
    parser.add_argument("--active", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "adapm_round_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    measured = Path(node_module.__file__).resolve().parents[4]  # the tree whose src/ is imported
    git = lambda *a: subprocess.run(["git", *a], cwd=measured, capture_output=True, text=True).stdout.strip()  # noqa: E731
    report = {"command": "benchmarks/adapm_round_cost.py", "measured_tree": str(measured),
              "commit": git("rev-parse", "HEAD"), "src_dirty": bool(git("status", "--porcelain", "--", "src")),
              "results": []}
    for size in (int(s) for s in args.sizes.split(",")):
        result = measure(size, args.active, args.rounds)
        print(f"N={size:>9,}: a round {result['median_ms']:8.3f} ms (median), {result['max_ms']:8.3f} ms max", flush=True)
        report["results"].append(result)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
