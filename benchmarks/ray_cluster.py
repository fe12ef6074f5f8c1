"""A Ray cluster on this machine for benchmarks: ``ray start --block`` processes on loopback (a head
and further nodes, each optionally inside a cgroup), each in its own process group and temp dir, torn down by
group id afterwards (never ``ray stop``, which ends every Ray process of the user)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def two_nodes(cpus_per_node: int = 1) -> Iterator[str]:
    """Yield the head's address once both nodes are alive (the caller runs ``ray.init`` with it)."""
    with nodes([[]], cpus_per_node, head_cpus=cpus_per_node) as address:
        yield address


@contextlib.contextmanager
def nodes(workers: list[list[str]], cpus_per_node: int = 1, head_cpus: int = 0,
          extra: tuple[str, ...] = (), head_ip: str = "127.0.0.1", worker_ips: list[str] | None = None,
          worker_extra: list[tuple[str, ...]] | None = None) -> Iterator[str]:
    """A head (``head_cpus`` CPUs: 0 keeps actors off it) and one node per entry of ``workers``, each
    started through that entry's command prefix (e.g. ``["sh", "-c", "echo $$ > CGROUP/cgroup.procs
    && exec \"$0\" \"$@\""]``: the node's raylet and every worker it starts live in that cgroup;
    ``["ip", "netns", "exec", NS]``: the node lives in a network namespace, reached at its entry of
    ``worker_ips``), with its entry of ``worker_extra`` added to ``ray start``'s arguments;
    yield the head's address (at ``head_ip``) once every node is alive."""
    import ray

    ray_bin = str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    address = f"{head_ip}:{port}"
    worker_ips = worker_ips or ["127.0.0.1"] * len(workers)
    worker_extra = worker_extra or [()] * len(workers)
    temp_dir = Path(f"/tmp/cdn-bench-ray-{os.getpid()}")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    started: list[subprocess.Popen] = []
    log_path = temp_dir.with_suffix(".log")  # every node's stderr (shown if the cluster does not come up)
    log = open(log_path, "ab")

    def start(prefix: list[str], cpus: int, ip: str, *args: str) -> None:
        started.append(subprocess.Popen([*prefix, ray_bin, "start", "--block", f"--num-cpus={cpus}",
                                         f"--node-ip-address={ip}", *extra, *args], env=env,
                                        start_new_session=True, stdout=subprocess.DEVNULL, stderr=log))

    def wait_until(condition, what: str, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                log.flush()
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"Ray cluster on this machine: {what}: " + " | ".join(tail))
            time.sleep(0.5)

    try:
        start([], head_cpus, head_ip, "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}")
        wait_until(lambda: subprocess.run([ray_bin, "status", f"--address={address}"], env=env,
                                          capture_output=True).returncode == 0, "the head did not come up")
        ray.init(address=address, log_to_driver=False)
        for count, (prefix, ip, more) in enumerate(zip(workers, worker_ips, worker_extra), start=2):
            start(prefix, cpus_per_node, ip, f"--address={address}", *more)  # one at a time: 2 cores start one in time
            wait_until(lambda: sum(1 for node in ray.nodes() if node["Alive"]) == count, "a node did not join")
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stop_nodes(started, temp_dir)
        log.close()
        log_path.unlink(missing_ok=True)


def stop_nodes(started: list[subprocess.Popen], temp_dir: Path, grace: float = 20) -> None:
    """End ``ray start --block`` supervisors (the last started first, while the head can drain it):
    SIGTERM, then whatever of each process group is left; remove the cluster's temp dir."""
    for process in reversed(started):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    shutil.rmtree(temp_dir, ignore_errors=True)
