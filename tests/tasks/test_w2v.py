"""The word2vec task against independent references: the pairs of an epoch against a naive
enumeration of every window, subsampling and noise frequencies against their formulas, the loss
against a per-pair loop, the learning-rate decay, and the word2vec text export."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from cadence import api
from cadence.config import load_config
from cadence.data.corpus import build_corpus
from cadence.tasks.w2v import Word2VecTask
from tests.conftest import make_config


def tiny_corpus(seed: int = 0, sentences: int = 40):
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(12)]
    text = [[rng.choice(vocabulary[: rng.randrange(2, 12)]) for _ in range(rng.randrange(1, 9))]
            for _ in range(sentences)]
    return text, build_corpus(text, min_count=1)


def task_for(corpus, *overrides: str) -> Word2VecTask:
    config = load_config(None, ["task=w2v", "model.name=skipgram", "model.dim=4", "train.batch_size=7",
                                "w2v.sample=0", *overrides])
    return Word2VecTask(config, corpus=corpus)


def epoch_pairs(task: Word2VecTask, epoch: int = 0) -> Counter:
    """(context word, centre word) of every pair the task's batches train in one epoch."""
    pairs: Counter = Counter()
    size = task.vocabulary_size
    for plan in task.plan(epoch):
        batch = task.prepare(plan)
        inputs = batch.ids[batch.inputs["inputs"]].tolist()
        targets = (batch.ids[batch.inputs["outputs"][:, 0]] - size).tolist()
        pairs.update(zip(inputs, targets))
    return pairs


def test_an_epoch_trains_every_pair_within_the_window_of_each_sentence_once() -> None:
    text, corpus = tiny_corpus()
    task = task_for(corpus, "w2v.window=3", "w2v.shrink_window=false")
    expected: Counter = Counter()
    for sentence in text:
        ids = [corpus.index[w] for w in sentence]
        for i, centre in enumerate(ids):
            for j in range(max(0, i - 3), min(len(ids), i + 4)):
                if j != i:
                    expected[(ids[j], centre)] += 1
    assert epoch_pairs(task) == expected


def test_a_shrunk_window_is_drawn_uniformly_from_one_to_window() -> None:
    text, corpus = tiny_corpus(sentences=400)
    task = task_for(corpus, "w2v.window=4")
    total = sum(epoch_pairs(task, epoch).total() for epoch in range(3)) / 3
    full = sum(epoch_pairs(task_for(corpus, "w2v.window=4", "w2v.shrink_window=false")).values())
    # a centre's reach b ~ U{1..4} keeps an offset d with probability (5 - d) / 4: fewer pairs than full
    assert 0.45 * full < total < 0.8 * full


def test_subsampling_keeps_each_word_with_its_probability() -> None:
    text, corpus = tiny_corpus(sentences=3000)
    task = task_for(corpus, "w2v.sample=0.01")
    counts = torch.bincount(task._stream(0)[0], minlength=task.vocabulary_size).double()
    threshold = 0.01 * corpus.counts.sum().item()
    for word, count in enumerate(corpus.counts.tolist()):
        keep = min(1.0, (math.sqrt(count / threshold) + 1) * threshold / count)
        assert counts[word] / count == pytest.approx(keep, abs=4 * math.sqrt(keep * (1 - keep) / count) + 1e-9)
    assert not torch.equal(task._stream(0)[0], task._stream(1)[0])  # drawn anew each epoch


def test_noise_words_follow_the_unigram_three_quarters_distribution() -> None:
    text, corpus = tiny_corpus(sentences=2000)
    task = task_for(corpus, "w2v.negatives=20", "train.batch_size=512")
    drawn = Counter()
    for plan in task.plan(0):
        batch = task.prepare(plan)
        drawn.update((batch.ids[batch.inputs["outputs"][:, 1:]].flatten() - task.vocabulary_size).tolist())
    total = sum(drawn.values())
    weights = corpus.counts.double() ** 0.75
    for word, weight in enumerate((weights / weights.sum()).tolist()):
        assert drawn[word] / total == pytest.approx(weight, abs=4 * math.sqrt(weight / total) + 1e-3)


def test_the_loss_is_the_summed_negative_sampling_objective_scaled_by_the_decayed_rate() -> None:
    _, corpus = tiny_corpus()
    task = task_for(corpus, "optimizer.lr=0.5", "w2v.min_lr=0.1", "train.epochs=2")
    plans = task.plan(1)
    batch = task.prepare(plans[-1])
    rows = torch.randn(batch.ids.shape[0], 4, dtype=torch.float64)
    expected = 0.0
    for p in range(batch.inputs["inputs"].shape[0]):
        u = rows[batch.inputs["inputs"][p]]
        target, *noise = batch.inputs["outputs"][p].tolist()
        expected -= math.log(torch.sigmoid(u @ rows[target]).item())
        for n in noise:
            expected -= math.log(torch.sigmoid(-(u @ rows[n])).item())
    progress = (1 + (len(plans) - 1) / len(plans)) / 2
    rate = (0.5 - (0.5 - 0.1) * progress) / 0.5
    assert float(task.loss(batch, rows, None)) == pytest.approx(expected * rate, rel=1e-6)
    assert float(task._rate(task.plan(0)[0])) == 1.0


@pytest.mark.parametrize("kind", ["torch", "compiled"])
def test_the_written_out_gradient_equals_autograd_through_the_formula(kind: str) -> None:
    """Both formulations: the torch ops (float64 here) and the compiled kernel (float32, the
    store's type; scores up to +-12, where a naive sigmoid or softplus would overflow)."""
    from cadence import compiled
    from cadence.tasks.w2v import CompiledSkipGramLoss, SkipGramLoss

    if kind == "compiled" and not compiled.AVAILABLE:
        pytest.skip("numba is not installed")
    function, dtype = {"torch": (SkipGramLoss, torch.float64), "compiled": (CompiledSkipGramLoss, torch.float32)}[kind]
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(20, 5, generator=generator, dtype=dtype) * 1.5
    inputs = torch.randint(0, 8, (40,), generator=generator)  # repeats: gradients add up per row
    outputs = torch.randint(8, 20, (40, 4), generator=generator)
    rate = torch.tensor(0.7, dtype=dtype)

    def plain(rows):
        u, v = rows[inputs], rows[outputs]
        scores = (v * u.unsqueeze(1)).sum(2)
        return (torch.nn.functional.softplus(-scores[:, 0]).sum() + torch.nn.functional.softplus(scores[:, 1:]).sum()) * rate

    first, second = rows.clone().requires_grad_(True), rows.clone().requires_grad_(True)
    expected, fused = plain(first), function.apply(second, inputs, outputs, rate)
    (2.0 * expected).backward()
    (2.0 * fused).backward()
    assert torch.allclose(fused, expected, rtol=1e-5)
    assert torch.allclose(second.grad, first.grad, rtol=1e-4, atol=1e-5)


def test_training_uses_the_compiled_kernel_on_the_cpu_unless_told_not_to(task_data, tmp_path: Path) -> None:
    """``train.compiled`` picks the formulation; both train the same vectors up to float32 rounding."""
    from cadence import compiled

    if not compiled.AVAILABLE:
        pytest.skip("numba is not installed")
    vectors, kinds = {}, {}
    for flag in ("true", "false"):
        config = make_config(tmp_path / flag, *task_data["w2v"], f"train.compiled={flag}")
        task = Word2VecTask(api.prepare_config(config))
        batch = task.prepare(task.plan(0)[0])
        rows = torch.randn(batch.ids.shape[0], config.model.dim, requires_grad=True)
        kinds[flag] = type(task.loss(batch, rows, None).grad_fn).__name__
        _, trained, view, _ = api.load_model(api.train(config).run_dir)
        vectors[flag] = view.values(torch.arange(2 * trained.vocabulary_size))
    assert kinds["true"].startswith("CompiledSkipGramLoss") and kinds["false"].startswith("SkipGramLoss")
    assert torch.allclose(vectors["true"], vectors["false"], atol=1e-5)


def test_output_vectors_start_at_zero_and_input_vectors_do_not() -> None:
    _, corpus = tiny_corpus()
    task = task_for(corpus, "model.init_std=0.1")
    spec = task.table()
    values = spec.initial_values(torch.arange(spec.rows))
    assert bool((values[task.vocabulary_size:] == 0).all()) and bool((values[: task.vocabulary_size] != 0).all())


def test_word2vec_export_is_the_text_format(task_data, tmp_path: Path) -> None:
    result = api.train(make_config(tmp_path / "run", *task_data["w2v"]))
    (path,) = api.export(result.run_dir, tmp_path / "out", "word2vec")
    lines = path.read_text(encoding="utf-8").splitlines()
    vocabulary, dim = map(int, lines[0].split())
    assert len(lines) == vocabulary + 1 and all(len(line.split()) == dim + 1 for line in lines[1:])
    _, task, view, _ = api.load_model(result.run_dir)
    first = lines[1].split()
    assert first[0] == task.corpus.words[0]
    assert [float(x) for x in first[1:]] == pytest.approx(view.values(torch.tensor([0]))[0].tolist(), rel=1e-5)
