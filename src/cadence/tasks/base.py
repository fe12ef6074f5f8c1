"""The task interface: *what* is learned from a batch.

A task owns everything specific to one kind of model: its data (a dataset registry, the splits), the
embedding rows it learns (one key space, ``TableSpec``), its dense module, the plan of an epoch's
batches (a pure function of seed and epoch), which rows a batch touches, the loss computed from the
pulled rows and the dense module, its evaluation (one primary metric drives early stopping,
``compare`` and the plots), its export and its predictor (a trained run, asked). Strategies, the
pipeline and the parameter-server runtime know nothing task-specific: they move rows by key and call
``prepare`` and ``loss``.

    task = TASKS.get(config.task)(config)       # reads and validates the data
    for plan in task.plan(epoch):
        batch = task.training_batch(plan)       # batch.ids: the keys of the rows it touches
        rows = <pull batch.ids>                 # wherever the runtime keeps them
        loss = task.train_loss(batch, rows, dense)  # rows: a leaf tensor [U, width]
        <backward, update rows and dense, write rows back>

A task whose own update rule is a step per example applied at once (word2vec's) may instead update
the rows in place when its config says so (``in_place_setting``): the runtime hands it the table
and calls ``step_in_place`` on several threads at once (strategies that keep the rows in one
process and apply batches in order: ``sync``, ``async``).

A task with several logical tables (matrix factorisation's users and items, word2vec's input and
output vectors) lays them out as consecutive ranges (``TablePart``) of one key space, so every
strategy's concurrency control (versions, OAC's validation cache, staleness accounting) works on a
single index of rows.
"""

from __future__ import annotations

import functools
import io

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from cadence import compiled
from cadence.config import Config
from cadence.device import resolve_device
from cadence.errors import ConfigError, DataError, QueryError
from cadence.kernels import RowStep
from cadence.optim import freeze_parameters
from cadence.data.fingerprint import fingerprint
from cadence.data.text import TSV_DIGITS, tsv_name  # noqa: F401  (re-exported: export's TSV files)
from cadence.core.batch import Batch, BatchPlan
from cadence.prediction import Predictor
from cadence.registry import Registry
from cadence.resources import check_memory
from cadence.core.rows import ParameterView, RowBlock, TablePart, TableSpec  # noqa: F401  (the task interface's row types)

TASKS: Registry[type["Task"]] = Registry("task", "task")

Progress = Callable[[Iterable], Iterable]  # wraps an iterable of evaluation steps (a progress bar)


@dataclass(frozen=True)
class Vocabulary:
    """What a model's rows stand for, by name, so another run on changed data can find them
    (``train.init_from``, ``cadence.training.grow``).

    ``parts``: the names of the keys of each consecutive range of a fixed table, in key order (KGE's
    ``entities``; MF's ``users`` then ``items``; word2vec's ``input`` then ``output``); None for a
    growing vocabulary, whose keys are their own names (CTR's hashed features). ``dense``: a dense
    parameter whose rows are vocabulary entries (KGE's ``relations``) and the name of each row.
    ``same``: what a grown model cannot change (the image task's classes: the output layer's rows)."""

    parts: dict[str, tuple[str, ...]] | None
    dense: dict[str, tuple[str, ...]] = field(default_factory=dict)
    same: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Frozen:
    """What does not train in a grown run (``train.freeze: known``): the rows of ``keys`` (sorted;
    their gradient is zero: every entity optimizer then leaves a row and its state as they are), the
    rows of a vocabulary-indexed dense parameter marked True in ``dense_rows``, and, if ``dense``,
    every other dense parameter (stepped at rate 0: ``cadence.optim.freeze_parameters``)."""

    keys: Tensor
    dense_rows: dict[str, Tensor] = field(default_factory=dict)
    dense: bool = False


@dataclass(frozen=True)
class Validation:
    """What to evaluate after an epoch: ``split`` (a name ``task.evaluate`` knows), recorded in
    metrics.jsonl as ``record`` with ``extra`` fields; ``early_stopping``: it counts for patience."""

    split: str
    record: str = "valid"
    extra: tuple[tuple[str, Any], ...] = ()
    early_stopping: bool = True


class Task(ABC):
    name: ClassVar[str]
    primary_metric: ClassVar[str]
    higher_is_better: ClassVar[bool] = True
    # config sections and keys that belong to this task alone (a run of another task must not set them)
    own_keys: ClassVar[tuple[str, ...]] = ()
    # "mean": ``loss`` is a mean over the batch's examples; "sum": a sum (per-example SGD step sizes)
    loss_reduction: ClassVar[str] = "mean"
    # (the config key that chooses how this task's updates are applied, the value of its in-place
    # loop): its value ``auto`` is resolved once, at the edge, to that loop where it applies, else
    # ``batch`` (``api.prepare_config``); None: the runtime applies every update
    update_choice: ClassVar[tuple[str, str] | None] = None

    # the config keys that size the dense module (named by the error when it would not fit in memory)
    dense_keys: ClassVar[tuple[str, ...]] = ("model.dim",)

    def __init__(self, config: Config):
        self.config = config
        self.frozen: Frozen | None = None  # set by a grown run with ``train.freeze: known``
        self.dense_checked = False  # whether the dense module's size was checked against the memory

    # ---- what is learned ------------------------------------------------------------------------
    @property
    @abstractmethod
    def dataset_name(self) -> str: ...

    @property
    def model_name(self) -> str:
        return self.config.model.name

    @abstractmethod
    def table(self) -> TableSpec:
        """The task's rows: one key space, fixed or growing."""

    def dense_module(self) -> nn.Module:
        """A fresh dense module (seeded: every call returns the same initial parameters), its frozen
        parameters marked (``frozen``) wherever it is built: every runtime, replica and process. The
        first call builds it on the meta device first: a module larger than this process may take is
        a ``ConfigError`` naming the settings that size it, before anything is allocated."""
        if not self.dense_checked:
            with torch.device("meta"):
                count = sum(p.numel() for p in self.build_dense().parameters())
            check_memory(f"the dense module of model {self.model_name}, sized by {' and '.join(self.dense_keys)} "
                         f"({count:,} parameters, with their gradients),", 2 * 4 * count)
            self.dense_checked = True
        module = self.build_dense()
        if self.frozen is not None and self.frozen.dense:
            freeze_parameters(module, [name for name, _ in module.named_parameters()
                                       if name not in self.frozen.dense_rows])
        return module

    @abstractmethod
    def build_dense(self) -> nn.Module:
        """The task's dense module as it starts (seeded); rows of ``frozen.dense_rows`` get no gradient."""

    @abstractmethod
    def vocabulary(self) -> Vocabulary:
        """The names of the rows (``Vocabulary``): written beside every run, read by a run grown from it."""

    def keeping(self, kept: Vocabulary, keys: Tensor) -> "Task":
        """This task with ids its data lacks added to its vocabulary, after its own (a grown run's
        ``train.keep_dropped``): ``kept.parts`` the names per row part, ``kept.dense`` per dense
        vocabulary parameter, ``keys`` a growing table's keys. The ids never train (no example has
        them); they are exported and, where a task ranks every id, ranked."""
        raise ConfigError(f"train.keep_dropped: the {self.name} task cannot keep ids its data lacks")

    def known_keys(self) -> Tensor:
        """Every key the task's data can touch (sorted): the pipeline sizes a growing vocabulary's
        store from it. Fixed tables: all keys."""
        spec = self.table()
        assert spec.rows is not None, f"task {self.name} must list the keys of its growing vocabulary"
        return torch.arange(spec.rows)

    # ---- batches --------------------------------------------------------------------------------
    def num_epochs(self) -> int:
        return self.config.train.epochs

    @abstractmethod
    def plan(self, epoch: int) -> list[BatchPlan]:
        """The batches of ``epoch``: a pure function of (seed, epoch)."""

    def partition(self, plans: list[BatchPlan], parts: int) -> list[list[BatchPlan]]:
        """The plans of an epoch split among ``parts`` nodes that each own a share of the data
        (AdaPM): by default round-robin, so every node sees the epoch's shuffle; a task whose data
        is partitioned (MF by rows) says which batches belong to which node."""
        return [plans[index::parts] for index in range(parts)]

    def partition_workers(self, plans: list[BatchPlan], workers: int) -> list[list[BatchPlan]]:
        """A node's plans split among its ``workers`` worker threads (AdaPM): round-robin by
        default; a task whose data is partitioned (MF by columns within a node) says which."""
        return [plans[index::workers] for index in range(workers)]

    @abstractmethod
    def prepare(self, plan: BatchPlan) -> Batch:
        """The batch of ``plan``: the keys it touches (``ids``, sorted, unique) and its inputs."""

    @abstractmethod
    def loss(self, batch: Batch, rows: Tensor, dense: nn.Module) -> Tensor:
        """The batch's loss from its rows [U, width] (in ``batch.ids`` order) and the dense module."""

    def training_batch(self, plan: BatchPlan) -> Batch:
        """``prepare`` as training calls it (every runtime): the rows that do not train marked
        (``Batch.frozen``, from the keys, before a runtime maps them to positions of its store)."""
        batch = self.prepare(plan)
        if self.frozen is not None and self.frozen.keys.numel() and batch.ids.numel():
            batch.frozen = torch.isin(batch.ids, self.frozen.keys)
        return batch

    def train_loss(self, batch: Batch, rows: Tensor, dense: nn.Module) -> Tensor:
        """``loss`` as training computes it (every runtime calls this): frozen rows get no gradient."""
        if batch.frozen is not None:
            rows = torch.where(batch.frozen.to(rows.device).unsqueeze(1), rows.detach(), rows)
        return self.loss(batch, rows, dense)

    def fused_step(self, batch: Batch, rows: RowBlock, dense: nn.Module,
                   step: RowStep) -> tuple[Tensor, list[Tensor | None]] | None:
        """One training step of the batch without autograd, where the task has one operator for it
        (``cadence.kge_step``): ``rows`` (values and state) updated in place by Adagrad's row ``step``;
        returns (the loss, each dense parameter's gradient in ``dense.parameters()`` order, None for
        one the loss did not use). None (the default): this batch takes ``train_loss``, autograd and
        the row optimizer, the reference a fused step must equal."""
        return None

    @classmethod
    def resolve_defaults(cls, config: Config, node_parts: tuple[int, int] = (1, 1)) -> None:
        """Give the task's own settings left at a word that the rest of the config decides (kge's
        ``train.negative_chunk: auto``) their concrete value, in place. ``node_parts``: (nodes,
        worker threads a node) of a strategy whose nodes each train their own part of the data with
        the rows they hold (``Strategy.node_parts``). Called once, by ``api.prepare_config``, so the
        run's config.yaml records what ran; the default: none."""

    # ---- updates in place (word2vec's own loop) ---------------------------------------------------
    @classmethod
    def in_place_setting(cls, config: Config) -> str | None:
        """The config key under which this task applies its updates to the rows itself, in place, as
        each is computed (``"w2v.update"`` when it is ``pair``), or None: it returns a loss and the
        runtime updates the rows. A ``ConfigError`` where that setting cannot work with the rest of
        the config (an optimizer it does not apply, a device its kernel does not run on)."""
        return None

    @property
    def updates_in_place(self) -> bool:
        return self.in_place_setting(self.config) is not None

    def step_in_place(self, batch: Batch, values: Tensor, part: int, parts: int) -> float:
        """Apply part ``part`` of ``parts`` of the batch's updates to ``values``, the whole table
        [rows, width] indexed by key, in place; return that part's loss (the parts' sum is the
        batch's loss). Called for a task that ``updates_in_place``, on ``parts`` threads at once,
        which may write the same rows (Hogwild); ``batch`` came from ``prepare`` with no ids (no row
        is pulled or written back)."""
        raise NotImplementedError(f"task {self.name} does not update rows in place")

    def loss_total(self, loss: float, size: int) -> float:
        """A batch's contribution to the epoch's summed loss (reported per example); a float or a
        tensor, so the pipeline sums on the device without a synchronisation per batch."""
        return loss * self.loss_weight(size)

    def loss_weight(self, size: int) -> int:
        """What a batch's loss is multiplied by in the epoch's sum (``loss_total``)."""
        return size if self.loss_reduction == "mean" else 1

    def examples_of(self, batch_examples: int) -> int:
        """Examples a count of batch examples stands for (KGE's reciprocal copies count once)."""
        return batch_examples

    # ---- evaluation -----------------------------------------------------------------------------
    def validation(self, epoch: int) -> Validation | None:
        """What to evaluate after ``epoch`` epochs (default: ``valid`` every ``eval.every``)."""
        every = self.config.eval.every
        return Validation("valid") if every and epoch % every == 0 else None

    def split_size(self, split: str) -> int | None:
        """How many examples ``split`` holds (None: this task does not count it; its metrics come from
        elsewhere, as word2vec's benchmarks). An empty split is refused before a metric is made up
        from it (``check_splits``)."""
        return None

    def check_splits(self, splits: Iterable[str]) -> None:
        """A ``DataError`` naming the data when one of ``splits`` is empty: no metric of it would mean
        anything (an accuracy of 0 images, an RMSE of 0 ratings)."""
        for split in splits:
            if self.split_size(split) == 0:
                setting = {"valid": "eval.every: 0", "test": "eval.test: false"}.get(split)
                raise DataError(f"the {split} split is empty: no {self.primary_metric} can be measured on it"
                                + (f" (to train without it, set {setting})" if setting else ""),
                                self.config.data.dataset)

    @abstractmethod
    def evaluate(self, params: ParameterView, dense: nn.Module, split: str, device: torch.device,
                 progress: Progress) -> dict[str, float]:
        """Metrics of the model on ``split``; the primary metric among them."""

    def final_metrics(self, evaluate: Callable[[str], dict[str, float]],
                      history: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, Any]]:
        """(test metrics to record, extra summary fields) at the end of a run."""
        return (evaluate("test") if self.config.eval.test else {}), {}

    def better(self, value: float, best: float | None) -> bool:
        if best is None:
            return True
        return value > best if self.higher_is_better else value < best

    # ---- the data's identity ----------------------------------------------------------------------
    @abstractmethod
    def data_parts(self) -> dict[str, tuple[Any, ...]]:
        """The parts of the data a checkpoint depends on (id maps, splits), each a tuple of
        tensors, names and numbers; their digests (``data_fingerprint``) go into every checkpoint."""

    def data_fingerprint(self) -> dict[str, str]:
        """{part: digest} of ``data_parts`` (computed once)."""
        if getattr(self, "_cache_fingerprint", None) is None:
            self._cache_fingerprint = fingerprint(self.data_parts())
        return self._cache_fingerprint

    # ---- outputs --------------------------------------------------------------------------------
    def write_metadata(self, run_dir: Path) -> None:
        """Id maps and other files a run directory keeps beside its checkpoints."""

    export_formats: ClassVar[tuple[str, ...]] = ("npy", "tsv")

    @abstractmethod
    def export(self, params: ParameterView, dense: nn.Module, run_dir: Path, out: Path, format: str) -> list[Path]:
        """Write the trained parameters in ``format``; return the files written."""

    # what ``predictor`` builds: its ``queries`` are what ``cadence predict`` may ask a run of this task
    predictor_type: ClassVar[type[Predictor] | None] = None

    def predictor(self, params: ParameterView, dense: nn.Module) -> Predictor:
        """The trained model, to be asked (``cadence.load``, ``cadence.prediction``): a predictor over
        the run's rows ``params`` and its ``dense`` module."""
        raise QueryError(f"the {self.name} task answers no queries")

    def summary_fields(self) -> dict[str, Any]:
        return {"task": self.name, "dataset": self.dataset_name, "model": self.model_name}

    def recipe(self) -> Callable[[], "Task"]:
        """How another process (a Ray worker) gets this task: it builds it from the config and reads
        the data itself, unless the data was handed in as an object (tests, the Python API): then
        the task travels whole."""
        if getattr(self, "data_given", False):
            return functools.partial(_same, self)
        return functools.partial(_rebuilt, type(self), self.config, self.frozen)

    def __getstate__(self) -> dict[str, Any]:
        """Tasks travel to worker processes (the Ray engine): caches are rebuilt there if needed."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_cache")}


def _same(task: Task) -> Task:
    return task


def _rebuilt(kind: type[Task], config: Config, frozen: Frozen | None) -> Task:
    task = kind(config)
    task.frozen = frozen
    return task


def in_place_key(config: Config, key: str, loop: str, default_optimizer: str) -> str:
    """``key`` (a task's ``in_place_setting``), once the rest of the config fits an in-place loop:
    the ``sgd`` entity optimizer (the loop applies its own SGD step), the compiled kernels, the CPU
    where the rows are; else a ``ConfigError`` naming ``key``. ``loop`` says what the setting asks for
    (``"word2vec's per-pair updates (pair)"``); ``key: batch`` is every in-place task's alternative; ``default_optimizer``: the task's entity
    optimizer where the config names none."""
    if (config.optimizer.entity or default_optimizer) != "sgd":
        raise ConfigError(f"{key}: {loop} apply their SGD step to the rows themselves: optimizer.entity must be sgd "
                          f"(got {config.optimizer.entity or 'the default, ' + default_optimizer}); use {key}: batch "
                          "for another optimizer")
    if not config.train.compiled or not compiled.AVAILABLE:
        raise ConfigError(f"{key}: {loop} are a compiled loop (numba): it needs train.compiled on and numba installed"
                          f"{'' if compiled.AVAILABLE else ' (numba cannot be imported here)'}")
    if config.device != "auto" and resolve_device(config.device).type != "cpu":
        raise ConfigError(f"{key}: {loop} run on the CPU, where the rows are (device: {config.device}); use device: "
                          f"cpu or {key}: batch")
    return key


# ---- export -----------------------------------------------------------------------------------------------
_TSV_BLOCK = 65536  # rows formatted at a time


def write_vectors_tsv(path: Path, names: Sequence[Any], vectors: Tensor) -> Path:
    """``--format tsv``: one line per row, ``name<TAB>v1<TAB>...<TAB>vd`` (``tsv_name``; each value with
    9 significant digits, which reads back to the same float32). ``vectors``: [len(names), ...], each
    row flattened."""
    values = vectors.detach().cpu().float().reshape(len(names), -1).numpy()
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for start in range(0, len(names), _TSV_BLOCK):
            text = io.StringIO()
            np.savetxt(text, values[start:start + _TSV_BLOCK], fmt=TSV_DIGITS, delimiter="\t")
            lines = text.getvalue().splitlines()
            handle.writelines(f"{tsv_name(name)}\t{line}\n"
                              for name, line in zip(names[start:start + _TSV_BLOCK], lines, strict=True))
    return path
