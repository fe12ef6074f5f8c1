"""The reliability corpus: what a user can get wrong, or do to a run, and what they should see.

Ten categories (issue 10): interrupts, one writer per run, data fingerprints, typed flags, numbers,
the operating system, data files, checkpoints, engines. Each case is a function of a
``Workspace``; cases that apply to every task (or strategy, or engine) are made once per task.
``test_corpus.py`` runs them all in the default suite (those marked ``slow`` with ``-m slow``);
``count.py`` counts the handled ones by category, against this tree or another checkout.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from tests.reliability.harness import (TASKS, CannotRun, Workspace, compare_args, data_file, interrupt_when, mask_paths,
                                       train_args, tree_digest)

CATEGORIES = ("interrupts", "one_writer", "fingerprint", "flags", "numbers", "os", "data", "checkpoints",
              "engines",
              # issue 29 (``newer_parts.py``): the parts added since
              "unread_keys", "edge_values", "hangs", "empty_splits", "resources", "ray_strategies")


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    run: Callable[[Workspace], None]
    processes: bool = False  # needs real processes (signals, locks held by another process)
    slow: bool = False
    root: bool = False  # needs root (a mount, another user's permissions)

    @property
    def id(self) -> str:
        return f"{self.category}/{self.name}"


CASES: list[Case] = []


def case(category: str, name: str | None = None, *, tasks: tuple[str, ...] | None = None,
         processes: bool = False, slow: Callable[[str], bool] | bool = False, root: bool = False):
    """Register ``fn(ws)`` (or ``fn(ws, task)``, once per task of ``tasks``)."""
    assert category in CATEGORIES, category

    def register(fn):
        base = name or fn.__name__
        if tasks is None:
            CASES.append(Case(category, base, fn, processes, bool(slow), root))
        else:
            for task in tasks:
                heavy = slow(task) if callable(slow) else slow
                CASES.append(Case(category, f"{base}[{task}]", lambda ws, t=task: fn(ws, t), processes, heavy, root))
        return fn

    return register


def last_checkpoint(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("epoch-*"))[-1]


# ==== 1. interrupts ================================================================================
# Ctrl-C during training (every task; pipeline strategies, the parameter server on threads and on
# Ray) exits 130 with a short message and the run resumes to the end; the default suite runs one
# strategy per task, the rest are slow.
INTERRUPTED = [(task, runtime) for task in (*TASKS, "image")
               for runtime in ("sync", "async", "oac", "pdasgd", "hop_bw", "gba", "shadow-ma", "fr-easgd", "ray",
                               "shadow-ray", "adapm")] + [("w2v", "pair"), ("mf", "rating")]
# one per family of runtimes: the pipeline (sync, oac), the parameter server (gba), ShadowSync
# (fr-easgd), pdASGD, AdaPM, Ray, and a task's in-place loop (w2v.update: pair, mf.update: rating)
DEFAULT_INTERRUPTS = {("kge", "sync"), ("ctr", "oac"), ("w2v", "gba"), ("ctr", "ray"), ("kge", "fr-easgd"),
                      ("image", "pdasgd"), ("mf", "adapm"), ("w2v", "pair")}


def _ctrl_c_then_resume(ws: Workspace, task: str, runtime: str) -> None:
    data = ws.data(task)
    out = ws.root / "run"
    process = ws.runner.start(["-q", "train", *train_args(task, data, runtime), "--epochs", "400",
                               "--set", "eval.every=0", "--out", str(out)])
    # any checkpoint: a tiny epoch takes milliseconds, and epoch 1's is pruned once epoch 3's is written
    result = interrupt_when(process, lambda: any((out / "checkpoints").glob("epoch-*")))
    assert result.code == 130, f"Ctrl-C: exit {result.code}, expected 130:\n{result}"
    assert "Traceback" not in result.err and "terminate called" not in result.err, str(result)
    assert result.err.strip().splitlines()[-1].startswith("cadence: interrupted"), str(result)
    done = max(int(path.name.removeprefix("epoch-")) for path in (out / "checkpoints").glob("epoch-*"))
    epochs = max(3, done + 1)  # at least one epoch left to train after the resume
    resumed = ws.cadence("-q", "train", "--resume", str(out), "--epochs", str(epochs))
    ws.succeeds(resumed)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == epochs, summary


for _task, _runtime in INTERRUPTED:
    case("interrupts", f"ctrl_c_then_resume[{_task}-{_runtime}]", processes=True,
         slow=(_task, _runtime) not in DEFAULT_INTERRUPTS)(
        lambda ws, t=_task, r=_runtime: _ctrl_c_then_resume(ws, t, r))


@case("interrupts", processes=True)
def ctrl_c_while_starting(ws: Workspace) -> None:
    """Ctrl-C before the first checkpoint (reading data, building the runtime): 130, and what it left
    does not stop the next run (``--resume`` trains from the start, or the directory is not there)."""
    data = ws.data("kge")
    out = ws.root / "run"
    process = ws.runner.start(["-q", "train", *train_args("kge", data), "--out", str(out)])
    result = interrupt_when(process, lambda: (out / "config.yaml").exists() or process.poll() is not None)
    assert result.code in (130, 0), str(result)
    assert "Traceback" not in result.err, str(result)
    if result.code == 130:
        ws.succeeds(ws.cadence("-q", "train", "--resume", str(out)))


@case("interrupts", processes=True, slow=True)
def ctrl_c_during_compare(ws: Workspace) -> None:
    """Ctrl-C while ``compare`` trains its second strategy: 130; that strategy's run resumes."""
    data = ws.data("kge")
    out = ws.root / "cmp"
    process = ws.runner.start([*compare_args("kge", data, "sync,oac"),
                               "--epochs", "400", "--set", "eval.every=0", "--out", str(out)])
    result = interrupt_when(process, lambda: (out / "oac" / "checkpoints" / "epoch-000001").is_dir(), timeout=400)
    assert result.code == 130 and "Traceback" not in result.err, str(result)
    assert not (out / "comparison.json").exists()
    ws.succeeds(ws.cadence("-q", "train", "--resume", str(out / "oac"), "--epochs", "3"))


@case("interrupts", processes=True, tasks=TASKS, slow=lambda task: task != "kge")
def sigkill_then_resume(ws: Workspace, task: str) -> None:
    data = ws.data(task)
    out = ws.root / "run"
    process = ws.runner.start(["-q", "train", *train_args(task, data), "--epochs", "400", "--set", "eval.every=0",
                               "--out", str(out)])
    # (any checkpoint from epoch 2 on: with checkpoint.keep 2 a tiny epoch's checkpoint can come and go
    # between two looks, and 400 epochs of tiny MF end within seconds)
    past_two = lambda: any(path.name >= "epoch-000002" for path in (out / "checkpoints").glob("epoch-*"))  # noqa: E731
    result = interrupt_when(process, past_two, signal.SIGKILL)
    assert result.code == -signal.SIGKILL, str(result)
    ws.succeeds(ws.cadence("-q", "train", "--resume", str(out), "--epochs", "3"))


@case("interrupts", tasks=TASKS)
def leftovers_of_a_killed_checkpoint_write_are_removed(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    partial = run / "checkpoints" / ".partial-epoch-000004-99999"
    partial.mkdir()
    (partial / "tensors.safetensors").write_bytes(b"\0" * 100)  # what a SIGKILL mid-write leaves
    (run / ".metrics.jsonl.tmp").write_text('{"half a rec')
    ws.succeeds(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"))
    assert not partial.exists() and not (run / ".metrics.jsonl.tmp").exists()
    assert json.loads((run / "summary.json").read_text())["epochs"] == 4


@case("interrupts", tasks=("kge", "ctr"))
def a_stall_stops_every_thread_and_names_the_stage(ws: Workspace, task: str) -> None:
    result = ws.train(task, "--strategy", "oac", "--set", "pipeline.stall_timeout=0.0001")
    line = ws.fails(result, "epoch", "batch", code=3)
    assert "stage" in line or "stall" in line, line


# ==== 2. one writer per run directory =============================================================
def _hold_lock(run: Path) -> subprocess.Popen:
    """Another process holding ``run``'s lock as a running ``cadence train`` does (it writes its pid)."""
    code = ("import fcntl, os, sys, time\nh = open(sys.argv[1], 'a+')\nfcntl.flock(h, fcntl.LOCK_EX)\n"
            "h.seek(0)\nh.truncate()\nh.write(str(os.getpid()))\nh.flush()\n"
            "print('locked', flush=True)\ntime.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run / ".lock")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


@case("one_writer", processes=True, tasks=TASKS, slow=lambda task: task != "kge")  # the lock knows no task
def resume_while_another_process_writes_the_run(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    before = tree_digest(run)
    holder = _hold_lock(run)
    try:
        ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"), str(run), str(holder.pid))
    finally:
        holder.kill()
        holder.wait()
    ws.unchanged(before, run)


@case("one_writer", processes=True)
def overwrite_while_another_process_writes_the_run(ws: Workspace) -> None:
    run, data = ws.trained("kge")
    before = tree_digest(run)
    holder = _hold_lock(run)
    try:
        ws.fails(ws.train("kge", "--overwrite", data=data, out=run), str(holder.pid))
    finally:
        holder.kill()
        holder.wait()
    ws.unchanged(before, run)


@case("one_writer", processes=True)
def two_runs_started_into_one_directory(ws: Workspace) -> None:
    """Two real processes race for one new directory: one trains, the other is refused cleanly."""
    data = ws.data("kge")
    out = ws.root / "run"
    argv = ["-q", "train", *train_args("kge", data), "--epochs", "30", "--set", "eval.every=0", "--out", str(out)]
    first, second = ws.runner.start(argv), ws.runner.start(argv)
    results = [(p.wait(timeout=300), *p.communicate()) for p in (first, second)]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, _, err in results if code == 2)
    assert "Traceback" not in refused and "cadence: error:" in refused and str(out) in refused, refused
    assert json.loads((out / "summary.json").read_text())["epochs"] == 30


@case("one_writer", tasks=TASKS)
def train_into_a_finished_run_without_overwrite(ws: Workspace, task: str) -> None:
    run, data = ws.trained(task)
    before = tree_digest(run)
    ws.fails(ws.train(task, data=data, out=run), str(run), "--overwrite")
    ws.unchanged(before, run)


@case("one_writer", tasks=TASKS)
def overwrite_with_an_invalid_value_keeps_the_old_run(ws: Workspace, task: str) -> None:
    run, data = ws.trained(task)
    before = tree_digest(run)
    ws.fails(ws.train(task, "--overwrite", "--dim", "-4", data=data, out=run), "--dim")
    ws.unchanged(before, run)


@case("one_writer", tasks=TASKS)
def overwrite_with_missing_data_keeps_the_old_run(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    before = tree_digest(run)
    missing = str(ws.root / "nowhere" / ("graph" if task == "kge" else "file.tsv"))
    ws.fails(ws.train(task, "--overwrite", data=["--dataset", missing], out=run), missing)
    ws.unchanged(before, run)


@case("one_writer")
def overwrite_with_an_unreachable_cluster_keeps_the_old_run(ws: Workspace) -> None:
    run, data = ws.trained("kge")
    before = tree_digest(run)
    ws.fails(ws.train("kge", "--overwrite", "--set", "ps.ray_address=127.0.0.1:1", runtime="ray", data=data,
                      out=run), "127.0.0.1:1")
    ws.unchanged(before, run)


@case("one_writer")
def overwrite_replaces_a_finished_run(ws: Workspace) -> None:
    run, data = ws.trained("kge")
    ws.succeeds(ws.train("kge", "--overwrite", "--epochs", "1", data=data, out=run))
    assert json.loads((run / "summary.json").read_text())["epochs"] == 1
    assert not (run / "checkpoints" / "epoch-000003").exists()


@case("one_writer")
def a_stale_lock_file_does_not_block(ws: Workspace) -> None:
    """A lock file left by a killed run is no lock: the next run proceeds."""
    run, _ = ws.trained("kge")
    (run / ".lock").write_text("12345\n")
    ws.succeeds(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"))


@case("one_writer")
def compare_into_a_non_empty_directory(ws: Workspace) -> None:
    run, data = ws.trained("kge")
    before = tree_digest(run)
    result = ws.cadence(*compare_args("kge", data, "sync,async"), "--out", str(run))
    ws.fails(result, str(run))
    ws.unchanged(before, run)


# ==== 3. a checkpoint knows its data ================================================================
def _change_data(task: str, data: list[str]) -> None:
    """An edit a user could make: a renamed entity, user, a flipped label, a changed word."""
    path = data_file(data, task)
    text = path.read_text()
    if task == "ctr":
        label = text[0]
        path.write_text(("1" if label == "0" else "0") + text[1:])
    else:
        first = text.split("\t")[0].split(" ")[0]
        path.write_text(text.replace(first, first + "x", 1))


@case("fingerprint", tasks=TASKS)
def resume_on_changed_data(ws: Workspace, task: str) -> None:
    run, data = ws.trained(task)
    _change_data(task, data)
    before = tree_digest(run)
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"), "data", "changed")
    ws.unchanged(before, run)


@case("fingerprint", tasks=TASKS)
def eval_on_changed_data(ws: Workspace, task: str) -> None:
    run, data = ws.trained(task)
    _change_data(task, data)
    ws.fails(ws.cadence("eval", str(run)), "data", "changed")


@case("fingerprint", tasks=TASKS)
def export_on_changed_data(ws: Workspace, task: str) -> None:
    run, data = ws.trained(task)
    _change_data(task, data)
    out = ws.root / "export"
    ws.fails(ws.cadence("export", str(run), "--out", str(out)), "data", "changed")
    assert not out.exists() or not any(out.iterdir()), "an export was written from changed data"


@case("fingerprint", tasks=TASKS)
def unchanged_data_evaluates_and_resumes(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    ws.succeeds(ws.cadence("eval", str(run)))
    ws.succeeds(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"))


@case("fingerprint")
def resume_on_a_reordered_graph(ws: Workspace) -> None:
    """Same triples, another order of first appearance: ids stay sorted by name, so this is no change
    for the id maps, but the training split's order differs: refused, naming the split."""
    run, data = ws.trained("kge")
    path = data_file(data, "kge")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(reversed(lines)) + "\n")
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"), "train split")


# ==== 4. flags are typed values =====================================================================
@case("flags", tasks=TASKS)
def lr_in_exponent_notation(ws: Workspace, task: str) -> None:
    ws.succeeds(ws.train(task, "--lr", "1e-5", "--epochs", "1"))
    assert yaml.safe_load((ws.root / "run" / "config.yaml").read_text())["optimizer"]["lr"] == 1e-5


@case("flags")
def out_with_a_hash_sign(ws: Workspace) -> None:
    out = ws.root / "exp #3"
    ws.succeeds(ws.train("kge", "--epochs", "1", out=out))
    assert (out / "summary.json").is_file()


@case("flags")
def out_that_reads_as_a_number(ws: Workspace) -> None:
    previous = Path.cwd()
    os.chdir(ws.root)
    try:
        ws.succeeds(ws.train("kge", "--epochs", "1", out=Path("2025")))
    finally:
        os.chdir(previous)
    assert (ws.root / "2025" / "summary.json").is_file()


@case("flags")
def dataset_that_reads_as_a_number(ws: Workspace) -> None:
    graph = Path(ws.data("kge")[1])
    graph.rename(ws.root / "2024")
    previous = Path.cwd()
    os.chdir(ws.root)
    try:
        ws.succeeds(ws.train("kge", "--epochs", "1", data=["--dataset", "2024"]))
    finally:
        os.chdir(previous)


@case("flags")
def yaml_exponent_is_a_float(ws: Workspace) -> None:
    config = ws.root / "c.yaml"
    config.write_text("optimizer:\n  lr: 1e-5\n")
    ws.succeeds(ws.train("kge", "--config", str(config), "--epochs", "1"))
    assert yaml.safe_load((ws.root / "run" / "config.yaml").read_text())["optimizer"]["lr"] == 1e-5


@case("flags")
def duplicate_key_in_a_config_file(ws: Workspace) -> None:
    config = ws.root / "c.yaml"
    config.write_text("model:\n  dim: 8\ntrain:\n  epochs: 2\nmodel:\n  dim: 16\n")
    line = ws.fails(ws.train("kge", "--config", str(config)), f"{config}:5")
    assert "line 1" in line, line
    ws.absent(ws.root / "run")


BAD_FLAGS = [  # (flag arguments, what the message must name)
    (["--epochs", "abc"], "--epochs"),
    (["--dim", "1.5"], "--dim"),
    (["--lr", "fast"], "--lr"),
    (["--dim", "0"], "--dim"),
    (["--batch-size", "-3"], "--batch-size"),
    (["--epochs", "-1"], "--epochs"),
    (["--strategy", "asynch"], "--strategy"),
    (["--model", "transx"], "--model"),
    (["--task", "knn"], "--task"),
    (["--workers", "0"], "--workers"),
    (["--engine", "spark"], "--engine"),
    (["--device", "tpu"], "--device"),
    (["--set", "model.dimm=8"], "model.dimm"),
    (["--set", "model.dim"], "model.dim"),
    (["--set", "eval.every=eight"], "eval.every"),
    (["--set", "train.negatives=8", "--set", "train.negatives=4.5"], "train.negatives=4.5"),
    (["--set", "train=3"], "train"),
    (["--set", "optimizer.lr=[1, 2]"], "optimizer.lr"),
    (["--strategy", "hop_bw", "--workers", "2", "--straggler", "x:2"], "--straggler"),
    (["--strategy", "hop_bw", "--workers", "2", "--kill-worker", "0"], "--kill-worker"),
    (["--straggler", "1:4"], "--straggler"),  # the pipeline has no workers to slow down
    (["--unknown-flag"], "--unknown-flag"),
    (["--out="], "--out"),
    (["--dataset="], "--dataset"),
    (["--set", "a..b=1"], "a..b"),
    (["--set", "eval.every.x=1"], "eval.every.x"),
]


for _index, (_flags, _names) in enumerate(BAD_FLAGS):
    @case("flags", f"bad_flag[{' '.join(_flags)}]")
    def _bad_flag(ws: Workspace, flags=_flags, names=_names) -> None:
        ws.fails(ws.train("kge", *flags), names)
        ws.absent(ws.root / "run")


@case("flags")
def resume_with_a_flag_that_cannot_change(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    before = tree_digest(run)
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--dim", "16"), "--dim")
    ws.unchanged(before, run)


@case("flags")
def resume_with_a_config_file(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--config", str(run / "config.yaml")), "--config")


@case("flags")
def resume_with_overwrite(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    before = tree_digest(run)
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--overwrite"), "--overwrite")
    ws.unchanged(before, run)


@case("flags")
def eval_with_an_unknown_split(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    ws.fails(ws.cadence("eval", str(run), "--split", "dev"), "--split")


@case("flags")
def export_in_a_format_the_task_lacks(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    out = ws.root / "export"
    ws.fails(ws.cadence("export", str(run), "--format", "word2vec", "--out", str(out)), "word2vec")
    ws.absent(out)


for _strategies, _named in (("sync,sync", "sync"), ("sync,fast", "fast")):
    @case("flags", f"compare_with_strategies[{_strategies}]")
    def _compare_strategies(ws: Workspace, strategies=_strategies, named=_named) -> None:
        out = ws.root / "cmp"
        ws.fails(ws.cadence(*compare_args("kge", ws.data("kge"), strategies), "--out", str(out)), named)
        ws.absent(out)


@case("flags")
def no_command(ws: Workspace) -> None:
    ws.fails(ws.cadence(), "COMMAND")


# ==== 5. numbers =====================================================================================
NOT_FINITE = [["--lr", "nan"], ["--lr", "inf"], ["--lr=-inf"], ["--set", "optimizer.lr=.nan"],
              ["--set", "model.init_std=.inf"], ["--set", "train.reg_weight=nan"]]

for _flags in NOT_FINITE:
    @case("numbers", f"not_finite[{' '.join(_flags)}]")
    def _not_finite(ws: Workspace, flags=_flags) -> None:
        named = flags[1].split("=")[0] if flags[0] == "--set" else flags[0].split("=")[0]
        line = ws.fails(ws.train("kge", *flags), named)
        assert "finite" in line, line
        ws.absent(ws.root / "run")


@case("numbers")
def not_finite_in_a_config_file(ws: Workspace) -> None:
    config = ws.root / "c.yaml"
    config.write_text("train:\n  epochs: 2\noptimizer:\n  lr: .inf\n")
    ws.fails(ws.train("kge", "--config", str(config)), f"{config}:4")
    ws.absent(ws.root / "run")


OUT_OF_RANGE = {  # task -> settings each out of its range; every check runs before the run directory exists
    "kge": [["--set", "train.negatives=0"], ["--set", "eval.every=-1"], ["--set", "checkpoint.keep=0"],
            ["--lr", "-0.1"], ["--set", "pipeline.staleness_bound=0", "--strategy", "async"],
            ["--set", "train.negatives=99999999999999999999999"], ["--model", "complex", "--dim", "7"]],
    "ctr": [["--set", "ctr.num_periods=0", "--set", "ctr.split=periods"], ["--set", "ctr.first_period=-1"],
            ["--set", "model.init_std=-1"]],
    "mf": [["--set", "mf.folds=1", "--set", "mf.split=folds"], ["--set", "mf.fold=9"],
           ["--batch-size", "0"]],
    "w2v": [["--set", "w2v.window=0"], ["--set", "w2v.min_count=0"], ["--set", "w2v.sample=-1"],
            ["--set", "w2v.negatives=0"]],
}

for _task, _settings in OUT_OF_RANGE.items():
    for _flags in _settings:
        @case("numbers", f"out_of_range[{_task}: {' '.join(_flags)}]")
        def _out_of_range(ws: Workspace, task=_task, flags=_flags) -> None:
            named = [f.split("=")[0] for f in flags if f.startswith(("--", "train.", "eval.", "ctr.", "mf.", "w2v.",
                                                                    "model.", "checkpoint.", "pipeline."))
                     and f != "--set"]
            line = ws.fails(ws.train(task, *flags))
            assert any(name in line for name in named), f"names none of {named}: {line}"
            ws.absent(ws.root / "run")


# ==== 6. the operating system ==========================================================================
@case("os", tasks=TASKS, root=True, processes=True)
def unreadable_data_file(ws: Workspace, task: str) -> None:
    data = ws.data(task)
    path = data_file(data, task)
    os.chmod(path, 0o000)
    ws.fails(ws.train(task, data=data, plain_user=True), str(path), "permission", code=None)
    ws.absent(ws.root / "run")


@case("os", root=True, processes=True)
def unreadable_config_file(ws: Workspace) -> None:
    config = ws.root / "c.yaml"
    config.write_text("seed: 1\n")
    os.chmod(config, 0o000)
    ws.fails(ws.train("kge", "--config", str(config), plain_user=True), str(config), "permission", code=None)
    ws.absent(ws.root / "run")


@case("os", root=True, processes=True)
def unwritable_out(ws: Workspace) -> None:
    data = ws.data("kge")
    locked = ws.root / "locked"
    locked.mkdir(mode=0o555)
    ws.fails(ws.train("kge", data=data, out=locked / "run", plain_user=True), str(locked), "permission", code=None)
    ws.absent(locked / "run")


@case("os", root=True, processes=True)
def unwritable_run_directory_on_resume(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    before = tree_digest(run)
    for path in [run, *run.rglob("*")]:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4", plain_user=True), str(run),
             "permission", code=None)
    ws.unchanged(before, run)


@case("os", root=True, processes=True)
def unwritable_export_out(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    locked = ws.root / "locked"
    locked.mkdir(mode=0o555)
    ws.fails(ws.cadence("export", str(run), "--out", str(locked / "x"), plain_user=True), str(locked),
             "permission", code=None)


def _tiny_filesystem(ws: Workspace, size: str) -> Path:
    mount = ws.root / "disk"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True,
                              text=True)
    except FileNotFoundError:
        raise CannotRun("no mount command here") from None
    if done.returncode != 0:
        raise CannotRun(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    ws.notes.append(f"umount {mount}")
    return mount


@case("os", tasks=TASKS, root=True, processes=True, slow=lambda task: task != "kge")
def disk_full_during_training(ws: Workspace, task: str) -> None:
    """The disk fills while the run writes (a filler file leaves room for the config and a little
    more): one line naming the path and the cause; the earlier checkpoints stay intact and, with
    room again, the run resumes."""
    disk = _tiny_filesystem(ws, "400k")
    data = ws.data(task)
    out = disk / "run"
    filler = disk / "filler"
    process = ws.runner.start(["-q", "train", *train_args(task, data), "--epochs", "400", "--set", "eval.every=0",
                               "--set", "checkpoint.keep=1", "--out", str(out)])
    def fill() -> bool:
        if not any((out / "checkpoints").glob("epoch-*")):
            return False
        try:
            with open(filler, "wb") as handle:  # take every free block
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
        except OSError:
            pass
        return True

    result = interrupt_when(process, fill, sign=0)  # signal 0: no signal, the full disk stops it
    line = ws.fails(result, str(disk), code=None)
    assert "space" in line, line
    assert not list((out / "checkpoints").glob(".partial-*")), "a partial checkpoint left before any --resume"
    filler.unlink()
    ws.succeeds(ws.cadence("-q", "train", "--resume", str(out), "--epochs", "3"))


@case("os", tasks=TASKS, root=True, processes=True)
def disk_full_during_export(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    disk = _tiny_filesystem(ws, "64k")
    try:
        with open(disk / "filler", "wb") as handle:
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
    except OSError:
        pass
    out = disk / "export"
    line = ws.fails(ws.cadence("export", str(run), "--out", str(out)), str(out), code=None)
    assert "space" in line, line
    ws.absent(out)


@case("os", tasks=TASKS)
def directory_where_a_file_is_expected(ws: Workspace, task: str) -> None:
    data = ws.data(task)
    path = data_file(data, task)
    path.unlink()
    path.mkdir()
    line = ws.fails(ws.train(task, data=data), str(path), code=None)
    assert "directory" in line and "not found" not in line, line
    ws.absent(ws.root / "run")


@case("os")
def file_where_a_graph_directory_is_expected(ws: Workspace) -> None:
    path = ws.root / "graph.txt"
    path.write_text("a\tr\tb\n")
    ws.fails(ws.train("kge", data=["--dataset", str(path)]), str(path), code=None)
    ws.absent(ws.root / "run")


@case("os", tasks=("kge", "w2v"))
def store_path_that_cannot_be_made(ws: Workspace, task: str) -> None:
    """The runtime fails to build after the run's directory was locked (made): the directory goes."""
    ws.fails(ws.train(task, "--set", "store.backend=mmap", "--set", "store.path=/proc/cadence-store"),
             "/proc/cadence-store", code=None)
    ws.absent(ws.root / "run")


@case("os")
def out_is_a_file(ws: Workspace) -> None:
    out = ws.root / "taken"
    out.write_text("mine\n")
    ws.fails(ws.train("kge", out=out), str(out), code=None)
    assert out.read_text() == "mine\n"


@case("os")
def out_inside_a_file(ws: Workspace) -> None:
    parent = ws.root / "taken"
    parent.write_text("mine\n")
    ws.fails(ws.train("kge", out=parent / "run"), str(parent), code=None)
    assert parent.read_text() == "mine\n"


@case("os")
def cadence_home_is_a_file(ws: Workspace) -> None:
    home = ws.root / "home"
    home.write_text("")
    ws.fails(ws.cadence("-q", "train", "--dataset", "nations", "--epochs", "1", "--out", str(ws.root / "run"),
                        env={"CADENCE_HOME": str(home)}), str(home), code=None)
    ws.absent(ws.root / "run")


@case("os")
def export_into_the_run_directory(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    before = tree_digest(run)
    ws.fails(ws.cadence("export", str(run), "--out", str(run)), str(run), code=None)
    ws.unchanged(before, run)


@case("os")
def export_out_is_a_file(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    out = ws.root / "taken"
    out.write_text("mine\n")
    ws.fails(ws.cadence("export", str(run), "--out", str(out)), str(out), code=None)
    assert out.read_text() == "mine\n"


@case("os")
def config_is_a_directory(ws: Workspace) -> None:
    ws.fails(ws.train("kge", "--config", str(ws.root)), str(ws.root), code=None)


@case("os")
def config_is_missing(ws: Workspace) -> None:
    ws.fails(ws.train("kge", "--config", str(ws.root / "missing.yaml")), str(ws.root / "missing.yaml"), code=None)


@case("os")
def eval_of_a_missing_run(ws: Workspace) -> None:
    ws.fails(ws.cadence("eval", str(ws.root / "nope")), str(ws.root / "nope"), code=None)


@case("os")
def eval_of_a_file(ws: Workspace) -> None:
    path = ws.root / "notes.txt"
    path.write_text("x\n")
    ws.fails(ws.cadence("eval", str(path)), str(path), code=None)


@case("os")
def resume_of_a_directory_that_is_no_run(ws: Workspace) -> None:
    (ws.root / "empty").mkdir()
    ws.fails(ws.cadence("-q", "train", "--resume", str(ws.root / "empty")), str(ws.root / "empty"), code=None)


@case("os")
def record_order_into_a_directory(ws: Workspace) -> None:
    ws.fails(ws.train("kge", "--strategy", "oac", "--record-order", str(ws.root)), str(ws.root), code=None)
    ws.absent(ws.root / "run")


@case("os")
def batch_order_missing(ws: Workspace) -> None:
    ws.fails(ws.train("kge", "--strategy", "oac", "--batch-order", str(ws.root / "order.json")),
             str(ws.root / "order.json"), code=None)
    ws.absent(ws.root / "run")


@case("os", tasks=("kge", "mf"))
def resume_after_the_data_was_deleted(ws: Workspace, task: str) -> None:
    run, data = ws.trained(task)
    path = data_file(data, task)
    path.unlink()
    before = tree_digest(run)
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"), str(path))
    ws.unchanged(before, run)


# ==== 7. data files =====================================================================================
def _with_bom(path: Path) -> None:
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())


@case("data", tasks=TASKS)
def byte_order_mark(ws: Workspace, task: str) -> None:
    """A BOM is dropped: the run trains exactly as on the file without it."""
    plain = ws.data(task, "plain")
    marked = ws.data(task, "marked")
    _with_bom(data_file(marked, task))
    ws.succeeds(ws.train(task, data=plain, out=ws.root / "a"))
    ws.succeeds(ws.train(task, data=marked, out=ws.root / "b"))
    first, second = (json.loads((ws.root / name / "summary.json").read_text()) for name in ("a", "b"))
    metric = first["primary_metric"]
    assert first[metric] == second[metric], (first[metric], second[metric])


HEADERS = {"kge": "head\trelation\ttail", "ctr": "\t".join(["label", *(f"I{i}" for i in range(1, 14)),
                                                            *(f"C{i}" for i in range(1, 27))]),
           "mf": "user\titem\trating"}


@case("data", tasks=tuple(HEADERS))
def header_line(ws: Workspace, task: str) -> None:
    """A header line is recognised and reported (not read as data: no entity called 'head')."""
    plain = ws.data(task, "plain")
    headed = ws.data(task, "headed")
    path = data_file(headed, task)
    path.write_text(HEADERS[task] + "\n" + path.read_text())
    result = ws.train(task, data=headed, out=ws.root / "b")
    said = mask_paths(result.err)  # the workspace's name may hold the word
    if result.code == 0:
        assert "header" in said, f"the header line was read as data, silently:\n{result}"
        ws.succeeds(ws.train(task, data=plain, out=ws.root / "a"))
        first, second = (json.loads((ws.root / name / "summary.json").read_text()) for name in ("a", "b"))
        assert first[first["primary_metric"]] == second[first["primary_metric"]]
    else:
        ws.fails(result, f"{path}:1")
        assert "header" in said, said


@case("data")
def comma_separated_ratings(ws: Workspace) -> None:
    path = ws.root / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n1,1029,3.0,1260759179\n")
    line = ws.fails(ws.train("mf", data=["--dataset", str(path)]), f"{path}:")
    assert "tab" in line, line


OVERFLOWS = {  # task -> (line, what the message names)
    "ctr": ("0\t" + "9" * 400 + "\t" * 12 + "\t" + "\t".join(["68fd1e64"] * 26), "I1"),
    "mf": ("u1\ti1\t1e999", "rating"),
    "mf-timestamp": ("u1\ti1\t3\t99999999999999999999999", "timestamp"),
}


@case("data", tasks=tuple(OVERFLOWS))
def number_that_overflows(ws: Workspace, task: str) -> None:
    real = task.split("-")[0]
    data = ws.data(real)
    path = data_file(data, real)
    line, name = OVERFLOWS[task]
    path.write_text(path.read_text() + line + "\n")
    number = len(path.read_text().splitlines())
    ws.fails(ws.train(real, data=data), f"{path}:{number}", name)
    ws.absent(ws.root / "run")


@case("data", tasks=TASKS)
def empty_file(ws: Workspace, task: str) -> None:
    data = ws.data(task)
    path = data_file(data, task)
    path.write_text("")
    ws.fails(ws.train(task, data=data), str(path))
    ws.absent(ws.root / "run")


@case("data", tasks=TASKS)
def binary_garbage(ws: Workspace, task: str) -> None:
    data = ws.data(task)
    path = data_file(data, task)
    path.write_bytes(path.read_bytes()[:200] + bytes(range(128, 256)) * 4 + b"\n")
    ws.fails(ws.train(task, data=data), str(path))
    ws.absent(ws.root / "run")


@case("data", tasks=("kge", "ctr", "mf"))
def too_few_columns(ws: Workspace, task: str) -> None:
    data = ws.data(task)
    path = data_file(data, task)
    path.write_text(path.read_text() + "lonely\n")
    number = len(path.read_text().splitlines())
    ws.fails(ws.train(task, data=data), f"{path}:{number}")
    ws.absent(ws.root / "run")


@case("data")
def ctr_label_not_binary(ws: Workspace) -> None:
    data = ws.data("ctr")
    path = data_file(data, "ctr")
    text = path.read_text()
    path.write_text("2" + text[1:])
    ws.fails(ws.train("ctr", data=data), f"{path}:1", "label")


@case("data")
def ctr_labels_of_one_class(ws: Workspace) -> None:
    """AUC is undefined: a warning, and summary.json is valid JSON (null, not NaN)."""
    data = ws.data("ctr")
    path = data_file(data, "ctr")
    path.write_text("".join("0" + line[1:] + "\n" for line in path.read_text().splitlines()))
    result = ws.train("ctr", data=data)
    ws.succeeds(result)
    assert "one class" in mask_paths(result.err) or "undefined" in mask_paths(result.err), str(result)
    summary = json.loads((ws.root / "run" / "summary.json").read_text(),
                         parse_constant=lambda name: (_ for _ in ()).throw(AssertionError(f"bare {name}")))
    assert summary["auc"] is None


@case("data")
def graph_without_a_test_split(ws: Workspace) -> None:
    data = ws.data("kge")
    (Path(data[1]) / "test.txt").unlink()
    ws.fails(ws.train("kge", data=data), "test.txt")
    ws.absent(ws.root / "run")


@case("data")
def corpus_with_one_word(ws: Workspace) -> None:
    path = ws.root / "corpus.txt"
    path.write_text("same same same\n")
    ws.fails(ws.train("w2v", data=["--dataset", str(path)]), f"--dataset {path}")
    ws.absent(ws.root / "run")


@case("data")
def batch_order_that_is_binary(ws: Workspace) -> None:
    order = ws.root / "order.jsonl"
    order.write_bytes(b"\x80\x81\xfe\n")
    ws.fails(ws.train("kge", "--strategy", "oac", "--batch-order", str(order)), f"{order}:1")
    ws.absent(ws.root / "run")


@case("data")
def batch_order_that_is_not_an_order(ws: Workspace) -> None:
    order = ws.root / "order.jsonl"
    order.write_text('{"epoch": 0, "index": 0}\n[1, 2]\n')
    ws.fails(ws.train("kge", "--strategy", "oac", "--batch-order", str(order)), f"{order}:2")
    ws.absent(ws.root / "run")


@case("data")
def batch_order_of_another_run(ws: Workspace) -> None:
    order = ws.root / "order.jsonl"
    order.write_text('{"epoch": 0, "index": 0}\n')
    ws.fails(ws.train("kge", "--strategy", "oac", "--batch-order", str(order)), str(order))
    ws.absent(ws.root / "run")


@case("data")
def init_from_a_missing_run(ws: Workspace) -> None:
    ws.fails(ws.train("ctr", "--init-from", str(ws.root / "nope")), str(ws.root / "nope"))
    ws.absent(ws.root / "run")


@case("data")
def init_from_a_run_of_another_task(ws: Workspace) -> None:
    other, _ = ws.trained("kge")
    ws.fails(ws.train("ctr", "--init-from", str(other)), str(other))
    ws.absent(ws.root / "run")


@case("data")
def fetch_an_unknown_dataset(ws: Workspace) -> None:
    # the error lists what can be fetched for every task, not only the knowledge graphs
    ws.fails(ws.cadence("data", "fetch", "umsl"), "umsl", "umls", "ml-100k", "enwiki-excerpt", "fashion-mnist")


@case("data")
def unknown_dataset_name(ws: Workspace) -> None:
    ws.fails(ws.train("kge", data=["--dataset", "umsl"]), "umsl")
    ws.absent(ws.root / "run")


# ==== 8. checkpoints are verified whole =================================================================
def _resume_skips_the_newest(ws: Workspace, run: Path) -> None:
    """The newest checkpoint was damaged: resume reports it and continues from the one before."""
    result = ws.cadence("train", "--resume", str(run), "--epochs", "4", "--no-progress")
    ws.succeeds(result)
    said = mask_paths(result.err)
    assert "skipping" in said, f"the damaged checkpoint was not reported:\n{result}"
    assert "epoch 2" in said, f"did not resume from the previous checkpoint:\n{result}"


@case("checkpoints", tasks=TASKS)
def hand_edited_state(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    state = last_checkpoint(run) / "state.json"
    body = json.loads(state.read_text())
    body["state"]["progress"]["epoch"] = 1
    state.write_text(json.dumps(body))
    _resume_skips_the_newest(ws, run)


@case("checkpoints", tasks=TASKS)
def truncated_tensors(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    tensors = last_checkpoint(run) / "tensors.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-50])
    _resume_skips_the_newest(ws, run)


@case("checkpoints", tasks=TASKS)
def state_that_is_not_json(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    (last_checkpoint(run) / "state.json").write_text('{"format": 2, "sha')
    _resume_skips_the_newest(ws, run)


@case("checkpoints", tasks=TASKS)
def missing_state(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    (last_checkpoint(run) / "state.json").unlink()
    _resume_skips_the_newest(ws, run)


@case("checkpoints", tasks=("ctr", "mf", "w2v"))
def checkpoint_of_another_task(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    other, _ = ws.runs.get("kge")
    newest = last_checkpoint(run)
    shutil.rmtree(newest)
    shutil.copytree(last_checkpoint(other), newest)
    _resume_skips_the_newest(ws, run)


@case("checkpoints")
def checkpoint_of_other_shapes(ws: Workspace) -> None:
    run, data = ws.trained("kge")
    wide = ws.root / "wide"
    ws.succeeds(ws.train("kge", "--dim", "16", "--epochs", "3", data=data, out=wide))
    newest = last_checkpoint(run)
    shutil.rmtree(newest)
    shutil.copytree(last_checkpoint(wide), newest)
    _resume_skips_the_newest(ws, run)


@case("checkpoints", tasks=TASKS)
def every_checkpoint_damaged(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    for checkpoint in (run / "checkpoints").glob("epoch-*"):
        tensors = checkpoint / "tensors.safetensors"
        tensors.write_bytes(b"\0" * 64)
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"), "checkpoint")


@case("checkpoints", tasks=TASKS)
def eval_with_a_damaged_final_checkpoint(ws: Workspace, task: str) -> None:
    run, _ = ws.trained(task)
    tensors = run / "checkpoints" / "final" / "tensors.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:100])
    ws.fails(ws.cadence("eval", str(run)), str(run / "checkpoints" / "final"))


@case("checkpoints")
def export_with_a_damaged_final_checkpoint(ws: Workspace) -> None:
    run, _ = ws.trained("mf")
    (run / "checkpoints" / "final" / "state.json").write_text("[]")
    out = ws.root / "export"
    ws.fails(ws.cadence("export", str(run), "--out", str(out)), str(run / "checkpoints" / "final"))
    assert not out.exists() or not any(out.iterdir())


@case("checkpoints")
def hand_edited_run_config(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("dim: 8", "dim: eight"))
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"), str(config))


@case("checkpoints")
def run_config_missing(ws: Workspace) -> None:
    run, _ = ws.trained("kge")
    (run / "config.yaml").unlink()
    ws.fails(ws.cadence("-q", "train", "--resume", str(run), "--epochs", "4"), str(run))


# ==== 9. engines ==========================================================================================
for _address in ("not-an-address", "127.0.0.1:1", "10.255.255.1:6379", "ray://127.0.0.1:1"):
    @case("engines", f"ray_address[{_address}]")
    def _ray_address(ws: Workspace, address=_address) -> None:
        import time

        start = time.monotonic()
        result = ws.train("kge", "--set", f"ps.ray_address={address}", runtime="ray")
        ws.fails(result, address)
        assert time.monotonic() - start < 30, "took more than 30 s to fail"
        ws.absent(ws.root / "run")


@case("engines")
def ray_address_on_the_pipeline(ws: Workspace) -> None:
    ws.fails(ws.train("kge", "--set", "ps.ray_address=127.0.0.1:1"), "ps.ray_address")
    ws.absent(ws.root / "run")
