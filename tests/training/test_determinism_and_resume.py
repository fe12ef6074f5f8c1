"""Same seed, same bits; a run killed with SIGKILL and resumed ends where an uninterrupted run ends."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.core import checkpoint as ckpt
from cadence.training.run_directory import RunDirectory
from tests.conftest import make_config


def final_entities(run_dir: Path) -> torch.Tensor:
    return api.final_checkpoint(RunDirectory(run_dir))[0]["table.values"]


def test_same_seed_gives_bit_identical_embeddings(tiny_graph: Path, tmp_path: Path) -> None:
    runs = [api.train(make_config(tmp_path / name, f"data.dataset={tiny_graph}", f"seed={seed}"))
            for name, seed in (("a", 5), ("b", 5), ("c", 6))]
    first, second, other = (final_entities(r.run_dir) for r in runs)
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_memory_and_mmap_backends_train_identically(tiny_graph: Path, tmp_path: Path) -> None:
    memory = api.train(make_config(tmp_path / "memory", f"data.dataset={tiny_graph}"))
    mapped = api.train(make_config(tmp_path / "mmap", f"data.dataset={tiny_graph}", "store.backend=mmap"))
    assert (tmp_path / "mmap" / "store" / "values.npy").is_file()
    assert torch.equal(final_entities(memory.run_dir), final_entities(mapped.run_dir))
    assert memory.summary["mrr"] == mapped.summary["mrr"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cadence.cli", "-q", *args]


TRAIN_ARGS = ["--dataset", "synthetic", "--model", "distmult", "--dim", "32", "--epochs", "8",
              "--batch-size", "500", "--no-progress",
              "--set", "data.synthetic.num_entities=20000", "--set", "data.synthetic.num_edges=60000",
              "--set", "data.synthetic.holdout=50", "--set", "threads=1", "--set", "eval.every=0",
              "--set", "checkpoint.keep=3", "--set", "train.negatives=64"]


def kill_after_checkpoint(args: list[str], out: Path, epoch: int, sign: int = signal.SIGKILL) -> None:
    """Start ``cadence train`` and send it ``sign`` as soon as its checkpoint of ``epoch`` exists."""
    # as at a terminal: a test run started in the background (&, nohup) ignores SIGINT, a child
    # inherits that, and Python would never raise KeyboardInterrupt in it
    process = subprocess.Popen(cli("train", *args, "--out", str(out)),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not (out / "checkpoints" / ckpt.epoch_name(epoch)).exists():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.005)
    os.kill(process.pid, sign)
    expected = -signal.SIGKILL if sign == signal.SIGKILL else 130  # Ctrl-C: the CLI's own exit code
    assert process.wait(timeout=60) == expected
    assert not (out / "summary.json").exists()


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    killed_dir, whole_dir = tmp_path / "killed", tmp_path / "whole"
    kill_after_checkpoint(TRAIN_ARGS, killed_dir, 3)
    subprocess.run(cli("train", "--resume", str(killed_dir)), check=True)
    subprocess.run(cli("train", *TRAIN_ARGS, "--out", str(whole_dir)), check=True)
    assert torch.equal(final_entities(killed_dir), final_entities(whole_dir))
    killed_summary = RunDirectory(killed_dir).read_summary()
    assert killed_summary["epochs"] == 8
    assert killed_summary["mrr"] == RunDirectory(whole_dir).read_summary()["mrr"]


def test_a_corrupt_checkpoint_is_reported_and_the_previous_one_used(tiny_graph: Path, tmp_path: Path, caplog) -> None:
    config = make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "train.epochs=3", "checkpoint.keep=3")
    reference = api.train(make_config(tmp_path / "reference", f"data.dataset={tiny_graph}", "train.epochs=3"))
    api.train(config)
    newest = ckpt.epoch_checkpoints(tmp_path / "run")[-1]
    tensor_file = newest / ckpt.TENSORS
    data = bytearray(tensor_file.read_bytes())
    data[-5] ^= 0xFF
    tensor_file.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="checksum mismatch"):
        ckpt.load_checkpoint(newest)
    result = api.resume(tmp_path / "run")
    assert "skipping corrupt checkpoint" in caplog.text
    assert torch.equal(final_entities(result.run_dir), final_entities(reference.run_dir))


def test_an_edited_or_mismatched_checkpoint_is_skipped_for_the_previous_one(tiny_graph: Path, tmp_path: Path,
                                                                           caplog) -> None:
    """The checksum covers state.json too: a hand edit is caught. A checkpoint whose tensors do not
    fit the run (another run's, other shapes) is reported and the one before it used, as is one
    whose state is incomplete."""
    import json
    import shutil

    config = make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "train.epochs=3", "checkpoint.keep=3")
    reference = api.train(make_config(tmp_path / "reference", f"data.dataset={tiny_graph}", "train.epochs=3"))
    api.train(config)
    newest = ckpt.epoch_checkpoints(tmp_path / "run")[-1]
    state_file = newest / ckpt.STATE
    state_file.write_text(state_file.read_text().replace('"epoch": 3', '"epoch": 30', 1))
    with pytest.raises(ckpt.CheckpointError, match="checksum does not match"):
        ckpt.load_checkpoint(newest)
    other = api.train(make_config(tmp_path / "other", f"data.dataset={tiny_graph}", "train.epochs=1", "model.dim=6"))
    shutil.rmtree(newest)
    shutil.copytree(ckpt.epoch_checkpoints(other.run_dir)[-1], newest)  # another run's epoch 1, as epoch 3 here
    result = api.resume(tmp_path / "run")
    assert "does not match this run" in caplog.text
    assert torch.equal(final_entities(result.run_dir), final_entities(reference.run_dir))
    legacy = ckpt.epoch_checkpoints(tmp_path / "run")[-1]  # a checkpoint of format 1 (no state checksum) still loads
    body = json.loads((legacy / ckpt.STATE).read_text())
    body.pop(ckpt.STATE_SHA)
    body["format"] = ckpt.LEGACY_FORMAT
    (legacy / ckpt.STATE).write_text(json.dumps(body))
    assert ckpt.load_checkpoint(legacy)[1]["progress"]["epoch"] == body["state"]["progress"]["epoch"]


def test_checkpoints_are_pruned_and_partial_ones_ignored(tiny_graph: Path, tmp_path: Path) -> None:
    api.train(make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "train.epochs=4", "checkpoint.keep=2"))
    names = [p.name for p in ckpt.epoch_checkpoints(tmp_path / "run")]
    assert names == [ckpt.epoch_name(3), ckpt.epoch_name(4)]
    (tmp_path / "run" / "checkpoints" / ".partial-epoch-000005-1").mkdir()
    _, state, path = ckpt.load_latest(tmp_path / "run")
    assert path.name == ckpt.epoch_name(4) and state["progress"]["epoch"] == 4


def test_resume_can_extend_epochs_but_not_change_the_model(tiny_graph: Path, tmp_path: Path) -> None:
    api.train(make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "train.epochs=2"))
    result = api.resume(tmp_path / "run", {"train.epochs": 3})
    assert result.summary["epochs"] == 3
    from cadence.errors import ConfigError

    with pytest.raises(ConfigError, match="model.dim: cannot be changed"):
        api.resume(tmp_path / "run", {"model.dim": 16})


def test_early_stopping_restores_the_best_model(tiny_graph: Path, tmp_path: Path) -> None:
    config = make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "train.epochs=40", "eval.patience=2",
                         "optimizer.lr=2.0")
    result = api.train(config)
    valid = [r for r in result.metrics if r["split"] == "valid"]
    best = max(valid, key=lambda r: r["mrr"])
    assert result.summary["best_epoch"] == best["epoch"]
    assert result.summary["epochs"] == len(valid) < 40
    assert api.evaluate(result.run_dir, "valid")["mrr"] == pytest.approx(best["mrr"])


CTR_ARGS = ["--task", "ctr", "--dataset", "ml-100k", "--model", "fm", "--dim", "8", "--epochs", "5",
            "--batch-size", "512", "--strategy", "sync", "--workers", "3", "--no-progress",
            "--set", "threads=1", "--set", "eval.every=0", "--set", "checkpoint.keep=5"]


def uninterrupted(args: list[str], out: Path) -> Path:
    subprocess.run(cli("train", *args, "--out", str(out)), check=True)
    return out


@pytest.fixture(scope="module")
def whole_ctr_run(tmp_path_factory) -> Path:
    """``CTR_ARGS`` trained without interruption (once for the module's tests)."""
    return uninterrupted(CTR_ARGS, tmp_path_factory.mktemp("whole") / "run")


def killed_then_resumed(tmp_path: Path, args: list[str], whole_dir: Path, sign: int = signal.SIGKILL) -> dict:
    """Kill ``cadence train args`` after its epoch-2 checkpoint and resume it; assert it ends with the
    same AUC, steps and rows as the uninterrupted run in ``whole_dir``; the resumed run's summary."""
    killed_dir = tmp_path / "killed"
    kill_after_checkpoint(args, killed_dir, 2, sign)
    subprocess.run(cli("train", "--resume", str(killed_dir)), check=True)
    killed, whole = (RunDirectory(d).read_summary() for d in (killed_dir, whole_dir))
    assert killed["epochs"] == 5
    assert killed["auc"] == whole["auc"] and killed["global_steps"] == whole["global_steps"]
    tensors = [api.final_checkpoint(RunDirectory(d))[0] for d in (killed_dir, whole_dir)]
    for key in ("table.keys", "table.values", "table.state"):
        assert torch.equal(tensors[0][key], tensors[1][key]), key
    return killed


@pytest.mark.xdist_group("whole_ctr_run")  # one worker trains the shared uninterrupted run (make test: --dist loadgroup)
@pytest.mark.parametrize("sign", [signal.SIGKILL, signal.SIGINT])
def test_killed_or_interrupted_then_resumed_equals_an_uninterrupted_run_on_the_parameter_server(
        sign: int, tmp_path: Path, whole_ctr_run: Path) -> None:
    assert killed_then_resumed(tmp_path, CTR_ARGS, whole_ctr_run, sign)["runtime"] == "parameter_server"


@pytest.mark.slow
def test_a_driver_killed_on_the_ray_engine_resumes_where_an_uninterrupted_run_ends(tmp_path: Path) -> None:
    """SIGKILL takes the driver's actors with it; --resume starts new ones and every shard reads its
    own part of the last checkpoint (sync is deterministic: the results must be equal)."""
    pytest.importorskip("ray")
    shards = ["--set", "ps.shards=2"]
    killed = killed_then_resumed(tmp_path, [*CTR_ARGS, "--engine", "ray", *shards],
                                 uninterrupted([*CTR_ARGS, *shards], tmp_path / "whole"))
    assert killed["engine"] == "ray"


def test_one_writer_per_run_directory(tiny_graph: Path, tmp_path: Path) -> None:
    """While a process holds a run directory, training or resuming into it is refused naming that
    process; once it is gone (even SIGKILLed: the kernel drops its lock) the directory is free."""
    from cadence.errors import CadenceError

    run_dir = tmp_path / "run"
    api.train(make_config(run_dir, f"data.dataset={tiny_graph}", "train.epochs=1"))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from cadence.training.run_directory import RunDirectory\n"
        f"with RunDirectory({str(run_dir)!r}).locked():\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CadenceError, match=rf"another cadence process \(pid {holder.pid}\) is writing this run"):
            api.resume(run_dir)
        with pytest.raises(CadenceError, match="another cadence process"):
            api.train(make_config(run_dir, f"data.dataset={tiny_graph}", "train.epochs=1"), overwrite=True)
        assert (run_dir / "summary.json").exists() and (run_dir / "checkpoints").is_dir()  # nothing deleted
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    api.train(make_config(run_dir, f"data.dataset={tiny_graph}", "train.epochs=1"), overwrite=True)


def test_an_undefined_metric_is_written_as_json_null(tmp_path: Path) -> None:
    """AUC of a split whose labels are all one class is NaN; summary.json and metrics.jsonl stay
    JSON (no bare NaN, which strict parsers reject) with null in its place."""
    import json

    run = RunDirectory(tmp_path / "run")
    (tmp_path / "run").mkdir()
    run.write_summary({"auc": float("nan"), "logloss": 0.5, "per_worker": [float("inf"), 1.0]})
    run.write_metrics([{"epoch": 1, "split": "valid", "auc": float("nan")}])
    strict = {"parse_constant": lambda name: pytest.fail(f"bare {name} in JSON")}
    assert json.loads((tmp_path / "run" / "summary.json").read_text(), **strict) == {
        "auc": None, "logloss": 0.5, "per_worker": [None, 1.0]}
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text(), **strict)["auc"] is None


def test_resume_removes_what_a_killed_checkpoint_write_left(tiny_graph: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    api.train(make_config(run_dir, f"data.dataset={tiny_graph}", "train.epochs=1"))
    partial = run_dir / "checkpoints" / ".partial-epoch-000002-4242"
    partial.mkdir()
    (partial / ckpt.TENSORS).write_bytes(b"half a file")
    temporary = run_dir / ".metrics.jsonl.4242.tmp"
    temporary.write_text("{")
    api.resume(run_dir, {"train.epochs": 2})
    assert not partial.exists() and not temporary.exists()
    assert [p.name for p in ckpt.epoch_checkpoints(run_dir)] == [ckpt.epoch_name(1), ckpt.epoch_name(2)]


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
def test_a_checkpoint_write_that_fails_midway_leaves_no_partial_directory(failure, tmp_path: Path) -> None:
    """Nothing partial is written (issue 50): a write that stops after its first file (a full disk,
    Ctrl-C) removes its ``.partial-*`` directory at once, not at the next ``--resume``, and the
    checkpoint before it stays whole."""
    from cadence.errors import SystemResourceError

    tensors = {"table.values": torch.arange(12.0).reshape(3, 4)}
    ckpt.save_checkpoint(tmp_path, ckpt.epoch_name(1), tensors, {"epoch": 1})

    def stops(partial: Path) -> dict[str, str]:
        (partial / "part-0.safetensors").write_bytes(b"\0" * 64)  # a shard's file, half of what it meant to write
        raise failure

    with pytest.raises(SystemResourceError if isinstance(failure, OSError) else KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, ckpt.epoch_name(2), tensors, {"epoch": 2}, parts=stops)
    root = ckpt.checkpoint_root(tmp_path)
    assert sorted(path.name for path in root.iterdir()) == [ckpt.epoch_name(1)]
    again, state = ckpt.load_checkpoint(root / ckpt.epoch_name(1))
    assert torch.equal(again["table.values"], tensors["table.values"]) and state["epoch"] == 1
