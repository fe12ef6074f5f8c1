"""Typed, strict configuration: "the config is the experiment".

A run is described by one ``Config``: nested dataclasses whose defaults sit beside their meaning.
Configs come from a YAML file plus dotted overrides (``--set train.epochs=5``). Loading is strict:
an unknown key or a value of the wrong type is a ``ConfigError`` naming the dotted key, and, where
the value came from a file, its path and line. Every run writes its resolved config as
``config.yaml``, which loads back to an equal ``Config``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

import yaml

from cadence.resources import check_threads
from cadence.errors import ConfigError


@dataclass
class SyntheticGraphConfig:
    """A seeded power-law graph (dataset ``synthetic``), for scale; with communities, for quality too."""

    num_entities: int = 100_000
    num_relations: int = 16
    num_edges: int = 1_000_000
    exponent: float = 1.1  # Zipf exponent of the endpoint distribution (degree ~ rank^-exponent)
    holdout: int = 1_000  # triples in each of valid and test
    # 0: independent endpoints (only popularity to learn); C > 0: each relation pairs C communities
    # of entities and every edge follows its relation's pairing (structure to learn; docs/data.md)
    communities: int = 0


@dataclass
class DataConfig:
    dataset: str = "umls"  # a registered name (see `cadence data list`) or a directory path
    strict: bool = False  # error (instead of filter with a printed count) on unseen ids and duplicates
    synthetic: SyntheticGraphConfig = field(default_factory=SyntheticGraphConfig)


@dataclass
class ModelConfig:
    # kge: distmult | complex | transe | rotate; ctr: lr | fm | wide_deep | deepfm | dlrm; mf: biased;
    # w2v: skipgram. None: the task's default (complex, deepfm, biased, skipgram)
    name: str | None = None
    dim: int = 128  # floats per entity row (complex models use dim/2 complex components)
    init_std: float = 1e-3  # entity and relation rows start as N(0, init_std^2)
    gamma: float = 12.0  # margin of the distance models (TransE, RotatE): score = gamma - distance
    p_norm: int = 1  # TransE distance norm


@dataclass
class TrainConfig:
    epochs: int = 20
    batch_size: int = 1000
    scoring: Literal["sampled", "all"] = "sampled"  # shared sampled negatives, or every entity
    negatives: int = 256  # shared negatives per batch and side (scoring: sampled)
    # 0: the negatives are shared by the whole batch; N: each chunk of N edges of the batch draws its
    # own ``negatives`` (PyTorch-BigGraph's chunked negatives: more distinct rows trained per batch);
    # auto: the layout that reaches a quality soonest for ``loss`` (docs/tasks/kge.md): chunks of
    # ``negatives`` edges under softmax, shared under logistic. Resolved once, when the run starts
    # (api.prepare_config): the run's config.yaml records the number
    negative_chunk: int | Literal["auto"] = "auto"
    # which entities the sampled negatives are drawn from: edges, those on a training edge (what
    # PyTorch-BigGraph's importer keeps; the same as all where every entity is on one); all: every
    # entity of the graph; auto: the pool that reached the better quality for ``loss`` (docs/tasks/kge.md):
    # edges under logistic, all under softmax. Resolved once, when the run starts (config.yaml records it)
    negative_pool: Literal["auto", "edges", "all"] = "auto"
    loss: Literal["softmax", "logistic"] = "softmax"
    reciprocal: bool = False  # add inverse relations; heads are then predicted as tails of (t, r^-1)
    regularizer: Literal["none", "n3", "l2"] = "none"
    reg_weight: float = 0.0
    # numba-compiled CPU kernels where a task has one (mf's loss and gradient: cadence.compiled), on
    # CPU tensors; false: torch ops only (the reference formulation, and the path on an accelerator)
    compiled: bool = True
    # start from another run's final model on this run's data, whose vocabulary may have changed: every
    # id the run knew keeps its trained row and optimizer state (matched by name), a new id starts from
    # the task's seeded initial row, an id the data no longer has is dropped (cadence.training.grow)
    init_from: str | None = None
    # known: only the rows of ids new to this run train (the run's rows are frozen); none: all train
    freeze: Literal["none", "known"] = "none"
    # with freeze: known, whether the dense parameters (beyond new vocabulary rows such as new
    # relations) are frozen too; false: they train
    freeze_dense: bool = True
    # with train.init_from: ids the run knew that this data lacks keep their rows (appended to this run's
    # vocabulary: exported, ranked as candidates, never trained); false: they are dropped
    keep_dropped: bool = False


@dataclass
class OptimizerConfig:
    lr: float = 0.1
    # embedding rows, state kept in the store. None: the task's default (rowwise_adagrad for kge and ctr,
    # adagrad for mf, sgd for w2v: word2vec's update, which its learning-rate decay assumes)
    entity: Literal["rowwise_adagrad", "adagrad", "sgd"] | None = None
    dense: Literal["adagrad", "adam", "sgd"] = "adagrad"  # the dense module's parameters
    dense_lr: float | None = None  # defaults to lr
    eps: float = 1e-10
    momentum: float = 0.0  # dense sgd: heavy-ball momentum (pdASGD's protocol: 0.9)
    nesterov: bool = False  # dense sgd: Nesterov momentum
    weight_decay: float = 0.0  # dense parameters: L2 added to the gradient, as torch.optim does
    # the dense rate per epoch: constant, or cosine annealing to 0 after the warm-up (cadence.optim.dense_lr)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_epochs: int = 0  # the first epochs at warmup_lr (pdASGD: 5 at 0.005)
    warmup_lr: float | None = None  # null: the base rate


@dataclass
class StoreConfig:
    backend: Literal["memory", "mmap"] = "memory"
    path: str | None = None  # mmap backend: directory of the table files (default: <out>/store)
    # mmap backend: let the kernel read ahead around each row it pages in (off: rows are read at
    # random, and readahead fills the page cache with their neighbours; docs/strategies/pipelined.md)
    readahead: bool = False
    # mmap backend: glibc malloc arenas the process's threads share (0: glibc's default, 8 per core). A
    # pipeline's threads each keep an arena of freed batch blocks whose high-water mark only grows, a
    # heap that crowds the table's page cache out (docs/strategies/pipelined.md); 1: one heap
    malloc_arenas: int = 1


@dataclass
class PipelineConfig:
    """Threads and queues of the pipelined strategies (async, oac); Marius's defaults."""

    staleness_bound: int = 16  # batches in flight at most (loaded but not yet written)
    loader_threads: int = 4
    writer_threads: int = 4
    queue_size: int = 4  # capacity of each queue between stages
    stall_timeout: float = 120.0  # seconds without a finished batch before the watchdog stops the run
    # oac: a batch does not write rows that a batch computed after it also updated (that one writes
    # them); same model, fewer writes, and writers rarely contend for a row (docs/strategies/pipelined.md)
    coalesce_writes: bool = True
    # when batches run in the threads: always; never (one after another on the calling thread: the
    # schedule of staleness_bound 1); auto: in the threads where there is something to hide (an
    # accelerator's transfers, an mmap store's reads, or reads and writes that took over half the
    # compute time of an epoch run inline), else inline until an epoch measures otherwise; inline for
    # good once a pipelined epoch ran slower than the inline one before it
    # (docs/strategies/pipelined.md, "When the pipeline runs")
    overlap: Literal["auto", "always", "never"] = "auto"


@dataclass
class ParameterServerConfig:
    """The parameter-server runtime and its modes (GBA paper, SPEC section 3). With workers = 1 and the
    threads engine, sync and async run as the one-process pipeline instead (see README)."""

    workers: int = 1
    engine: Literal["threads", "ray"] = "threads"  # ray: servers and workers as Ray actors (pip install cadence[ray])
    shards: int = 1  # server shards; feature keys are routed by key % shards, dense parameters live on shard 0
    buffer: int = 0  # GBA / BSP gradient buffer M (global batch = M x train.batch_size); 0 = workers
    tolerance: int = 2  # GBA's staleness tolerance iota: gradients with step - token > iota are dropped
    decay: str = "cutoff"  # GBA's decay f(staleness): cutoff (the reconstructed default)
    normalizer: Literal["buffer", "kept"] = "buffer"  # divide an aggregate by M, or by gradients kept
    staleness: int = 2  # hop_bs: a worker may run at most this many batches ahead of the slowest
    backup_workers: int = 1  # hop_bw: aggregate the first workers - backup_workers gradients of a step
    stragglers: list[str] = field(default_factory=list)  # "WORKER:SLOWDOWN[@FIRST-LAST epochs]": fault injection
    # how a straggler is slowed: sleep (its batch takes SLOWDOWN x its compute time: a sleep in the
    # worker loop, for tests and any engine) or cpu_quota (its Ray worker process runs in a cgroup-v1
    # CPU quota of threads / SLOWDOWN cores for its slowed epochs: a really slow process; root, ps.engine: ray)
    straggler_cause: Literal["sleep", "cpu_quota"] = "sleep"
    # cpu_quota: relative (default: the process's own CPU rate, measured unthrottled in its first
    # second, over SLOWDOWN: slow by that factor against the load it meets) or absolute (threads /
    # SLOWDOWN cores: on a machine with more busy processes than cores, about its fair share anyway)
    straggler_quota: Literal["relative", "absolute"] = "relative"
    kill_workers: list[str] = field(default_factory=list)  # "WORKER:AFTER_STEPS": fault injection
    emulated_latency: float = 0.0  # seconds each batch spends off this machine (emulates one machine per worker)
    ray_address: str | None = None  # engine ray: the cluster to join ("HOST:PORT"); None = ray.init()'s default
    # engine ray: actor processes a finished run leaves idle, for the next run of the same driver
    # process to build its roles in (torch and cadence already imported); 0: a run's processes end with it
    ray_idle_processes: int = 8
    # where the dense parameters live: on shard 0 (updated from pushed gradients), or a replica on
    # every worker, its gradients all-reduced each round (PERSIA's split; embeddings stay on the servers)
    dense: Literal["server", "workers"] = "server"


@dataclass
class ShadowConfig:
    """ShadowSync and its baselines (SPEC section 5): ``ps.workers`` trainers, each a dense replica
    trained Hogwild by ``threads`` worker threads and kept in step with the others by a shadow
    thread (``shadow-*``) or in the foreground every ``every`` batches (``fr-*``)."""

    threads: int = 1  # Hogwild worker threads per trainer
    # elastic parameter a of w_i <- (1 - a) w_i + a w; None: 0.9 / trainers (reconstructed, TF's
    # EASGD moving rate 0.9 / workers with period 1; the paper gives no value)
    alpha: float | None = None
    every: int = 5  # fr-*: a sync every k iterations (the paper: 5, 10, 30, 100)
    # fr-*: who syncs every k iterations. thread: each worker thread, inside its own loop, every k
    # of its own iterations (the paper's FR-EASGD: sync traffic grows with the threads); trainer:
    # the trainer's threads pause, drain, and one round runs every k batches of the trainer (the
    # trainer-wide variant). None: thread for EASGD; trainer for MA and BMUF, whose all-reduce needs
    # one member per trainer (thread is an error there)
    fr_sync: Literal["thread", "trainer"] | None = None
    # EASGD: sync parameter servers holding the central copy, each a slice of the dense vector (the
    # paper: 2 to 6 sync PSs; more relieve FR's saturated sync servers, Fig. 5). Processes of their
    # own on the Ray engine, objects of this process on threads
    sync_servers: int = 1
    block_lr: float = 1.0  # BMUF's block learning rate eta (fairseq's default)
    block_momentum: float = 0.875  # BMUF's block momentum (fairseq's default; 0 = plain averaging)
    nesterov: bool = False  # BMUF: interpolate towards w_g + momentum (Nesterov)
    max_syncs_per_second: float = 0.0  # shadow-*: a cap on each shadow thread's rounds; 0 = none
    # shadow-*: a round waits until the replica took an update since the last one. Off by default:
    # the paper's shadow thread loops freely (Algorithm 1, one of 25 threads on 20 cores) and its
    # sync gap comes from the sync servers' capacity; on a few cores with sync servers in this
    # process a round with nothing new only takes CPU and the interpreter from the worker threads,
    # and this option (or max_syncs_per_second) gives them back
    wait_for_update: bool = False


@dataclass
class PdasgdConfig:
    """pdASGD (SPEC section 4): one forward thread hands each batch's graph to one of
    ``backward_threads`` backward threads and starts the next batch."""

    backward_threads: int = 2  # K (the seed: 2, since a backward pass costs about two forwards)
    # torch intra-op threads of each pdASGD thread (forward and backward): 1 keeps K + 1 threads
    # from oversubscribing the cores with OpenMP teams of their own; 0: torch's default
    intra_op_threads: int = 1
    # each batch's backward and updates finish before the next forward starts: the sequential twin
    # (with one backward thread, bit for bit ``sync``); for tests and ablations
    barrier: bool = False


@dataclass
class AdapmConfig:
    """AdaPM (SPEC section 2): ``ps.workers`` nodes, each with ``threads`` worker threads sharing a
    node-local store; parameters are relocated or replicated between nodes from the workers' intent
    signals. Defaults are the paper's, never tuned per task."""

    # adaptive: relocate when one node has intent, replicate when several do; replication: only
    # replicate; relocation: only relocate; static: a classic parameter server (keys stay on their
    # home node, every other access remote); full: every key replicated on every node, all synced
    # each round
    technique: Literal["adaptive", "replication", "relocation", "static", "full"] = "adaptive"
    timing: Literal["adaptive", "immediate"] = "adaptive"  # Algorithm 1, or act on every intent at once
    lookahead: int = 64  # a worker signals a batch's intent this many batches before it computes it
    alpha: float = 0.1  # Algorithm 1's smoothing factor
    quantile: float = 0.9999  # Algorithm 1's p
    initial_rate: float = 10.0  # Algorithm 1's lambda_0 (clocks per round)
    threads: int = 1  # worker threads per node
    round_interval: float = 0.001  # seconds a sync thread rests between communication rounds (at least)
    # the share of one core a node's sync thread takes: after a round of c CPU seconds it rests
    # c * (1 / sync_share - 1) (at least round_interval, at most the time the workers take for a
    # quarter of the look-ahead); 1 (default): the paper's, a round as soon as the last one ended.
    # Lower trades replica freshness for CPU: 0.25 on 4 nodes sharing 2 cores is 1.4x the examples/s,
    # MF's RMSE unchanged, a small KG's MRR lower (docs/strategies/adapm.md)
    sync_share: float = 1.0
    # at an epoch's start a worker waits for rounds (wait_sync) until its first batch's rows are held
    # on its node, at most this many (every node signals its first intents at once: an owner may
    # hand a key to one node before another's intent arrives, and that one's comes a round later)
    start_rounds: int = 10


@dataclass
class SyntheticCtrConfig:
    """Sizes of the seeded CTR data sets ``synthetic-ctr`` (generated in memory) and
    ``synthetic-ctr-stream`` (each example generated on demand from its index: for scale)."""

    num_examples: int = 200_000
    num_fields: int = 8
    vocab_per_field: int = 100_000
    zipf_exponent: float = 1.1
    dim: int = 8  # rank of the planted pairwise interaction
    holdout: int = 100_000  # synthetic-ctr-stream: examples in each of valid and test (the last ones)


@dataclass
class CtrModelConfig:
    hidden: list[int] = field(default_factory=lambda: [64, 32])  # MLP widths of deep models
    dropout: float = 0.0
    split: Literal["random", "periods"] = "random"  # 80/10/10, or time-ordered periods ("days")
    num_periods: int = 10  # split: periods -> consecutive equal-size periods by timestamp
    first_period: int = 0  # continual training: train on period d, evaluate on d + 1, for d in
    last_period: int = -1  # first_period..last_period (-1: the second to last period)
    init_from: str | None = None  # the old spelling of train.init_from (kept working)
    synthetic: SyntheticCtrConfig = field(default_factory=SyntheticCtrConfig)


@dataclass
class SyntheticRatingsConfig:
    """A seeded Zipf rating matrix (dataset ``synthetic-zipf``; AdaPM's MF setting), for scale."""

    users: int = 100_000
    items: int = 10_000
    ratings: int = 1_000_000
    exponent: float = 1.1  # Zipf exponent of user and item popularity


@dataclass
class MfConfig:
    """Matrix factorisation (task: mf): biased MF on explicit ratings, squared error."""

    reg: float = 0.05  # L2 weight on the factors and biases of each rating's user and item
    split: Literal["random", "kfold"] = "random"  # 80/10/10, or fold `fold` of a `folds`-fold protocol
    folds: int = 5
    fold: int = 0
    # P > 0: each epoch is P sub-epochs; in sub-epoch s part p trains the ratings of user block p and
    # item block (p + s) mod P (DSGD's strata: row-partitioned data with column locality; with
    # P = ps.workers each AdaPM node trains one part; not AdaPM's App. C partitioning, which gives a
    # node's worker threads columns of its rows); 0: one shuffle of all ratings
    strata: int = 0
    # R > 0: AdaPM's MF partitioning (App. C): the ratings go to R row blocks by user (with R =
    # ps.workers, one per AdaPM node) and within each to mf.column_blocks blocks by item (with
    # C = adapm.threads, one per worker thread of the node), every block trained at the same time;
    # 0: off. Not with mf.strata. auto: the paper's, R = the nodes and C = a node's worker threads
    # under a strategy whose nodes hold their own rows (adapm with ps.workers > 1, unless mf.strata
    # is set), else off (R = 0, C = 1)
    row_blocks: int | Literal["auto"] = "auto"
    column_blocks: int | Literal["auto"] = "auto"
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


@dataclass
class W2vConfig:
    """word2vec (task: w2v): skip-gram with negative sampling, as word2vec.c and gensim define it."""

    window: int = 5  # maximum distance between a centre word and a context word
    shrink_window: bool = True  # draw each centre's window uniformly from 1..window (word2vec's default)
    negatives: int = 5  # noise words per (centre, context) pair, from unigram^0.75
    sample: float = 1e-3  # frequent-word subsampling threshold (0 = off)
    min_count: int = 5  # words rarer than this are dropped from the vocabulary
    max_vocab: int = 0  # keep only the most frequent words (0 = all)
    min_lr: float = 1e-4  # the learning rate decays linearly from optimizer.lr to this over the run
    # batch: each batch's summed gradient applied once (every strategy); pair: word2vec's own update,
    # each (centre, context) pair's SGD step applied to the rows in place as it is computed, the
    # batch's centres split among the threads (Hogwild, as word2vec.c and gensim); strategies sync
    # and async on one process, the CPU, optimizer.entity sgd (docs/tasks/w2v.md); auto: pair where it
    # applies, else batch (the run says why in one line; config.yaml records the choice)
    update: Literal["auto", "batch", "pair"] = "auto"


@dataclass
class ImageConfig:
    """Image classification (task: image): Fashion-MNIST (or any IDX data set), an MLP or a CNN."""

    valid_size: int = 5000  # the last training images held out for validation (and early stopping)
    hidden: list[int] = field(default_factory=lambda: [256, 128])  # mlp: hidden widths
    channels: list[int] = field(default_factory=lambda: [32, 64])  # cnn: 3x3 conv + 2x2 max-pool blocks
    fc: int = 128  # cnn: width of the fully connected layer after the convolutions
    dropout: float = 0.0  # before each hidden fully connected layer's output


@dataclass
class AutoConfig:
    """``strategy: auto`` (cadence.auto): a short trial of each strategy that keeps sync's model."""

    trial_batches: int = 200  # batches of epoch 0 each candidate trains (the first tenth a warm-up, untimed)
    trial_seconds: float = 20.0  # at most this long per candidate's timed part (fewer batches if slower)
    # sync (the bit-exact reference) is kept unless another candidate is this many times faster
    margin: float = 1.05
    # each trial in a fresh process (it reads the data again): no trial inherits another's memory or
    # warm caches, and one that exhausts a memory cap fails alone; false: in this process (faster to start)
    isolate: bool = True
    # a table on disk (store.backend: mmap) in a trial: detect: one larger than the page cache may hold (the
    # memory cgroup's limit less its heaps; else the available memory) is timed from a cold page cache, then warm, the two weighted by the run's epochs (its first
    # epoch reads the rows from disk, later ones what the page cache kept); cold: every table on disk so;
    # warm: as the trial finds it (the page cache its initialisation left)
    page_cache: Literal["detect", "cold", "warm"] = "detect"


@dataclass
class EvalConfig:
    every: int = 1  # validate every N epochs; 0 = never
    batch_size: int = 256
    test: bool = True  # evaluate on test at the end
    patience: int = 0  # early stopping after N validations without a better primary metric; 0 = off
    max_triples: int = 0  # evaluate a fixed random subset of this many triples; 0 = all
    # kge: rank each query against this many entities drawn once per split (seeded: the same every
    # evaluation; OGB-style sampled ranking, labelled in every output); 0 = against every entity (exact)
    negatives: int = 0


@dataclass
class CheckpointConfig:
    every: int = 1  # epochs between checkpoints; 0 = never
    keep: int = 2  # newest checkpoints kept on disk


@dataclass
class Config:
    seed: int = 0
    # knowledge-graph embeddings, click-through rate, matrix factorisation, word2vec, image classification
    task: Literal["kge", "ctr", "mf", "w2v", "image"] = "kge"
    strategy: str = "sync"
    out: str | None = None  # run directory
    threads: int = 0  # torch intra-op threads; 0 = the cores this process may use (affinity, cgroup quota)
    # re-choose the compute thread's intra-op count while training, from the throughput measured at
    # its neighbours (engines.threads.ThreadGovernor): a team of threads that waits at every op for a
    # member another process has descheduled runs at a tenth of one thread's speed; false: fixed
    adapt_threads: bool = True
    device: str = "auto"  # compute device for dense parameters and batches: auto | cpu | cuda[:N]
    deterministic: bool = True  # deterministic kernels on an accelerator (bit-identical replays); false: faster
    record_order: str | None = None  # write the computation order of the batches to this file
    batch_order: str | None = None  # replay the computation order recorded in this file
    progress: bool = True  # progress bars (shown only on a terminal)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    ps: ParameterServerConfig = field(default_factory=ParameterServerConfig)
    shadow: ShadowConfig = field(default_factory=ShadowConfig)
    pdasgd: PdasgdConfig = field(default_factory=PdasgdConfig)
    adapm: AdapmConfig = field(default_factory=AdapmConfig)
    ctr: CtrModelConfig = field(default_factory=CtrModelConfig)
    mf: MfConfig = field(default_factory=MfConfig)
    w2v: W2vConfig = field(default_factory=W2vConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


_POSITIVE = {
    "model.dim", "train.epochs", "train.batch_size", "train.negatives", "eval.batch_size",
    "data.synthetic.num_entities", "data.synthetic.num_relations", "data.synthetic.num_edges",
    "checkpoint.keep", "pipeline.staleness_bound", "pipeline.loader_threads", "pipeline.writer_threads",
    "pipeline.queue_size", "pipeline.stall_timeout", "ps.workers", "ps.shards", "mf.folds",
    "mf.synthetic.users", "mf.synthetic.items", "mf.synthetic.ratings", "w2v.window", "w2v.min_count",
    "ctr.synthetic.num_examples", "ctr.synthetic.num_fields", "ctr.synthetic.vocab_per_field",
    "ctr.synthetic.holdout", "ctr.num_periods", "w2v.negatives", "shadow.threads", "shadow.every",
    "shadow.block_lr", "pdasgd.backward_threads", "image.fc", "adapm.threads", "adapm.initial_rate",
    "mf.column_blocks", "auto.trial_batches", "auto.trial_seconds", "adapm.lookahead",
}

# the ranges beyond a sign: waits and rates a thread sleeps by (1/rate of a tiny rate never ends), sizes
# whose plans or tables grow with them, and factors that overflow a float32 parameter past them.
# key -> (lowest, highest, what the setting is); a setting whose 0 means "off" is checked only when on
_BOUNDS: dict[str, tuple[float, float, str]] = {
    "adapm.lookahead": (1, 100_000, "batches of intent signalled ahead"),
    "store.malloc_arenas": (0, 4096, "malloc arenas (0: the C library's default)"),
    "adapm.round_interval": (1e-5, 60.0, "seconds between communication rounds"),
    "adapm.sync_share": (1e-3, 1.0, "the share of a core a node's sync thread takes"),
    "adapm.initial_rate": (1e-3, 1e6, "clocks per round, the rate estimate's start"),
    "adapm.start_rounds": (0, 100_000, "rounds a worker waits for its first rows"),
    "shadow.max_syncs_per_second": (1e-4, 1e6, "syncs a second (0: no cap)"),
    "shadow.every": (1, 1_000_000_000, "batches between foreground syncs"),
    "shadow.block_lr": (1e-6, 100.0, "BMUF's block learning rate"),
    "ps.emulated_latency": (0.0, 60.0, "seconds of emulated latency per message"),
    "pipeline.stall_timeout": (1e-6, 1e6, "seconds a stage may wait"),
    "auto.trial_seconds": (1e-2, 86_400.0, "seconds of a trial"),
    "optimizer.lr": (1e-30, 1e6, "a learning rate"),
    "optimizer.dense_lr": (1e-30, 1e6, "a learning rate"),
    "optimizer.warmup_lr": (1e-30, 1e6, "a learning rate"),
    "optimizer.eps": (1e-30, 1.0, "Adagrad's epsilon (float32 keeps 1e-38 and up)"),
    "optimizer.weight_decay": (0.0, 1e3, "a decay factor"),
    "train.reg_weight": (0.0, 1e6, "a regularisation weight"),
    "model.init_std": (0.0, 1e3, "the initial rows' standard deviation"),
    "model.gamma": (-1e6, 1e6, "a margin"),
    "mf.reg": (0.0, 1e6, "a regularisation weight"),
}
_OFF_AT_ZERO = {"shadow.max_syncs_per_second"}
# settings that count threads (or processes): at most ``resources.thread_limit()`` each
_THREAD_COUNTS = ("threads", "pipeline.loader_threads", "pipeline.writer_threads", "shadow.threads",
                  "pdasgd.backward_threads", "pdasgd.intra_op_threads", "adapm.threads", "ps.workers", "ps.shards",
                  "ps.ray_idle_processes")
_NON_NEGATIVE = {"data.synthetic.communities", "train.negative_chunk", "ps.emulated_latency", "ps.ray_idle_processes", "ps.buffer", "ps.tolerance", "ps.staleness", "ps.backup_workers", "threads", "eval.every", "eval.patience", "eval.max_triples", "eval.negatives", "checkpoint.every",
                 "train.reg_weight", "data.synthetic.holdout", "mf.reg", "mf.fold", "ctr.first_period",
                 "model.init_std",
                 "w2v.sample", "w2v.max_vocab", "w2v.min_lr", "ctr.synthetic.dim", "ctr.synthetic.zipf_exponent",
                 "shadow.max_syncs_per_second", "optimizer.weight_decay", "optimizer.warmup_epochs",
                 "image.valid_size", "pdasgd.intra_op_threads", "adapm.round_interval", "adapm.start_rounds",
                 "mf.strata", "mf.row_blocks"}


# paths and names: an empty one would silently mean the current directory (or nothing)
_NOT_EMPTY = ("out", "data.dataset", "record_order", "batch_order", "store.path", "ctr.init_from", "train.init_from", "device", "strategy")


def from_dict(data: dict[str, Any], where: dict[str, str] | None = None) -> Config:
    """Build a ``Config`` from nested dicts, rejecting unknown keys and wrong types.

    ``where`` maps dotted keys to ``file:line`` for error messages.
    """
    config = _build(Config, data, "", where or {})
    _check_ranges(config, where or {})
    config._where = dict(where or {})  # not a field: neither written to config.yaml nor compared
    return config


@contextlib.contextmanager
def user_terms(config: Config) -> Iterator[None]:
    """A ``ConfigError`` raised inside (a check after loading: a registry name, a task's own range)
    names the setting as the user gave it: the flag, ``--set`` item or file line of the first key
    its message mentions, instead of the internal key alone."""
    try:
        yield
    except ConfigError as err:
        located = locate_error(config, str(err))
        if located is None:
            raise
        raise ConfigError(located) from None


def locate_error(config: Config, message: str) -> str | None:
    where: dict[str, str] = getattr(config, "_where", {})
    found = []
    for key, origin in where.items():
        match = re.search(rf"(?<![\w.]){re.escape(key)}(?!\w|\.\w)", message)
        if match:
            found.append((match.start(), -len(key), key, origin))
    if not found:
        return None
    _, _, key, origin = min(found)
    if origin in message:
        return None
    if message.startswith(f"{key}: "):
        message = message[len(key) + 2:]
    return f"{origin}: {message}"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                values: list[tuple[str, Any, str]] | None = None) -> Config:
    """Load a YAML file (optional) and apply ``key=value`` dotted overrides on top (each value read
    as YAML, as ``--set`` does), then ``values``: (dotted key, value, where it came from) set as
    they are, never re-read (the command line's typed flags: ``--out 2025`` stays a string)."""
    data: dict[str, Any] = {}
    where: dict[str, str] = {}
    if path is not None:
        data, where = _read_yaml(Path(path))
    given = [(*parse_override(item), f"--set {item}") for item in overrides or []] + list(values or [])
    for key, value, origin in given:
        try:
            set_dotted(data, key, value)
        except ConfigError as err:
            raise ConfigError(f"{origin}: {err}") from None
        where[key] = origin
    return from_dict(data, where)


class _YamlLoader(yaml.SafeLoader):
    """YAML as a config file means it: YAML 1.2's floats (``1e-5`` is a number, as in JSON and
    Python; YAML 1.1 reads it as a string) and no key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep)


_YamlLoader.yaml_implicit_resolvers = {first: list(resolvers)  # a copy: SafeLoader's lists stay as they are
                                       for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = _yaml(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    if not all(part.strip() for part in parts):
        raise ConfigError(f"{key!r} is not a config key (an empty part between dots)")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, where a config file was expected") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        node = yaml.compose(text, Loader=_YamlLoader)
        data = _yaml(text)
    except yaml.MarkedYAMLError as err:
        line = err.problem_mark.line + 1 if err.problem_mark else "?"
        raise ConfigError(f"{path}:{line}: invalid YAML: {err.problem}") from None
    except yaml.reader.ReaderError as err:  # a control character: the reader gives its position
        line = text[:err.position].count("\n") + 1
        raise ConfigError(f"{path}:{line}: invalid YAML: character {err.character:#x} is not allowed") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: a config file must be a mapping of keys to values")
    where: dict[str, str] = {}
    _record_lines(node, "", path, where)
    return data, where


def _record_lines(node: yaml.Node, prefix: str, path: Path, where: dict[str, str]) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        key = f"{prefix}{key_node.value}"
        where[key] = f"{path}:{key_node.start_mark.line + 1}"
        _record_lines(value_node, key + ".", path, where)


def _locate(key: str, where: dict[str, str]) -> str:
    if key in where:
        return f"{where[key]}: "
    inside = [origin for given, origin in where.items() if given.startswith(key + ".")]  # a key set under a value
    return f"{inside[0]}: " if inside else ""


def _build(cls: type, data: Any, prefix: str, where: dict[str, str]) -> Any:
    section = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{_locate(section, where)}{section} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in fields:
            close = difflib.get_close_matches(str(name), fields, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ConfigError(f"{_locate(key, where)}unknown key {key!r}{hint}")
        kwargs[name] = _convert(hints[name], value, key, where)
    return cls(**kwargs)


def _convert(tp: Any, value: Any, key: str, where: dict[str, str]) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".", where)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, key, where)
            except ConfigError as err:
                errors.append(err)
        if len(errors) > 1:  # a number or a word (int | Literal["auto"]): one line naming both
            kinds = [f"one of {', '.join(map(str, typing.get_args(option)))}" if typing.get_origin(option) is Literal
                     else f"of type {option.__name__}" for option in options if option is not type(None)]
            raise ConfigError(f"{_locate(key, where)}{key} must be {' or '.join(kinds)}; "
                              f"got {type(value).__name__} {value!r}")
        raise errors[0]
    if origin is list:
        if not isinstance(value, list):
            value = [value] if value is not None else []
        (item_type,) = typing.get_args(tp)
        return [_convert(item_type, item, f"{key}[{i}]", where) for i, item in enumerate(value)]
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(
                f"{_locate(key, where)}{key} must be one of {', '.join(map(str, choices))}; got {value!r}"
            )
        return value
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if tp is float and isinstance(value, str) and _not_finite(value):
        raise ConfigError(f"{_locate(key, where)}{key} must be a finite number, got {value!r}")
    if tp is int and ok and not -2**63 <= value < 2**63:
        raise ConfigError(f"{_locate(key, where)}{key} is too large, got {value}")
    if not ok:
        raise ConfigError(
            f"{_locate(key, where)}{key} must be of type {tp.__name__}, got {type(value).__name__} {value!r}"
        )
    if tp is float and not math.isfinite(value):  # no setting means NaN or an infinity
        raise ConfigError(f"{_locate(key, where)}{key} must be a finite number, got {value!r}")
    return float(value) if tp is float else value


def _not_finite(text: str) -> bool:
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def _check_ranges(config: Config, where: dict[str, str]) -> None:
    flat = flatten(config.to_dict())
    for key in _POSITIVE:
        if isinstance(flat[key], (int, float)) and flat[key] <= 0:  # (a word such as auto is a Literal's)
            raise ConfigError(f"{_locate(key, where)}{key} must be positive, got {flat[key]}")
    for key in _NON_NEGATIVE:
        if isinstance(flat[key], (int, float)) and flat[key] < 0:  # (a word such as auto is a Literal's)
            raise ConfigError(f"{_locate(key, where)}{key} must not be negative, got {flat[key]}")
    for key in ("optimizer.lr", "optimizer.eps"):
        if flat[key] <= 0:
            raise ConfigError(f"{_locate(key, where)}{key} must be positive, got {flat[key]}")
    for key in _NOT_EMPTY:
        if flat[key] is not None and not str(flat[key]).strip():
            raise ConfigError(f"{_locate(key, where)}{key} is empty; give a path or name (or leave it out)")
    for key, (low, high, what) in _BOUNDS.items():
        value = flat[key]
        if value is None or (key in _OFF_AT_ZERO and value == 0):
            continue
        if not low <= value <= high:
            raise ConfigError(f"{_locate(key, where)}{key} must be between {low:g} and {high:g} ({what}), got {value:g}")
    for key in _THREAD_COUNTS:  # (each a thread, or a process, of its own)
        check_threads(_locate(key, where) + key, flat[key])
    for key in ("shadow.threads", "adapm.threads"):  # per worker
        check_threads(f"{_locate(key, where)}ps.workers x {key} ({flat['ps.workers']:,} x {flat[key]:,})",
                      flat["ps.workers"] * flat[key])
    if not 1.0 <= config.auto.margin < float("inf"):
        raise ConfigError(f"{_locate('auto.margin', where)}auto.margin must be a finite ratio of at least 1 (1.05: "
                          f"another strategy must be 5% faster than sync to be chosen), got {config.auto.margin}")
    if config.mf.fold >= config.mf.folds:
        raise ConfigError(f"{_locate('mf.fold', where)}mf.fold must be less than mf.folds ({config.mf.folds}), "
                          f"got {config.mf.fold}")
    if config.ctr.last_period < -1:
        raise ConfigError(f"{_locate('ctr.last_period', where)}ctr.last_period must be -1 (the second to last "
                          f"period) or a period, got {config.ctr.last_period}")
    if config.shadow.alpha is not None and not 0 <= config.shadow.alpha <= 1:
        raise ConfigError(f"{_locate('shadow.alpha', where)}shadow.alpha must be in [0, 1], got {config.shadow.alpha}")
    if not 0 <= config.shadow.block_momentum < 1:
        raise ConfigError(f"{_locate('shadow.block_momentum', where)}shadow.block_momentum must be in [0, 1), "
                          f"got {config.shadow.block_momentum}")
    for key in ("ctr.dropout", "image.dropout"):
        if not 0 <= flat[key] < 1:
            raise ConfigError(f"{_locate(key, where)}{key} must be in [0, 1), got {flat[key]}")
    for key in ("image.hidden", "image.channels", "ctr.hidden"):
        if any(width <= 0 for width in flat[key]):
            raise ConfigError(f"{_locate(key, where)}{key} must hold positive widths, got {flat[key]}")
    if not 0 <= config.optimizer.momentum < 1:
        raise ConfigError(f"{_locate('optimizer.momentum', where)}optimizer.momentum must be in [0, 1), "
                          f"got {config.optimizer.momentum}")
    if config.optimizer.nesterov and config.optimizer.momentum == 0:
        raise ConfigError(f"{_locate('optimizer.nesterov', where)}optimizer.nesterov needs optimizer.momentum > 0")
    if config.optimizer.warmup_lr is not None and config.optimizer.warmup_lr <= 0:
        raise ConfigError(f"{_locate('optimizer.warmup_lr', where)}optimizer.warmup_lr must be positive")
    if not 0 < config.adapm.alpha <= 1:
        raise ConfigError(f"{_locate('adapm.alpha', where)}adapm.alpha must be in (0, 1], got {config.adapm.alpha}")
    if not 0 < config.adapm.quantile < 1:
        raise ConfigError(f"{_locate('adapm.quantile', where)}adapm.quantile must be in (0, 1), "
                          f"got {config.adapm.quantile}")
    if config.optimizer.dense_lr is not None and config.optimizer.dense_lr <= 0:
        raise ConfigError(f"{_locate('optimizer.dense_lr', where)}optimizer.dense_lr must be positive")


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
