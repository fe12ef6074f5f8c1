#!/usr/bin/env python
"""AdaPM with a model larger than any node, for real (issue 25, seed 001 section 1).

Four AdaPM nodes are four Ray nodes on this machine, each a ``ray start`` whose raylet and every
process it starts (the node actor) live in a cgroup-v1 memory cgroup of ``--node-memory`` bytes
(swap included where the kernel accounts it). The model, its rows and their optimizer state, is at
least twice that (checked before anything runs): no node can hold it, and a node that tries is
killed by the kernel. Per task (``--tasks``: the synthetic Zipf MF, ``synthetic-zipf``; the synthetic
power-law KG, ``synthetic``), in one invocation and on the same data:

- ``single``: the single node given enough memory (``strategy=sync`` in its own process, uncapped,
  using the machine's cores): the quality and time reference;
- ``threads``: the four AdaPM nodes (adaptive) as threads of one uncapped process: its peak RSS
  against the single node's (bar: <= 1.5x);
- on the four capped Ray nodes, the same node count for every contender: ``adaptive`` (AdaPM),
  ``static`` (a classic parameter server: every key at its home, each non-local access remote),
  ``replication`` (AdaPM without relocation) and ``relocation`` (without replication).

Each run is a ``cadence train`` process. Reported per run: per-node peak RSS of the node actor
(VmHWM) and the cgroup's peak usage against the model size, OOM kills, bytes per epoch per node,
remote access share, relocations, replicas, epoch seconds, and quality (MF: test RMSE; KG: filtered
MRR on 300 held-out edges, ranked against every entity a block at a time; and the last epoch's
training loss) against the single node (bar: within 1%). A contender killed for memory is reported
as such.

Needs root (cgroups): otherwise it prints why and exits 0. Refuses a tree with uncommitted changes to
``src/`` or ``benchmarks/`` unless ``--dirty`` (then the result file says so).

    .venv/bin/python benchmarks/adapm_memory.py [--node-memory 2.5G] [--tasks mf,kge] [--quick]

Writes benchmarks/results/adapm_memory.json (``--quick``: adapm_memory_quick.json: a 2G limit and fewer examples,
to check the harness).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kge_throughput import machine_info  # same folder: the shared machine record
from peer_stats import OthersMeter, write_report
from provenance import add_flag, check

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
CONTENDERS = ("adaptive", "static", "replication", "relocation")
SUMMARY = ("train_seconds", "epoch_seconds", "bytes_per_epoch", "bytes_per_node", "remote_access_share",
           "remote_accesses", "remote_reads", "remote_read_causes", "accesses", "relocations", "replicas_created", "rounds", "node_hosts", "engine",
           "examples_per_second", "examples_seen", "worker_seconds")


def units(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)", text.strip().upper())
    if not match:
        raise SystemExit(f"adapm_memory: error: --node-memory {text!r}: a size like 1.5G, 800M")
    return int(float(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2)])


def task_overrides(task: str, limit: int, quick: bool) -> tuple[list[str], list[str]]:
    """(the task's settings, what the AdaPM runs add): rows and their Adagrad state at 2.1x ``limit``,
    128 floats of row and 128 of state (1 KiB) per key; MF partitioned as the paper does (App. C:
    node r trains user block r, every item)."""
    keys = int(2.1 * limit / 1024)
    common = ["optimizer.entity=adagrad", "train.epochs=2", "checkpoint.every=0", "progress=false", "eval.every=0"]
    adapm = ["strategy=adapm", "ps.workers=4", "adapm.lookahead=32"]
    if task == "mf":  # (MF rows: dim + a bias)
        users, items = int(keys * 0.9), keys - int(keys * 0.9)
        ratings = 150_000 if quick else 1_000_000
        return (["task=mf", "data.dataset=synthetic-zipf", f"mf.synthetic.users={users}", "model.dim=127",
                 f"mf.synthetic.items={items}", f"mf.synthetic.ratings={ratings}", "train.batch_size=1000",
                 "optimizer.lr=0.05", "mf.reg=0.02", "model.init_std=0.1", *common], [*adapm, "mf.row_blocks=4"])
    edges = 40_000 if quick else 200_000
    return (["task=kge", "data.dataset=synthetic", f"data.synthetic.num_entities={keys}", "model.dim=128",
             "data.synthetic.num_relations=20", f"data.synthetic.num_edges={edges}",
             f"data.synthetic.holdout={100 if quick else 300}", "model.name=distmult", "train.batch_size=500",
             "optimizer.lr=0.1", *common], adapm)


def model_bytes(overrides: list[str]) -> int:
    """Rows x (width + Adagrad state) x 4 bytes, from the task as cadence builds it."""
    from cadence import api
    from cadence.config import load_config
    from cadence.tasks import TASKS

    config = api.prepare_config(load_config(None, overrides))
    spec = TASKS.get(config.task)(config).table()
    return spec.rows * 2 * spec.width * 4


class NodeCgroups:
    """One cgroup per node under a cgroup-v1 controller's mount (``root``): the command prefix that
    starts a node inside its cgroup, and their removal afterwards."""

    def __init__(self, root: Path, name: str, count: int):
        self.base = root / f"{name}-{os.getpid()}"
        self.paths = [self.base / f"node-{index}" for index in range(count)]
        for path in [self.base, *self.paths]:
            path.mkdir(exist_ok=True)

    def prefixes(self) -> list[list[str]]:
        """A command prefix per node that joins its cgroup before it execs the node."""
        return [["sh", "-c", f'echo $$ > {path}/cgroup.procs && exec "$0" "$@"'] for path in self.paths]

    def remove(self) -> None:
        for path in [*self.paths, self.base]:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.2)


class Cgroups(NodeCgroups):
    """One memory cgroup per node under /sys/fs/cgroup/memory/cadence-adapm-bench-<pid>/."""

    def __init__(self, count: int, limit: int):
        super().__init__(CGROUP_ROOT, "cadence-adapm-bench", count)
        for path in self.paths:
            (path / "memory.limit_in_bytes").write_text(str(limit))
            swap = path / "memory.memsw.limit_in_bytes"
            if swap.exists():  # (no swap escape where the kernel accounts it)
                swap.write_text(str(limit))

    def reset(self) -> None:
        self.kills = [self._kills(path) for path in self.paths]  # (a counter that never resets)
        for path in self.paths:
            (path / "memory.max_usage_in_bytes").write_text("0")
            (path / "memory.failcnt").write_text("0")

    @staticmethod
    def _kills(path: Path) -> int:
        control = dict(line.split() for line in (path / "memory.oom_control").read_text().splitlines())
        return int(control.get("oom_kill", 0))

    def peaks(self) -> list[dict[str, int]]:
        out = []
        for path, before in zip(self.paths, self.kills):
            out.append({"cgroup_peak_bytes": int((path / "memory.max_usage_in_bytes").read_text()),
                        "limit_hits": int((path / "memory.failcnt").read_text()),
                        "oom_kills": self._kills(path) - before})
        return out

    def pids(self, index: int) -> list[int]:
        try:
            return [int(p) for p in (self.paths[index] / "cgroup.procs").read_text().split()]
        except OSError:
            return []


def status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {"cmd": cmdline, "hwm": fields.get("VmHWM", "0 kB"), "rss": fields.get("VmRSS", "0 kB")}


class ActorSampler:
    """Polls each cgroup's processes: the peak RSS (VmHWM) of its node (the one process a node's cgroup
    holds: a Ray actor process, whatever title Ray gives it; an idle one taken for the role is
    ``ray::Host``, not ``ray::RoleActor``)."""

    def __init__(self, cgroups: Cgroups):
        self.cgroups, self.stop = cgroups, threading.Event()
        self.peak = [0] * len(cgroups.paths)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ActorSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for index in range(len(self.peak)):
                for pid in self.cgroups.pids(index):
                    info = status(pid)
                    if info:
                        kib = int(info["hwm"].split()[0])
                        self.peak[index] = max(self.peak[index], kib * 1024)


def train(overrides: list[str], name: str) -> dict[str, Any]:
    """One ``cadence train`` process: its summary's fields, wall seconds, peak RSS, the load."""
    record: dict[str, Any] = {"name": name, "overrides": overrides}
    with tempfile.TemporaryDirectory(prefix="adapm-memory-") as out:
        command = [str(Path(sys.executable).with_name("cadence")), "train", "--out", out, "--overwrite"]
        for item in overrides:
            command += ["--set", item]
        started = time.perf_counter()
        with OthersMeter() as meter:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            _, status_code, usage = os.wait4(process.pid, 0)
            stderr = process.stderr.read()
            process.returncode = os.waitstatus_to_exitcode(status_code)
        record.update(wall_seconds=round(time.perf_counter() - started, 2), others_cpu_share=round(meter.share, 3),
                      driver_peak_rss_bytes=usage.ru_maxrss * 1024, returncode=process.returncode)
        summary_path = Path(out) / "summary.json"
        if process.returncode != 0 or not summary_path.exists():
            record["error"] = (stderr.strip().splitlines() or ["(no output)"])[-1][:500]
            return record
        summary = json.loads(summary_path.read_text())
    record.update({key: summary[key] for key in SUMMARY if key in summary})
    record.update({key: summary.get(key) for key in ("rmse", "mrr", "auc", "train_loss")})
    return record


def quality(record: dict[str, Any], task: str) -> float | None:
    """MF: test RMSE; KG: filtered test MRR over the holdout (the entity table ranked a block at a
    time, read from the nodes: the driver never holds it); CTR: test AUC."""
    return record.get({"mf": "rmse", "ctr": "auc"}.get(task, "mrr"))


def part(task: str, limit: int, quick: bool, contenders: list[str]) -> dict[str, Any]:
    from ray_cluster import nodes

    overrides, adapm = task_overrides(task, limit, quick)
    size = model_bytes(overrides)
    print(f"{task}: model {size / 2**30:.2f} GiB (rows and optimizer state), node limit {limit / 2**30:.2f} GiB: "
          f"{size / limit:.2f}x", flush=True)
    if size < 2 * limit:
        raise SystemExit(f"adapm_memory: error: the {task} model ({size} bytes) is not 2x --node-memory")
    out: dict[str, Any] = {"overrides": overrides, "adapm_overrides": adapm, "model_bytes": size, "node_limit_bytes": limit, "runs": {}}
    runs = out["runs"]
    print("  single (sync, uncapped) ...", flush=True)
    runs["single"] = train([*overrides, "strategy=sync"], "single")
    print("  threads (4 AdaPM nodes in one uncapped process) ...", flush=True)
    runs["threads"] = train([*overrides, *adapm, "ps.engine=threads"], "threads")
    cgroups = Cgroups(4, limit)
    try:
        for technique in contenders:
            # a cluster of its own: a contender whose node the cap killed (replication-only) leaves
            # the next one nothing to run on ("the actor never ran")
            print(f"  {technique} (4 Ray nodes, {limit / 2**30:.2f} GiB each) ...", flush=True)
            cgroups.reset()
            with nodes(cgroups.prefixes(), cpus_per_node=1, head_cpus=0,
                       extra=("--object-store-memory=78643200",)) as address:
                with ActorSampler(cgroups) as sampler:
                    record = train([*overrides, *adapm, "ps.engine=ray", f"ps.ray_address={address}",
                                    f"adapm.technique={technique}"], technique)
                record["nodes"] = [{"actor_peak_rss_bytes": peak, **cg} for peak, cg in zip(sampler.peak, cgroups.peaks())]
            runs[technique] = record
            time.sleep(2)  # (the killed actors' memory returns before the next contender starts)
    finally:
        cgroups.remove()
    single = runs["single"]
    for name, record in runs.items():
        ours, theirs = quality(record, task), quality(single, task)
        if ours is not None and theirs:
            record["quality_vs_single"] = round(ours / theirs - 1, 5)
        if record.get("train_seconds") and single.get("train_seconds"):
            record["time_vs_single"] = round(record["train_seconds"] / single["train_seconds"], 3)
        peaks = [n["actor_peak_rss_bytes"] for n in record.get("nodes", [])]
        if peaks:
            record["max_node_rss_vs_model"] = round(max(peaks) / size, 4)
        print(f"    {name:<12} " + ("ERROR " + record["error"] if "error" in record else
              f"quality {quality(record, task)} ({record.get('quality_vs_single', 0):+.2%}), "
              f"train {record.get('train_seconds')} s, remote {record.get('remote_access_share', 0):.4%}, "
              f"bytes/epoch/node {record.get('bytes_per_epoch', 0) / 2**20:.1f} MiB, "
              f"node RSS peaks {[round(p / 2**30, 2) for p in peaks]} GiB, driver {record['driver_peak_rss_bytes'] / 2**30:.2f} GiB"),
              flush=True)
    return out


def bars(report: dict[str, Any]) -> dict[str, Any]:
    result = {}
    for task, out in report["tasks"].items():
        runs = out["runs"]
        adaptive, single, threads = runs.get("adaptive", {}), runs["single"], runs["threads"]
        peaks = [n["actor_peak_rss_bytes"] for n in adaptive.get("nodes", [])]
        result[f"{task}: adaptive trains on 4 capped nodes, each peak RSS < the model / 2"] = (
            "error" not in adaptive and bool(peaks) and 0 < max(peaks) < out["model_bytes"] / 2)
        result[f"{task}: adaptive quality within 1% of the single node"] = (
            "quality_vs_single" in adaptive and abs(adaptive["quality_vs_single"]) <= 0.01)
        result[f"{task}: threads engine peak RSS <= 1.5x the single node's"] = (
            "error" not in threads and threads["driver_peak_rss_bytes"] <= 1.5 * single["driver_peak_rss_bytes"])
    for name, ok in result.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node-memory", default=None, help="each node's memory cgroup limit (default 2.5G; --quick 2G)")
    parser.add_argument("--tasks", default="mf,kge")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    add_flag(parser)
    args = parser.parse_args()
    if os.geteuid() != 0 or not CGROUP_ROOT.is_dir():
        print("adapm_memory: skipped: needs root and cgroup v1's memory controller at /sys/fs/cgroup/memory")
        return
    found = check(args, "adapm_memory")
    limit = units(args.node_memory or ("2G" if args.quick else "2.5G"))
    started = time.perf_counter()
    report: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/adapm_memory.py", *sys.argv[1:]]),
        "machine": machine_info(), "measured_from": {"commit": found["commit"], "dirty": found["dirty"]},
        "tasks": {}}
    for task in args.tasks.split(","):
        report["tasks"][task] = part(task, limit, args.quick, args.contenders.split(","))
    report["bars"] = bars(report)
    out = Path(args.out) if args.out else RESULTS / ("adapm_memory_quick.json" if args.quick else "adapm_memory.json")
    print(write_report(report, out, started, 0.0))


if __name__ == "__main__":
    main()
