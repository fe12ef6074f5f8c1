"""gensim 4.4.0 skip-gram (negative sampling) on a tokenised corpus: the word2vec peer of cadence's w2v task.

Runs inside its own virtualenv and never imports cadence or torch:

    python3.11 -m venv .venv-bench-gensim
    .venv-bench-gensim/bin/pip install -r benchmarks/peers/requirements-gensim.txt
    .venv/bin/cadence data fetch gcide        # writes ~/.cache/cadence/datasets/gcide/corpus.txt
    .venv-bench-gensim/bin/python benchmarks/peers/gensim_contender.py --corpus ~/.cache/cadence/datasets/gcide/corpus.txt

The corpus is one sentence per line, tokens separated by spaces, already tokenised and lowercased
(cadence's ``corpus.txt``); gensim's ``LineSentence`` reads it. Training is
``Word2Vec(sg=1, hs=0, negative=...)``, timed around ``train()`` alone (the vocabulary scan is timed
apart). Evaluation is gensim's own: ``evaluate_word_pairs`` on WordSim353 and SimLex-999 (Spearman)
and ``evaluate_word_analogies`` on questions-words (accuracy), from gensim's test data, with their
defaults (restrict_vocab 300,000, case-insensitive).

Prints one JSON object. ``words_per_second`` counts gensim's *effective* words (tokens actually
trained: in-vocabulary and kept by subsampling, over all epochs, as gensim's log reports them) per
second of ``train()``; ``raw_words_per_second`` counts every corpus token (out-of-vocabulary ones
included) times epochs. With ``--workers`` > 1 gensim is not deterministic even with ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="one sentence per line, tokens separated by spaces")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--negatives", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--sample", type=float, default=1e-3)
    parser.add_argument("--alpha", type=float, default=0.025)
    parser.add_argument("--min-alpha", type=float, default=1e-4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save-vectors", help="also write the vectors in word2vec text format here")
    parser.add_argument("--verbose", action="store_true", help="gensim's INFO log on stderr")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    print(json.dumps(run(args), indent=2))


def run(args: argparse.Namespace) -> dict:
    import gensim
    import numpy
    import scipy
    from gensim.models import Word2Vec
    from gensim.models.word2vec import LineSentence
    from gensim.models.word2vec_inner import FAST_VERSION
    from gensim.test.utils import datapath

    model = Word2Vec(vector_size=args.dim, window=args.window, negative=args.negatives, sg=1, hs=0,
                     epochs=args.epochs, min_count=args.min_count, sample=args.sample, alpha=args.alpha,
                     min_alpha=args.min_alpha, workers=args.workers, seed=args.seed)
    sentences = LineSentence(args.corpus)
    started = time.perf_counter()
    model.build_vocab(sentences)
    vocab_seconds = time.perf_counter() - started
    started = time.perf_counter()
    effective_words, raw_words = model.train(sentences, total_examples=model.corpus_count, epochs=model.epochs)
    train_seconds = time.perf_counter() - started
    if args.save_vectors:
        model.wv.save_word2vec_format(args.save_vectors)

    metrics = {}
    for name, filename in (("wordsim353", "wordsim353.tsv"), ("simlex999", "simlex999.txt")):
        _, spearman, oov_percent = model.wv.evaluate_word_pairs(datapath(filename))
        metrics[name] = float(spearman[0])
        metrics[f"{name}_oov_percent"] = float(oov_percent)
    analogy, sections = model.wv.evaluate_word_analogies(datapath("questions-words.txt"))
    total = sections[-1]  # gensim's 'Total accuracy'
    metrics["analogy"] = float(analogy)
    metrics["analogy_questions"] = len(total["correct"]) + len(total["incorrect"])
    return {
        "contender": "gensim",
        "corpus": args.corpus,
        "settings": {key: value for key, value in vars(args).items()
                     if key not in ("corpus", "save_vectors", "verbose")},
        **metrics,
        "vocabulary": len(model.wv),
        "corpus_sentences": model.corpus_count,
        "corpus_words": model.corpus_total_words,
        "vocab_seconds": round(vocab_seconds, 3),
        "train_seconds": round(train_seconds, 3),
        "effective_words": effective_words,
        "raw_words": raw_words,
        "words_per_second": round(effective_words / train_seconds),
        "words_per_second_counts": "effective words (in-vocabulary, kept by subsampling), all epochs, per train second",
        "raw_words_per_second": round(raw_words / train_seconds),
        "versions": {"gensim": gensim.__version__, "numpy": numpy.__version__, "scipy": scipy.__version__,
                     "python": platform.python_version(), "gensim_fast_version": FAST_VERSION},
    }


if __name__ == "__main__":
    main()
