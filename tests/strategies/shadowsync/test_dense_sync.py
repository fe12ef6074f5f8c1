"""ShadowSync's dense-sync rules against their definitions (SPEC section 5, the paper's Algorithms
2-4) on tiny tensors, computed here by hand; the all-reduce of trainer threads; the shadow thread's
stop and its cap on syncs per second."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from cadence.strategies.shadowsync.dense_sync import (Bmuf, CentralCopy, Easgd, ForegroundGate, ModelAverage, ShadowThread,
                                        ThreadAverager, elastic)


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def replicas(n: int, seed: int = 0) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(3, 2, generator=generator), torch.randn(4, generator=generator)] for _ in range(n)]


def run_round(rules, params, training=None) -> list[int]:
    """One round of every trainer's rule, each on its own thread (the collective needs them all)."""
    training = training or [True] * len(rules)
    counts = [None] * len(rules)

    def one(i):
        counts[i] = rules[i].round(params[i], training[i])

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(rules))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), "a round did not complete"
    return counts


def test_elastic_is_the_convex_interpolation() -> None:
    local, target = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -2.0])
    elastic(local, target, 0.25)
    assert torch.allclose(local, torch.tensor([0.75 * 1 + 0.25 * 3, 0.75 * 2 + 0.25 * -2]))


def test_easgd_moves_the_centre_then_the_replica_towards_the_new_centre() -> None:
    alpha = 0.3
    [w0], [w1] = replicas(1, seed=1), replicas(1, seed=2)
    centre = [t.clone() for t in w1]
    central = CentralCopy(centre)
    expected_ps = [(1 - alpha) * c + alpha * w for c, w in zip(centre, w0)]
    expected_w = [(1 - alpha) * w + alpha * ps for w, ps in zip(w0, expected_ps)]
    Easgd(alpha, central, lambda: 1).round(w0, True)
    for got, want in zip(w0, expected_w):
        assert torch.allclose(got, want)
    for got, want in zip(central.values, expected_ps):
        assert torch.allclose(got, want)


def test_model_average_pulls_every_replica_towards_the_mean() -> None:
    alpha, params = 0.4, replicas(3)
    means = [sum(p[k] for p in params) / 3 for k in range(2)]
    expected = [[(1 - alpha) * p[k] + alpha * means[k] for k in range(2)] for p in params]
    group = ThreadAverager(3)
    counts = run_round([ModelAverage(alpha, group.member(i)) for i in range(3)], params)
    assert counts == [3, 3, 3]
    for got, want in zip(params, expected):
        for a, b in zip(got, want):
            assert torch.allclose(a, b)


def bmuf_by_hand(params, global_, momentum, block_lr, mu, nesterov, alpha):
    """One BMUF round of every replica, written out (fairseq's BMUF, then the elastic step)."""
    mean = [sum(p[k] for p in params) / len(params) for k in range(len(global_))]
    momentum = [mu * m + block_lr * (a - g) for m, a, g in zip(momentum, mean, global_)]
    global_ = [g + m for g, m in zip(global_, momentum)]
    target = [g + mu * m for g, m in zip(global_, momentum)] if nesterov else global_
    params = [[(1 - alpha) * w + alpha * t for w, t in zip(p, target)] for p in params]
    return params, global_, momentum


@pytest.mark.parametrize("nesterov", [False, True])
def test_bmuf_follows_block_momentum_over_several_rounds(nesterov: bool) -> None:
    alpha, block_lr, mu = 0.5, 0.8, 0.875
    params = replicas(2)
    initial = [t.clone() for t in params[0]]
    group = ThreadAverager(2)
    rules = [Bmuf(alpha, group.member(i), initial, block_lr, mu, nesterov) for i in range(2)]
    ref_params = [[t.clone() for t in p] for p in params]
    ref_global, ref_momentum = [t.clone() for t in initial], [torch.zeros_like(t) for t in initial]
    for step in range(3):
        for p in params:  # the workers train between rounds
            for t in p:
                t.add_(0.1 * (step + 1))
        for p in ref_params:
            for t in p:
                t.add_(0.1 * (step + 1))
        run_round(rules, params)
        ref_params, ref_global, ref_momentum = bmuf_by_hand(ref_params, ref_global, ref_momentum, block_lr, mu,
                                                            nesterov, alpha)
        for got, want in zip(params, ref_params):
            for a, b in zip(got, want):
                assert torch.allclose(a, b, atol=1e-6), step


def test_bmuf_without_momentum_and_unit_step_is_model_average() -> None:
    alpha = 0.3
    ma_params, bmuf_params = replicas(2), replicas(2)
    initial = [t.clone() for t in bmuf_params[0]]
    ma_group, bmuf_group = ThreadAverager(2), ThreadAverager(2)
    ma = [ModelAverage(alpha, ma_group.member(i)) for i in range(2)]
    bmuf = [Bmuf(alpha, bmuf_group.member(i), initial, 1.0, 0.0) for i in range(2)]
    run_round(ma, ma_params)
    run_round(bmuf, bmuf_params)
    for a, b in zip(ma_params, bmuf_params):
        for x, y in zip(a, b):
            assert torch.allclose(x, y, atol=1e-6)


def test_alpha_zero_leaves_every_replica_alone() -> None:
    params = replicas(2)
    before = [[t.clone() for t in p] for p in params]
    group = ThreadAverager(2)
    run_round([ModelAverage(0.0, group.member(i)) for i in range(2)], params)
    central = CentralCopy(replicas(1, seed=9)[0])
    Easgd(0.0, central, lambda: 1).round(params[0], True)
    for got, want in zip(params, before):
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def test_a_trainer_that_leaves_does_not_hang_the_others() -> None:
    group = ThreadAverager(3)
    members = [group.member(i) for i in range(3)]
    params = replicas(3)
    done = []

    def survivor(i):
        for _ in range(3):
            members[i].mean(params[i], True)
        done.append(i)

    threads = [threading.Thread(target=survivor, args=(i,), daemon=True) for i in (0, 1)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    members[2].leave()  # trainer 2 died before its first round
    for thread in threads:
        thread.join(5)
    assert sorted(done) == [0, 1]


def test_shadow_threads_sync_until_every_trainer_is_out_of_data_then_stop() -> None:
    """Trainer 0 runs out of data first; both shadow threads keep syncing until trainer 1 is done
    too (a collective needs everyone), then both stop on the same round."""
    group = ThreadAverager(2)
    params = replicas(2)
    training = [threading.Event(), threading.Event()]
    for event in training:
        event.set()
    shadows = [ShadowThread(ModelAverage(0.5, group.member(i)), params[i], training[i].is_set).start()
               for i in range(2)]
    time.sleep(0.05)
    training[0].clear()
    time.sleep(0.05)
    assert all(s.thread.is_alive() for s in shadows)
    training[1].clear()
    for shadow in shadows:
        shadow.join(5)
        assert not shadow.thread.is_alive()
    assert shadows[0].syncs == shadows[1].syncs > 2


def test_stop_ends_the_shadow_threads_of_every_rule() -> None:
    group = ThreadAverager(2)
    params = replicas(2)
    shadows = [ShadowThread(ModelAverage(0.5, group.member(i)), params[i], lambda: True).start() for i in range(2)]
    central = CentralCopy(params[0])
    easgd = ShadowThread(Easgd(0.5, central, lambda: 1), replicas(1)[0], lambda: True).start()
    time.sleep(0.05)
    for shadow in [*shadows, easgd]:
        shadow.stop()  # Ctrl-C
    for shadow in [*shadows, easgd]:
        shadow.join(5)
        assert not shadow.thread.is_alive()


def test_a_stopped_trainer_leaves_the_rounds_while_its_peer_trains_on() -> None:
    """stop() (a trainer that died, Ctrl-C) ends that shadow thread after its round, even though a
    peer still trains; the peer's rounds go on without it."""
    group = ThreadAverager(2)
    params = replicas(2)
    shadows = [ShadowThread(ModelAverage(0.5, group.member(i)), params[i], lambda: True).start() for i in range(2)]
    time.sleep(0.05)
    shadows[1].stop()
    shadows[1].join(5)
    assert not shadows[1].thread.is_alive()
    before = shadows[0].syncs
    wait_until(lambda: shadows[0].syncs > before + 2)  # alone now, not waiting for trainer 1
    assert shadows[0].thread.is_alive()
    shadows[0].stop()
    shadows[0].join(5)


def test_a_background_round_waits_for_an_update_of_the_replica() -> None:
    """shadow.wait_for_update: no round while the replica is unchanged, one round per update burst;
    a stop, or the trainer out of data, ends the wait."""
    updated, training = threading.Event(), threading.Event()
    training.set()
    shadow = ShadowThread(Easgd(0.5, CentralCopy(replicas(1)[0]), lambda: 1), replicas(1)[0], training.is_set,
                          updated=updated).start()
    time.sleep(0.15)
    assert shadow.syncs == 0
    for done in range(1, 4):
        updated.set()  # (a worker thread applied a batch)
        wait_until(lambda: shadow.syncs >= done)
    time.sleep(0.15)
    assert shadow.syncs == 3  # nothing new: no more rounds
    training.clear()
    shadow.join(5)
    assert not shadow.thread.is_alive() and shadow.syncs == 4  # the last round, as its trainer stops


def test_the_cap_on_syncs_per_second_holds() -> None:
    central = CentralCopy(replicas(1)[0])
    capped = ShadowThread(Easgd(0.5, central, lambda: 1), replicas(1)[0], lambda: True, max_per_second=20).start()
    free = ShadowThread(Easgd(0.5, central, lambda: 1), replicas(1)[0], lambda: True).start()
    time.sleep(0.5)
    capped.stop()
    free.stop()
    capped.join(5)
    free.join(5)
    assert capped.syncs <= 12 and capped.syncs_per_second < 25  # 20 a second, plus the round at the start
    assert free.syncs > 5 * capped.syncs


def test_an_error_in_a_round_reaches_the_trainer() -> None:
    class Broken(Easgd):
        def round(self, params, training):
            raise RuntimeError("sync PS unreachable")

    shadow = ShadowThread(Broken(0.5, CentralCopy(replicas(1)[0]), lambda: 1), replicas(1)[0], lambda: True).start()
    with pytest.raises(RuntimeError, match="unreachable"):
        shadow.join(5)


# ---- a replica trained by several threads -----------------------------------------------------------
@pytest.mark.parametrize("kind, extra", [("adagrad", {}), ("adam", {}), ("adagrad", {"weight_decay": 0.01}),
                                         ("adam", {"weight_decay": 0.01}),
                                         ("sgd", {"momentum": 0.9, "weight_decay": 0.005}),
                                         ("sgd", {"momentum": 0.9, "nesterov": True}), ("sgd", {})])
def test_one_hogwild_thread_takes_exactly_the_torch_optimizer_step(kind: str, extra: dict) -> None:
    from cadence.config import OptimizerConfig
    from cadence.optim import dense_optimizer
    from cadence.strategies.shadowsync.dense_sync import HogwildReplica

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    mine = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    mine.load_state_dict(reference.state_dict())
    config = OptimizerConfig(dense=kind, lr=0.05, **extra)
    optimizer = dense_optimizer(config, list(reference.parameters()))
    replica = HogwildReplica(mine, dense_optimizer(config, list(mine.parameters())))
    for step in range(5):
        inputs = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        reference(inputs).pow(2).mean().backward()
        optimizer.step()
        grads, _ = replica.gradients(mine(inputs).pow(2).mean())
        replica.apply(grads)
        for a, b in zip(reference.parameters(), mine.parameters()):
            assert torch.equal(a, b), (kind, step)


def test_hogwild_threads_train_one_replica_without_touching_its_grad_fields() -> None:
    from cadence.strategies.shadowsync.dense_sync import HogwildReplica

    torch.manual_seed(1)
    target = torch.randn(4, 1)
    model = torch.nn.Linear(4, 1, bias=False)
    replica = HogwildReplica(model, torch.optim.Adagrad(model.parameters(), lr=0.1))
    inputs = torch.randn(256, 4, generator=torch.Generator().manual_seed(2))

    def loss() -> torch.Tensor:
        return (model(inputs) - inputs @ target).pow(2).mean()

    before = float(loss().detach())

    def worker(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        for _ in range(100):
            batch = inputs[torch.randint(256, (16,), generator=generator)]
            grads, _ = replica.gradients((model(batch) - batch @ target).pow(2).mean())
            replica.apply(grads)

    threads = [threading.Thread(target=worker, args=(seed,), daemon=True) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(p.grad is None for p in model.parameters())
    assert float(loss().detach()) < 0.2 * before


# ---- the foreground baselines (fr-*) --------------------------------------------------------------
def test_no_batch_waits_for_a_round_once_the_sync_thread_is_gone() -> None:
    """The round raised and the sync thread ended: the workers' later batches never wait for a
    round (they would wait forever), so the trainer can reach the epoch's end and report the error."""
    class Broken(Easgd):
        def round(self, params, training):
            raise RuntimeError("broken")

    gate = ForegroundGate(1)
    shadow = ShadowThread(Broken(0.5, CentralCopy(replicas(1)[0]), lambda: 1), replicas(1)[0], lambda: True,
                          gate=gate).start()
    gate.begin()
    gate.end()  # the k-th batch: the round runs, and raises
    shadow.thread.join(5)
    assert not shadow.thread.is_alive() and shadow.error is not None

    def batches() -> None:
        for _ in range(3):
            gate.begin()
            gate.end()

    worker = threading.Thread(target=batches, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "a batch waits for a round that will never come"


def test_a_foreground_round_runs_every_k_batches_with_no_batch_in_flight() -> None:
    from cadence.strategies.shadowsync.dense_sync import DenseSync, ForegroundGate

    gate = ForegroundGate(every=3)
    seen: list[tuple[int, int]] = []  # (batches done, batches in flight) at each round

    class Recording(DenseSync):
        def round(self, params, training):
            seen.append((gate.done, gate.active))
            return 1

    left = {"batches": 10}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if left["batches"] == 0:
                    return
                left["batches"] -= 1
            with gate.batch():
                time.sleep(0.01)

    training = threading.Event()
    training.set()
    shadow = ShadowThread(Recording(0.5), [], training.is_set, gate=gate).start()
    workers = [threading.Thread(target=worker, daemon=True) for _ in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(10)
    training.clear()
    gate.finish()
    shadow.join(5)
    assert not shadow.thread.is_alive()
    assert all(active == 0 for _, active in seen), seen  # the workers were paused
    done = [count for count, _ in seen]
    # the third batch to finish pauses the others; the one in flight then finishes too
    assert all(3 <= b - a <= 4 for a, b in zip([0] + done, [d for d in done if d < 10])), done
    assert len([d for d in done if d < 10]) >= 2, done  # rounds during training, not only at its end
    assert done[-1] == 10, done  # and one round at the end


def test_a_central_copy_sync_stops_with_its_own_trainer() -> None:
    """EASGD has no collective: a trainer out of data stops syncing (pulling the centre towards a
    replica that no longer learns), while the others go on."""
    central = CentralCopy(replicas(1)[0])
    mine, other = threading.Event(), threading.Event()
    mine.set()
    other.set()
    count = lambda: int(mine.is_set()) + int(other.is_set())  # noqa: E731
    shadow = ShadowThread(Easgd(0.5, central, count), replicas(1)[0], mine.is_set).start()
    time.sleep(0.05)
    mine.clear()
    shadow.join(5)
    assert not shadow.thread.is_alive() and other.is_set()


class BusyRound:
    """A background rule whose round burns ``seconds`` of this thread's CPU; records when each ran."""

    collective = False

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.spans: list[tuple[float, float]] = []  # (start, end) of each round, perf_counter

    def round(self, params, training) -> int:
        start = time.perf_counter()
        cpu = time.thread_time()
        while time.thread_time() - cpu < self.seconds:
            pass
        self.spans.append((start, time.perf_counter()))
        return 1


@pytest.mark.parametrize("share", [0.0, 0.1])
def test_a_cpu_share_spaces_the_shadow_threads_rounds(share: float) -> None:
    """shadow.cpu_share: a round of c CPU seconds starts c / share after the previous one began, so
    the thread runs at most ``share`` of a core (its own CPU clock over the wall time); without the
    cap the rounds follow each other at once and the thread takes a whole core."""
    rule = BusyRound(0.01)
    shadow = ShadowThread(rule, [], lambda: True, cpu_share=share).start()
    wait_until(lambda: len(rule.spans) >= 6)
    shadow.stop()
    shadow.join(5)
    spans = rule.spans[:6]
    gaps = [later[0] - earlier[0] for earlier, later in zip(spans, spans[1:])]
    busy = shadow.cpu_seconds / shadow.seconds
    if share:
        assert min(gaps) >= 0.01 / share * 0.95  # each round began >= c / share after the last
        assert busy <= share * 1.5
    else:
        assert max(gaps) < 0.01 / 0.1 * 0.5  # back to back (a CPU-starved round takes longer)
        assert busy > 0.3
