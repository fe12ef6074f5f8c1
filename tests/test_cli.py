"""The ``cadence`` command end to end: outputs are a public contract; mistakes exit 2 cleanly."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from cadence.cli import main, print_comparison
from tests.reliability.harness import Runner


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``cadence ARGS`` in this process (``cadence.cli.main``, its stdout and stderr captured, a
    traceback caught as exit 1): a process start costs ~3 s of imports here. What only a process
    shows (the interpreter's own output, its teardown, signals) is tested with ``run_process``."""
    result = Runner(in_process=True)(list(args), env=env)
    return subprocess.CompletedProcess(["cadence", *args], result.code, result.out, result.err)


def run_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m cadence.cli ARGS``: a real process."""
    import os

    return subprocess.run([sys.executable, "-m", "cadence.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_train_eval_export_on_a_user_directory(tiny_graph: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", str(tiny_graph), "--model", "distmult", "--dim", "8",
                 "--epochs", "3", "--batch-size", "64", "--lr", "0.2", "--seed", "1", "--out", str(out),
                 "--no-progress", "--set", "train.negatives=8"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "mrr" in printed and "hits@10" in printed and str(out) in printed

    summary = json.loads((out / "summary.json").read_text())
    for key in ("strategy", "dataset", "model", "epochs", "train_seconds", "examples_per_second",
                "mrr", "hits@1", "hits@3", "hits@10"):
        assert key in summary, key
    assert summary["strategy"] == "sync" and summary["epochs"] == 3 and summary["examples_per_second"] > 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["split"] == "valid"] == [1, 2, 3]
    for record in records:
        assert {"epoch", "wall_seconds", "examples_seen", "mrr", "hits@10"} <= set(record)
    assert records[-1]["split"] == "test" and records[-1]["mrr"] == summary["mrr"]
    assert records[0]["examples_seen"] == 220
    config_text = (out / "config.yaml").read_text()
    assert "dim: 8" in config_text and "distmult" in config_text
    assert (out / "entity_ids.tsv").read_text().count("\n") == 30

    assert main(["eval", str(out)]) == 0
    assert f"{summary['mrr']:.4f}" in capsys.readouterr().out

    assert main(["export", str(out), "--format", "npy", "--out", str(tmp_path / "export")]) == 0
    entities = np.load(tmp_path / "export" / "entity_embeddings.npy")
    relations = np.load(tmp_path / "export" / "relation_embeddings.npy")
    assert entities.shape == (30, 8) and relations.shape == (4, 8)
    assert (tmp_path / "export" / "relation_ids.tsv").exists()


def test_data_list_names_the_registered_datasets(capsys) -> None:
    assert main(["data", "list"]) == 0
    listed = capsys.readouterr().out
    for name in ("umls", "kinships", "nations", "synthetic", "ml-100k", "synthetic-ctr"):
        assert name in listed


@pytest.mark.parametrize("args, message", [
    (["--set", "train.epoch=3"], "unknown key 'train.epoch'"),
    (["--model", "complx"], "unknown model 'complx' (did you mean 'complex'?)"),
    (["--strategy", "nope"], "unknown strategy 'nope'"),
    (["--dim", "7", "--model", "complex"], "model.dim must be even"),
    (["--epochs", "0"], "cadence: error: --epochs 0: train.epochs must be positive"),
    (["--lr", "nan"], "cadence: error: --lr nan: optimizer.lr must be a finite number"),
    (["--lr", "inf"], "cadence: error: --lr inf: optimizer.lr must be a finite number"),
    (["--device", "gpu"], "--device gpu: 'gpu' is not a device"),
    (["--strategy", "adapm", "--workers", "64"], "--workers 64: 64 adapm nodes; at most 63"),
    pytest.param(["--device", "cuda", "--strategy", "gba"], "--device cuda: 'cuda' was asked for, but no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")),
])
def test_config_mistakes_exit_2_without_traceback_or_output(tiny_graph: Path, tmp_path: Path, args, message) -> None:
    out = tmp_path / "run"
    done = run_cli("train", "--dataset", str(tiny_graph), "--out", str(out), *args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_a_config_mistake_in_a_real_process_is_one_line_and_exit_2(tiny_graph: Path, tmp_path: Path) -> None:
    """The in-process tests above see what ``main`` writes; a process also shows what the interpreter
    and the libraries write to its stderr: still exactly one line."""
    out = tmp_path / "run"
    done = run_process("train", "--dataset", str(tiny_graph), "--out", str(out), "--model", "complx")
    assert done.returncode == 2 and not out.exists() and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cadence: error: ") and "unknown model 'complx'" in lines[0], lines


def test_bad_data_line_exits_2_naming_file_and_line(tiny_graph: Path, tmp_path: Path) -> None:
    with open(tiny_graph / "valid.txt", "a") as handle:
        handle.write("e1\tr1\n")
    lines = (tiny_graph / "valid.txt").read_text().count("\n")
    out = tmp_path / "run"
    done = run_process("train", "--dataset", str(tiny_graph), "--out", str(out))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"valid.txt:{lines}: expected 3 tab-separated fields" in done.stderr
    assert not out.exists()


def test_strict_rejects_what_the_default_filters(tiny_graph: Path, tmp_path: Path) -> None:
    with open(tiny_graph / "test.txt", "a") as handle:
        handle.write("e1\tr1\tnever_seen\n")
    done = run_cli("train", "--dataset", str(tiny_graph), "--out", str(tmp_path / "strict"), "--strict")
    assert done.returncode == 2 and "'never_seen' does not occur in train.txt" in done.stderr
    done = run_cli("-q", "train", "--dataset", str(tiny_graph), "--out", str(tmp_path / "lenient"),
                   "--epochs", "1", "--dim", "8", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "dropped 1 triples with an entity or relation unseen in train" in done.stderr


def test_an_existing_run_is_not_overwritten_by_accident(tiny_graph: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["-q", "train", "--dataset", str(tiny_graph), "--out", str(out), "--epochs", "1", "--dim", "8"]
    assert run_cli(*args).returncode == 0
    again = run_cli(*args)
    assert again.returncode == 2 and "--resume" in again.stderr and "--overwrite" in again.stderr
    assert run_cli(*args, "--overwrite").returncode == 0


def test_eval_of_a_directory_that_is_no_run(tmp_path: Path) -> None:
    done = run_cli("eval", str(tmp_path))
    assert done.returncode == 2 and "not a cadence run directory" in done.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    done = run_cli("train", "--config", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2 and "config file not found" in done.stderr


def test_compare_writes_comparison_and_both_plots(tiny_graph: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    code = main(["-q", "compare", "--strategies", "sync,async,oac", "--dataset", str(tiny_graph), "--dim", "8",
                 "--epochs", "2", "--batch-size", "32", "--out", str(out), "--no-progress",
                 "--set", "train.negatives=8"])
    assert code == 0
    table = capsys.readouterr().out
    for name in ("sync", "async", "oac", "speedup", "repaired_rows", "stale_reads"):
        assert name in table
    comparison = json.loads((out / "comparison.json").read_text())
    assert list(comparison["strategies"]) == ["sync", "async", "oac"]
    for name, entry in comparison["strategies"].items():
        assert entry["summary"]["strategy"] == name and entry["summary"]["epochs"] == 2
        assert [r["epoch"] for r in entry["curve"]] == [1, 2]
        assert {"wall_seconds", "mrr"} <= set(entry["curve"][0])
        assert (out / name / "summary.json").exists()
    for plot in ("time_to_accuracy.png", "accuracy_per_epoch.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_table_of_ctr_runs_lists_logloss_and_ne(capsys) -> None:
    def summary(eps: float, ne: float | None) -> dict:
        return {"primary_metric": "auc", "epochs": 1, "train_seconds": 2.0, "examples_per_second": eps,
                "auc": 0.75, "logloss": 0.45, "ne": ne}

    print_comparison({"strategies": {"hogwild": {"summary": summary(1000.0, 0.875)},
                                     "shadow-easgd": {"summary": summary(1500.0, None)}}})
    header, _, first, second = capsys.readouterr().out.splitlines()
    assert header.split()[-3:] == ["auc", "logloss", "ne"]
    assert first.split()[-1] == "0.8750" and second.split()[-1] == "None"


def test_compare_rejects_unknown_strategies_before_training(tiny_graph: Path, tmp_path: Path) -> None:
    done = run_cli("compare", "--strategies", "sync,asink", "--dataset", str(tiny_graph), "--out", str(tmp_path / "c"))
    assert done.returncode == 2 and "unknown strategy 'asink'" in done.stderr
    assert not (tmp_path / "c").exists()


def test_ctr_train_on_movielens_writes_the_contracted_summary(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ctr"
    code = main(["-q", "train", "--task", "ctr", "--dataset", "ml-100k", "--model", "deepfm", "--strategy", "gba",
                 "--workers", "4", "--epochs", "1", "--dim", "8", "--batch-size", "512", "--out", str(out),
                 "--no-progress", "--straggler", "0:2", "--kill-worker", "3:5"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("auc", "logloss", "ne", "examples_per_second", "worker_examples_per_second", "global_steps",
                "gradients_dropped", "staleness_mean", "staleness_max", "vocabulary_added", "workers_killed"):
        assert key in summary, key
    assert summary["strategy"] == "gba" and summary["workers_killed"] == [3]
    assert 0.6 < summary["auc"] < 1.0
    assert 0 < summary["ne"] < 1.1  # about 1: the base rate everywhere
    assert (out / "checkpoints" / "final" / "tensors.safetensors").exists()
    assert "auc" in capsys.readouterr().out
    assert main(["eval", str(out)]) == 0 and "auc" in capsys.readouterr().out
    assert main(["export", str(out), "--out", str(tmp_path / "e")]) == 0
    keys = np.load(tmp_path / "e" / "feature_keys.npy")
    assert keys.shape[0] == np.load(tmp_path / "e" / "embeddings.npy").shape[0] > 0
    assert main(["train", "--resume", str(out)]) == 0  # finished: evaluates again, trains nothing


def test_ctr_mistakes_exit_2(tmp_path: Path) -> None:
    done = run_cli("train", "--task", "ctr", "--dataset", "ml-100k", "--model", "deepfm", "--strategy", "gba",
                   "--init-from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "no final checkpoint" in done.stderr and not (tmp_path / "x").exists()
    done = run_cli("train", "--task", "ctr", "--dataset", "ml-100k", "--model", "deepfm", "--strategy", "oac",
                   "--workers", "4", "--out", str(tmp_path / "y"))
    assert done.returncode == 2 and "strategy oac runs in one process" in done.stderr
    done = run_cli("train", "--task", "ctr", "--dataset", "ml-100k", "--model", "deepfm", "--strategy", "gba",
                   "--straggler", "9:2", "--out", str(tmp_path / "z"))
    assert done.returncode == 2 and "worker 9 does not exist" in done.stderr


def test_compare_without_matplotlib_writes_the_comparison_and_exits_0(tiny_graph: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    args = ["-q", "compare", "--strategies", "sync,oac", "--dataset", str(tiny_graph), "--dim", "8", "--epochs", "1",
            "--batch-size", "32", "--out", str(out), "--no-progress", "--set", "train.negatives=8"]
    code = ("import sys; sys.modules['matplotlib'] = None  # as if it were not installed\n"
            f"from cadence.cli import main; sys.exit(main({args!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "pip install 'cadence[plot]'" in done.stdout and "Traceback" not in done.stderr
    assert json.loads((out / "comparison.json").read_text())["plots"] is None
    assert not list(out.glob("*.png"))


def test_compare_works_for_another_task(task_data, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    sets = [arg for item in task_data["mf"] for arg in ("--set", item)]
    code = main(["-q", "compare", "--strategies", "sync,gba,oac", "--epochs", "2", "--dim", "4", "--out", str(out),
                 "--no-progress", *sets])
    assert code == 0
    table = capsys.readouterr().out
    assert "rmse" in table and "parameter_server" in table and "pipeline" in table
    comparison = json.loads((out / "comparison.json").read_text())
    assert all(entry["summary"]["primary_metric"] == "rmse" for entry in comparison["strategies"].values())


@pytest.mark.parametrize("args, message", [
    (["--task", "mf", "--set", "train.negatives=5"], "train.negatives belongs to the kge task; this run's task is mf"),
    (["--task", "kge", "--set", "mf.reg=0.1"], "mf.reg belongs to the mf task; this run's task is kge"),
    (["--task", "ctr", "--set", "w2v.window=3"], "w2v.window belongs to the w2v task; this run's task is ctr"),
    (["--workers", "2", "--batch-order", "order.jsonl"], "batch_order applies to the one-process pipeline"),
    (["--strategy", "gba", "--set", "store.backend=mmap"], "store.backend applies to the one-process pipeline"),
    (["--strategy", "oac", "--workers", "2"], "strategy oac runs in one process"),
    (["--strategy", "oac", "--engine", "ray"], "strategy oac runs in one process"),
    (["--straggler", "0:4"], "ps.stragglers applies to the parameter-server runtime"),
])
def test_a_key_of_another_task_or_runtime_is_an_error_naming_it(args, message, tmp_path: Path) -> None:
    done = run_cli("train", *args, "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "x").exists()


CTR_STALL = ["--task", "ctr", "--dataset", "ml-100k", "--dim", "8"]


# each strategy and each task once in the default suite (a real process each: ~8 s)
@pytest.mark.parametrize("task_args, strategy", [(CTR_STALL, "async"), (None, "oac"),
                                                 pytest.param(CTR_STALL, "oac", marks=pytest.mark.slow),
                                                 pytest.param(None, "async", marks=pytest.mark.slow)])
def test_a_pipeline_stall_exits_3_naming_stage_epoch_and_batch(task_args, strategy, tiny_graph: Path,
                                                               tmp_path: Path) -> None:
    """The watchdog stops a run whose stage threads are busy in torch: the command still exits with
    the stall's code and one line, never an abort from tearing the interpreter down under them."""
    task_args = task_args or ["--dataset", str(tiny_graph), "--set", "train.negatives=8"]
    done = run_process("train", *task_args, "--strategy", strategy, "--epochs", "3", "--out", str(tmp_path / "r"),
                       "--no-progress", "--set", "pipeline.stall_timeout=0.0001")  # no batch is that fast
    assert done.returncode == 3, done.stderr[-2000:]
    error = [line for line in done.stderr.splitlines() if line.startswith("cadence: error:")]
    assert len(error) == 1 and "pipeline stalled" in error[0]
    assert re.search(r"the \w+ stage has held batch \d+ of epoch \d+|every stage is waiting", error[0])
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr


def test_flag_values_are_taken_as_typed_never_reread_as_yaml(tiny_graph: Path, tmp_path: Path, monkeypatch) -> None:
    """``--out 2025`` is a directory named 2025 (YAML would make it an int), ``--lr 1e-5`` a float
    (YAML 1.1 would make it a string), ``--out "exp #3"`` keeps its ``#`` (YAML: a comment)."""
    monkeypatch.chdir(tmp_path)
    common = ["--dataset", str(tiny_graph), "--epochs", "1", "--no-progress", "--set", "train.negatives=8"]
    assert main(["-q", "train", *common, "--out", "2025", "--lr", "1e-5"]) == 0
    assert (tmp_path / "2025" / "summary.json").exists()
    assert yaml.safe_load((tmp_path / "2025" / "config.yaml").read_text())["optimizer"]["lr"] == 1e-5
    assert main(["-q", "train", *common, "--out", "exp #3"]) == 0
    assert (tmp_path / "exp #3" / "summary.json").exists()


def test_os_level_mistakes_are_one_line_errors_naming_the_path(tiny_graph: Path, tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    common = ["train", "--dataset", str(tiny_graph), "--epochs", "1", "--no-progress"]
    cases = [
        (["--out", str(a_file)], {}, f"{a_file}: is a file; --out must name a directory"),
        (["--out", str(a_file / "run")], {}, f"{a_file / 'run'}: cannot use it as a run directory"),
        (["--dataset", "nations", "--out", str(tmp_path / "r")], {"CADENCE_HOME": str(a_file)},
         f"{a_file}: CADENCE_HOME is not a directory"),
    ]
    for number, (args, env, message) in enumerate(cases):
        done = (run_process if number == 0 else run_cli)(*common, *args, env=env)  # one in a real process
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr[-1500:])
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "r").exists()
    assert main(["-q", "train", *common[1:], "--out", str(tmp_path / "run")]) == 0
    done = run_cli("export", str(tmp_path / "run"), "--out", str(tmp_path / "run" / "."))
    assert done.returncode == 2 and "that is the run directory itself" in done.stderr
    assert not (tmp_path / "run" / "entity_embeddings.npy").exists()


def test_ctrl_c_inside_an_import_callback_is_delivered_once_it_returns() -> None:
    """A KeyboardInterrupt raised inside the import system's weakref callback is printed and dropped
    by the interpreter (the run would go on after Ctrl-C); the command's handler sends it again a
    moment later instead, and raises it anywhere else."""
    import signal
    import threading
    import types

    from cadence.cli import _interrupt

    arrived = threading.Event()
    before = signal.signal(signal.SIGINT, lambda signum, frame: arrived.set())
    try:
        in_import = types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename="<frozen importlib._bootstrap>"))
        _interrupt(signal.SIGINT, in_import)  # not raised here
        deadline = time.monotonic() + 5
        while not arrived.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)  # (the handler runs on this thread, between bytecodes)
        assert arrived.is_set()
    finally:
        signal.signal(signal.SIGINT, before)
    with pytest.raises(KeyboardInterrupt):
        _interrupt(signal.SIGINT, sys._getframe())


def test_a_lost_ray_process_is_told_apart_from_an_error_raised_in_one() -> None:
    """``errors.lost_process``: Ray's errors for a process that died (matched by name, this module
    imports no Ray) and not an error that code in a process raised, nor one of ours."""
    from cadence.errors import ConfigError, lost_process

    def ray_error(name: str, base: type = RuntimeError) -> BaseException:
        return type(name, (base,), {"__module__": "ray.exceptions"})("gone")

    died = ray_error("RayActorError")
    assert lost_process(died) and lost_process(type("ActorDiedError", (type(died),), {"__module__": "ray.exceptions"})())
    assert not lost_process(ray_error("RayTaskError")) and not lost_process(ConfigError("x"))
    assert not lost_process(type("RayActorError", (RuntimeError,), {"__module__": "tests"})())
    import torch.distributed

    assert lost_process(torch.distributed.DistStoreError("wait timeout after 60000ms"))  # (a gloo peer is gone)


@pytest.mark.parametrize("command", [
    ["export", "RUN", "--out", ""], ["report", "RUN", "--out", " "], ["predict", "RUN", "tails", "a", "r", "--out", ""],
    ["train", "--task", "kge", "--out", ""], ["eval", ""], ["train", "--config", ""], ["report", ""],
])
def test_an_empty_path_is_refused_not_taken_for_the_working_directory(tmp_path, monkeypatch, command) -> None:
    monkeypatch.chdir(tmp_path)
    done = run_cli(*command)
    assert done.returncode == 2 and done.stderr.startswith("cadence: error: ") and "an empty path" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
