"""The tasks' config sections (``ctr``, ``mf``, ``w2v``, ``image``): root sections of ``Config``
(``cadence.config``), declared here beside nothing that imports torch, so a config is read before
any task is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from cadence.settings import At, setting


def dropout_and_widths(at: At, dropout: float, **widths: list[int]) -> None:
    if not 0 <= dropout < 1:
        at.fail("dropout", f"must be in [0, 1), got {dropout}")
    for name, values in widths.items():
        if any(width <= 0 for width in values):
            at.fail(name, f"must hold positive widths, got {values}")



@dataclass
class SyntheticCtrConfig:
    """Sizes of the seeded CTR data sets ``synthetic-ctr`` (generated in memory) and
    ``synthetic-ctr-stream`` (each example generated on demand from its index: for scale)."""

    num_examples: int = setting(200_000, positive=True)
    num_fields: int = setting(8, positive=True)
    vocab_per_field: int = setting(100_000, positive=True)
    zipf_exponent: float = setting(1.1, non_negative=True)
    dim: int = setting(8, non_negative=True)  # rank of the planted pairwise interaction
    # synthetic-ctr-stream: examples in each of valid and test (the last ones)
    holdout: int = setting(100_000, positive=True)


@dataclass
class CtrModelConfig:
    hidden: list[int] = field(default_factory=lambda: [64, 32])  # MLP widths of deep models
    dropout: float = 0.0
    split: Literal["random", "periods"] = "random"  # 80/10/10, or time-ordered periods ("days")
    num_periods: int = setting(10, positive=True)  # split: periods -> consecutive equal-size periods by timestamp
    # continual training: train on period d, evaluate on d + 1, for d in
    first_period: int = setting(0, non_negative=True)
    last_period: int = -1  # first_period..last_period (-1: the second to last period)
    init_from: str | None = setting(None, not_empty=True)  # the old spelling of train.init_from (kept working)
    synthetic: SyntheticCtrConfig = field(default_factory=SyntheticCtrConfig)

    def unread(self) -> dict[str, tuple[str, str]]:
        """The keys these values leave unread: (the setting under which they are read, this one's)."""
        periods = ("num_periods", "first_period", "last_period")
        why = ("ctr.split: periods", f"ctr.split: {self.split}")
        return {} if self.split == "periods" else dict.fromkeys(periods, why)

    def check(self, at: At, root: Any) -> None:
        if self.last_period < -1:
            at.fail("last_period", f"must be -1 (the second to last period) or a period, got {self.last_period}")
        dropout_and_widths(at, self.dropout, hidden=self.hidden)


@dataclass
class SyntheticRatingsConfig:
    """A seeded Zipf rating matrix (dataset ``synthetic-zipf``; AdaPM's MF setting), for scale."""

    users: int = setting(100_000, positive=True)
    items: int = setting(10_000, positive=True)
    ratings: int = setting(1_000_000, positive=True)
    exponent: float = 1.1  # Zipf exponent of user and item popularity


@dataclass
class MfConfig:
    """Matrix factorisation (task: mf): biased MF on explicit ratings, squared error."""

    # L2 weight on the factors and biases of each rating's user and item
    reg: float = setting(0.05, non_negative=True, between=(0.0, 1e6, "a regularisation weight"))
    split: Literal["random", "kfold"] = "random"  # 80/10/10, or fold `fold` of a `folds`-fold protocol
    folds: int = setting(5, positive=True)
    fold: int = setting(0, non_negative=True)
    # P > 0: each epoch is P sub-epochs; in sub-epoch s part p trains the ratings of user block p and
    # item block (p + s) mod P (DSGD's strata: row-partitioned data with column locality; with
    # P = ps.workers each AdaPM node trains one part; not AdaPM's App. C partitioning, which gives a
    # node's worker threads columns of its rows); 0: one shuffle of all ratings
    strata: int = setting(0, non_negative=True)
    # R > 0: AdaPM's MF partitioning (App. C): the ratings go to R row blocks by user (with R =
    # ps.workers, one per AdaPM node) and within each to mf.column_blocks blocks by item (with
    # C = adapm.threads, one per worker thread of the node), every block trained at the same time;
    # 0: off. Not with mf.strata. auto: the paper's, R = the nodes and C = a node's worker threads
    # under a strategy whose nodes hold their own rows (adapm with ps.workers > 1, unless mf.strata
    # is set), else off (R = 0, C = 1)
    row_blocks: int | Literal["auto"] = setting("auto", non_negative=True)
    column_blocks: int | Literal["auto"] = setting("auto", positive=True)
    # the order of a block's ratings (mf.row_blocks > 0): shuffled; or by-column, the paper's (App. C:
    # the columns in a random order, a column's ratings shuffled), which keeps an item on one worker
    # for a while (relocated, not replicated) but gives it one batch step where a shuffle gives it many
    visit: Literal["shuffled", "by-column"] = "shuffled"
    # batch: each batch's mean gradient and the entity optimizer (every strategy); rating: Surprise's
    # SVD step, each rating's SGD step of size optimizer.lr applied to the rows in place as it is
    # computed, the batch split among the threads (Hogwild); strategies sync and async on one process,
    # the CPU, optimizer.entity sgd (docs/tasks/mf.md); auto: rating where it applies, else batch (the
    # run says why in one line; config.yaml records the choice)
    update: Literal["auto", "batch", "rating"] = "auto"
    synthetic: SyntheticRatingsConfig = field(default_factory=SyntheticRatingsConfig)

    def unread(self) -> dict[str, tuple[str, str]]:
        """The keys these values leave unread: (the setting under which they are read, this one's)."""
        why = ("mf.split: kfold", f"mf.split: {self.split}")
        return {} if self.split == "kfold" else dict.fromkeys(("folds", "fold"), why)

    def check(self, at: At, root: Any) -> None:
        if self.fold >= self.folds:
            at.fail("fold", f"must be less than mf.folds ({self.folds}), got {self.fold}")


@dataclass
class W2vConfig:
    """word2vec (task: w2v): skip-gram with negative sampling, as word2vec.c and gensim define it."""

    window: int = setting(5, positive=True)  # maximum distance between a centre word and a context word
    shrink_window: bool = True  # draw each centre's window uniformly from 1..window (word2vec's default)
    negatives: int = setting(5, positive=True)  # noise words per (centre, context) pair, from unigram^0.75
    sample: float = setting(1e-3, non_negative=True)  # frequent-word subsampling threshold (0 = off)
    min_count: int = setting(5, positive=True)  # words rarer than this are dropped from the vocabulary
    max_vocab: int = setting(0, non_negative=True)  # keep only the most frequent words (0 = all)
    # the learning rate decays linearly from optimizer.lr to this over the run
    min_lr: float = setting(1e-4, non_negative=True, between=(0.0, 1e6, "a learning rate"))
    # batch: each batch's summed gradient applied once (every strategy); pair: word2vec's own update,
    # each (centre, context) pair's SGD step applied to the rows in place as it is computed, the
    # batch's centres split among the threads (Hogwild, as word2vec.c and gensim); strategies sync
    # and async on one process, the CPU, optimizer.entity sgd (docs/tasks/w2v.md); auto: pair where it
    # applies, else batch (the run says why in one line; config.yaml records the choice)
    update: Literal["auto", "batch", "pair"] = "auto"


@dataclass
class ImageConfig:
    """Image classification (task: image): Fashion-MNIST (or any IDX data set), an MLP or a CNN."""

    # the last training images held out for validation (and early stopping)
    valid_size: int = setting(5000, non_negative=True)
    hidden: list[int] = field(default_factory=lambda: [256, 128])  # mlp: hidden widths
    channels: list[int] = field(default_factory=lambda: [32, 64])  # cnn: 3x3 conv + 2x2 max-pool blocks
    fc: int = setting(128, positive=True)  # cnn: width of the fully connected layer after the convolutions
    dropout: float = 0.0  # before each hidden fully connected layer's output

    def check(self, at: At, root: Any) -> None:
        dropout_and_widths(at, self.dropout, hidden=self.hidden, channels=self.channels)
