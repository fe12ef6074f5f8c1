#!/usr/bin/env python
"""Where each task's time goes (issue 27): each task's shipped config trained under ``sync`` (the
reference every strategy schedules the same stages of) inside the sampling profiler py-spy, every
sample put in one stage of the step, and the shares written to ``results/task_profiles.json`` and,
with ``--write``, to docs/benchmarks.md's generated table.

    make bench-profiles                                   # builds .venv-bench-pyspy, then this
    .venv/bin/python benchmarks/task_profiles.py [--tasks kge,mf] [--rate 200] [--write]
    .venv/bin/python benchmarks/task_profiles.py --render --write   # the table from the committed file

Stages, from the Python stack of each sample (the calling thread runs a sync epoch): ``prepare`` (the
task builds the batch: ids, negatives, windows), ``gather`` (rows read from the store), ``forward``
(the task's loss), ``backward``, ``optimizer`` (the rows' and the dense parameters' updates),
``write`` (rows into the store), ``transfer`` (uploads and downloads: none on the CPU), ``epoch
other`` (the loop, callbacks, the thread governor); outside the epochs: ``evaluation`` and ``setup``
(imports, data, the task and store built), and ``unattributed`` (stacks py-spy read only in part);
beside the calling thread, as shares of the epoch's samples: ``intra-op threads`` (native threads
with no Python frame, busy: torch's OpenMP team, computing or spinning) and ``helper threads``
(Python threads the run started: a kernel's helper). Native frames are not sampled (``--native`` is not used:
it stops the process), so a torch op's time is its Python caller's. py-spy runs in its own
virtualenv (benchmarks/requirements-pyspy.txt); the library never imports it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import doc_tables  # same folder
from provenance import add_flag, check, stamp

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
RESULT = RESULTS / "task_profiles.json"
CADENCE = REPO / ".venv" / "bin" / "cadence"
PYSPY = REPO / ".venv-bench-pyspy" / "bin" / "py-spy"
NAME, SCRIPT = "task-profiles", "task_profiles.py"

# each task's shipped config, short; sync on both cores, no checkpoints, no validation between epochs
KGE_1M = ["data.dataset=synthetic", "data.synthetic.num_entities=1000000", "data.synthetic.num_edges=1000000",
          "data.synthetic.holdout=500", "model.name=distmult", "model.dim=100", "train.scoring=sampled",
          "train.negatives=100", "train.loss=logistic", "train.batch_size=1000", "train.reciprocal=false",
          "train.regularizer=none", "train.reg_weight=0", "optimizer.entity=rowwise_adagrad", "eval.test=false"]
TASKS: dict[str, tuple[str, int, list[str]]] = {
    "kge": ("umls-complex.yaml", 20, []),  # the demo's setting
    "kge-1m": ("umls-complex.yaml", 1, KGE_1M),  # the tables dominate (kge_vs_pbg's shape)
    "ctr": ("ml100k-deepfm.yaml", 4, ["ps.workers=1"]),  # the one-process pipeline (workers: threads of their own)
    "mf": ("ml100k-mf.yaml", 40, []),
    "w2v": ("w2v.yaml", 1, []),
    "image": ("fashion-mnist-mlp.yaml", 2, []),
}
EPOCH_STAGES = ("prepare", "gather", "forward", "backward", "optimizer", "write", "transfer", "epoch other")
OUTSIDE = ("evaluation", "setup", "unattributed")
BESIDE = ("intra-op threads", "helper threads")
# stage-level frames (the first one found from the root decides), then the step inside ComputeStage
STAGE_FRAMES = {"LoadStage.prepare": "prepare", "LoadStage.read": "gather", "EmbeddingStore.pull": "gather",
                "WriteStage.__call__": "write", "EmbeddingStore.set": "write", "DeviceLink.upload": "transfer",
                "DeviceLink.download": "transfer"}


def function(frame: str) -> str:
    """``Class.method`` of a py-spy frame ``Class.method (path:line)``."""
    return frame.split(" (", 1)[0]


def stage(stack: list[str]) -> str:
    """The stage a sample (root-first frames, as py-spy's raw format lists them) was taken in."""
    names = [function(frame) for frame in stack]
    if not any(names):
        return "intra-op threads"  # no Python frame: a native thread busy (torch's OpenMP team)
    if names[0].endswith("_bootstrap"):
        return "helper threads"  # a Python thread the run started (a kernel's helper)
    if names[0] != "<module>":
        return "unattributed"  # a stack py-spy read only in part
    if "Trainer.evaluate" in names or "Task.final_metrics" in names:
        return "evaluation"
    if "Trainer._run_epoch" not in names:
        return "setup"
    for name in names:
        if name in STAGE_FRAMES:
            return STAGE_FRAMES[name]
    if "ComputeStage._compute" in names:
        below = names[names.index("ComputeStage._compute") + 1:]
        child = below[0] if below else ""
        if child.endswith(".loss"):
            return "forward"
        if child.endswith("backward"):
            return "backward"
        if child.endswith((".step", "zero_grad", "wrapper")):
            return "optimizer"
    return "epoch other"


def summarize(raw: str) -> dict[str, Any]:
    """Shares of every stage from py-spy's raw output (``frame;frame;... count`` per line), and the
    functions that held the most epoch samples themselves."""
    stages: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    pending = ""
    for line in raw.splitlines():
        line = pending + line
        if not line.strip():
            continue
        frames, _, count = line.rpartition(" ")
        if not count.isdigit():  # a frame's name held a line break: the entry goes on in the next line
            pending = line + "\\n"
            continue
        pending = ""
        stack = frames.split(";")
        where = stage(stack)
        stages[where] += int(count)
        if where in EPOCH_STAGES:
            own[function(stack[-1])] += int(count)
    total = sum(stages.values())
    epoch = sum(stages[name] for name in EPOCH_STAGES)
    return {"samples": total, "epoch_samples": epoch,
            "share_of_run": {name: stages[name] / max(1, total) for name in (*EPOCH_STAGES, *OUTSIDE, *BESIDE)},
            "share_of_epoch": {name: stages[name] / max(1, epoch) for name in (*EPOCH_STAGES, *BESIDE)},
            "top_self_in_epoch": [[name, count / max(1, epoch)] for name, count in own.most_common(8)]}


def profile(task: str, rate: int, scratch: Path) -> dict[str, Any]:
    config, epochs, overrides = TASKS[task]
    out, raw = scratch / task, scratch / f"{task}.txt"
    command = [str(CADENCE), "train", "--config", str(REPO / "configs" / config), "--strategy", "sync",
               "--epochs", str(epochs), "--no-progress", "--out", str(out), "--overwrite",
               *(arg for key in ("threads=2", "checkpoint.every=0", "eval.every=0", *overrides) for arg in ("--set", key))]
    load = os.getloadavg()
    done = subprocess.run([str(PYSPY), "record", "--rate", str(rate), "--format", "raw", "--nonblocking",
                           "--output", str(raw), "--", *command], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"task_profiles.py: {task}: py-spy or the run failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"config": f"configs/{config}", "epochs": epochs, "overrides": overrides,
            "command": " ".join(command[1:]), "loadavg_before": list(load), "loadavg_after": list(os.getloadavg()),
            "train_seconds": summary["train_seconds"], "examples_per_second": summary["examples_per_second"],
            **summarize(raw.read_text())}


def render(report: dict[str, Any]) -> str:
    commit = (report.get("provenance") or {}).get("commit") or "?"
    head = ("| task (sync, profiled) | " + " | ".join((*EPOCH_STAGES, *(f"{name} (beside)" for name in BESIDE)))
            + " | epochs / run | largest in the epoch |\n|---|" + "---|" * (len(EPOCH_STAGES) + len(BESIDE) + 2))
    rows = [head]
    for task, record in report["tasks"].items():
        shares = " | ".join(f"{100 * record['share_of_epoch'][name]:.0f}%" for name in (*EPOCH_STAGES, *BESIDE))
        epoch_share = sum(record["share_of_run"][name] for name in EPOCH_STAGES)
        top = ", ".join(f"`{name}` {100 * share:.0f}%" for name, share in record["top_self_in_epoch"][:3])
        rows.append(f"| {task} | {shares} | {100 * epoch_share:.0f}% | {top} |")
    rows.append(f"\n(`results/task_profiles.json`, measured at `{commit[:7]}`: shares of the samples taken in the "
                "epochs; a torch op counts for the Python function that called it.)")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated (default: {','.join(TASKS)})")
    parser.add_argument("--rate", type=int, default=200, help="samples a second (default 200)")
    parser.add_argument("--render", action="store_true", help="no profiling: the table from the committed result")
    parser.add_argument("--write", action="store_true", help="put the table into docs/benchmarks.md")
    add_flag(parser)
    args = parser.parse_args()
    if args.render:
        report = json.loads(RESULT.read_text())
    else:
        check(args)
        wanted = [name.strip() for name in args.tasks.split(",") if name.strip()]
        unknown = sorted(set(wanted) - set(TASKS))
        if unknown:
            raise SystemExit(f"task_profiles.py: --tasks: unknown {', '.join(unknown)} (known: {', '.join(TASKS)})")
        if not PYSPY.exists():
            raise SystemExit(f"task_profiles.py: {PYSPY} missing: make .venv-bench-pyspy/bin/python")
        report = {"command": " ".join([".venv/bin/python", "benchmarks/task_profiles.py", *sys.argv[1:]]),
                  "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rate": args.rate, "cpus": os.cpu_count(), "tasks": {}}
        with tempfile.TemporaryDirectory(prefix="cadence-profiles-") as scratch:
            for task in wanted:
                record = profile(task, args.rate, Path(scratch))
                report["tasks"][task] = record
                print(f"{task}: " + ", ".join(f"{name} {100 * share:.0f}%" for name, share in
                                               record["share_of_epoch"].items()), file=sys.stderr, flush=True)
        report = stamp(report)
        RESULT.write_text(json.dumps(report, indent=2) + "\n")
    doc_tables.emit(render(report), args.write, NAME, SCRIPT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
