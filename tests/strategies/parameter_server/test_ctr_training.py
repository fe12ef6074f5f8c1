"""The parameter-server runtime end to end on small synthetic CTR data: each mode against its
definition, the single-worker sync run against a naive single-process reference, fault injection."""

import math
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cadence import api
from cadence.api import build_trainer, prepare_config
from cadence.config import load_config
from cadence.models.ctr import CTR_MODELS
from cadence.core.initial import hashed_normal
from cadence.seeding import derive_seed
from cadence.ps.modes import PS_MODES
from cadence.tasks.ctr import CtrTask
from cadence.training.run_directory import RunDirectory

from tests.ps.ctr_helpers import BATCH, final_state, make_trainer, small_data

trainer_for = make_trainer


def table_snapshot(trainer) -> dict[int, torch.Tensor]:
    return final_state(trainer)[0]


@pytest.mark.parametrize("strategy", ["sync", "hop_bw"])  # the one-process pipeline; the server with one worker
def test_sync_with_one_worker_equals_single_process_training(tmp_path: Path, strategy: str) -> None:
    trainer, config, splits = trainer_for(tmp_path, f"strategy={strategy}", "ps.workers=1")
    assert trainer.runtime.name == ("pipeline" if strategy == "sync" else "parameter_server")
    initial_dense = {k: v.clone() for k, v in trainer.runtime.dense().state_dict().items()}
    trainer.fit()

    # the reference: one process, a dict of rows, per-row Adagrad, no server, no tokens
    torch.manual_seed(derive_seed(config.seed, "ctr-model"))
    model = CTR_MODELS.get("fm")(3, 0, 4, tuple(config.ctr.hidden), 0.0)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in initial_dense.items())
    dense_optimizer = torch.optim.Adagrad(model.parameters(), lr=0.1, eps=1e-10)
    table_seed = derive_seed(config.seed, "ctr-table") & 0xFFFFFFFF
    rows: dict[int, torch.Tensor] = {}
    state: dict[int, float] = {}
    train = splits["train"]
    for epoch in range(2):
        generator = torch.Generator().manual_seed(derive_seed(config.seed, "ctr-shuffle", -1, epoch))
        for batch in torch.randperm(len(train), generator=generator).split(BATCH):
            examples = train.subset(batch)
            for key in examples.keys.flatten().tolist():
                if key not in rows:
                    rows[key] = hashed_normal(torch.tensor([key]), 5, 0.1, table_seed)[0]
                    state[key] = 0.0
            keys = sorted({k for k in examples.keys.flatten().tolist()})
            leaf = torch.stack([rows[k] for k in keys]).requires_grad_(True)
            index = {k: i for i, k in enumerate(keys)}
            field_rows = torch.stack([torch.stack([leaf[index[k]] for k in example]) for example in examples.keys.tolist()])
            loss = F.binary_cross_entropy_with_logits(model(field_rows, examples.dense), examples.labels)
            dense_optimizer.zero_grad()
            loss.backward()
            dense_optimizer.step()
            for k, i in index.items():
                g = leaf.grad[i]
                state[k] += float((g * g).mean())
                rows[k] = rows[k] - 0.1 * g / (math.sqrt(state[k]) + 1e-10)
    snapshot = table_snapshot(trainer)
    assert snapshot.keys() >= rows.keys()  # the pipeline also holds the keys of valid and test, untrained
    for key, value in snapshot.items():
        expected = rows[key] if key in rows else hashed_normal(torch.tensor([key]), 5, 0.1, table_seed)[0]
        assert torch.allclose(value, expected, atol=1e-5), key
    for name, value in model.state_dict().items():
        assert torch.allclose(trainer.runtime.dense().state_dict()[name], value, atol=1e-5), name


def test_gba_with_infinite_tolerance_equals_bsp_end_to_end(tmp_path: Path) -> None:
    snapshots = []
    for mode in ("gba", "bsp"):
        trainer, _, _ = trainer_for(tmp_path / mode, f"strategy={mode}", "ps.workers=1", "ps.buffer=3",
                                    *(["ps.tolerance=1000000"] if mode == "gba" else []))  # (bsp reads no tolerance)
        summary = trainer.fit()
        snapshots.append((table_snapshot(trainer), summary["global_steps"]))
    (first, steps), (second, bsp_steps) = snapshots
    assert steps == bsp_steps == 2 * 4  # 12 batches per epoch, M = 3
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("mode, steps_per_epoch", [("sync", 3), ("async", 12), ("bsp", 3), ("gba", 3),
                                                   ("hop_bs", 12), ("hop_bw", None)])
def test_each_mode_counts_steps_and_examples_exactly(tmp_path: Path, mode: str, steps_per_epoch: int | None) -> None:
    trainer, _, splits = trainer_for(tmp_path, f"strategy={mode}", "ps.workers=4")
    summary = trainer.fit()
    if steps_per_epoch is not None:
        assert summary["global_steps"] == 2 * steps_per_epoch
    else:  # backup workers: 3 or 4 batches per step, whichever arrive
        assert 2 * 3 <= summary["global_steps"] <= 2 * 4
    assert summary["examples_seen"] == 2 * len(splits["train"])
    applied, dropped = summary["gradients_applied"], summary["gradients_dropped"]
    assert applied + dropped == 2 * 12
    if mode == "hop_bw":
        assert applied <= 3 * summary["global_steps"]  # at most the quorum N - b = 3 per step
    elif mode in ("sync", "bsp"):
        assert dropped == 0
    if mode == "sync":
        assert summary["staleness_max"] == 0
    assert 0.0 <= summary["auc"] <= 1.0


def test_every_mode_is_covered() -> None:
    shadow = {f"{kind}-{rule}" for kind in ("shadow", "fr") for rule in ("easgd", "ma", "bmuf")}
    assert set(PS_MODES.names()) == {"sync", "async", "bsp", "gba", "hop_bs", "hop_bw", "hogwild", *shadow}


@pytest.mark.parametrize("mode, lost_batches", [
    ("gba", 1), ("hop_bs", 1), ("hop_bw", 1),  # shared data list: the batch the worker died with
    ("sync", 7),  # one batch per worker per step: worker 1 owns batches 1, 4, 7, 10 of each epoch;
])                # it pushes batch 1, dies with 4, and 7, 10 and epoch 2's 4 are lost
def test_a_killed_worker_loses_its_batch_and_the_run_finishes(tmp_path: Path, mode: str, lost_batches: int) -> None:
    trainer, _, splits = trainer_for(tmp_path, f"strategy={mode}", "ps.workers=3", 'ps.kill_workers=["1:1"]')
    summary = trainer.fit()
    assert summary["workers_killed"] == [1] and summary["epochs"] == 2
    assert summary["examples_seen"] == 2 * len(splits["train"]) - lost_batches * BATCH


def test_sync_gives_each_worker_one_batch_per_step(tmp_path: Path) -> None:
    trainer, _, _ = trainer_for(tmp_path, "strategy=sync", "ps.workers=3", 'ps.stragglers=["0:5"]')
    summary = trainer.fit()
    assert summary["global_steps"] == 2 * 4
    assert trainer.runtime.worker_examples == [2 * 4 * BATCH] * 3  # the straggler too: everyone waits for it


def test_a_straggler_processes_fewer_batches(tmp_path: Path) -> None:
    trainer, _, _ = trainer_for(tmp_path, "strategy=async", "ps.workers=2", 'ps.stragglers=["0:6"]', "train.epochs=3")
    summary = trainer.fit()
    slow, fast = summary["worker_examples_per_second"]
    assert slow < 0.6 * fast


def test_fault_specs_are_validated(tmp_path: Path) -> None:
    from cadence.errors import ConfigError

    with pytest.raises(ConfigError, match="worker 7 does not exist"):
        trainer_for(tmp_path, "strategy=gba", "ps.workers=2", 'ps.stragglers=["7:2"]')
    with pytest.raises(ConfigError, match="is not WORKER:AFTER_STEPS"):
        trainer_for(tmp_path, "strategy=gba", "ps.workers=2", 'ps.kill_workers=["x"]')


def test_a_cpu_quota_straggler_needs_the_ray_engine(tmp_path: Path) -> None:
    from cadence.errors import ConfigError

    with pytest.raises(ConfigError, match="ps.straggler_cause: cpu_quota .* ps.engine: ray"):
        trainer_for(tmp_path, "strategy=gba", "ps.workers=2", 'ps.stragglers=["1:4"]', "ps.straggler_cause=cpu_quota")


def test_switching_modes_from_a_checkpoint_continues_the_same_model(tmp_path: Path) -> None:
    sync, _, _ = trainer_for(tmp_path / "sync", "strategy=sync", "ps.workers=2")
    sync.fit()  # writes checkpoints/final
    saved = table_snapshot(sync)
    gba, _, _ = trainer_for(tmp_path / "gba", "strategy=gba", "ps.workers=2")
    gba.init_from(tmp_path / "sync" / "run", *api.final_checkpoint(RunDirectory(tmp_path / "sync" / "run")))
    assert table_snapshot(gba).keys() == saved.keys()
    assert all(torch.equal(table_snapshot(gba)[k], v) for k, v in saved.items())
    dense = sync.runtime.dense().state_dict()
    assert all(torch.equal(gba.runtime.dense().state_dict()[k], v) for k, v in dense.items())
    steps = sync.runtime.shards[0].global_step
    assert gba.runtime.shards[0].global_step == steps
    summary = gba.fit()
    assert summary["global_steps"] == 2 * steps


def test_continual_training_reports_every_next_period(tmp_path: Path) -> None:
    config = load_config(None, ["task=ctr", "model.name=lr", "model.dim=4", "train.batch_size=64", "train.epochs=1",
                                "progress=false", "strategy=gba", "ps.workers=2", "ctr.split=periods",
                                "ctr.num_periods=4"])
    dataset, _ = small_data()
    run = RunDirectory(tmp_path / "run")
    run.create(config)
    trainer = build_trainer(prepare_config(config), CtrTask(config, dataset=dataset), run)
    summary = trainer.fit()
    records = [r for r in run.read_metrics() if r["split"] == "next_period"]
    assert [r["period"] for r in records] == [0, 1, 2]
    assert summary["next_period_auc"] == [r["auc"] for r in records]
    assert summary["auc"] == pytest.approx(sum(summary["next_period_auc"]) / 3)


def test_sync_is_reproducible_with_several_shards(tmp_path: Path) -> None:
    """Regression: the step barrier once watched shard 0 only, so a worker could read another
    shard's rows before that shard had applied the step."""
    snapshots = []
    for attempt in range(3):
        trainer, _, _ = trainer_for(tmp_path / str(attempt), "strategy=sync", "ps.workers=3", "ps.shards=2",
                                    "ps.emulated_latency=0.001")
        trainer.fit()
        snapshots.append(final_state(trainer))
    for tables, dense in snapshots[1:]:
        assert tables.keys() == snapshots[0][0].keys()
        assert all(torch.equal(tables[k], snapshots[0][0][k]) for k in tables)
        assert all(torch.equal(dense[k], snapshots[0][1][k]) for k in dense)


def test_gba_drops_the_stale_gradients_of_a_straggler(tmp_path: Path) -> None:
    # 20x: at 8x a loaded machine (the whole suite on 2 cores) once let the others move on by only 2
    # steps while the straggler computed, and nothing was dropped
    trainer, _, _ = trainer_for(tmp_path, "strategy=gba", "ps.workers=3", "ps.shards=2", "ps.tolerance=2",
                                'ps.stragglers=["0:20"]')
    summary = trainer.fit()
    # the straggler pulls at step t and pushes after the others have moved the server on: dropped
    assert summary["gradients_dropped"] >= 1
    assert summary["token_staleness_max"] <= 2  # nothing staler than iota was applied
    assert summary["gradients_applied"] + summary["gradients_dropped"] == 24
    for shard in summary["shards"]:  # every shard reports its own counts
        assert shard["gradients_applied"] + shard["gradients_dropped"] == 24


def test_hop_bs_keeps_every_worker_within_the_staleness_bound(tmp_path: Path) -> None:
    trainer, _, _ = trainer_for(tmp_path, "strategy=hop_bs", "ps.workers=2", "ps.staleness=1",
                                'ps.stragglers=["0:8"]', "train.epochs=1")
    trainer.fit()
    slow, fast = trainer.runtime.worker_examples
    # without the bound the fast worker would take ~11 of 12 batches; with it, at most bound + 1 more
    assert fast - slow <= 2 * BATCH, (slow, fast)


def test_backup_workers_do_not_wait_for_a_straggler(tmp_path: Path) -> None:
    # 20x: at 8x, beside the whole suite on 2 cores, a fast worker once took 576 examples to the
    # straggler's 320 (CI at 71b4ab6)
    trainer, _, _ = trainer_for(tmp_path, "strategy=hop_bw", "ps.workers=3", "ps.backup_workers=1",
                                'ps.stragglers=["0:20"]', "train.epochs=2")
    summary = trainer.fit()
    slow, *fast = trainer.runtime.worker_examples
    assert all(f >= 2 * slow for f in fast), trainer.runtime.worker_examples  # sync would give each the same
    assert summary["gradients_dropped"] >= 1  # the straggler's late gradients
    assert summary["gradients_applied"] <= 2 * summary["global_steps"]


@pytest.mark.parametrize("mode", ["sync", "hop_bw", "gba"])
def test_a_worker_that_raises_fails_the_run_without_hanging(tmp_path: Path, mode: str, monkeypatch) -> None:
    import threading
    import time

    from cadence.ps import worker as worker_module
    from cadence.core.runtime import WorkerFailed

    original = worker_module.Worker.step

    def flaky(self, position, plan, token):
        if self.index == 1 and self.pushed == 1:
            raise ValueError("disk on fire")
        return original(self, position, plan, token)

    monkeypatch.setattr(worker_module.Worker, "step", flaky)
    trainer, _, _ = trainer_for(tmp_path, f"strategy={mode}", "ps.workers=3")
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(_raised(trainer.fit)), daemon=True)
    started = time.perf_counter()
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the run hangs"
    assert time.perf_counter() - started < 15
    assert isinstance(outcome[0], WorkerFailed) and "worker 1 failed" in str(outcome[0]) and "disk on fire" in str(outcome[0])


def _raised(call):
    try:
        call()
    except BaseException as err:  # noqa: BLE001 - the test inspects it
        return err
    return None


def test_logistic_regression_rows_are_one_weight_and_dim_changes_nothing(tmp_path: Path) -> None:
    results = []
    for dim in (4, 16):
        trainer, _, _ = trainer_for(tmp_path / str(dim), "model.name=lr", f"model.dim={dim}", "strategy=gba",
                                    "ps.workers=1")
        summary = trainer.fit()
        rows, _ = final_state(trainer)
        assert {value.shape for value in rows.values()} == {torch.Size([1])}
        results.append((rows, summary["auc"]))
    (first, auc), (second, auc16) = results
    assert auc == auc16 and first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_transient_straggler_is_slow_only_in_its_window() -> None:
    from cadence.errors import ConfigError
    from cadence.ps.worker import Faults

    faults = Faults.parse(["0:4@2-3", "1:2"], [], 3)
    assert [faults.slowdown_in(0, epoch) for epoch in range(4)] == [1.0, 4.0, 4.0, 1.0]
    assert [faults.slowdown_in(1, epoch) for epoch in range(4)] == [2.0] * 4 and faults.slowdown_in(2, 0) == 1.0
    with pytest.raises(ConfigError, match="@FIRST-LAST"):
        Faults.parse(["0:4@x"], [], 3)


def test_each_shard_writes_its_own_checksummed_part_and_a_corrupt_part_is_skipped(tmp_path: Path) -> None:
    from cadence.core import checkpoint as ckpt

    trainer, _, _ = trainer_for(tmp_path, "strategy=gba", "ps.workers=2", "ps.shards=2")
    trainer.fit()
    run = trainer.run.path
    newest = ckpt.epoch_checkpoints(run)[-1]
    assert sorted(p.name for p in newest.glob("shard-*")) == ["shard-000-of-002.safetensors",
                                                               "shard-001-of-002.safetensors"]
    tensors, state = ckpt.load_checkpoint(newest)  # merged: the same rows the shards hold
    merged = trainer.runtime.table_tensors()
    assert torch.equal(tensors["table.keys"], merged["table.keys"])
    assert torch.equal(tensors["table.values"], merged["table.values"])
    part = newest / "shard-001-of-002.safetensors"
    part.write_bytes(part.read_bytes()[:-8] + b"corrupt!")
    found = ckpt.load_latest(run, tables=False)
    assert found is not None and found[2].name == "epoch-000001"  # the corrupt newest one is skipped


@pytest.mark.parametrize("mode", ["sync", "gba"])
def test_dense_on_the_workers_all_reduced_equals_dense_on_the_server_under_sync(tmp_path: Path, mode: str) -> None:
    """PERSIA's split (ps.dense: workers): under sync each step's dense update is the same mean of
    the same gradients, so the model must equal the dense-on-server run exactly; under gba it trains."""
    results = []
    for dense in ("server", "workers"):
        trainer, _, _ = trainer_for(tmp_path / dense, f"strategy={mode}", "ps.workers=3", "ps.shards=2",
                                    f"ps.dense={dense}", "model.name=deepfm", "ctr.hidden=[8]")
        summary = trainer.fit()
        results.append((summary, final_state(trainer)))
    (server, (server_rows, server_dense)), (workers, (worker_rows, worker_dense)) = results
    assert workers["examples_seen"] == server["examples_seen"] == 2 * 768
    if mode == "sync":
        assert all(torch.equal(server_dense[k], worker_dense[k]) for k in server_dense)
        assert server_rows.keys() == worker_rows.keys()
        assert all(torch.equal(server_rows[k], worker_rows[k]) for k in server_rows)
        assert workers["auc"] == server["auc"]
    else:
        assert 0.5 < workers["auc"] <= 1.0


def test_dense_on_the_workers_survives_a_killed_worker_and_a_resume(tmp_path: Path) -> None:
    trainer, _, _ = trainer_for(tmp_path, "strategy=gba", "ps.workers=3", "ps.dense=workers",
                                'ps.kill_workers=["1:2"]', "model.name=deepfm", "ctr.hidden=[8]")
    summary = trainer.fit()
    assert summary["workers_killed"] == [1] and summary["epochs"] == 2
    before = {k: v.clone() for k, v in trainer.runtime.dense().state_dict().items()}
    again, _, _ = trainer_for(tmp_path / "again", "strategy=gba", "ps.workers=3", "ps.dense=workers",
                              "model.name=deepfm", "ctr.hidden=[8]")
    again.run = trainer.run
    assert again.resume()  # the dense state and its optimizer come back from the checkpoint
    assert all(torch.equal(before[k], v) for k, v in again.runtime.dense().state_dict().items())


def test_syncs_barrier_is_answered_in_the_pull_not_in_a_call_of_its_own(tmp_path: Path, monkeypatch) -> None:
    """A sync worker's batch asks each shard once: the pull carries the step it waits for (``after``:
    on Ray one round trip, not a barrier's wait and then the pull), and the pulled parameters are
    those of the batch's own step."""
    from cadence.ps.server import ServerShard

    inside, calls = threading.local(), []
    real_wait, real_pull = ServerShard.wait_for_step, ServerShard.pull_with_dense

    def wait_for_step(self, step):
        if not getattr(inside, "pull", False) and threading.current_thread().name.startswith("cadence-worker"):
            calls.append(("wait", step))
        return real_wait(self, step)

    def pull_with_dense(self, keys, after=None):
        inside.pull = True
        try:
            rows, (dense, step) = real_pull(self, keys, after)
        finally:
            inside.pull = False
        calls.append(("pull", after, step))
        return rows, (dense, step)

    monkeypatch.setattr(ServerShard, "wait_for_step", wait_for_step)
    monkeypatch.setattr(ServerShard, "pull_with_dense", pull_with_dense)
    trainer, _, _ = make_trainer(tmp_path, "strategy=sync", "ps.workers=2", "train.epochs=1", "eval.every=0")
    trainer.fit()
    assert [call for call in calls if call[0] == "wait"] == []
    pulls = [call for call in calls if call[0] == "pull"]
    assert len(pulls) == 12 and all(after is not None and step == after for _, after, step in pulls)
