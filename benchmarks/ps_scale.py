"""A synthetic CTR run of >= 50M examples and >= 10M feature keys on a two-node Ray cluster (issue 8).

Starts its own cluster on loopback (``ray start --head`` and a second ``ray start`` joining it, each
``--num-cpus=1``, in their own process groups and temp dir, so no other Ray user's cluster is found
or touched), then runs ``cadence train`` as a separate driver process against it:

    synthetic-ctr-stream (examples generated on demand from their index by each worker: no process
    holds the data set), 10 fields x 2M values (Zipf 1.05), LR (rows of width 1), local batch 8192,
    gba with 2 workers and 2 shards, 1 epoch, validation and test on 2 x 100k held-out examples.

While it runs, a monitor samples the resident memory (VmRSS) of the driver and of every Ray actor
process (by its ``ray::`` command line) every second and keeps each one's peak. Reports examples/s,
feature keys created, bytes moved between workers and shards per example (keys, rows, gradients,
dense parameters), AUC, and the peak memory of each process (actors are dealt round-robin over the
nodes, shards first: each node holds one shard).

    .venv/bin/python benchmarks/ps_scale.py [--examples 50000000] [--vocab 2000000]

The same two-node run of another strategy and model (ShadowSync, issue 11: each worker actor a
trainer of Hogwild threads; extra ``--set`` items go last and win):

    .venv/bin/python benchmarks/ps_scale.py --strategy shadow-ma --examples 10000000 --vocab 1000000 \
        --batch 1024 --set model.name=deepfm --set model.dim=8 --set shadow.threads=2 --name ps_scale_shadow

Writes benchmarks/results/NAME.json (default ps_scale; the cluster is stopped even when the run fails).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

from ray_cluster import stop_nodes  # same folder

RESULTS = Path(__file__).parent / "results"
BIN = Path(sys.executable).parent
GIB = 1 << 30


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rss_gib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / GIB
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def ray_processes() -> dict[int, str]:
    """pid -> actor class of every ``ray::`` actor process on this machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if command.startswith("ray::") and command[5:].split(".")[0] in ("ShardServer", "TaskWorker", "Coordinator"):
            found[int(entry.name)] = command[5:].split(".")[0]
    return found


class Monitor(threading.Thread):
    def __init__(self, driver: int):
        super().__init__(daemon=True)
        self.driver = driver
        self.peaks: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            kinds = {self.driver: "driver", **ray_processes()}
            for pid, kind in kinds.items():
                key = f"{kind}:{pid}"
                self.peaks[key] = round(max(self.peaks.get(key, 0.0), rss_gib(pid)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=50_000_000)
    parser.add_argument("--vocab", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--strategy", default="gba")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config items")
    parser.add_argument("--name", default="ps_scale", help="the result file's name")
    add_flag(parser)
    args = parser.parse_args()
    check(args)
    port, temp = free_port(), Path(f"/tmp/cdn-scale-{os.getpid()}")
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    nodes: list[subprocess.Popen] = []

    def start(*extra: str) -> None:
        nodes.append(subprocess.Popen([str(BIN / "ray"), "start", "--block", "--num-cpus=1",
                                       "--node-ip-address=127.0.0.1", *extra], env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            if time.monotonic() > deadline or any(node.poll() is not None for node in nodes):
                raise RuntimeError(what)
            time.sleep(0.5)

    def status_ok(count: int) -> bool:
        done = subprocess.run([str(BIN / "ray"), "status", f"--address={address}"], env=env, capture_output=True,
                              text=True)
        return done.returncode == 0 and done.stdout.count("node_") >= count

    run_dir = Path(f"/tmp/cdn-scale-run-{os.getpid()}")
    overrides = ["task=ctr", "data.dataset=synthetic-ctr-stream", f"ctr.synthetic.num_examples={args.examples}",
                 "ctr.synthetic.num_fields=10", f"ctr.synthetic.vocab_per_field={args.vocab}",
                 "ctr.synthetic.zipf_exponent=1.05", "ctr.synthetic.holdout=100000", "model.name=lr",
                 f"train.batch_size={args.batch}", "train.epochs=1", f"strategy={args.strategy}", "ps.workers=2",
                 "ps.shards=2", "ps.engine=ray", f"ps.ray_address={address}", "eval.every=1", "checkpoint.every=0",
                 "progress=false", "threads=1", "optimizer.lr=0.05", *args.set]
    try:
        start("--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}")
        wait_for(lambda: status_ok(1), "the head did not come up")
        start(f"--address={address}")
        wait_for(lambda: status_ok(2), "the second node did not join")
        say(f"two nodes up at {address}; training {args.examples:,} examples")
        command = [str(BIN / "cadence"), "-q", "train", "--out", str(run_dir), "--overwrite",
                   *[item for o in overrides for item in ("--set", o)]]
        started = time.perf_counter()
        driver = subprocess.Popen(command, env=env)
        monitor = Monitor(driver.pid)
        monitor.start()
        code = driver.wait()
        monitor.stop.set()
        wall = time.perf_counter() - started
        if code != 0:
            raise RuntimeError(f"cadence train exited {code}")
        summary = json.loads((run_dir / "summary.json").read_text())
    finally:
        stop_nodes(nodes, temp, grace=30)
    peaks: dict[str, list[float]] = {}
    for key, value in monitor.peaks.items():
        peaks.setdefault(key.split(":")[0], []).append(value)
    keep = ("examples_seen", "examples_per_second", "train_seconds", "vocabulary_added", "bytes_moved_per_example",
            "gradients_applied", "gradients_dropped", "global_steps", "auc", "logloss", "token_staleness_mean",
            "token_staleness_max", "shards", "ne", "dense_syncs", "sync_gap", "syncs_per_second",
            "examples_in_flight", "strategy")
    result = {"command": "benchmarks/ps_scale.py " + " ".join(sys.argv[1:]), "machine": platform.platform(),
              "cpus": os.cpu_count(), "nodes": 2, "overrides": overrides, "wall_seconds": round(wall, 1),
              "summary": {k: summary.get(k) for k in keep}, "peak_rss_gib_per_process": peaks}
    shutil.rmtree(run_dir, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(stamp(result), indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
