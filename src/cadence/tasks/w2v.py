"""word2vec (``task: w2v``): skip-gram with negative sampling, as word2vec.c and gensim define it
(Mikolov et al. 2013, "Distributed Representations of Words and Phrases and their
Compositionality").

Rows: one key space of ``2 V`` rows of ``dim`` floats: input vectors (keys 0..V-1, the word
vectors evaluated and exported) and output vectors (keys V..2V-1, starting at zero as in
word2vec). Input vectors start as N(0, ``model.init_std``^2) (word2vec draws uniform(-0.5/dim,
0.5/dim): the configs set the same variance, ``init_std = 0.289 / dim``). No dense module.

An epoch: each token is kept with word2vec's subsampling probability (``w2v.sample``, drawn per
epoch from the run's seed) and the kept tokens of a sentence close up, as in word2vec; the kept
positions are shuffled into batches of ``train.batch_size`` centre words. Per centre, the window is
drawn from 1..``w2v.window`` (``w2v.shrink_window``) and stays inside the sentence. As in
word2vec.c's skip-gram, each (centre, context) pair trains the *context* word's input vector to
predict the centre word's output vector against ``w2v.negatives`` noise words drawn from the
unigram^0.75 distribution.

Loss and learning rate: the batch loss is the **sum** over its pairs of
``-log s(u.v) - sum_k log s(-u.n_k)`` (word2vec's per-pair SGD step, applied for the whole batch at
once), multiplied by ``alpha_t / optimizer.lr`` where ``alpha_t`` decays linearly from
``optimizer.lr`` to ``w2v.min_lr`` over the run (as gensim's ``alpha`` -> ``min_alpha``). With the
``sgd`` entity optimizer (the shipped config) this is exactly an SGD step of size ``alpha_t``; the
factor is a function of (epoch, batch index), so every strategy and runtime sees the same rate.

Updates (``w2v.update``): ``batch`` (the default) returns the loss above and the runtime applies the
batch's summed gradient once, under every strategy. ``pair`` is word2vec's own loop
(``compiled.skipgram_in_place``): the batch's centre words are split among the threads, and each
thread draws its centres' windows and noise words in the kernel and applies every pair's SGD step
of size ``alpha_t`` to the rows in place at once (Hogwild between threads, as word2vec.c and
gensim); a noise word equal to the centre word is skipped, as there. It runs under ``sync`` and
``async`` on one process (the pipeline), on the CPU, with the ``sgd`` entity optimizer.

Evaluation (primary metric ``wordsim353``): Spearman correlation on WordSim353 and SimLex-999 and
accuracy on the analogy questions, computed as gensim does (``cadence.evaluation.word_vectors``).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cadence import compiled
from cadence.config import Config
from cadence.data.corpus import Corpus, keep_probabilities, load_corpus, noise_distribution
from cadence.errors import ConfigError
from cadence.evaluation.word_vectors import evaluate_word_vectors
from cadence.prediction.word_vectors import W2vPredictor
from cadence.core.batch import Batch, BatchPlan, plan_epoch, unique_keys
from cadence.seeding import derive_seed
from cadence.tasks.base import (TASKS, ParameterView, Progress, TablePart, TableSpec, Task, Vocabulary, in_place_key,
                                write_vectors_tsv)


class SkipGramLoss(torch.autograd.Function):
    """The batch loss with its gradient written out (one gather and one scatter per side, no
    autograd graph through the gathers):

        u_p = input vector of pair p's context word; v_p0 = output vector of its centre word,
        v_pk = output vectors of its noise words (k = 1..K), s_pk = <v_pk, u_p>
        loss = rate * sum_p (softplus(-s_p0) + sum_k softplus(s_pk))
        d loss / d s_pk = rate * (sigmoid(s_pk) - [k = 0])

    ``tests/tasks/test_w2v.py`` checks it against autograd through the plain formula."""

    @staticmethod
    def forward(ctx, rows: Tensor, inputs: Tensor, outputs: Tensor, rate: Tensor) -> Tensor:
        # column by column: [P, D] temporaries stay in cache, where one [P, 1 + K, D] gather did not
        u = rows.index_select(0, inputs)  # [P, D]
        scores = torch.stack([(rows.index_select(0, column) * u).sum(1) for column in outputs.unbind(1)], 1)
        signs = torch.ones_like(scores[:1])
        signs[0, 0] = -1.0
        ctx.save_for_backward(rows, u, scores, inputs, outputs, rate)
        return F.softplus(scores * signs).sum() * rate

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows, u, scores, inputs, outputs, rate = ctx.saved_tensors
        coefficients = torch.sigmoid(scores)
        coefficients[:, 0] -= 1.0
        coefficients.mul_(grad * rate)
        gradient = torch.zeros_like(rows)
        grad_u = torch.zeros_like(u)
        for k, column in enumerate(outputs.unbind(1)):
            weight = coefficients[:, k:k + 1]
            grad_u.addcmul_(weight, rows.index_select(0, column))
            gradient.index_add_(0, column, weight * u)
        gradient.index_add_(0, inputs, grad_u)
        return gradient, None, None, None


class CompiledSkipGramLoss(compiled.KernelLoss):
    """``SkipGramLoss`` in one compiled pass over the batch's pairs (``cadence.compiled``): the
    forward computes the loss and its gradient together, pair by pair as word2vec's loop, the
    backward scales the gradient."""

    @staticmethod
    def forward(ctx, rows: Tensor, inputs: Tensor, outputs: Tensor, rate: Tensor) -> Tensor:
        return compiled.KernelLoss.keep(ctx, rows, *compiled.skipgram_loss_and_gradient(rows, inputs, outputs,
                                                                                        float(rate)))


class AliasTable:
    """Draws from a discrete distribution in O(1) per sample (Walker's alias method, Vose's
    construction): column i keeps itself with probability ``keep[i]``, else gives ``alias[i]``."""

    def __init__(self, probabilities: Tensor):
        size = probabilities.shape[0]
        scaled = (probabilities.double() * size).tolist()
        keep, alias = [1.0] * size, list(range(size))
        small = [i for i, p in enumerate(scaled) if p < 1.0]
        large = [i for i, p in enumerate(scaled) if p >= 1.0]
        while small and large:
            low, high = small.pop(), large.pop()
            keep[low], alias[low] = scaled[low], high
            scaled[high] -= 1.0 - scaled[low]
            (small if scaled[high] < 1.0 else large).append(high)
        self.keep = torch.tensor(keep, dtype=torch.float64)
        self.alias = torch.tensor(alias, dtype=torch.int64)

    def sample(self, count: int, generator: torch.Generator) -> Tensor:
        columns = torch.randint(self.keep.shape[0], (count,), generator=generator)
        stay = torch.rand(count, generator=generator, dtype=torch.float64) < self.keep[columns]
        return torch.where(stay, columns, self.alias[columns])


@TASKS.register("w2v")
class Word2VecTask(Task):
    name = "w2v"
    primary_metric = "wordsim353"
    own_keys = ("w2v",)
    loss_reduction = "sum"
    export_formats = ("npy", "word2vec", "tsv")

    def __init__(self, config: Config, corpus: Corpus | None = None):
        super().__init__(config)
        self.data_given = corpus is not None
        if config.model.name != "skipgram":
            raise ConfigError(f"model.name: the w2v task has one model, skipgram; got {config.model.name!r}")
        w2v = config.w2v
        self.corpus = corpus if corpus is not None else load_corpus(config.data.dataset, w2v.min_count, w2v.max_vocab)
        self.vocabulary_size = len(self.corpus.words)
        if self.vocabulary_size < 2:
            raise ConfigError(f"data.dataset: {self.vocabulary_size} words occur at least w2v.min_count="
                              f"{w2v.min_count} times; nothing to train")
        # the kernels' first calls outside the epochs
        compiled.warm_up(*(("skipgram_in_place",) if self.updates_in_place else
                           ("unique_keys", *(("skipgram",) if config.train.compiled else ()))))
        self.keep = keep_probabilities(self.corpus.counts, w2v.sample).float()
        self.noise = AliasTable(noise_distribution(self.corpus.counts))
        starts = self.corpus.sentence_starts
        lengths = starts[1:] - starts[:-1]
        self.sentence_of = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths)

    update_choice = ("w2v.update", "pair")

    @classmethod
    def in_place_setting(cls, config: Config) -> str | None:
        if config.w2v.update != "pair":
            return None
        return in_place_key(config, "w2v.update", "word2vec's per-pair updates (pair)", "sgd")

    @property
    def dataset_name(self) -> str:
        return self.corpus.name

    def data_parts(self) -> dict[str, tuple]:
        corpus = self.corpus
        return {"vocabulary": (corpus.words, corpus.counts), "corpus": (corpus.tokens, corpus.sentence_starts)}

    def table(self) -> TableSpec:
        size = self.vocabulary_size
        return TableSpec(2 * size, self.config.model.dim, self.config.model.init_std,
                         derive_seed(self.config.seed, "w2v-table"),
                         (TablePart("input", 0, size), TablePart("output", size, size, zero=True)))

    def build_dense(self) -> nn.Module:
        return nn.Module()  # no dense parameters

    def keeping(self, kept: Vocabulary, keys: Tensor) -> "Word2VecTask":
        """Kept words appended to the vocabulary with a count of 0 (never drawn as a negative, never
        in the corpus), their input and output vectors both kept."""
        corpus = self.corpus
        words = [word for word in kept.parts.get("input", ()) if word not in corpus.index]
        grown = dataclasses.replace(corpus, words=[*corpus.words, *words],
                                    counts=torch.cat([corpus.counts, torch.zeros(len(words), dtype=corpus.counts.dtype)]),
                                    index={**corpus.index, **{w: len(corpus.words) + i for i, w in enumerate(words)}})
        return Word2VecTask(self.config, grown)

    def vocabulary(self) -> Vocabulary:
        """Each word's input vector, then each word's output vector."""
        words = tuple(self.corpus.words)
        return Vocabulary({"input": words, "output": words})

    # ---- batches --------------------------------------------------------------------------------
    def _stream(self, epoch: int) -> tuple[Tensor, Tensor]:
        """The epoch's kept tokens and their sentence ids (subsampling drawn from (seed, epoch))."""
        if not hasattr(self, "_cache_lock"):
            self._cache_lock = threading.Lock()
        with self._cache_lock:
            cached = getattr(self, "_cache_stream", None)
            if cached is None or cached[0] != epoch:
                generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "w2v-subsample", epoch))
                tokens = self.corpus.tokens
                kept = torch.rand(tokens.shape[0], generator=generator) < self.keep[tokens]
                cached = (epoch, tokens[kept], self.sentence_of[kept])
                self._cache_stream = cached
            return cached[1], cached[2]

    def plan(self, epoch: int) -> list[BatchPlan]:
        tokens, _ = self._stream(epoch)
        return plan_epoch(tokens.shape[0], self.config.train.batch_size, self.config.seed, epoch, "w2v-shuffle")

    def prepare(self, plan: BatchPlan) -> Batch:
        if self.updates_in_place:  # the kernel draws the windows and noise words (``step_in_place``)
            return Batch(plan, torch.empty(0, dtype=torch.int64), {"rate": self._rate(plan)})
        tokens, sentences = self._stream(plan.epoch)
        window = self.config.w2v.window
        generator = plan.generator(self.config.seed)
        centres = plan.examples  # positions in the epoch's stream
        if self.config.w2v.shrink_window:
            reach = torch.randint(1, window + 1, (centres.shape[0],), generator=generator)
        else:
            reach = torch.full((centres.shape[0],), window)
        offsets = torch.cat([torch.arange(-window, 0), torch.arange(1, window + 1)])
        positions = centres.unsqueeze(1) + offsets  # [B, 2W]
        inside = (positions >= 0) & (positions < tokens.shape[0]) & (offsets.abs() <= reach.unsqueeze(1))
        positions = positions.clamp(0, tokens.shape[0] - 1)
        inside &= sentences[positions] == sentences[centres].unsqueeze(1)
        pair_centre, pair_slot = inside.nonzero().unbind(1)
        context_words = tokens[positions[pair_centre, pair_slot]]  # input vectors
        centre_words = tokens[centres[pair_centre]]  # output vectors: the positive targets
        pairs, negatives = context_words.shape[0], self.config.w2v.negatives
        noise = self.noise.sample(pairs * negatives, generator)
        size = self.vocabulary_size
        ids, local = unique_keys(torch.cat([context_words, centre_words + size, noise + size]), 2 * size)
        outputs = torch.cat([local[pairs:2 * pairs].unsqueeze(1), local[2 * pairs:].view(pairs, negatives)], 1)
        return Batch(plan, ids, {"inputs": local[:pairs], "outputs": outputs, "rate": self._rate(plan)})

    def _rate(self, plan: BatchPlan) -> Tensor:
        """alpha_t / optimizer.lr for this batch (the linear decay, a function of epoch and index)."""
        batches = -(-self._stream(plan.epoch)[0].shape[0] // self.config.train.batch_size)
        progress = (plan.epoch + plan.index / max(1, batches)) / max(1, self.num_epochs())
        lr, final = self.config.optimizer.lr, self.config.w2v.min_lr
        return torch.tensor(max(final, lr - (lr - final) * progress) / lr)

    def loss(self, batch: Batch, rows: Tensor, dense: nn.Module) -> Tensor:
        kind = CompiledSkipGramLoss if self.config.train.compiled and compiled.usable(rows) else SkipGramLoss
        return kind.apply(rows, batch.inputs["inputs"], batch.inputs["outputs"], batch.inputs["rate"])

    def step_in_place(self, batch: Batch, values: Tensor, part: int, parts: int) -> float:
        """word2vec's loop over this part's share of the batch's centres (a contiguous slice of the
        shuffled positions), in place on ``values`` (``compiled.skipgram_in_place``); every draw is
        a function of (seed, epoch, position), so a centre trains on the same window and noise words
        however the batch is split. The loss is scaled by the batch's rate, as ``loss`` is."""
        tokens, sentences = self._stream(batch.plan.epoch)
        centres, w2v = batch.plan.examples, self.config.w2v
        size = centres.shape[0]
        rate = float(batch.inputs["rate"])
        total, _ = compiled.skipgram_in_place(
            values, tokens, sentences, centres[part * size // parts:(part + 1) * size // parts], w2v.window,
            w2v.shrink_window, w2v.negatives, self.noise.keep, self.noise.alias, self.vocabulary_size,
            derive_seed(self.config.seed, "w2v-pairs", batch.plan.epoch), self.config.optimizer.lr * rate)
        return total * rate

    # ---- evaluation -----------------------------------------------------------------------------
    def vectors(self, params: ParameterView) -> Tensor:
        return params.values(torch.arange(self.vocabulary_size))

    def evaluate(self, params: ParameterView, dense: nn.Module, split: str, device: torch.device,
                 progress: Progress) -> dict[str, float]:
        if split not in ("valid", "test"):
            raise ConfigError(f"split must be valid or test for the w2v task (both evaluate the word-vector "
                              f"benchmarks), got {split!r}")
        return evaluate_word_vectors(self.vectors(params), self.corpus.words)

    # ---- prediction ------------------------------------------------------------------------------
    predictor_type = W2vPredictor

    def predictor(self, params: ParameterView, dense: nn.Module) -> W2vPredictor:
        return W2vPredictor(self.config, self.corpus.words, params)

    # ---- outputs --------------------------------------------------------------------------------
    def export(self, params: ParameterView, dense: nn.Module, run_dir: Path, out: Path, format: str) -> list[Path]:
        """``word2vec``: ``vectors.txt`` in word2vec's text format (``V dim``, then ``word v1 .. vdim``
        per line), which ``gensim.models.KeyedVectors.load_word2vec_format`` reads; ``npy``:
        ``vectors.npy`` [V, dim] and ``vocabulary.tsv`` (word and count, by row); ``tsv``: ``vectors.tsv``
        (word, then its vector)."""
        if format == "tsv":
            return [write_vectors_tsv(out / "vectors.tsv", self.corpus.words, self.vectors(params))]
        vectors = self.vectors(params).numpy()
        words, counts = self.corpus.words, self.corpus.counts.tolist()
        if format == "word2vec":
            path = out / "vectors.txt"
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(f"{vectors.shape[0]} {vectors.shape[1]}\n")
                for word, row in zip(words, vectors):
                    handle.write(word + " " + " ".join(f"{x:.6g}" for x in row) + "\n")
            return [path]
        np.save(out / "vectors.npy", vectors)
        (out / "vocabulary.tsv").write_text("".join(f"{w}\t{c}\n" for w, c in zip(words, counts)), encoding="utf-8")
        return [out / "vectors.npy", out / "vocabulary.tsv"]
