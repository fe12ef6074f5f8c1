"""word2vec's own loop (``w2v.update: pair``) against independent references: the generator against
splitmix64's published output, the compiled in-place loop against a per-pair Python loop that draws
the same numbers, a batch split into parts against the whole, the parts' overlap in time, the
strategies that run it (async against its sequential twin) and the ones that refuse it."""

from __future__ import annotations

import math
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cadence import api, compiled
from cadence.config import load_config
from cadence.data.corpus import build_corpus
from cadence.errors import ConfigError
from cadence.pipeline.stages import InPlaceStage
from cadence.seeding import derive_seed
from cadence.store.embedding_store import create_store
from cadence.tasks.w2v import Word2VecTask
from tests.conftest import make_config
from tests.tasks.test_w2v import tiny_corpus

pytestmark = pytest.mark.skipif(not compiled.AVAILABLE, reason="numba is not installed")


def pair_task(corpus, *overrides: str) -> Word2VecTask:
    config = load_config(None, ["task=w2v", "model.name=skipgram", "model.dim=6", "train.batch_size=9",
                                "w2v.sample=0", "w2v.update=pair", "optimizer.entity=sgd", "optimizer.lr=0.3",
                                "w2v.min_lr=0.05", "train.epochs=2", *overrides])
    return Word2VecTask(config, corpus=corpus)


def initial_table(task: Word2VecTask, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(2 * task.vocabulary_size, task.config.model.dim, generator=generator) * 0.4).contiguous()


def reference_step(task: Word2VecTask, plan, table: np.ndarray) -> tuple[float, int]:
    """word2vec's loop written out pair by pair in numpy float32: the draws from ``compiled.draw``,
    decoded as the alias method says; each pair's steps applied at once."""
    config, w2v = task.config, task.config.w2v
    tokens, sentences = (t.tolist() for t in task._stream(plan.epoch))
    keep, alias = task.noise.keep.tolist(), task.noise.alias.tolist()
    seed = derive_seed(config.seed, "w2v-pairs", plan.epoch)
    rate = float(task._rate(plan))
    lr = np.float32(config.optimizer.lr * rate)
    size = task.vocabulary_size
    total, pairs = 0.0, 0
    for position in plan.examples.tolist():
        number, reach = 0, w2v.window
        if w2v.shrink_window:
            reach, number = 1 + compiled.draw(seed, position, 0) % w2v.window, 1
        target = tokens[position] + size
        for shift in range(-reach, reach + 1):
            context = position + shift
            if shift == 0 or not 0 <= context < len(tokens) or sentences[context] != sentences[position]:
                continue
            word = tokens[context]
            work = np.zeros(table.shape[1], np.float32)
            for k in range(w2v.negatives + 1):
                if k == 0:
                    out, label = target, 1.0
                else:
                    bits = compiled.draw(seed, position, number)
                    number += 1
                    column = bits % len(keep)
                    out = (column if (bits >> 11) / 2.0 ** 53 < keep[column] else alias[column]) + size
                    label = 0.0
                    if out == target:
                        continue
                score = float(np.dot(table[out], table[word]))
                total += math.log1p(math.exp(-score)) if label else math.log1p(math.exp(score))
                step = np.float32((label - 1.0 / (1.0 + math.exp(-score))) * lr)
                work += step * table[out]
                table[out] += step * table[word]
            table[word] += work
            pairs += 1
    return total * rate, pairs


def test_the_generator_is_splitmix64() -> None:
    # splitmix64 seeded with 0: its first outputs (Vigna's reference implementation, splitmix64.c)
    assert compiled.mix(compiled.GOLDEN) == 0xE220A8397B1DCDAF
    assert compiled.mix(2 * compiled.GOLDEN) == 0x6E789E6AA1B965F4


@pytest.mark.parametrize("shrink", [True, False])
def test_the_in_place_loop_equals_a_per_pair_python_reference(shrink: bool) -> None:
    _, corpus = tiny_corpus(sentences=60)
    task = pair_task(corpus, "w2v.window=3", "w2v.negatives=4", f"w2v.shrink_window={str(shrink).lower()}")
    plan = task.plan(1)[2]  # epoch 1, a middle batch: a decayed rate, a seed of its own
    table = initial_table(task)
    expected_table = table.numpy().copy()
    expected_loss, expected_pairs = reference_step(task, plan, expected_table)
    batch = task.prepare(plan)
    assert batch.ids.numel() == 0  # nothing to pull: the loop works on the table itself
    loss = task.step_in_place(batch, table, 0, 1)
    assert expected_pairs > 20
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(table.numpy(), expected_table, rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected_table, initial_table(task).numpy())  # (it trained something)


def test_a_batch_in_parts_trains_each_centre_as_the_whole_batch_does() -> None:
    """Each draw is a function of (seed, epoch, position): the parts one after another are the whole
    batch, bit for bit; at once (two threads) they differ only by the order of their writes, a
    second-order effect at a small step."""
    _, corpus = tiny_corpus(sentences=200)
    task = pair_task(corpus, "train.batch_size=64")
    batch = task.prepare(task.plan(0)[1])
    whole, parts = initial_table(task), initial_table(task)
    whole_loss = task.step_in_place(batch, whole, 0, 1)
    part_losses = [task.step_in_place(batch, parts, part, 3) for part in range(3)]
    assert torch.equal(whole, parts) and sum(part_losses) == pytest.approx(whole_loss, rel=1e-12)

    rng = random.Random(1)
    wide = build_corpus([[f"w{rng.randrange(3000)}" for _ in range(10)] for _ in range(2000)], min_count=1)
    small = pair_task(wide, "train.batch_size=256", "optimizer.lr=0.01", "w2v.min_lr=0.01")
    batch = small.prepare(small.plan(0)[0])
    start = initial_table(small)
    alone, stage = start.clone(), InPlaceStage(small, store_of(start), 2)
    small.step_in_place(batch, alone, 0, 1)
    try:
        stage(batch)
    finally:
        stage.close()
    moved, expected = stage.store.values - start, alone - start
    assert float((moved - expected).norm()) < 0.02 * float(expected.norm())


def store_of(values: torch.Tensor):
    store = create_store(values.shape[0], values.shape[1], 0, "memory")
    store.values.copy_(values)
    return store


def test_the_pieces_of_a_batch_run_at_once_on_the_rows_themselves() -> None:
    """Timestamps of each piece's kernel: the two threads' pieces overlap in time (the kernel
    releases the GIL), and they write the store's rows, not a copy."""
    _, corpus = tiny_corpus(sentences=3000)
    task = pair_task(corpus, "train.batch_size=4096", "w2v.negatives=20", "model.dim=200", "w2v.window=8")
    spans: list[tuple[float, float, int]] = []
    step = task.step_in_place

    def timed(batch, values, piece, pieces):
        start = time.perf_counter()
        loss = step(batch, values, piece, pieces)
        spans.append((start, time.perf_counter(), threading.get_ident()))
        return loss

    task.step_in_place = timed
    store = store_of(initial_table(task))
    before = store.values.clone()
    stage = InPlaceStage(task, store, 2)
    batch = task.prepare(task.plan(0)[0])
    overlaps = []
    try:
        for _ in range(5):  # (a busy machine may run one thread late now and then: most overlap)
            spans.clear()
            stage(batch)
            assert len(spans) == stage.pieces == 8
            by_thread: dict[int, list[tuple[float, float]]] = {}
            for start, end, thread in spans:
                by_thread.setdefault(thread, []).append((start, end))
            if len(by_thread) < 2:
                overlaps.append(0.0)
                continue
            first, second = (sorted(v) for v in by_thread.values())
            together = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in first for s2, e2 in second)
            overlaps.append(together / min(sum(e - s for s, e in first), sum(e - s for s, e in second)))
    finally:
        stage.close()
    assert sorted(overlaps)[2] > 0.5, overlaps
    assert not torch.equal(store.values, before) and math.isfinite(float(batch.loss))


def test_a_thread_kept_from_its_core_takes_fewer_pieces() -> None:
    """Pieces go to whichever thread is free: a thread made slow (here by a sleep, a unit-test
    device) trains fewer of them, and the batch takes about the fast thread's time, not twice the
    slow one's share."""
    slow_thread = []

    def job(piece: int) -> int:
        if not slow_thread:
            slow_thread.append(threading.get_ident())
        time.sleep(0.08 if threading.get_ident() == slow_thread[0] else 0.01)
        return piece

    from cadence.engines.threads import Parts

    parts = Parts(2)
    try:
        started = time.perf_counter()
        results = parts.share(job, 16)
        elapsed = time.perf_counter() - started
    finally:
        parts.close()
    assert results == list(range(16))
    # split evenly, the slow thread's 8 pieces would take 0.64 s; shared, the fast one takes most
    assert elapsed < 0.4, elapsed


def test_async_with_pair_updates_equals_its_sequential_twin(task_data, tmp_path: Path) -> None:
    """One thread: async computes its batches one at a time on the same rows (in the order its
    loaders finish them), so its model is that of sync replaying the order it recorded, bit for bit;
    and the loss falls from the first epoch to the last."""
    order = tmp_path / "order.jsonl"
    runs = {"async": ["strategy=async", "pipeline.overlap=always", "pipeline.loader_threads=3",
                      f"record_order={order}"],
            "replay": ["strategy=sync", f"batch_order={order}"]}
    values, losses = {}, {}
    for name, overrides in runs.items():
        config = make_config(tmp_path / name, *task_data["w2v"], "w2v.update=pair", "train.epochs=3", *overrides)
        result = api.train(config)
        _, task, view, _ = api.load_model(result.run_dir)
        values[name] = view.values(torch.arange(2 * task.vocabulary_size))
        losses[name] = [m["loss"] for m in result.metrics if "loss" in m]
        assert result.summary["in_place_threads"] == 1
    assert torch.equal(values["async"], values["replay"])
    assert losses["replay"][-1] < losses["replay"][0]


@pytest.mark.parametrize("overrides, message", [
    (["strategy=oac"], "strategy oac does not run such a task"),
    (["strategy=pdasgd"], "strategy pdasgd does not run such a task"),
    (["strategy=gba"], "strategy gba does not run such a task"),
    (["strategy=sync", "ps.workers=2"], "none does with ps.workers=2"),
    (["optimizer.entity=adagrad"], "optimizer.entity must be sgd"),
    (["train.compiled=false"], "it needs train.compiled on"),
])
def test_pair_updates_under_what_cannot_run_them_is_an_error_naming_the_setting(overrides, message,
                                                                                task_data, tmp_path: Path) -> None:
    config = make_config(tmp_path / "x", *task_data["w2v"], "w2v.update=pair", *overrides)
    with pytest.raises(ConfigError, match="w2v.update") as raised:
        api.train(config)
    assert message in str(raised.value)
    assert not (tmp_path / "x").exists()
