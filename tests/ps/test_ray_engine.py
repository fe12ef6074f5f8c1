"""The Ray engine on a real Ray cluster: where a mode is deterministic (sync, or one worker) it must
give exactly the thread engine's result, for every task; a killed worker's batch is dropped and the
run finishes; a worker process that dies has its token released and is replaced; a shard process
that dies is restarted from the last checkpoint and the run ends where an uninterrupted one does; an
unreachable cluster fails fast; two Ray nodes give the same result as one process. The default
tests share one local cluster (``local_cluster``); the two-node test starts its own (``slow``)."""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from cadence.cli import main  # noqa: E402
from cadence.ps import ray_engine  # noqa: E402
from cadence import resources  # noqa: E402
from cadence.errors import ConfigError  # noqa: E402
from tests.conftest import foreground  # noqa: E402
from tests.ps.ctr_helpers import BATCH, final_state, make_trainer  # noqa: E402
from tests.training.test_grow import STILL, assert_frozen, exported, grow_data, train  # noqa: E402,F401  (grow_data: a fixture)

# one worker of a parallel run (make test: --dist loadgroup) runs the module: one cluster, and the
# processes one test's runs leave are the next test's (engines.ray.Hosts)
pytestmark = pytest.mark.xdist_group("ray_engine")

COUNTERS = ("global_steps", "gradients_applied", "gradients_dropped", "staleness_mean", "staleness_max",
            "vocabulary_added", "examples_seen", "workers_killed")


@pytest.fixture(scope="module")
def local_cluster():
    """One local Ray cluster for the module's default tests (ray.init costs 3-6 s here)."""
    if not ray.is_initialized():
        # (sync_server: a custom resource the node offers, for shadow.sync_server_resource)
        ray.init(address="local", num_cpus=2, resources={"sync_server": 4}, include_dashboard=False,
                 log_to_driver=False)
    yield
    ray_engine.shutdown()
    ray.shutdown()


def trainer_for(tmp_path: Path, *overrides: str):
    return make_trainer(tmp_path, *overrides)[0]


def fit(trainer):
    """(summary, final state), the run's actors released."""
    try:
        summary = trainer.fit()
        return summary, final_state(trainer)
    finally:
        trainer.runtime.close()


def train_on_both(tmp_path: Path, *overrides: str):
    """(summary, state) under the thread engine, then under the Ray engine."""
    return [fit(trainer_for(tmp_path / engine, f"ps.engine={engine}", *overrides)) for engine in ("threads", "ray")]


def assert_same(first, second, atol: float = 0.0) -> None:
    (rows, dense), (other_rows, other_dense) = first, second
    assert rows.keys() == other_rows.keys()
    for key, value in rows.items():
        assert torch.allclose(value, other_rows[key], rtol=0.0, atol=atol), key
    assert dense.keys() == other_dense.keys()
    for name, value in dense.items():
        assert torch.allclose(value, other_dense[name], rtol=0.0, atol=atol), name


def test_sync_with_four_workers_equals_the_thread_engine(tmp_path: Path, local_cluster) -> None:
    (threads, threads_state), (on_ray, ray_state) = train_on_both(tmp_path, "strategy=sync", "ps.workers=4")
    assert_same(threads_state, ray_state)
    assert {k: on_ray[k] for k in COUNTERS} == {k: threads[k] for k in COUNTERS}
    assert on_ray["auc"] == threads["auc"] and on_ray["staleness_max"] == 0
    assert on_ray["global_steps"] == 2 * 3


# (async and sync with one worker on the threads engine run as the pipeline: tests/test_task_matrix.py
# checks them against the parameter server)
@pytest.mark.parametrize("mode, shards", [pytest.param("bsp", 1, marks=pytest.mark.slow), ("gba", 1), pytest.param("hop_bs", 1, marks=pytest.mark.slow),
                                          pytest.param("hop_bw", 1, marks=pytest.mark.slow), ("hop_bw", 2),
                                          pytest.param("gba", 2, marks=pytest.mark.slow)])
# (bsp: gba's rule without a tolerance; gba with 2 shards: gba-1 and hop_bw-2 cover its parts)
def test_one_worker_equals_the_thread_engine_in_every_mode(tmp_path: Path, local_cluster, mode: str,
                                                           shards: int) -> None:
    buffer = ["ps.buffer=3"] if mode in ("bsp", "gba") else []  # (the modes that read it)
    (threads, threads_state), (on_ray, ray_state) = train_on_both(tmp_path, f"strategy={mode}", "ps.workers=1",
                                                                  *buffer, f"ps.shards={shards}")
    assert_same(threads_state, ray_state)
    assert {k: on_ray[k] for k in COUNTERS} == {k: threads[k] for k in COUNTERS}


@pytest.mark.parametrize("task", ["kge", "mf", "w2v", "image"])  # ctr: every test above
def test_every_task_on_ray_equals_the_thread_engine(task: str, task_data, tmp_path: Path, local_cluster) -> None:
    """With the dense rate scheduled per epoch (shard 0's ``set_dense_lr`` over the actor handle)."""
    from cadence import api
    from tests.conftest import make_config
    from tests.test_task_matrix import assert_same_model

    runs = [api.train(make_config(tmp_path / engine, *task_data[task], "strategy=hop_bw", "ps.workers=2",
                                  "ps.backup_workers=0", "ps.shards=2", f"ps.engine={engine}",
                                  "optimizer.schedule=cosine", "optimizer.warmup_epochs=1"))
            for engine in ("threads", "ray")]
    assert runs[1].summary["runtime"] == "parameter_server" and runs[1].summary["global_steps"] > 0
    assert_same_model(runs[0].run_dir, runs[1].run_dir)


def test_one_worker_with_dropout_equals_the_thread_engine(tmp_path: Path, local_cluster) -> None:
    """The worker actor continues the driver's random stream, as the worker thread does."""
    (threads, threads_state), (on_ray, ray_state) = train_on_both(tmp_path, "strategy=gba", "ps.workers=1",
                                                                  "model.name=deepfm", "ctr.hidden=[8]",
                                                                  "ctr.dropout=0.3")
    assert_same(threads_state, ray_state)
    assert on_ray["auc"] == threads["auc"]


@pytest.mark.parametrize("mode, steps_per_epoch", [("async", 12), pytest.param("gba", 3, marks=pytest.mark.slow),
                                                   pytest.param("hop_bs", 12, marks=pytest.mark.slow)])
def test_nondeterministic_modes_count_steps_and_examples_exactly(tmp_path: Path, local_cluster, mode: str,
                                                                   steps_per_epoch: int) -> None:
    summary, _ = fit(trainer_for(tmp_path, f"strategy={mode}", "ps.workers=4", "ps.engine=ray"))
    assert summary["global_steps"] == 2 * steps_per_epoch
    assert summary["examples_seen"] == 2 * 768
    assert summary["gradients_applied"] + summary["gradients_dropped"] == 2 * 12
    assert 0.0 <= summary["auc"] <= 1.0


def test_hop_bs_on_ray_keeps_every_worker_within_the_staleness_bound(tmp_path: Path, local_cluster) -> None:
    """The bounded-staleness gate lives in the coordinator actor and the workers reach it over their
    channels (wait, and done sent one-way): a fast worker still waits for a slow one, as on threads
    (tests/strategies/parameter_server/test_ctr_training.py)."""
    trainer = trainer_for(tmp_path, "strategy=hop_bs", "ps.workers=2", "ps.staleness=1", 'ps.stragglers=["0:8"]',
                          "train.epochs=1", "ps.engine=ray")
    fit(trainer)
    slow, fast = trainer.runtime.worker_examples
    # without the bound the fast worker would take ~11 of 12 batches; with it, at most bound + 1 more
    assert fast - slow <= 2 * BATCH, (slow, fast)


def test_a_killed_worker_drops_its_batch_and_the_run_finishes(tmp_path: Path, local_cluster) -> None:
    # (dies at its first batch: a worker whose actor started late may take only one batch in a run)
    trainer = trainer_for(tmp_path, "strategy=gba", "ps.workers=3", 'ps.kill_workers=["1:0"]', "ps.engine=ray")
    try:
        summary = trainer.fit()
        assert 1 not in trainer.runtime.engine.workers and set(trainer.runtime.engine.workers) == {0, 2}
    finally:
        trainer.runtime.close()
    assert summary["workers_killed"] == [1] and summary["epochs"] == 2
    assert summary["examples_seen"] == 2 * 768 - BATCH  # exactly the batch worker 1 died with
    assert summary["gradients_applied"] + summary["gradients_dropped"] == 2 * 12 - 1


def test_a_killed_worker_under_sync_equals_the_thread_engine(tmp_path: Path, local_cluster) -> None:
    (threads, threads_state), (on_ray, ray_state) = train_on_both(tmp_path, "strategy=sync", "ps.workers=3",
                                                                  'ps.kill_workers=["1:1"]')
    assert on_ray["workers_killed"] == [1]
    assert {k: on_ray[k] for k in COUNTERS} == {k: threads[k] for k in COUNTERS}
    assert on_ray["examples_seen"] < 2 * 768
    assert_same(threads_state, ray_state)


def write_criteo(path: Path, lines: int, seed: int) -> Path:
    rng = random.Random(seed)
    rows = []
    for _ in range(lines):
        cats = [f"{rng.randrange(12) * 977 + c:08x}" for c in range(26)]
        dense = [str(rng.randrange(50)) for _ in range(13)]
        rows.append("\t".join([str(int(rng.random() < 0.3)), *dense, *cats]))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_the_cli_trains_on_ray_like_on_threads(tmp_path: Path, local_cluster) -> None:
    data = write_criteo(tmp_path / "tiny.tsv", 400, seed=3)
    summaries = []
    for engine in ("threads", "ray"):
        out = tmp_path / engine
        code = main(["-q", "train", "--task", "ctr", "--dataset", str(data), "--model", "fm", "--dim", "4",
                     "--epochs", "1", "--batch-size", "32", "--strategy", "sync", "--workers", "2",
                     "--engine", engine, "--no-progress", "--out", str(out), "--set", "threads=1"])
        assert code == 0
        summaries.append(json.loads((out / "summary.json").read_text()))
    threads, on_ray = summaries
    assert on_ray["auc"] == threads["auc"] and on_ray["global_steps"] == threads["global_steps"] > 0


def kill_when(condition, action, timeout: float = 60.0) -> threading.Thread:
    """Run ``action`` once ``condition()`` holds (polled), on a thread of its own."""
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.02)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(120)
def test_a_worker_process_that_dies_releases_its_token_and_is_replaced(tmp_path: Path, local_cluster) -> None:
    trainer = trainer_for(tmp_path, "strategy=sync", "ps.workers=2", "ps.emulated_latency=0.1", "ps.engine=ray")
    engine = trainer.runtime.engine
    victim = engine.workers[1]
    shard = trainer.runtime.shards[0]
    watcher = kill_when(lambda: shard.get_global_step() >= 2, lambda: ray.kill(victim.host, no_restart=True))
    started = time.perf_counter()
    try:
        summary = trainer.fit()  # sync: the barrier of the dead worker's step is released, not awaited
        watcher.join()
        assert engine.workers[1] is not victim  # replaced for the next epoch
    finally:
        trainer.runtime.close()
    assert time.perf_counter() - started < 60
    assert summary["epochs"] == 2 and summary["workers_replaced"] == 1 and summary["workers_killed"] == []
    assert summary["examples_seen"] < 2 * 768  # the dead worker's share of epoch 1 was lost
    assert summary["examples_seen"] > 768  # epoch 2 ran with both workers again


@pytest.mark.timeout(180)
def test_a_shard_process_that_dies_is_restarted_from_its_checkpoint(tmp_path: Path, local_cluster) -> None:
    """Sync is deterministic, so the run that lost a shard and replayed epoch 2 from the epoch-1
    checkpoint must end exactly where the uninterrupted run ends."""
    reference = fit(trainer_for(tmp_path / "threads", "strategy=sync", "ps.workers=2", "ps.shards=2",
                                "train.epochs=3"))
    trainer = trainer_for(tmp_path / "ray", "strategy=sync", "ps.workers=2", "ps.shards=2", "train.epochs=3",
                          "ps.engine=ray", "ps.emulated_latency=0.05")
    checkpoint = tmp_path / "ray" / "run" / "checkpoints" / "epoch-000001"
    first = trainer.runtime.shards[1].handle
    watcher = kill_when(checkpoint.exists, lambda: (time.sleep(0.2), ray.kill(first.host, no_restart=True)))
    try:
        summary, state = fit(trainer)
    finally:
        watcher.join()
    assert trainer.runtime.shards[1].handle is not first  # a new process, loaded from the checkpoint
    assert summary["epochs"] == 3
    assert_same(reference[1], state)
    assert summary["global_steps"] == reference[0]["global_steps"] and summary["auc"] == reference[0]["auc"]


def test_an_unreachable_ray_address_fails_fast_and_leaves_no_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "cadence.cli", "train", "--task", "ctr", "--dataset", "synthetic-ctr",
                             "--strategy", "gba", "--workers", "2", "--engine", "ray", "--set",
                             "ps.ray_address=127.0.0.1:1", "--out", str(out)], capture_output=True, text=True,
                            env={**os.environ, "CADENCE_HOME": str(tmp_path / "home")})
    assert time.perf_counter() - started < 30
    assert result.returncode == 2 and "cadence: error: --set ps.ray_address=127.0.0.1:1:" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_import_cadence_does_not_import_ray_and_a_missing_ray_is_a_config_error() -> None:
    code = ("import sys, cadence, cadence.api, cadence.tasks, cadence.engines as e; make = e.PLACEMENTS.get('ray'); "
            "assert 'ray' not in sys.modules, 'ray imported'\n"
            "sys.modules['ray'] = None  # as if it were not installed\n"
            "from cadence.errors import ConfigError\n"
            "try:\n    make(None, 0)\nexcept ConfigError as err:\n    assert 'cadence[ray]' in str(err), err\n"
            "else:\n    raise AssertionError('no error without ray')")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- two Ray nodes on this machine -----------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ray_command() -> str:
    return str(Path(sys.executable).with_name("ray"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sync_on_a_two_node_cluster_equals_the_thread_engine(tmp_path: Path) -> None:
    if ray.is_initialized():  # the module's local cluster, when the default tests ran first
        ray_engine.shutdown()
        ray.shutdown()
    port = free_port()
    temp_dir = Path(f"/tmp/cdn-ray-{os.getpid()}")  # its own: no other Ray user's cluster is found or touched
    # Every process of a cluster, this driver included, must agree on token authentication. This
    # process fixed its mode when Ray was loaded (token once a local ray.init ran here, which turns
    # it on; disabled while RAY_AUTH_MODE is unset), so the cluster is started in the same mode.
    auth = os.environ.get("RAY_AUTH_MODE", "disabled")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": auth}
    address = f"127.0.0.1:{port}"
    started: list[subprocess.Popen] = []

    def start(*args: str) -> None:
        # `--block` keeps the command alive as the node's supervisor; its own process group lets the
        # test end exactly this cluster's processes, by group id (not `ray stop`, which ends every
        # Ray process of the user on this machine)
        started.append(subprocess.Popen([ray_command(), "start", "--block", "--num-cpus=1",
                                         "--node-ip-address=127.0.0.1", *args], env=env, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def wait_until(condition, what: str, seconds: float = 90) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, what
            assert all(process.poll() is None for process in started), f"a `ray start` exited: {what}"
            time.sleep(0.5)

    try:
        start("--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}")
        wait_until(lambda: subprocess.run([ray_command(), "status", f"--address={address}"], env=env,
                                          capture_output=True).returncode == 0, "the head did not come up")
        start(f"--address={address}")
        ray.init(address=address)
        wait_until(lambda: sum(1 for node in ray.nodes() if node["Alive"]) == 2, "the second node did not join")

        threads_summary, threads_state = fit(trainer_for(tmp_path / "threads", "strategy=sync", "ps.workers=3"))
        ray_trainer = trainer_for(tmp_path / "ray", "strategy=sync", "ps.workers=3", "ps.shards=2",
                                  "ps.engine=ray", f"ps.ray_address={address}")
        hosts = ray_trainer.runtime.engine.actors
        assert len(set(ray.get([host.node.remote() for host in hosts]))) == 2, "actors on both nodes"
        ray_summary, ray_state = fit(ray_trainer)
        assert_same(threads_state, ray_state)
        assert {k: ray_summary[k] for k in COUNTERS} == {k: threads_summary[k] for k in COUNTERS}
    finally:
        ray_engine.shutdown()
        ray.shutdown()
        for process in reversed(started):  # the second node first, while the head can still drain it
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # the supervisor stops its node's processes
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(process.pid, signal.SIGKILL)  # whatever of the group is left
            except ProcessLookupError:
                pass
            process.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_dense_on_the_workers_on_ray_equals_the_thread_engine(tmp_path: Path, local_cluster) -> None:
    (threads, threads_state), (on_ray, ray_state) = train_on_both(tmp_path, "strategy=sync", "ps.workers=2",
                                                                  "ps.dense=workers", "model.name=deepfm",
                                                                  "ctr.hidden=[8]")
    assert_same(threads_state, ray_state)
    assert on_ray["auc"] == threads["auc"] and on_ray["bytes_moved_per_example"] > 0
    # the actors' start (torch imported, the task built) is setup, recorded apart from training time
    assert on_ray["engine_start_seconds"] > 0 and threads["engine_start_seconds"] == 0


# ---- ShadowSync: each worker actor is a trainer of Hogwild threads ----------------------------------
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["fr-easgd", pytest.param("shadow-ma", marks=pytest.mark.slow),
                                  pytest.param("fr-bmuf", marks=pytest.mark.slow),
                                  pytest.param("shadow-easgd", marks=pytest.mark.slow)])
# (shadow-ma's trainers as actors: also test_one_trainer_of_one_thread_on_ray_equals_the_thread_engine)
def test_shadow_trainers_as_actors_train_one_pass_and_sync(tmp_path: Path, local_cluster, mode: str) -> None:
    """Two trainer processes of two threads each: every example once, the replicas synced (EASGD with
    the central copy on two sync servers, processes of their own; MA and BMUF over the trainers'
    gloo group), the run evaluable."""
    import os

    trainer = trainer_for(tmp_path, f"strategy={mode}", "ps.workers=2", "shadow.threads=2",
                          *foreground(mode, "shadow.every=2"), "ps.engine=ray", "train.epochs=1",
                          *(["shadow.sync_servers=2", "shadow.sync_server_resource=sync_server"]
                            if mode.endswith("easgd") else []))
    if mode.endswith("easgd"):
        pids = trainer.runtime.engine.sync_server_pids()
        assert len(set(pids)) == 2 and os.getpid() not in pids
    summary, _ = fit(trainer)
    assert summary["examples_seen"] == 768 and summary["gradients_applied"] == 12
    assert summary["dense_syncs"] > 0 and summary["sync_gap"] > 0
    assert summary["examples_in_flight"] == 64 * 2 * 2
    assert 0.0 <= summary["auc"] <= 1.0


def test_sync_servers_bound_for_a_resource_no_node_offers_are_a_clear_error(tmp_path: Path, local_cluster) -> None:
    with pytest.raises(ConfigError, match=r"shadow.sync_server_resource: no alive node .* offers the resource 'nowhere'"):
        trainer_for(tmp_path, "strategy=shadow-easgd", "ps.workers=2", "ps.engine=ray",
                    "shadow.sync_server_resource=nowhere")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", [pytest.param("shadow-easgd", marks=pytest.mark.slow), "shadow-ma"])
def test_one_trainer_of_one_thread_on_ray_equals_the_thread_engine(tmp_path: Path, local_cluster, mode: str) -> None:
    """The sequential twin: one trainer, one thread, alpha 0 (the sync leaves the replica alone) gives
    the same model on both engines, bit for bit."""
    threads, ray_run = train_on_both(tmp_path, f"strategy={mode}", "ps.workers=1", "shadow.threads=1",
                                     "shadow.alpha=0")
    assert threads[0]["dense_syncs"] > 0 and ray_run[0]["dense_syncs"] > 0
    assert_same(threads[1], ray_run[1])


@pytest.mark.timeout(240)
def test_a_trainer_process_that_dies_does_not_hang_the_others(tmp_path: Path, local_cluster) -> None:
    """shadow-ma: the dead trainer's peers lose their all-reduce (gloo cannot shrink), train on
    unsynced to the end of the epoch, and the next epoch forms a group with its replacement."""
    trainer = trainer_for(tmp_path, "strategy=shadow-ma", "ps.workers=2", "shadow.threads=2",
                          "ps.emulated_latency=0.1", "ps.engine=ray")
    engine = trainer.runtime.engine
    victim = engine.workers[1]
    shard = trainer.runtime.shards[0]
    # early in the first epoch (12 batches of 0.1 s over 4 threads), so the victim dies with a batch in hand
    watcher = kill_when(lambda: shard.stats()["gradients_applied"] >= 2, lambda: ray.kill(victim.host, no_restart=True))
    started = time.perf_counter()
    try:
        summary = trainer.fit()
        watcher.join()
    finally:
        trainer.runtime.close()
    assert time.perf_counter() - started < 120
    assert summary["epochs"] == 2 and summary["workers_replaced"] == 1
    # the victim loses the batch in hand, or none when the kill lands between its batches (CI saw both)
    assert 768 < summary["examples_seen"] <= 2 * 768


# ---- AdaPM's nodes as actors (--strategy adapm --engine ray) -----------------------------------------------
@pytest.mark.parametrize("task", ["kge", pytest.param("ctr", marks=pytest.mark.slow)])
def test_one_adapm_node_actor_equals_sync(task: str, task_data, tmp_path: Path, local_cluster) -> None:
    """The node actor builds the task, its store and its dense module itself: one node of one worker
    computes exactly what ``sync`` does, and its rows reach the driver for evaluation and export."""
    from cadence import api
    from tests.conftest import make_config
    from tests.test_task_matrix import assert_same_model

    sync = api.train(make_config(tmp_path / "sync", *task_data[task]))
    adapm = api.train(make_config(tmp_path / "adapm", *task_data[task], "strategy=adapm", "ps.engine=ray"))
    assert adapm.summary["engine"] == "ray" and adapm.summary["runtime"] == "adapm"
    assert_same_model(sync.run_dir, adapm.run_dir)


def test_adapm_nodes_as_actors_relocate_and_replicate_between_processes(tmp_path: Path, local_cluster) -> None:
    from cadence import api
    from tests.conftest import make_config

    zipf = ["task=mf", "data.dataset=synthetic-zipf", "mf.synthetic.users=2000", "mf.synthetic.items=500",
            "mf.synthetic.ratings=40000", "train.batch_size=200", "train.epochs=2", "eval.every=0",
            "strategy=adapm", "ps.workers=2", "adapm.lookahead=32"]
    on_ray = api.train(make_config(tmp_path / "ray", *zipf, "ps.engine=ray")).summary
    on_threads = api.train(make_config(tmp_path / "threads", *zipf)).summary
    sync = api.train(make_config(tmp_path / "sync", *zipf[:-3])).summary  # (deterministic)
    assert on_ray["engine"] == "ray" and on_ray["nodes"] == 2
    assert on_ray["relocations"] > 0 and on_ray["replicas_created"] > 0 and on_ray["bytes_per_epoch"] > 0
    assert on_ray["remote_access_share"] < 0.01
    assert on_ray["examples_seen"] == on_threads["examples_seen"] == sync["examples_seen"]
    # one asynchronous run spreads about +-2% on two shared cores: each within 6% of sync (lost
    # replica deltas, about 4%, are the look-ahead test's to catch, over three runs: test_adapm.py)
    for summary in (on_ray, on_threads):
        assert summary["rmse"] == pytest.approx(sync["rmse"], rel=0.06)


# ---- Runtime.run_epoch's contract on Ray ----------------------------------------------------------------------
@pytest.mark.parametrize("settings", [["strategy=gba", "ps.workers=2"], ["strategy=hogwild", "ps.workers=2"],
                                      ["strategy=adapm", "ps.workers=2", "adapm.lookahead=4"]],
                         ids=["server", "shadowsync", "adapm"])
def test_on_batch_fires_once_per_finished_batch_on_ray(settings: list[str], task_data, tmp_path: Path,
                                                      local_cluster) -> None:
    """The batches finish in the actors; each is reported to the driver's ``on_batch`` exactly once,
    with its plan and loss, before the epoch returns (as on threads: tests/training/test_on_batch.py)."""
    from tests.conftest import make_config
    from tests.training.test_on_batch import assert_each_batch_once, batches_reported

    log, plans = batches_reported(make_config(tmp_path / "run", *task_data["mf"], "ps.engine=ray", *settings))
    assert_each_batch_once(log, plans)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["async", pytest.param("shadow-easgd", marks=pytest.mark.slow)])
def test_a_straggler_is_a_worker_process_under_a_cpu_quota(tmp_path: Path, local_cluster, mode: str) -> None:
    """``ps.straggler_cause: cpu_quota``: worker 1's process runs its epoch in a cgroup-v1 CPU quota
    of a 32nd of a core (slowdown 32: 3 ms of CPU per 100 ms period, which a batch's compute exceeds;
    at an eighth a run was once never throttled), nothing
    sleeps: the kernel throttles it (its throttled seconds come back in the summary, the fast
    worker's are 0), it computes fewer batches than the fast one, which takes more from the shared
    data list, and its cgroup is gone afterwards."""
    from cadence.engines import cgroups

    if cgroups.unavailable() is not None:
        pytest.skip(cgroups.unavailable())
    # (batches of 16 with 10 ms of emulated latency each: an epoch of 48 batches lasts long enough for
    # the slowed worker to take some, and its compute, not the latency, sets its pace; with 12 quick
    # batches, under the suite's load, it once took none and so was never throttled)
    trainer = trainer_for(tmp_path, f"strategy={mode}", "ps.workers=2", 'ps.stragglers=["1:32"]',
                          "ps.straggler_cause=cpu_quota", "ps.straggler_quota=absolute", "ps.engine=ray",
                          "train.epochs=3", "train.batch_size=16", "ps.emulated_latency=0.01")
    summary, _ = fit(trainer)
    fast, slow = summary["worker_throttled_seconds"]
    assert fast == 0.0 and slow > 0.0
    examples = trainer.runtime.worker_examples
    assert examples[1] < examples[0], examples
    assert not list((cgroups.CPU_ROOT / "cadence").glob("*-worker-*"))


# ---- the processes a run leaves for the next (last: its run with ps.ray_idle_processes=0 ends them) ----
def actor_pids(trainer) -> list[int]:
    return ray.get([actor.pid.remote() for actor in trainer.runtime.engine.actors])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_the_next_run_builds_its_roles_in_the_processes_the_last_run_left(tmp_path: Path, local_cluster) -> None:
    """Sync with 2 workers and 2 shards (5 roles). The second run's roles are built in the first
    run's processes (no process started) and train to the same bits; a handle kept from the first
    run cannot reach the second run's role; with ``ps.ray_idle_processes=0`` a run's processes end
    with it."""
    from cadence.engines.ray import StaleCall, hosts

    settings = ("strategy=sync", "ps.workers=2", "ps.shards=2", "ps.engine=ray")
    first = trainer_for(tmp_path / "first", *settings)
    first_pids, kept_handle = actor_pids(first), first.runtime.engine.workers[0]
    first_result = fit(first)
    assert all(alive(pid) for pid in first_pids)  # kept for the next run
    second = trainer_for(tmp_path / "second", *settings, "ps.ray_idle_processes=0")
    second_pids = actor_pids(second)
    assert sorted(second_pids) == sorted(first_pids)
    with pytest.raises(StaleCall):
        ray_engine.ray_get(kept_handle.ping.remote())
    second_result = fit(second)
    assert second_result[0]["auc"] == first_result[0]["auc"]
    assert_same(first_result[1], second_result[1])
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in second_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in second_pids)  # ps.ray_idle_processes=0: none kept
    kept = [host for waiting in hosts().idle.values() for host, _ in waiting]
    assert not set(ray.get([host.pid.remote() for host in kept])) & set(second_pids)


def test_a_grown_run_freezes_the_known_rows_on_ray(grow_data, tmp_path: Path, local_cluster) -> None:
    """``train.init_from`` with ``train.freeze: known`` on Ray: the workers, built from the task's recipe
    in their own processes, leave the known rows (and relations) as they were."""
    old_data, new_data = grow_data["kge"]
    old = train(tmp_path, "old", *old_data)
    grown = train(tmp_path, "grown", *new_data, "strategy=hop_bw", "ps.workers=2", "ps.engine=ray",
                  f"train.init_from={old.run_dir}", "train.freeze=known")
    scratch = train(tmp_path, "scratch", *new_data, *STILL, "train.epochs=1")
    before, after, fresh = (exported(run, tmp_path / f"export-{run.name}") for run in
                            (old.run_dir, grown.run_dir, scratch.run_dir))
    assert_frozen(before, after, fresh, ("entities.tsv", "relations.tsv"))


def test_a_direct_role_answers_over_a_channel_as_a_ray_call_would(local_cluster) -> None:
    """``placement.place(..., direct=True)`` (EASGD's sync servers): the role's verbs answer over a
    channel each process opens on its first call, the same as through a Ray call; a copy of the
    handle in another process (here: unpickled) opens its own; a verb's error comes back as itself."""
    import pickle

    from cadence.engines.ray import RayPlacement
    from cadence.strategies.shadowsync.dense_sync import SyncServer

    placement = RayPlacement(None, 1)
    try:
        direct, plain = placement.place(SyncServer, 0, direct=True), placement.place(SyncServer, 1)
        placement.ready()
        assert direct.address is not None and plain.address is None
        start, local = torch.arange(6.0), torch.ones(6)
        for handle in (direct, plain):
            handle.call(SyncServer.reset, start)
        by_channel, by_ray = direct.call(SyncServer.exchange, local, 0.5), plain.call(SyncServer.exchange, local, 0.5)
        assert torch.equal(by_channel, by_ray) and torch.equal(by_channel, 0.5 * start + 0.5 * local)
        copy = pickle.loads(pickle.dumps(direct))
        assert copy._channel is None  # (its own, opened on its first call)
        assert torch.equal(copy.call(SyncServer.exchange, local, 0.0), by_channel)
        fresh = placement.place(SyncServer, 2, direct=True)  # never reset: its exchange fails
        with pytest.raises(AttributeError):
            fresh.call(SyncServer.exchange, local, 0.5)
    finally:
        placement.close()


# ---- strategy: auto's trials on Ray (issue 50: their Ray processes outlived the command) ---------------
def _processes_with(marker: str) -> dict[int, str]:
    """{pid: command line} of the processes whose environment holds ``marker`` (this test's TMPDIR:
    the command's, inherited by every process it or Ray started, whatever their titles)."""
    name, _, value = marker.partition("=")
    found = {}
    for pid in resources.processes_marked(name, value):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


@pytest.fixture
def short_tmpdir():
    """A TMPDIR short enough for Ray's socket paths (107 bytes at most), removed after the test."""
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="cdn-", dir="/tmp"))
    yield scratch
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("ending", [pytest.param("finished", marks=pytest.mark.slow), "ctrl-c"])
def test_auto_s_trials_on_ray_leave_no_process_behind(ending: str, short_tmpdir: Path, tmp_path: Path) -> None:
    """Each trial of ``--strategy auto --engine ray`` runs in a process of its own that starts a Ray
    instance; that process leaves by ``os._exit``, which skipped Ray's own shutdown: its dashboard
    and runtime-env agents lived on, orphaned. Finished or interrupted, every process the command or
    its Ray instances started has ended a few seconds after it returns (seen in /proc, by the
    command's environment), and the trials' Ray session directories are gone (a finished run's own,
    its logs, stays as after any Ray run)."""
    from tests.conftest import write_criteo

    scratch = short_tmpdir
    marker = f"TMPDIR={scratch}"
    data = write_criteo(tmp_path / "ctr.tsv", 600, 1)
    argv = [sys.executable, "-m", "cadence.cli", "-q", "train", "--task", "ctr", "--dataset", str(data),
            "--strategy", "auto", "--workers", "2", "--engine", "ray", "--epochs", "1" if ending == "finished" else "500",
            "--batch-size", "32", "--no-progress", "--set", "threads=1", "--set", "auto.trial_seconds=0.5",
            "--out", str(tmp_path / "run")]
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    process = subprocess.Popen(argv, env={**env, "TMPDIR": str(scratch), "CADENCE_HOME": str(tmp_path / "home")},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[str] = set()
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
        seen |= {line.split()[0] for line in _processes_with(marker).values() if line}
        if ending == "ctrl-c" and any("raylet" in name for name in seen):
            time.sleep(2)
            process.send_signal(signal.SIGINT)
            break
        time.sleep(0.2)
    try:
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert any("raylet" in name for name in seen), f"no Ray instance seen: the test proves nothing ({seen}): {err}"
    assert process.returncode == (0 if ending == "finished" else 130), err
    assert "Traceback" not in err, err
    left = _processes_with(marker)
    for _ in range(50):
        if not left:
            break
        time.sleep(0.2)
        left = _processes_with(marker)
    assert not left, f"outlived the command: {left}"
    sessions = sorted((scratch / "ray").glob("session_2*")) if (scratch / "ray").is_dir() else []
    assert len(sessions) == (1 if ending == "finished" else 0), sessions
