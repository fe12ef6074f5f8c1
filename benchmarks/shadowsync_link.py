#!/usr/bin/env python
"""ShadowSync against its foreground baseline when the sync servers sit behind a slow link (seed 004,
section 4.1.2 and Fig. 5, the paper's cause: "the network bandwidths of the sync PSs will be
saturated"; issue 49, item 2). Nothing sleeps and no delay is emulated: the bytes of every EASGD
exchange cross a rate-limited network interface.

The link: a network namespace (``cdn-sync``) joined to this one by a veth pair, 10.203.0.1 here and
10.203.0.2 there, each end's egress shaped by ``tc ... tbf`` at ``--rate`` (both directions: the
trainers' pushes and the servers' answers). A Ray cluster of two nodes: the head here (2 CPUs: the
driver, the parameter-server shards, the coordinator and the trainers) and a node inside the
namespace with no CPUs and the custom resource ``sync_server`` (``shadow.sync_server_resource``):
only EASGD's sync servers run there, so every round of every trainer crosses the link, and nothing
else does but Ray's own control messages.

What runs: ``benchmarks/shadowsync.py``'s setting (synthetic CTR, DLRM, dense lr 0.01, one pass, batch
256 per worker thread, 2 Hogwild worker threads per trainer, torch intra-op threads 1) on the Ray
engine, at 1, 2 and 4 trainers (the paper's x-axis), per seed: ``hogwild`` (no dense sync: the
ceiling), ``shadow-easgd`` (the free loop) and ``shadow-easgd@share`` (its thread at the paper's share
of the CPU, ``shadow.cpu_share``), ``fr-easgd`` at k = 5 and 30 (each worker thread syncs every k of
its iterations: the paper's FR-EASGD-k). Measured per run: EPS, its ratio to hogwild's of the same
seed and trainer count, the sync gap, syncs per second, the shadow threads' CPU share, eval logloss,
and the link's counters over the run (``tc -s``: bytes sent and packets held back by the shaper,
each direction), so a plateau is seen to come from the link.

Bars (PASS/FAIL printed, in the JSON under ``bars``): (a) FR plateaus: fr-easgd-5's EPS ratio to
hogwild at the most trainers is below its ratio at one trainer; (b) every shadow-easgd contender
stays >= 0.9x hogwild at every trainer count (mean over seeds).

Needs root (network namespaces, tc): otherwise it says why and exits 0. Refuses a tree with
uncommitted changes to ``src/`` or ``benchmarks/`` unless ``--dirty``.

    sudo .venv/bin/python benchmarks/shadowsync_link.py [--quick] [--seeds N] [--rate 8mbit] [--out FILE]
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from provenance import check  # same folder: every result traces to a commit

import ray_cluster  # same folder: Ray nodes of this machine
from kge_throughput import QuietGate, machine_info
from peer_stats import mean_ci, peer_parser, peer_run, write_report
from shadowsync import (HOGWILD, PAPER_SHARE, Contender, base_overrides, number, run_one)

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, HOST_END, SERVER_END = "cdn-sync", "cdn-h", "cdn-s"
HOST_IP, SERVER_IP = "10.203.0.1", "10.203.0.2"
RESOURCE = "sync_server"
TRAINERS = (1, 2, 4)
WORKER_THREADS = 2
CONTENDERS = (HOGWILD, Contender("shadow-easgd", "shadow-easgd"),
              Contender("shadow-easgd@share", "shadow-easgd", share=PAPER_SHARE),
              Contender("fr-easgd-5", "fr-easgd", 5), Contender("fr-easgd-30", "fr-easgd", 30))
SHADOWS = ("shadow-easgd", "shadow-easgd@share")
EPS_BAR = 0.9


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sh(*args: str, namespace: bool = False) -> str:
    command = ["ip", "netns", "exec", NAMESPACE, *args] if namespace else list(args)
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def unavailable() -> str | None:
    """Why this machine cannot build the link, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"needs `{tool}`"
    return None


@contextlib.contextmanager
def slow_link(rate: str, burst: str, latency: str) -> Iterator[None]:
    """The namespace, the veth pair and a tbf shaper on each end's egress; all removed afterwards."""
    subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True)  # a leftover of a killed run
    try:
        sh("ip", "netns", "add", NAMESPACE)
        sh("ip", "link", "add", HOST_END, "type", "veth", "peer", "name", SERVER_END)
        sh("ip", "link", "set", SERVER_END, "netns", NAMESPACE)
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST_END)
        sh("ip", "link", "set", HOST_END, "up")
        sh("ip", "addr", "add", f"{SERVER_IP}/24", "dev", SERVER_END, namespace=True)
        sh("ip", "link", "set", SERVER_END, "up", namespace=True)
        sh("ip", "link", "set", "lo", "up", namespace=True)
        for end, inside in ((HOST_END, False), (SERVER_END, True)):
            sh("tc", "qdisc", "add", "dev", end, "root", "tbf", "rate", rate, "burst", burst, "latency", latency,
               namespace=inside)
        yield
    finally:
        subprocess.run(["ip", "link", "del", HOST_END], capture_output=True)
        subprocess.run(["ip", "netns", "del", NAMESPACE], capture_output=True)


def link_counters() -> dict[str, dict[str, int]]:
    """Each direction's tbf counters: bytes and packets sent, packets dropped, times the shaper held
    a packet back (``overlimits``)."""
    out = {}
    for direction, end, inside in (("to_servers", HOST_END, False), ("from_servers", SERVER_END, True)):
        text = sh("tc", "-s", "qdisc", "show", "dev", end, namespace=inside)
        sent = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", text)
        out[direction] = dict(zip(("bytes", "packets", "dropped", "overlimits"), map(int, sent.groups()))) if sent else {}
    return out


def delta(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {d: {k: after[d].get(k, 0) - before[d].get(k, 0) for k in after[d]} for d in after}


def run_all(seeds: list[int], trainers: tuple[int, ...], overrides: list[str], gate: QuietGate) -> list[dict[str, Any]]:
    runs = []
    for index, seed in enumerate(seeds):
        for count in trainers:
            order = CONTENDERS if index % 2 == 0 else CONTENDERS[::-1]
            for contender in order:
                # EASGD's sync servers go behind the link (a key a strategy does not read is an error)
                behind = [f"shadow.sync_server_resource={RESOURCE}"] if contender.strategy.endswith("easgd") else []
                before = link_counters()
                record = run_one(contender, seed, [*overrides, *behind, f"ps.workers={count}",
                                                   f"shadow.threads={WORKER_THREADS}"], gate, section="link")
                record["link"] = delta(link_counters(), before)
                seconds = record.get("train_seconds") or 0.0
                record["link_bytes_per_second"] = {d: round(v["bytes"] / seconds) if seconds else None
                                                   for d, v in record["link"].items()}
                runs.append(record)
    for record in runs:  # each run's EPS over hogwild's of the same seed and trainer count
        base = next((r for r in runs if r["contender"] == HOGWILD.name and r["seed"] == record["seed"]
                     and r["trainers"] == record["trainers"] and "error" not in r), None)
        eps = record.get("examples_per_second")
        record["eps_ratio_to_hogwild"] = eps / base["examples_per_second"] if base and eps else None
    return runs


def stat_of(values: list[float | None]) -> dict[str, Any] | None:
    kept = [v for v in values if v is not None]
    return mean_ci(kept) if kept else None


def summarize(runs: list[dict[str, Any]], trainers: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for contender in CONTENDERS:
        for count in trainers:
            mine = [r for r in runs if r["contender"] == contender.name and r["trainers"] == count and "error" not in r]

            def stat(key: str) -> dict[str, Any] | None:
                return stat_of([r.get(key) for r in mine])

            table.setdefault(contender.name, {})[str(count)] = {
                "runs": len(mine), "examples_per_second": stat("examples_per_second"),
                "eps_ratio_to_hogwild": stat("eps_ratio_to_hogwild"), "sync_gap": stat("sync_gap"),
                "syncs_per_second": stat("syncs_per_second"), "shadow_cpu_share": stat("shadow_cpu_share"),
                "eval_logloss": stat("eval_logloss"),
                "link_bytes_per_second_to_servers": stat_of([r["link_bytes_per_second"].get("to_servers") for r in mine])}
    return table


def bars(table: dict[str, dict[str, Any]], trainers: tuple[int, ...]) -> dict[str, Any]:
    def ratio(name: str, count: int) -> float | None:
        cell = table[name][str(count)]["eps_ratio_to_hogwild"]
        return cell and cell["mean"]

    first, last = ratio("fr-easgd-5", trainers[0]), ratio("fr-easgd-5", trainers[-1])
    shadows = {name: {count: ratio(name, count) for count in trainers} for name in SHADOWS}
    return {
        "a_fr_plateaus": {"bar": f"fr-easgd-5's EPS / hogwild at {trainers[-1]} trainers < at {trainers[0]}",
                          "at_first": first, "at_last": last,
                          "passed": first is not None and last is not None and last < first},
        "b_shadow_keeps_up": {"bar": f"every shadow-easgd contender >= {EPS_BAR}x hogwild at every trainer count",
                              "ratios": shadows,
                              "passed": all(v is not None and v >= EPS_BAR for row in shadows.values() for v in row.values())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = peer_parser(__doc__, "1 seed, trainers 1 and 2, 100,000 examples", 3,
                         "total seconds to wait for other processes to go idle before runs (default 120)", 120.0)
    parser.add_argument("--rate", default="8mbit", help="the link's rate each way (tc tbf rate; default 8mbit)")
    parser.add_argument("--burst", default="32kb", help="tbf burst (default 32kb)")
    parser.add_argument("--latency", default="100ms", help="tbf latency: how long a packet may wait (default 100ms)")
    args = parser.parse_args(argv)
    why = unavailable()
    if why is not None:
        print(f"shadowsync_link: skipped: {why}")
        return 0
    check(args)
    seeds, out_path, command = peer_run(args, "shadowsync_link", 3)
    trainers = TRAINERS[:2] if args.quick else TRAINERS
    logging.getLogger("cadence").setLevel(logging.WARNING)
    gate = QuietGate(args.max_wait)
    started = time.perf_counter()
    overrides = [*base_overrides(args.quick), "ps.engine=ray"]
    report: dict[str, Any] = {
        "benchmark": "ShadowSync vs FR-EASGD with the sync servers behind a tc-tbf link (benchmarks/shadowsync_link.py)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": command,
        "quick": args.quick, "complete": False, "machine": machine_info(), "seeds": seeds,
        "settings": {"rate": args.rate, "burst": args.burst, "latency": args.latency, "trainers": trainers,
                     "worker_threads": WORKER_THREADS, "overrides": overrides, "paper_share": PAPER_SHARE,
                     "contenders": {c.name: c.overrides() for c in CONTENDERS}}}
    with slow_link(args.rate, args.burst, args.latency), \
            ray_cluster.nodes([["ip", "netns", "exec", NAMESPACE]], cpus_per_node=0, head_cpus=2, head_ip=HOST_IP,
                              worker_ips=[SERVER_IP], worker_extra=[(f'--resources={{"{RESOURCE}": 64}}',)]) as address:
        overrides.append(f"ps.ray_address={address}")
        run_one(HOGWILD, seeds[0], [*overrides, "ps.workers=1", "shadow.threads=1"], gate, section="warm-up")
        runs = run_all(seeds, trainers, overrides, gate)
    table = summarize(runs, trainers)
    report.update(runs=runs, summary=table, bars=bars(table, trainers), complete=True)
    write_report(report, out_path, started, gate.waited_s)
    print(f"{'contender':20} {'trainers':>8} {'EPS':>14} {'/hogwild':>14} {'sync gap':>12} {'shadow CPU':>10} "
          f"{'to servers B/s':>14} {'eval logloss':>14}")
    for name, rows in table.items():
        for count, row in rows.items():
            def cell(key: str, digits: int = 3) -> str:
                value = row[key]
                return "-" if not value else f"{value['mean']:.{digits}f}"
            print(f"{name:20} {count:>8} {cell('examples_per_second', 0):>14} {cell('eps_ratio_to_hogwild'):>14} "
                  f"{cell('sync_gap', 2):>12} {cell('shadow_cpu_share', 3):>10} "
                  f"{cell('link_bytes_per_second_to_servers', 0):>14} {cell('eval_logloss', 4):>14}")
    for name, bar in report["bars"].items():
        print(f"{'PASS' if bar['passed'] else 'FAIL'} {name}: {bar['bar']}")
    print(f"wrote {out_path} ({number(report['wall_seconds'], 0)} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
