"""Typed, strict configuration: "the config is the experiment".

A run is described by one ``Config``: nested dataclasses whose defaults sit beside their meaning,
each setting's checks declared with it (``cadence.settings``). The root sections are here (the
tasks' own, ``ctr``, ``mf``, ``w2v``, ``image``, in ``cadence.task_config``); each
strategy family declares its own (``ps``, ``shadow``: the parameter server; ``pdasgd``: the
pipelined family; ``adapm``) in its package's ``settings`` module, and ``Config`` holds them beside
the root sections (``settings.SECTIONS``: attributes of the same name, written to config.yaml after
them).
Configs come from a YAML file plus dotted overrides (``--set train.epochs=5``). Loading is strict:
an unknown key or a value of the wrong type is a ``ConfigError`` naming the dotted key, and, where
the value came from a file, its path and line. Every run writes its resolved config as
``config.yaml``, which loads back to an equal ``Config``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from cadence.errors import ConfigError
from cadence.settings import (SECTIONS, At, build, check, flatten, locate_error, parse_override, read_yaml, set_dotted,
                              setting, user_terms)
from cadence.task_config import CtrModelConfig, ImageConfig, MfConfig, W2vConfig

__all__ = ["Config", "ConfigError", "flatten", "from_dict", "load_config", "locate_error", "parse_override",
           "set_dotted", "user_terms"]


@dataclass
class SyntheticGraphConfig:
    """A seeded power-law graph (dataset ``synthetic``), for scale; with communities, for quality too."""

    num_entities: int = setting(100_000, positive=True)
    num_relations: int = setting(16, positive=True)
    num_edges: int = setting(1_000_000, positive=True)
    exponent: float = 1.1  # Zipf exponent of the endpoint distribution (degree ~ rank^-exponent)
    holdout: int = setting(1_000, non_negative=True)  # triples in each of valid and test
    # 0: independent endpoints (only popularity to learn); C > 0: each relation pairs C communities
    # of entities and every edge follows its relation's pairing (structure to learn; docs/data.md)
    communities: int = setting(0, non_negative=True)


@dataclass
class DataConfig:
    dataset: str = setting("umls", not_empty=True)  # a registered name (see `cadence data list`) or a directory path
    strict: bool = False  # error (instead of filter with a printed count) on unseen ids and duplicates
    synthetic: SyntheticGraphConfig = field(default_factory=SyntheticGraphConfig)


@dataclass
class ModelConfig:
    # kge: distmult | complex | transe | rotate; ctr: lr | fm | wide_deep | deepfm | dlrm; mf: biased;
    # w2v: skipgram. None: the task's default (complex, deepfm, biased, skipgram)
    name: str | None = None
    dim: int = setting(128, positive=True)  # floats per entity row (complex models use dim/2 complex components)
    # entity and relation rows start as N(0, init_std^2)
    init_std: float = setting(1e-3, non_negative=True, between=(0.0, 1e3, "the initial rows' standard deviation"))
    # margin of the distance models (TransE, RotatE): score = gamma - distance
    gamma: float = setting(12.0, between=(-1e6, 1e6, "a margin"))
    p_norm: int = 1  # TransE distance norm


@dataclass
class TrainConfig:
    epochs: int = setting(20, positive=True)
    batch_size: int = setting(1000, positive=True)
    scoring: Literal["sampled", "all"] = "sampled"  # shared sampled negatives, or every entity
    negatives: int = setting(256, positive=True)  # shared negatives per batch and side (scoring: sampled)
    # 0: the negatives are shared by the whole batch; N: each chunk of N edges of the batch draws its
    # own ``negatives`` (PyTorch-BigGraph's chunked negatives: more distinct rows trained per batch);
    # auto: the layout that reaches a quality soonest for ``loss`` (docs/tasks/kge.md): chunks of
    # ``negatives`` edges under softmax, shared under logistic. Resolved once, when the run starts
    # (api.prepare_config): the run's config.yaml records the number
    negative_chunk: int | Literal["auto"] = setting("auto", non_negative=True)
    # which entities the sampled negatives are drawn from: edges, those on a training edge (what
    # PyTorch-BigGraph's importer keeps; the same as all where every entity is on one); all: every
    # entity of the graph; auto: the pool that reached the better quality for ``loss`` (docs/tasks/kge.md):
    # edges under logistic, all under softmax. Resolved once, when the run starts (config.yaml records it)
    negative_pool: Literal["auto", "edges", "all"] = "auto"
    loss: Literal["softmax", "logistic"] = "softmax"
    reciprocal: bool = False  # add inverse relations; heads are then predicted as tails of (t, r^-1)
    regularizer: Literal["none", "n3", "l2"] = "none"
    reg_weight: float = setting(0.0, non_negative=True, between=(0.0, 1e6, "a regularisation weight"))
    # numba-compiled CPU kernels where a task has one (mf's loss and gradient: cadence.compiled), on
    # CPU tensors; false: torch ops only (the reference formulation, and the path on an accelerator)
    compiled: bool = True
    # start from another run's final model on this run's data, whose vocabulary may have changed: every
    # id the run knew keeps its trained row and optimizer state (matched by name), a new id starts from
    # the task's seeded initial row, an id the data no longer has is dropped (cadence.training.grow)
    init_from: str | None = setting(None, not_empty=True)
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
    lr: float = setting(0.1, positive=True, between=(1e-30, 1e6, "a learning rate"))
    # embedding rows, state kept in the store. None: the task's default (rowwise_adagrad for kge and ctr,
    # adagrad for mf, sgd for w2v: word2vec's update, which its learning-rate decay assumes)
    entity: Literal["rowwise_adagrad", "adagrad", "sgd"] | None = None
    dense: Literal["adagrad", "adam", "sgd"] = "adagrad"  # the dense module's parameters
    dense_lr: float | None = setting(None, between=(1e-30, 1e6, "a learning rate"))  # defaults to lr
    eps: float = setting(1e-10, positive=True, between=(1e-30, 1.0, "Adagrad's epsilon (float32 keeps 1e-38 and up)"))
    momentum: float = 0.0  # dense sgd: heavy-ball momentum (pdASGD's protocol: 0.9)
    nesterov: bool = False  # dense sgd: Nesterov momentum
    # dense parameters: L2 added to the gradient, as torch.optim does
    weight_decay: float = setting(0.0, non_negative=True, between=(0.0, 1e3, "a decay factor"))
    # the dense rate per epoch: constant, or cosine annealing to 0 after the warm-up (cadence.optim.dense_lr)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_epochs: int = setting(0, non_negative=True)  # the first epochs at warmup_lr (pdASGD: 5 at 0.005)
    warmup_lr: float | None = setting(None, between=(1e-30, 1e6, "a learning rate"))  # null: the base rate

    def check(self, at: At, root: Any) -> None:
        if not 0 <= self.momentum < 1:
            at.fail("momentum", f"must be in [0, 1), got {self.momentum}")
        if self.nesterov and self.momentum == 0:
            at.fail("nesterov", "needs optimizer.momentum > 0")


@dataclass
class StoreConfig:
    backend: Literal["memory", "mmap"] = "memory"
    path: str | None = setting(None, not_empty=True)  # mmap backend: the table files' directory (default: <out>/store)
    # mmap backend: the kernel reads ahead around each row it pages in (off: rows read at random; on fills
    readahead: bool = False  # the page cache with their neighbours: docs/strategies/pipelined.md)
    # mmap backend: glibc malloc arenas the threads share (0: glibc's default, 8 per core; 1: one heap: each
    # thread's arena of freed batch blocks only grows, crowding out the page cache: docs/strategies/pipelined.md)
    malloc_arenas: int = setting(1, between=(0, 4096, "malloc arenas (0: the C library's default)"))

    def unread(self) -> dict[str, tuple[str, str]]:  # keys these values leave unread: (what reads them, what is set)
        return {} if self.backend == "mmap" else dict.fromkeys(("path", "readahead", "malloc_arenas"), ("store.backend: mmap", f"store.backend: {self.backend}"))


@dataclass
class PipelineConfig:
    """Threads and queues of the pipelined strategies (async, oac); Marius's defaults."""

    staleness_bound: int = setting(16, positive=True)  # batches in flight at most (loaded but not yet written)
    loader_threads: int = setting(4, positive=True, threads=True)
    writer_threads: int = setting(4, positive=True, threads=True)
    queue_size: int = setting(4, positive=True)  # capacity of each queue between stages
    # seconds without a finished batch before the watchdog stops the run
    stall_timeout: float = setting(120.0, positive=True, between=(1e-6, 1e6, "seconds a stage may wait"))
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
class AutoConfig:
    """``strategy: auto`` (cadence.auto): a short trial of each strategy that keeps sync's model."""

    # batches of epoch 0 each candidate trains (the first tenth a warm-up, untimed)
    trial_batches: int = setting(200, positive=True)
    # at most this long per candidate's timed part (fewer batches if slower)
    trial_seconds: float = setting(20.0, positive=True, between=(1e-2, 86_400.0, "seconds of a trial"))
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

    def check(self, at: At, root: Any) -> None:
        if not 1.0 <= self.margin < float("inf"):
            at.fail("margin", "must be a finite ratio of at least 1 (1.05: another strategy must be 5% faster than "
                              f"sync to be chosen), got {self.margin}")


@dataclass
class EvalConfig:
    every: int = setting(1, non_negative=True)  # validate every N epochs; 0 = never
    batch_size: int = setting(256, positive=True)
    test: bool = True  # evaluate on test at the end
    # early stopping after N validations without a better primary metric; 0 = off
    patience: int = setting(0, non_negative=True)
    max_triples: int = setting(0, non_negative=True)  # evaluate a fixed random subset of this many triples; 0 = all
    # kge: rank each query against this many entities drawn once per split (seeded: the same every
    # evaluation; OGB-style sampled ranking, labelled in every output); 0 = against every entity (exact)
    negatives: int = setting(0, non_negative=True)


@dataclass
class CheckpointConfig:
    every: int = setting(1, non_negative=True)  # epochs between checkpoints; 0 = never
    keep: int = setting(2, positive=True)  # newest checkpoints kept on disk


@dataclass
class Config:
    """The root sections as fields; each registered section (``settings.SECTIONS``) an attribute of
    its name, its defaults where the config gives none."""

    seed: int = 0
    # knowledge-graph embeddings, click-through rate, matrix factorisation, word2vec, image classification
    task: Literal["kge", "ctr", "mf", "w2v", "image"] = "kge"
    strategy: str = setting("sync", not_empty=True)
    out: str | None = setting(None, not_empty=True)  # run directory
    # torch intra-op threads; 0 = the cores this process may use (affinity, cgroup quota)
    threads: int = setting(0, non_negative=True, threads=True)
    # re-choose the compute thread's intra-op count while training, from the throughput measured at
    # its neighbours (engines.threads.ThreadGovernor): a team of threads that waits at every op for a
    # member another process has descheduled runs at a tenth of one thread's speed; false: fixed
    adapt_threads: bool = True
    # compute device for dense parameters and batches: auto | cpu | cuda[:N]
    device: str = setting("auto", not_empty=True)
    deterministic: bool = True  # deterministic kernels on an accelerator (bit-identical replays); false: faster
    record_order: str | None = setting(None, not_empty=True)  # write the computation order of the batches to this file
    batch_order: str | None = setting(None, not_empty=True)  # replay the computation order recorded in this file
    progress: bool = True  # progress bars (shown only on a terminal)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    ctr: CtrModelConfig = field(default_factory=CtrModelConfig)
    mf: MfConfig = field(default_factory=MfConfig)
    w2v: W2vConfig = field(default_factory=W2vConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        for name, kind in SECTIONS.items():  # (the strategy families' sections: their defaults)
            self.__dict__.setdefault(name, kind())

    def section(self, name: str | None) -> Any:
        """The section called ``name`` (a strategy's own, such as ``shadow``), or None for no name."""
        return getattr(self, name) if name else None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update((name, dataclasses.asdict(getattr(self, name))) for name in SECTIONS)
        return data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def from_dict(data: dict[str, Any], where: dict[str, str] | None = None) -> Config:
    """Build a ``Config`` from nested dicts, rejecting unknown keys, wrong types and values out of
    their declared ranges (``settings.setting``, each section's ``check``).

    ``where`` maps dotted keys to ``file:line`` for error messages.
    """
    where = dict(where or {})
    config, sections = build(Config, data, "", where, extra=SECTIONS)
    config.__dict__.update(sections)
    check(config, "", where, config)
    for name in SECTIONS:
        check(getattr(config, name), f"{name}.", where, config)
    config._where = where  # not a field: neither written to config.yaml nor compared
    return config


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                values: list[tuple[str, Any, str]] | None = None) -> Config:
    """Load a YAML file (optional) and apply ``key=value`` dotted overrides on top (each value read
    as YAML, as ``--set`` does), then ``values``: (dotted key, value, where it came from) set as
    they are, never re-read (the command line's typed flags: ``--out 2025`` stays a string)."""
    data: dict[str, Any] = {}
    where: dict[str, str] = {}
    if path is not None:
        data, where = read_yaml(Path(path))
    given = [(*parse_override(item), f"--set {item}") for item in overrides or []] + list(values or [])
    for key, value, origin in given:
        try:
            set_dotted(data, key, value)
        except ConfigError as err:
            raise ConfigError(f"{origin}: {err}") from None
        where[key] = origin
    return from_dict(data, where)
