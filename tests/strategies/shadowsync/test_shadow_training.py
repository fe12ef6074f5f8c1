"""ShadowSync and its baselines end to end on small synthetic CTR data (SPEC section 5): one pass
over the data, the summary's sync metrics against their definitions, the foreground baselines'
period, a killed trainer, and alpha = 0 against trainers that never sync (with a real shadow thread
running beside them)."""

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cadence.strategies.shadowsync.dense_sync import (Bmuf, CentralCopy, Easgd, HogwildReplica, ModelAverage, ShadowThread,
                                        ThreadAverager)

from cadence.core.runtime import WorkerFailed
from cadence.ps.modes import PS_MODES

from tests.conftest import foreground
from tests.ps.ctr_helpers import BATCH, make_trainer

SYNCED = [f"{kind}-{rule}" for kind in ("shadow", "fr") for rule in ("easgd", "ma", "bmuf")]


@pytest.mark.parametrize("mode", [*SYNCED, "hogwild"])
def test_one_pass_sees_each_example_once_and_reports_the_sync_metrics(tmp_path: Path, mode: str) -> None:
    trainer, _, splits = make_trainer(tmp_path, f"strategy={mode}", "ps.workers=2", "shadow.threads=2",
                                      *foreground(mode, "shadow.every=2"), "train.epochs=1")
    summary = trainer.fit()
    assert summary["epochs"] == 1 and summary["examples_seen"] == len(splits["train"])
    assert sum(trainer.runtime.worker_examples) == len(splits["train"])
    assert summary["examples_in_flight"] == BATCH * 2 * 2  # ELP = batch x threads x trainers
    assert summary["gradients_applied"] == len(splits["train"]) // BATCH  # Hogwild: every gradient, on arrival
    assert summary["gradients_dropped"] == 0
    if mode == "hogwild":
        assert summary["dense_syncs"] == 0 and summary["sync_gap"] is None
        return
    assert summary["dense_syncs"] > 0
    # (over the runtime's own clock: the trainer's adds the loop's overhead)
    assert summary["syncs_per_second"] == pytest.approx(summary["dense_syncs"] / trainer.runtime.train_seconds,
                                                        rel=1e-3)
    # the seed's equation (2), iterations a second over syncs a second, on one clock: batches per sync
    assert summary["sync_gap"] == pytest.approx(len(splits["train"]) / BATCH / summary["dense_syncs"], rel=1e-4)
    assert 0.0 <= summary["auc"] <= 1.0


@pytest.mark.parametrize("rule", ["easgd", "ma", "bmuf"])
def test_the_trainer_wide_foreground_baseline_syncs_every_k_batches_of_a_trainer(tmp_path: Path, rule: str) -> None:
    every = 3
    trainer, _, splits = make_trainer(tmp_path, f"strategy=fr-{rule}", "ps.workers=2", "shadow.threads=2",
                                      f"shadow.every={every}", "train.epochs=1", "shadow.fr_sync=trainer")
    summary = trainer.fit()
    batches = [examples // BATCH for examples in trainer.runtime.worker_examples]
    due = sum(b // every for b in batches)  # the rounds every k-th batch of each trainer triggers
    # plus a last round as each trainer runs out of data; a collective rule keeps a finished trainer
    # in the rounds its peers trigger
    extra = 2 if rule == "easgd" else 2 + max(b // every for b in batches)
    assert due <= summary["dense_syncs"] <= due + extra, (batches, summary["dense_syncs"])


@pytest.mark.parametrize("mode", ["shadow-easgd", "shadow-ma", "shadow-bmuf", "fr-ma"])
def test_a_killed_trainer_does_not_hang_the_others(tmp_path: Path, mode: str) -> None:
    # 20 ms off the CPU per batch: each of the 6 threads takes its turn at the 12 batches, so trainer
    # 1 reaches its second push on a loaded machine too (without it, its threads could be starved
    # until the data ran out: CI saw no kill once)
    trainer, _, splits = make_trainer(tmp_path, f"strategy={mode}", "ps.workers=3", "shadow.threads=2",
                                      'ps.kill_workers=["1:2"]', "ps.emulated_latency=0.02")
    summary = trainer.fit()
    assert summary["workers_killed"] == [1] and summary["epochs"] == 2
    # trainer 1 dies once its threads pushed 2 batches together; each of its threads dies with the
    # batch it takes next (one it may never take: the data can run out first)
    lost = 2 * len(splits["train"]) - summary["examples_seen"]
    assert lost in (BATCH, 2 * BATCH)
    assert trainer.runtime.worker_examples[1] >= 2 * BATCH


def test_the_cap_on_syncs_per_second_holds_end_to_end(tmp_path: Path) -> None:
    trainer, _, _ = make_trainer(tmp_path, "strategy=shadow-easgd", "ps.workers=2", "shadow.alpha=0.5",
                                 "shadow.max_syncs_per_second=20", "train.epochs=1", "ps.emulated_latency=0.01")
    summary = trainer.fit()
    # two trainers, each at most 20 rounds a second after its first, and the round at the end of its
    # data (not delayed by the cap: the data's end wakes the shadow thread)
    assert 0 < summary["dense_syncs"] <= 2 * (20 * summary["train_seconds"] + 2)


@pytest.mark.parametrize("share", [0.0, 0.01])
def test_the_shadow_threads_cpu_share_is_reported_and_held_end_to_end(tmp_path: Path, share: float) -> None:
    """summary.json's shadow_cpu_share is the shadow threads' own CPU clock over the training time
    (each thread's mean share of a core); shadow.cpu_share caps it (uncapped, here: 0.06-0.5)."""
    trainer, _, _ = make_trainer(tmp_path, "strategy=shadow-easgd", "ps.workers=2", "train.epochs=1",
                                 "ps.emulated_latency=0.05", f"shadow.cpu_share={share}")
    summary = trainer.fit()
    assert summary["shadow_cpu_share"] == pytest.approx(
        summary["shadow_cpu_seconds"] / trainer.runtime.train_seconds / 2, rel=0.01)
    assert summary["shadow_cpu_seconds"] > 0 and summary["dense_syncs"] > 0
    if share:
        assert summary["shadow_cpu_share"] <= share * 1.5


@pytest.mark.parametrize("mode", ["shadow-easgd", "shadow-ma", "shadow-bmuf"])
def test_the_end_of_the_data_wakes_a_shadow_thread_waiting_on_its_rate_cap(tmp_path: Path, mode: str) -> None:
    """At the lowest cap (1e-4 syncs a second: a wait of ~3 hours after each round) the run ends when
    the data does: its first round, then nothing until the trainers are out of data."""
    import time

    trainer, _, _ = make_trainer(tmp_path, f"strategy={mode}", "ps.workers=2", "shadow.max_syncs_per_second=1e-4",
                                 "train.epochs=1")
    done: list[dict] = []
    fitting = threading.Thread(target=lambda: done.append(trainer.fit()), daemon=True)
    started = time.perf_counter()
    fitting.start()
    fitting.join(60)  # (a thread: a wait that does not end fails the test here instead of hanging it)
    assert not fitting.is_alive(), "the run did not end with its data"
    assert time.perf_counter() - started < 60 and done
    assert done[0]["dense_syncs"] >= 2  # (each trainer's first round, at least)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["fr-easgd", "shadow-ma"])
def test_a_shadow_thread_that_fails_fails_the_epoch_instead_of_hanging(tmp_path: Path, mode: str,
                                                                        monkeypatch) -> None:
    """A round that raises (a broken sync PS, say): the workers are released (fr-*: none waits for a
    round that will never come), the epoch is abandoned and the error reaches the caller."""
    rule = Easgd if mode.endswith("easgd") else ModelAverage
    original, calls = rule.round, []

    def failing(self, params, training):
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("the sync parameter server is gone")
        return original(self, params, training)

    monkeypatch.setattr(rule, "round", failing)
    trainer, _, _ = make_trainer(tmp_path, f"strategy={mode}", "ps.workers=2", "shadow.threads=2",
                                 *foreground(mode, "shadow.every=1"), "ps.emulated_latency=0.01")
    with pytest.raises(WorkerFailed, match="sync parameter server is gone"):
        trainer.fit()


def test_the_run_keeps_the_mean_of_the_replicas_and_the_first_optimizer_state() -> None:
    module = torch.nn.Linear(2, 1)
    engine = SimpleNamespace(dense=module, dense_optimizer=torch.optim.Adagrad(module.parameters(), lr=0.1), syncs=3)
    replicas = []
    for value in (1.0, 2.0, 6.0):
        state = {name: torch.full_like(p, value) for name, p in module.state_dict().items()}
        optimizer = torch.optim.Adagrad(torch.nn.Linear(2, 1).parameters(), lr=0.1, initial_accumulator_value=value)
        replicas.append((state, optimizer.state_dict()))
    PS_MODES.get("shadow-ma").keep(engine, replicas, syncs=4)
    assert all(torch.equal(p, torch.full_like(p, 3.0)) for p in module.state_dict().values())
    assert all(torch.equal(s["sum"], torch.full_like(s["sum"], 1.0)) for s in engine.dense_optimizer.state.values())
    assert engine.syncs == 7


# ---- alpha = 0: the trainers are independent, a shadow thread running or not ----------------------
def _train_two_trainers(rule: str | None, alpha: float = 0.0) -> list[list[torch.Tensor]]:
    """Two trainers (a linear model each, Adagrad, their own fixed batches), trained on threads of
    their own while a shadow thread per trainer syncs them with ``rule`` (None: no shadow thread)."""
    modules = []
    for _ in range(2):
        torch.manual_seed(0)
        modules.append(torch.nn.Linear(6, 1))
    replicas = [HogwildReplica(m, torch.optim.Adagrad(m.parameters(), lr=0.1)) for m in modules]
    averager, central = ThreadAverager(2), CentralCopy(list(modules[0].parameters()))
    live = [True, True]
    shadows = []
    if rule is not None:
        for i, replica in enumerate(replicas):
            sync = {"ma": lambda: ModelAverage(alpha, averager.member(i)),
                    "bmuf": lambda: Bmuf(alpha, averager.member(i), replica.params, 1.0, 0.5),
                    "easgd": lambda: Easgd(alpha, central, lambda: sum(live))}[rule]()
            shadows.append(ShadowThread(sync, replica.params, lambda i=i: live[i]).start())

    def train(i: int) -> None:
        data = torch.Generator().manual_seed(10 + i)
        for _ in range(200):
            inputs = torch.randn(16, 6, generator=data)
            target = inputs.sum(1, keepdim=True)
            loss = ((modules[i](inputs) - target) ** 2).mean()
            grads, _ = replicas[i].gradients(loss)
            replicas[i].apply(grads)
        live[i] = False

    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for shadow in shadows:
        shadow.join(timeout=30)
        assert not shadow.thread.is_alive() and shadow.syncs > 0
    return [[p.detach().clone() for p in m.parameters()] for m in modules]


@pytest.mark.parametrize("rule", ["easgd", "ma", "bmuf"])
def test_alpha_zero_equals_independent_trainers(rule: str) -> None:
    alone = _train_two_trainers(None)
    assert not torch.equal(alone[0][0], alone[1][0])  # (their data differ, so their models do)
    synced = _train_two_trainers(rule, alpha=0.0)
    for mine, reference in zip(synced, alone):
        for got, want in zip(mine, reference):
            assert torch.equal(got, want)
    pulled = _train_two_trainers(rule, alpha=0.5)  # (and the rule does act when alpha is not 0)
    assert not all(torch.equal(a, b) for a, b in zip(pulled[0], alone[0]))


@pytest.mark.parametrize("servers", [1, 3])
def test_each_epoch_the_central_copy_on_the_sync_servers_starts_from_the_runs_dense_parameters(servers: int) -> None:
    """EASGD's central copy is reset on every sync server at each epoch's start; a server that kept
    the old slice would start epoch 2 from epoch 1's central copy."""
    from cadence.strategies.shadowsync.settings import ShadowConfig
    from cadence.engines.placement import InProcess
    from cadence.strategies.shadowsync.dense_sync import CentralSlices
    from cadence.strategies.shadowsync.trainer import reset_central

    sync_servers = PS_MODES.get("shadow-easgd").sync_servers(ShadowConfig(sync_servers=servers), InProcess())
    assert len(sync_servers) == servers
    for value in (1.0, 5.0):  # two epochs, each from the run's dense parameters of that moment
        dense = torch.nn.Linear(3, 2)
        torch.nn.init.constant_(dense.weight, value)
        torch.nn.init.constant_(dense.bias, value)
        reset_central(sync_servers, dense)
        central = CentralSlices(sync_servers).exchange([torch.zeros(8)], 0.0)  # alpha 0: reads w_ps unchanged
        assert torch.equal(torch.cat([c.reshape(-1) for c in central]), torch.full((8,), value))


@pytest.mark.parametrize("servers", [2, 3, 7])
def test_the_central_copy_sliced_over_sync_servers_exchanges_as_one_copy(servers: int) -> None:
    """Slices of the flat vector on several sync servers give exactly one central copy's exchanges
    (the reference: ``CentralCopy`` whole), for parameters of several shapes and a vector that does
    not divide evenly; each server holds only its slice."""
    from cadence.strategies.shadowsync.settings import ShadowConfig
    from cadence.engines.placement import InProcess
    from cadence.strategies.shadowsync.dense_sync import CentralSlices

    generator = torch.Generator().manual_seed(servers)
    initial = [torch.randn(5, 3, generator=generator), torch.randn(4, generator=generator)]
    sync_servers = PS_MODES.get("fr-easgd").sync_servers(ShadowConfig(sync_servers=servers), InProcess())
    from cadence.strategies.shadowsync.dense_sync import reset_sync_servers

    reset_sync_servers(sync_servers, initial)
    sliced, whole = CentralSlices(sync_servers), CentralCopy(initial)
    for _ in range(4):
        local = [torch.randn(5, 3, generator=generator), torch.randn(4, generator=generator)]
        for mine, reference in zip(sliced.exchange(local, 0.3), whole.exchange(local, 0.3)):
            assert torch.allclose(mine, reference, atol=1e-6)
    held = [server.instance.copy.values[0].numel() for server in sync_servers]
    assert sum(held) == 19 and max(held) - min(held) <= 1


def test_easgd_trains_with_several_sync_servers(tmp_path: Path) -> None:
    trainer, _, splits = make_trainer(tmp_path, "strategy=shadow-easgd", "ps.workers=2", "shadow.sync_servers=3",
                                      "train.epochs=1")
    summary = trainer.fit()
    assert summary["examples_seen"] == len(splits["train"]) and summary["dense_syncs"] > 0
    assert len(trainer.runtime.engine.sync_servers) == 3


@pytest.mark.parametrize("mode", ["shadow-easgd", "shadow-ma", "fr-easgd", "fr-ma"])
def test_a_shadow_round_runs_while_its_trainers_batches_are_in_flight(tmp_path: Path, mode: str,
                                                                      monkeypatch) -> None:
    """ShadowSync's claim, in time: a trainer's sync rounds run while its own worker threads are in
    the middle of batches (wall-clock intervals that intersect), and the foreground baseline's never
    do (it pauses the trainer's threads and drains their batches first)."""
    import time

    from cadence.strategies.shadowsync import dense_sync
    from cadence.strategies.shadowsync.trainer import HogwildWorker

    steps: list[tuple[int, float, float]] = []
    rounds: list[tuple[int, float, float]] = []
    lock = threading.Lock()
    original_step = HogwildWorker.step

    def step(self, *args):
        began = time.perf_counter()
        try:
            return original_step(self, *args)
        finally:
            with lock:
                steps.append((self.trainer.index, began, time.perf_counter()))

    def timed_round(original):
        def run(self, params, training):
            began = time.perf_counter()
            try:
                return original(self, params, training)
            finally:  # (the shadow thread of trainer i is named cadence-shadow-i)
                with lock:
                    rounds.append((int(threading.current_thread().name.rsplit("-", 1)[1]), began, time.perf_counter()))
        return run

    monkeypatch.setattr(HogwildWorker, "step", step)
    for rule in (dense_sync.Easgd, dense_sync.ModelAverage):
        monkeypatch.setattr(rule, "round", timed_round(rule.round))
    trainer, _, _ = make_trainer(tmp_path, f"strategy={mode}", "ps.workers=2", "shadow.threads=2",
                                 *foreground(mode, "shadow.every=2", "shadow.fr_sync=trainer"), "train.epochs=2")
    trainer.fit()
    assert len(rounds) > 2 and len(steps) > 20
    overlapping = sum(1 for t, r0, r1 in rounds for u, s0, s1 in steps if t == u and r0 < s1 and s0 < r1)
    if mode.startswith("shadow"):
        assert overlapping > 0, "no round of a trainer ran while one of its batches was in flight"
    else:
        assert overlapping == 0


@pytest.mark.parametrize("mode", ["hogwild", "shadow-easgd", "fr-easgd"])
def test_hogwild_tables_train_while_another_thread_holds_the_shards_lock(tmp_path: Path, mode: str) -> None:
    """The seed: "there is no lock involved in the accesses of the tables". A thread takes every
    shard's lock (the one a pull or push took before) and holds it while the whole run trains: the
    run finishes, every gradient applied. Under a locking shard the run would wait for the lock."""
    trainer, _, splits = make_trainer(tmp_path, f"strategy={mode}", "ps.workers=2", "shadow.threads=2",
                                      *foreground(mode, "shadow.every=2"), "train.epochs=1", "ps.shards=2")
    shards = trainer.runtime.engine.shards
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        for shard in shards:
            shard.changed.acquire()
        held.set()
        release.wait()
        for shard in shards:
            shard.changed.release()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    held.wait()
    outcome: dict = {}

    def train() -> None:
        trainer.runtime.run_epoch(trainer.task.plan(0), lambda finished: None)
        outcome["done"] = True

    run = threading.Thread(target=train, daemon=True)
    try:
        run.start()
        run.join(20)
        assert not run.is_alive(), "training waited for the shards' lock"
    finally:
        release.set()
        run.join()
    assert outcome.get("done"), "the epoch failed"
    applied = sum(shard.applied_gradients for shard in shards)
    assert applied == 2 * (len(splits["train"]) // BATCH)  # each batch's gradient on both shards


def test_the_foreground_baseline_syncs_in_each_threads_own_loop_every_k_of_its_iterations(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """The paper's FR-EASGD: every worker thread syncs inside its own loop, after every k-th of its
    own iterations, so the sync traffic grows with the threads. Each thread's events in time order:
    k batches begun, its own round, k more, ... ; no round from any other thread (no shadow thread,
    no trainer-wide round)."""
    from cadence.strategies.shadowsync import dense_sync
    from cadence.strategies.shadowsync.trainer import HogwildWorker

    every = 3
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    original_step, original_round = HogwildWorker.step, dense_sync.Easgd.round

    def step(self, *args):
        with lock:
            events.append((threading.current_thread().name, "batch"))
        return original_step(self, *args)

    def round_(self, params, training):
        with lock:
            events.append((threading.current_thread().name, "sync"))
        return original_round(self, params, training)

    monkeypatch.setattr(HogwildWorker, "step", step)
    monkeypatch.setattr(dense_sync.Easgd, "round", round_)
    trainer, _, _ = make_trainer(tmp_path, "strategy=fr-easgd", "ps.workers=2", "shadow.threads=2",
                                 f"shadow.every={every}", "train.epochs=1")
    summary = trainer.fit()
    threads = {name for name, _ in events}
    # 2 trainers x 2 threads, every round from one of them (on a fast machine a thread that starts
    # last may find the shared data list empty: it takes no batch and makes no round)
    assert 2 <= len(threads) <= 4 and sum(kind == "batch" for _, kind in events) >= 2 * every
    total = 0
    for name in threads:
        mine = [kind for who, kind in events if who == name]
        batches = mine.count("batch")
        expected = [kind for b in range(1, batches + 1) for kind in (("batch", "sync") if b % every == 0 else ("batch",))]
        assert mine == expected, name
        total += batches // every
    assert summary["dense_syncs"] == total > 0


def test_a_per_thread_all_reduce_is_refused(tmp_path: Path) -> None:
    from cadence.errors import ConfigError

    with pytest.raises(ConfigError, match="shadow.fr_sync"):
        make_trainer(tmp_path, "strategy=fr-ma", "ps.workers=2", "shadow.fr_sync=thread")
