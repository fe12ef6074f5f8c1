"""What ``--strategy auto`` chooses in the three settings whose winner the benchmarks established
(issue 28): ``sync`` on UMLS in memory (docs/strategies/pipelined.md: the pipeline has nothing to
hide there), ``oac`` on the out-of-core graph (benchmarks/out_of_core.py: a 2 GiB table in a process
capped at 900 MiB), ``gba`` with 4 workers and a straggler (benchmarks/gba_stragglers.py: worker 0
slowed 4x by a cgroup CPU quota, its real cause, on Ray).

Each setting is run ``--repeats`` times, each run a fresh process with ``--strategy auto`` (its
trials, then one epoch of the chosen strategy); recorded per run: the choice, the trial table (each
candidate's examples/s) and the reason line. The out-of-core and straggler settings need root (a
memory cgroup; a CPU cgroup) and are skipped without it.

    sudo .venv/bin/python benchmarks/auto_choice.py [--repeats 2] [--settings umls,out-of-core,straggler]

Writes benchmarks/results/auto_choice.json.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
CADENCE = [sys.executable, "-m", "cadence.cli"]
EXPECTED = {"umls": "sync", "out-of-core": "oac", "straggler": "gba"}


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
    return cli_run(["--config", "configs/umls-complex.yaml", "--strategy", "auto", "--epochs", "1"], work / "umls")


def straggler(work: Path) -> dict:
    return cli_run(["--config", "configs/ml100k-deepfm.yaml", "--strategy", "auto", "--epochs", "1",
                    "--engine", "ray", "--set", "ps.straggler_cause=cpu_quota", "--straggler", "0:4"],
                   work / "straggler")


def out_of_core_run(work: Path, group: Path) -> dict:
    """The out-of-core setting of benchmarks/out_of_core.py (its defaults: 2M entities x dim 256, a
    900 MiB cap, 150k edges), in its memory cgroup, with ``--strategy auto``, for 3 epochs: a trial
    never trains longer than the run, and one epoch (30 batches) is too short to see past the page
    cache the table's initialisation leaves warm."""
    entities, edges, cap = 2_000_000, 150_000, 900
    common = ["data.dataset=synthetic", f"data.synthetic.num_entities={entities}", f"data.synthetic.num_edges={edges}",
              "data.synthetic.holdout=1000", "model.name=distmult", "model.dim=256", "train.epochs=3",
              "train.batch_size=5000", "train.negatives=128", "eval.every=0", "eval.test=false",
              "eval.max_triples=200", "checkpoint.every=1", "pipeline.staleness_bound=16", "store.backend=mmap",
              "threads=2", f"store.path={work / 'store'}"]
    # the command a user runs, in the cgroup (the CLI measures every trial before it imports torch)
    out_of_core.drop_caches()
    enter = f"echo $$ > {group / 'cgroup.procs'} && exec \"$0\" \"$@\""
    command = ["sh", "-c", enter, *CADENCE, "train", "--strategy", "auto", "--no-progress", "--overwrite",
               "--out", str(work / "ooc"), *[item for key in common for item in ("--set", key)]]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"a run failed with exit code {done.returncode} (memory cap hit "
                         f"{int((group / 'memory.failcnt').read_text())} times; {' '.join(common)}):\n{done.stderr[-3000:]}")
    summary = json.loads((work / "ooc" / "summary.json").read_text())
    summary["peak_memory_mib"] = int((group / "memory.max_usage_in_bytes").read_text()) >> 20
    (group / "memory.max_usage_in_bytes").write_text("0")
    shutil.rmtree(work / "ooc", ignore_errors=True)
    shutil.rmtree(work / "store", ignore_errors=True)
    shutil.rmtree(work / "store-auto-trial", ignore_errors=True)
    summary["memory_cap_mib"] = cap
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", default="umls,out-of-core,straggler")
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
            if name == "out-of-core":
                why = out_of_core.usable()
                if why is not None:
                    entry["skipped"] = why
                    continue
                group = group or out_of_core.make_cgroup(900)
            for repeat in range(args.repeats):
                load = os.getloadavg()
                try:
                    summary = {"umls": lambda: umls(work), "straggler": lambda: straggler(work),
                               "out-of-core": lambda: out_of_core_run(work, group)}[name]()
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
    results["passed"] = all(entry.get("passed", True) for entry in results["settings"].values())
    Path(args.out).write_text(json.dumps(stamp(results), indent=1) + "\n")
    for name, entry in results["settings"].items():
        state = "skipped" if "skipped" in entry else ("PASS" if entry["passed"] else "FAIL")
        say(f"{state} {name}: expected {entry['expected']}, chose {[r['chosen'] for r in entry['runs']]}")
    say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
