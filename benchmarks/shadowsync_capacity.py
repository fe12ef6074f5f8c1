#!/usr/bin/env python
"""ShadowSync against its foreground baseline when the sync servers are really slow (seed 004,
section 4.1.2 and Fig. 5; issue 26, part 2): EASGD's sync servers are Ray actors, processes of their
own, each in a cgroup-v1 CPU cgroup whose quota (``cpu.cfs_quota_us`` over a 100 ms period) caps
it at a share of one core. Nothing in the code under test sleeps: a round takes what the throttled
server process takes to answer.

What runs: ``benchmarks/shadowsync.py``'s setting (synthetic CTR, DLRM, dense lr 0.01, one pass,
batch 256 per worker thread, 2 Hogwild worker threads per trainer, torch intra-op threads 1) on
the Ray engine (``ps.engine=ray``: shards, coordinator, trainers and sync servers are actors of a
local cluster this process starts once). Contenders per seed and trainer count: ``hogwild`` (no
dense sync: the ceiling), and at every sync-server capacity (no quota, then ``QUOTAS`` cores each)
``shadow-easgd`` (a shadow thread per trainer, looping freely: the paper's Algorithm 1) and
``fr-easgd`` with k = 5 (each worker thread syncs in its own loop every 5 of its iterations: the
paper's FR-EASGD-5); at the lowest capacity both again with 2 sync servers (each its own cgroup
and quota: twice the capacity, the paper's remedy). How a process joins its cgroup: a poller
thread moves every ``ray::RoleActor`` process (in a parameter-server run only the sync servers are
role actors) into the next server's cgroup as it appears, within ~10 ms, before training starts.

Measured per run: EPS (training examples per second), its ratio to hogwild's of the same seed and
trainer count, ``sync_gap`` (EPS / batch / syncs per second: batches between two syncs), syncs per
second, eval logloss on the test split, and each sync-server cgroup's ``cpu.stat`` (periods
throttled, seconds throttled) and CPU seconds used (``cpuacct.usage``), so a capacity claim shows
the servers were indeed at their quota. ``others_cpu_share`` counts every Ray actor as "other"
(the runs are not in this process), so it is not a contention measure here; the load average
before each run is recorded instead.

The paper's shape, checked and printed (PASS/FAIL, in the JSON under ``bars``):
(a) FR's EPS falls as the sync servers saturate: fr-easgd's mean EPS ratio at the lowest capacity
    is below its ratio without a quota, for every trainer count;
(b) shadow-easgd stays at >= 0.95x hogwild at every capacity (mean over seeds of the per-seed
    ratio), while its sync gap grows as the capacity falls;
(c) more sync servers relieve FR: at the lowest capacity fr-easgd with 2 servers has a higher mean
    EPS ratio than with 1;
(d) shadow-easgd's eval logloss is no worse than the best fr-easgd's of the same capacity within
    the seeds' interval (paired per seed: the 95% t-interval's lower bound of shadow - fr <= 0).

Needs root (cgroups): otherwise it says why and exits 0. Refuses a tree with uncommitted changes to
``src/`` or ``benchmarks/`` unless ``--dirty``.

    .venv/bin/python benchmarks/shadowsync_capacity.py [--quick] [--seeds N] [--out FILE]

``--quick``: 1 seed, 2 trainers only, 60,000 examples (a harness check, ~5 minutes). The full run
(3 seeds, 2 and 4 trainers, 150,000 examples) takes about 40 minutes on 2 cores.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provenance import check  # same folder: every result traces to a commit

from kge_throughput import QuietGate, loadavg, machine_info  # same folder: the shared machine record
from peer_stats import mean_ci, peer_parser, peer_run, train_measured, write_report
from shadowsync import CONFIG, REPO, base_overrides, measurements, number, say, scale

from cadence.config import load_config

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
ACCT_ROOT = Path("/sys/fs/cgroup/cpuacct")  # (a hierarchy of its own here: the CPU seconds used)
GROUP, ACCT_GROUP = CPU_ROOT / "cadence-sync-bench", ACCT_ROOT / "cadence-sync-bench"
PERIOD_US = 100_000
QUOTAS = (None, 0.1, 0.02)  # cores per sync server; None: no quota (one exchange costs ~5 ms of server CPU)
TRAINERS = {False: (2, 4), True: (2,)}
EXAMPLES = {False: 150_000, True: 60_000}
THREADS_PER_TRAINER, EVERY = 2, 5
EPS_BAR = 0.95


@dataclass(frozen=True)
class Contender:
    name: str
    strategy: str
    quota: float | None = None  # cores per sync server
    servers: int = 1

    def overrides(self) -> list[str]:
        return [f"strategy={self.strategy}", f"shadow.sync_servers={self.servers}",
                *([f"shadow.every={EVERY}"] if self.strategy.startswith("fr") else [])]

    @property
    def label(self) -> str:
        if self.strategy == "hogwild":
            return "hogwild"
        capacity = "no quota" if self.quota is None else f"{self.quota:g} core"
        return f"{self.strategy}{'-' + str(EVERY) if self.strategy.startswith('fr') else ''} @ {capacity} x{self.servers}"


def contenders() -> list[Contender]:
    out = [Contender("hogwild", "hogwild")]
    for quota in QUOTAS:
        out += [Contender("shadow-easgd", "shadow-easgd", quota), Contender("fr-easgd", "fr-easgd", quota)]
    low = QUOTAS[-1]
    out += [Contender("shadow-easgd", "shadow-easgd", low, 2), Contender("fr-easgd", "fr-easgd", low, 2)]
    return out


# ---- the sync servers' cgroups ---------------------------------------------------------------------
class ServerCgroups:
    """One cpu cgroup per sync server under /sys/fs/cgroup/cpu/cadence-sync-bench/, and a poller that
    moves each new ``ray::RoleActor`` process into the next one."""

    def __init__(self, servers: int, quota: float | None):
        self.paths = [GROUP / f"server-{index}" for index in range(servers)]
        self.acct = [ACCT_GROUP / f"server-{index}" for index in range(servers)] if ACCT_ROOT.exists() else []
        for path in self.paths:
            path.mkdir(parents=True, exist_ok=True)
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(-1 if quota is None else int(quota * PERIOD_US)))
        for path in self.acct:
            path.mkdir(parents=True, exist_ok=True)
            (path / "cpuacct.usage").write_text("0")
        self.stop, self.moved = threading.Event(), []
        self.before = [self._stat(index) for index in range(servers)]
        self.seen = set(role_actors())  # (role actors of an earlier run still exiting stay where they are)
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "ServerCgroups":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def _poll(self) -> None:
        while not self.stop.is_set():
            for pid in role_actors():
                if pid not in self.seen:
                    self.seen.add(pid)
                    index = len(self.moved) % len(self.paths)
                    try:
                        (self.paths[index] / "cgroup.procs").write_text(str(pid))
                        if self.acct:
                            (self.acct[index] / "cgroup.procs").write_text(str(pid))
                        self.moved.append(pid)
                    except OSError:  # gone already
                        pass
            self.stop.wait(0.01)

    def _stat(self, index: int) -> dict[str, float]:
        stat = dict(line.split() for line in (self.paths[index] / "cpu.stat").read_text().splitlines())
        usage = self.acct[index] / "cpuacct.usage" if self.acct else Path("/nonexistent")
        return {"periods": int(stat.get("nr_periods", 0)), "throttled_periods": int(stat.get("nr_throttled", 0)),
                "throttled_seconds": int(stat.get("throttled_time", 0)) / 1e9,
                "cpu_seconds": int(usage.read_text()) / 1e9 if usage.exists() else None}

    def stats(self) -> list[dict[str, float]]:
        out = []
        for index, before in enumerate(self.before):
            now = self._stat(index)
            out.append({key: (None if now[key] is None else round(now[key] - (before[key] or 0), 4)) for key in now})
        return out


def role_actors() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes().startswith(b"ray::RoleActor"):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def remove_cgroups() -> None:
    for root, group in ((CPU_ROOT, GROUP), (ACCT_ROOT, ACCT_GROUP)):
        if not group.exists():
            continue
        for path in sorted(group.glob("server-*")):
            for pid in (path / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            path.rmdir()
        group.rmdir()


# ---- runs ------------------------------------------------------------------------------------------
def run_one(contender: Contender, seed: int, trainers: int, overrides: list[str], gate: QuietGate) -> dict[str, Any]:
    waited, load = gate.wait(), loadavg()
    config = load_config(CONFIG, [*overrides, *scale(trainers, THREADS_PER_TRAINER), *contender.overrides(),
                                  f"seed={seed}"])
    record: dict[str, Any] = {"contender": contender.label, "strategy": contender.strategy, "seed": seed,
                              "trainers": trainers, "worker_threads": THREADS_PER_TRAINER,
                              "quota_cores": contender.quota, "sync_servers": contender.servers,
                              "every": EVERY if contender.strategy.startswith("fr") else None}
    with ServerCgroups(contender.servers, contender.quota) as cgroups:
        result = train_measured(config, record, "cadence-shadowsync-capacity-")
    record.update(loadavg_before=load, gate=waited, sync_server_pids=cgroups.moved,
                  sync_server_cgroups=cgroups.stats())
    if "error" not in record:
        record.update(measurements(result))
    if contender.strategy != "hogwild" and len(cgroups.moved) != contender.servers and "error" not in record:
        record["error"] = f"{len(cgroups.moved)} sync server processes found for {contender.servers}"
    say(describe(record))
    return record


def describe(record: dict[str, Any]) -> str:
    head = f"seed {record['seed']} {record['trainers']} trainers {record['contender']:32s}"
    if "error" in record:
        return f"{head}: FAILED {record['error']}"
    gap, cg = record["sync_gap"], record["sync_server_cgroups"]
    throttled = sum(c["throttled_periods"] for c in cg) if cg else 0
    used = sum(c["cpu_seconds"] or 0 for c in cg) if cg else 0
    return (f"{head}: {record['examples_per_second']:>7,.0f} ex/s  gap {'-' if gap is None else f'{gap:.3g}'}  "
            f"syncs/s {number(record['syncs_per_second'], 1)}  eval logloss {number(record['eval_logloss'])}  "
            f"servers: {used:.2f} CPU s, {throttled} periods throttled  ({record['train_seconds']:.1f} s training, "
            f"others {record['others_cpu_share']:.0%})")


def ratios(runs: list[dict[str, Any]]) -> None:
    """Each run's EPS over hogwild's of the same seed and trainer count."""
    ceiling = {(r["seed"], r["trainers"]): r["examples_per_second"] for r in runs
               if r["strategy"] == "hogwild" and "error" not in r}
    for r in runs:
        base = ceiling.get((r["seed"], r["trainers"]))
        if "error" not in r and base:
            r["eps_ratio_to_hogwild"] = r["examples_per_second"] / base


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for trainers in sorted({r["trainers"] for r in runs}):
        for label in dict.fromkeys(r["contender"] for r in runs):
            mine = [r for r in runs if r["trainers"] == trainers and r["contender"] == label and "error" not in r]
            if not mine:
                continue
            cell = {}
            for key in ("examples_per_second", "eps_ratio_to_hogwild", "sync_gap", "syncs_per_second", "eval_logloss"):
                values = [r[key] for r in mine if r.get(key) is not None]
                cell[key] = mean_ci(values) if values else None
            cell["server_throttled_periods"] = [sum(c["throttled_periods"] for c in r["sync_server_cgroups"])
                                                for r in mine]
            table[f"{trainers} trainers | {label}"] = cell
    return table


def mean_of(table: dict[str, Any], trainers: int, label: str, key: str) -> float | None:
    cell = table.get(f"{trainers} trainers | {label}")
    return cell and cell.get(key) and cell[key]["mean"]


def bars(runs: list[dict[str, Any]], table: dict[str, Any]) -> dict[str, Any]:
    low = QUOTAS[-1]
    shadow = {q: Contender("shadow-easgd", "shadow-easgd", q).label for q in QUOTAS}
    fr = {q: Contender("fr-easgd", "fr-easgd", q).label for q in QUOTAS}
    fr2 = Contender("fr-easgd", "fr-easgd", low, 2).label
    out: dict[str, Any] = {}
    trainer_counts = sorted({r["trainers"] for r in runs})
    falls = {t: (mean_of(table, t, fr[None], "eps_ratio_to_hogwild"), mean_of(table, t, fr[low], "eps_ratio_to_hogwild"))
             for t in trainer_counts}
    out["a_fr_falls_as_servers_saturate"] = {
        "bar": f"fr-easgd-{EVERY}'s EPS ratio at {low:g} core per server < without a quota, every trainer count",
        "values": falls, "passed": all(a is not None and b is not None and b < a for a, b in falls.values())}
    shadow_ratios = {f"{t} trainers @ {q}": mean_of(table, t, shadow[q], "eps_ratio_to_hogwild")
                     for t in trainer_counts for q in QUOTAS}
    gaps = {t: [mean_of(table, t, shadow[q], "sync_gap") for q in QUOTAS] for t in trainer_counts}
    out["b_shadow_keeps_hogwild_speed"] = {
        "bar": f"shadow-easgd's EPS >= {EPS_BAR} x hogwild at every capacity, its sync gap growing as capacity falls",
        "ratios": shadow_ratios, "sync_gaps_by_capacity": gaps,
        "passed": all(v is not None and v >= EPS_BAR for v in shadow_ratios.values())
        and all(g[0] is not None and g[-1] is not None and g[-1] > g[0] for g in gaps.values())}
    relief = {t: (mean_of(table, t, fr[low], "eps_ratio_to_hogwild"), mean_of(table, t, fr2, "eps_ratio_to_hogwild"))
              for t in trainer_counts}
    out["c_more_sync_servers_relieve_fr"] = {
        "bar": f"at {low:g} core per server fr-easgd with 2 servers has a higher EPS ratio than with 1",
        "values": relief, "passed": all(a is not None and b is not None and b > a for a, b in relief.values())}
    losses = {}
    for t in trainer_counts:
        for q in QUOTAS:
            pairs = {}
            for r in runs:
                if (r["trainers"] == t and r["strategy"] != "hogwild" and r.get("quota_cores") == q
                        and r["sync_servers"] == 1 and "error" not in r):
                    pairs.setdefault(r["seed"], {})[r["strategy"]] = r["eval_logloss"]
            diffs = [p["shadow-easgd"] - p["fr-easgd"] for p in pairs.values() if len(p) == 2]
            losses[f"{t} trainers @ {q}"] = mean_ci(diffs) if diffs else None
    out["d_shadow_loss_no_worse"] = {
        "bar": "shadow-easgd's eval logloss - fr-easgd's (same seed, capacity): 95% interval's lower bound <= 0",
        "differences": losses,
        "passed": all(d is not None and ((d["ci95"] or [d["mean"]])[0] <= 0) for d in losses.values())}
    return out


def print_table(table: dict[str, Any], found: dict[str, Any]) -> None:
    print(f"{'trainers | contender':48} {'EPS':>8} {'/hogwild':>9} {'sync gap':>9} {'syncs/s':>8} {'eval logloss':>12}")
    for name, cell in table.items():
        def m(key: str, digits: int = 3) -> str:
            return number(cell[key]["mean"], digits) if cell.get(key) else "-"
        print(f"{name:48} {m('examples_per_second', 0):>8} {m('eps_ratio_to_hogwild'):>9} {m('sync_gap'):>9} "
              f"{m('syncs_per_second', 1):>8} {m('eval_logloss', 4):>12}")
    for bar in found.values():
        print(f"{'PASS' if bar['passed'] else 'FAIL'} {bar['bar']}")


def reaggregate(path: Path) -> int:
    """Ratios, summary and bars recomputed from the runs on record (the runs themselves untouched)."""
    import json

    from provenance import record as provenance_record

    report = json.loads(path.read_text())
    runs = report["runs"]
    ratios(runs)
    table = summarize(runs)
    found = bars(runs, table)
    report.update(summary=table, bars=found)
    report.setdefault("reaggregated", []).append(
        {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **provenance_record()})
    path.write_text(json.dumps(report, indent=2) + "\n")  # (the runs' provenance stays the run's)
    print_table(table, found)
    print(f"reaggregated {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = peer_parser(__doc__, "1 seed, 2 trainers, fewer examples: a harness check", 3,
                         "total seconds to wait for other processes to go idle before runs (default 300, 0 with "
                         "--quick)")
    parser.add_argument("--reaggregate", action="store_true",
                        help="train nothing: recompute ratios, the summary and the bars from the runs in the JSON")
    args = parser.parse_args(argv)
    check(args)
    if args.reaggregate:
        return reaggregate(peer_run(args, "shadowsync_capacity", 3)[1])
    if os.geteuid() != 0 or not CPU_ROOT.exists():
        print("shadowsync_capacity: skipped: needs root and cgroup v1's cpu controller at /sys/fs/cgroup/cpu")
        return 0
    seeds, out_path, command = peer_run(args, "shadowsync_capacity", 3)
    logging.getLogger("cadence").setLevel(logging.WARNING)
    gate = QuietGate(args.max_wait if args.max_wait is not None else (0.0 if args.quick else 300.0))
    started = time.perf_counter()
    overrides = [*(o for o in base_overrides(args.quick) if not o.startswith("ctr.synthetic.num_examples")),
                 f"ctr.synthetic.num_examples={EXAMPLES[args.quick]}", "ps.engine=ray"]
    report: dict[str, Any] = {
        "benchmark": "ShadowSync vs FR-EASGD with CPU-capped sync servers (benchmarks/shadowsync_capacity.py)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": command,
        "quick": args.quick, "complete": False, "machine": machine_info(), "seeds": seeds,
        "settings": {"config": str(CONFIG.relative_to(REPO)), "common_overrides": overrides,
                     "quota_cores_per_server": QUOTAS, "cfs_period_us": PERIOD_US,
                     "trainers": TRAINERS[args.quick], "threads_per_trainer": THREADS_PER_TRAINER, "every": EVERY,
                     "contenders": [c.label for c in contenders()]},
        "runs": []}
    remove_cgroups()
    try:
        run_one(Contender("hogwild", "hogwild"), seeds[0], 2, overrides, gate)  # Ray's start and one-time costs, not kept
        for index, seed in enumerate(seeds):
            for trainers in TRAINERS[args.quick]:
                order = contenders() if index % 2 == 0 else contenders()[::-1]
                for contender in order:
                    report["runs"].append(run_one(contender, seed, trainers, overrides, gate))
                write_report(report, out_path, started, gate.waited_s)
    finally:
        remove_cgroups()
    runs = report["runs"]
    ratios(runs)
    table = summarize(runs)
    found = bars(runs, table)
    report.update(summary=table, bars=found, complete=True, failures=[r for r in runs if "error" in r])
    write_report(report, out_path, started, gate.waited_s)
    print_table(table, found)
    print(f"wrote {out_path.relative_to(REPO) if out_path.is_relative_to(REPO) else out_path} "
          f"({report['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
