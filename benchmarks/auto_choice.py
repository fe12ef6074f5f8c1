"""What ``--strategy auto`` chooses in the settings whose winner the benchmarks established (issue
28): ``sync`` on UMLS in memory (docs/strategies/pipelined.md: the pipeline has nothing to hide
there); ``oac`` on an out-of-core table (benchmarks/out_of_core.py): on this machine's disk
("out-of-core": a 2 GiB table under a 900 MiB cap, 3 epochs, a checkpoint after each: OAC 1.65x and
1.88x sync, ``out_of_core.py --epochs 3`` at 6bd09b7) and where reads take time ("slow-storage": its
``--latency-ms 1`` setting, OAC 1.9-2.7x sync); ``gba`` with 4
workers and a straggler (benchmarks/gba_stragglers.py: worker 0 slowed 4x by a cgroup CPU quota, its
real cause, on Ray).

Each setting is run ``--repeats`` times, each run a fresh process with ``--strategy auto`` (its
trials, then the chosen strategy's run); recorded per run: the choice, the trial table (each
candidate's examples/s) and the reason line. The out-of-core and straggler settings need root (a
memory cgroup, a FUSE mount; a CPU cgroup) and are skipped without it.

    sudo .venv/bin/python benchmarks/auto_choice.py [--repeats 2] [--settings umls,out-of-core,slow-storage,straggler]

Writes benchmarks/results/auto_choice.json.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit
import out_of_core  # same folder: the out-of-core setting's cgroup and child runs
import slowfs  # same folder: storage whose reads take time

REPO = Path(__file__).resolve().parents[1]
CADENCE = [sys.executable, "-m", "cadence.cli"]
EXPECTED = {"umls": "sync", "out-of-core": "oac", "slow-storage": "oac", "straggler": "gba"}


def say(text: str) -> None:
    print(text, flush=True)


def cli_run(args: list[str], out: Path) -> dict:
    """One ``cadence train`` process; its summary."""
    done = subprocess.run([*CADENCE, "train", *args, "--out", str(out), "--no-progress", "--overwrite"],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cadence train {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def umls(work: Path) -> dict:
    """The shipped config as a user runs it (40 epochs): its trials time 180 batches each; with one
    epoch a trial timed 20 batches (0.08 s), and OAC once came out 1.07x sync by noise alone."""
    return cli_run(["--config", "configs/umls-complex.yaml", "--strategy", "auto"], work / "umls")


def straggler(work: Path) -> dict:
    return cli_run(["--config", "configs/ml100k-deepfm.yaml", "--strategy", "auto", "--epochs", "1",
                    "--engine", "ray", "--set", "ps.straggler_cause=cpu_quota", "--straggler", "0:4"],
                   work / "straggler")


# the out-of-core settings: (the cap in MiB, the run's overrides); "out-of-core": benchmarks/out_of_core.py's
# defaults (2M entities x dim 256, 150k edges) on this machine's disk, 3 epochs (a trial never trains
# longer than the run, and one epoch, 30 batches, is shorter than a trial); "slow-storage": its
# ``--latency-ms 1`` sweep (1M entities x dim 64, 10k edges; the table on benchmarks/slowfs.py, every read
# request served after 1 ms), one epoch as there
OUT_OF_CORE = {
    "out-of-core": (900, ["data.synthetic.num_entities=2000000", "data.synthetic.num_edges=150000", "model.dim=256",
                          "train.epochs=3", "train.batch_size=5000", "train.negatives=128", "eval.max_triples=200"]),
    "slow-storage": (420, ["data.synthetic.num_entities=1000000", "data.synthetic.num_edges=10000", "model.dim=64",
                           "train.epochs=1", "train.batch_size=500", "train.negatives=16", "eval.max_triples=100"]),
}
SLOW_READ_MS = 1.0


def out_of_core_run(name: str, work: Path, group: Path) -> dict:
    """``--strategy auto`` on an out-of-core setting (``OUT_OF_CORE``), the command a user runs, in the
    setting's memory cgroup (the CLI measures every trial before it imports torch)."""
    cap, setting = OUT_OF_CORE[name]
    (group / "memory.limit_in_bytes").write_text(str(cap << 20))
    storage = work / "slow" if name == "slow-storage" else work
    common = ["data.dataset=synthetic", "data.synthetic.holdout=1000", "model.name=distmult", *setting,
              "eval.every=0", "eval.test=false", "checkpoint.every=1", "pipeline.staleness_bound=16",
              "store.backend=mmap", "threads=2", f"store.path={storage / 'store'}"]
    mount = slowfs.SlowMount(work / "backing", storage, SLOW_READ_MS) if name == "slow-storage" else contextlib.nullcontext()
    with mount as slow:
        out_of_core.drop_caches()
        enter = f"echo $$ > {group / 'cgroup.procs'} && exec \"$0\" \"$@\""
        command = ["sh", "-c", enter, *CADENCE, "train", "--strategy", "auto", "--no-progress", "--overwrite",
                   "--out", str(work / "ooc"), *[item for key in common for item in ("--set", key)]]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - started
        shutil.rmtree(storage / "store", ignore_errors=True)
        shutil.rmtree(storage / "store-auto-trial", ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"a run failed with exit code {done.returncode} (memory cap hit "
                         f"{int((group / 'memory.failcnt').read_text())} times; {' '.join(common)}):\n{done.stderr[-3000:]}")
    summary = json.loads((work / "ooc" / "summary.json").read_text())
    summary["peak_memory_mib"] = int((group / "memory.max_usage_in_bytes").read_text()) >> 20
    (group / "memory.max_usage_in_bytes").write_text("0")
    shutil.rmtree(work / "ooc", ignore_errors=True)
    summary["memory_cap_mib"] = cap
    summary["run_wall_seconds"] = round(wall, 1)
    if slow is not None:
        summary["slowfs_served"] = slow.stats()
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", default=",".join(EXPECTED))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "auto_choice.json"))
    add_flag(parser)
    args = parser.parse_args()
    check(args, "auto_choice.py")
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = sorted(set(settings) - set(EXPECTED))
    if unknown:
        raise SystemExit(f"auto_choice: unknown setting(s) {', '.join(unknown)}; choose from {', '.join(EXPECTED)}")
    root = os.geteuid() == 0
    results: dict = {"command": " ".join([".venv/bin/python", "benchmarks/auto_choice.py", *sys.argv[1:]]),
                     "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                     "settings": {}}
    group = None
    with tempfile.TemporaryDirectory(prefix="auto-choice-") as scratch:
        work = Path(scratch)
        for name in settings:
            entry = results["settings"][name] = {"expected": EXPECTED[name], "runs": []}
            if name != "umls" and not root:
                entry["skipped"] = "needs root (a cgroup)"
                say(f"{name}: skipped (needs root)")
                continue
            if name in OUT_OF_CORE:
                why = out_of_core.usable() or (slowfs.usable() if name == "slow-storage" else None)
                if why is not None:
                    entry["skipped"] = why
                    say(f"{name}: skipped ({why})")
                    continue
                group = group or out_of_core.make_cgroup(OUT_OF_CORE[name][0])
            for repeat in range(args.repeats):
                load = os.getloadavg()
                try:
                    summary = {"umls": lambda: umls(work), "straggler": lambda: straggler(work),
                               **{setting: functools.partial(out_of_core_run, setting, work, group)
                                  for setting in OUT_OF_CORE}}[name]()
                except SystemExit as failed:  # (a run that failed: recorded, and the others still run)
                    entry["runs"].append({"chosen": None, "failed": str(failed)[:2000],
                                          "load_before": [round(x, 2) for x in load]})
                    say(f"{name} [{repeat}]: the run failed: {str(failed).splitlines()[0][:300]}")
                    continue
                record = summary["auto"]
                entry["runs"].append({"chosen": record["chosen"], "reason": record["reason"], "trials": record["trials"],
                                      "load_before": [round(x, 2) for x in load],
                                      "load_after": [round(x, 2) for x in os.getloadavg()]})
                speeds = ", ".join(f"{t['strategy']} {t['examples_per_second'] or 0:,.0f}" for t in record["trials"])
                say(f"{name} [{repeat}]: chose {record['chosen']} (expected {EXPECTED[name]}); {speeds} examples/s")
            entry["passed"] = all(run["chosen"] == EXPECTED[name] for run in entry["runs"])
    if group is not None:
        out_of_core.remove_cgroup(group)
    results["passed"] = all(entry.get("passed", True) for entry in results["settings"].values())
    Path(args.out).write_text(json.dumps(stamp(results), indent=1) + "\n")
    for name, entry in results["settings"].items():
        state = "skipped" if "skipped" in entry else ("PASS" if entry["passed"] else "FAIL")
        say(f"{state} {name}: expected {entry['expected']}, chose {[r['chosen'] for r in entry['runs']]}")
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
