"""Click-through-rate prediction (``task: ctr``): LR, FM, Wide&Deep, DeepFM, DLRM on MovieLens-100k,
Criteo TSV files or synthetic data.

Rows: one per feature key, ``dim + 1`` floats (vector and linear weight; LR: the weight alone), in a growing vocabulary
of hashed keys (``(field << 40) | value``): a parameter server adds a key's row when a worker first
pulls it; the pipeline sizes its store once from every key in the data (``known_keys``). Either
way a key's initial row is a hash of (seed, key), so both runtimes start from the same model.
Dense module: the CTR model. Loss: binary cross-entropy; metrics: AUC (primary), logloss and NE
(normalised entropy: logloss over the entropy of the background CTR, the mean label of the examples
the run trains on: the train split, or periods ``ctr.first_period..ctr.last_period``; of at most
``BASE_RATE_SAMPLE`` of them, evenly spaced, where there are more: a streamed data set is never
materialised for it, and the mean is computed once, at the first evaluation).

Splits: a random 80/10/10 split, or time-ordered periods for continual training (``ctr.split:
periods``, GBA's protocol): the run trains ``train.epochs`` epochs on each period d from
``ctr.first_period`` to ``ctr.last_period`` and evaluates on period d + 1 after each (records
``next_period``); the summary's ``auc`` is the mean next-period AUC.
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cadence.config import Config
from cadence.data.ctr import MAX_VALUE_INDEX, CtrDataset, CtrExamples, field_of, load_ctr_dataset, rows_reader
from cadence.errors import ConfigError
from cadence.evaluation.classification import auc, logloss, normalized_entropy
from cadence.models.ctr import CTR_MODELS, batch_logits, examples_batch, examples_logits
from cadence.prediction.clicks import CtrPredictor
from cadence import compiled
from cadence.core.batch import Batch, BatchPlan, plan_epoch
from cadence.seeding import derive_seed
from cadence.tasks.base import TASKS, ParameterView, Progress, TableSpec, Task, Validation, Vocabulary, write_vectors_tsv

log = logging.getLogger("cadence")

EVAL_BATCH = 4096


@TASKS.register("ctr")
class CtrTask(Task):
    name = "ctr"
    primary_metric = "auc"
    own_keys = ("ctr",)
    dense_keys = ("model.dim", "ctr.hidden")

    def __init__(self, config: Config, dataset: CtrDataset | None = None):
        super().__init__(config)
        self.data_given = dataset is not None
        CTR_MODELS.get(config.model.name)
        self.dataset = dataset if dataset is not None else load_ctr_dataset(config.data.dataset, config.seed,
                                                                            config.ctr.synthetic)
        self.num_fields = len(self.dataset.field_names) + len(self.dataset.bag_names)
        self.num_dense = len(self.dataset.dense_names)
        compiled.warm_up("unique_any")  # the kernel's first call outside the epochs
        if config.ctr.split == "random":
            train, valid, test = self.dataset.random_split(config.seed)
            self.splits = {"train": train, "valid": valid, "test": test}
            self.periods: list[CtrExamples] | None = None
        else:
            self.periods = self.dataset.periods(config.ctr.num_periods)
            self.first_period = config.ctr.first_period
            self.last_period = config.ctr.last_period if config.ctr.last_period >= 0 else len(self.periods) - 2
            if not 0 <= self.first_period <= self.last_period <= len(self.periods) - 2:
                raise ConfigError(f"ctr.first_period..ctr.last_period must lie in 0..{len(self.periods) - 2} (each "
                                  f"trained period is evaluated on the next of {len(self.periods)}); got "
                                  f"{config.ctr.first_period}..{config.ctr.last_period}")
            self.splits = {}
        self._base_rate: float | None = None  # NE's background CTR (``base_rate``)

    @property
    def base_rate(self) -> float:
        """NE's background CTR: the mean label of the trained examples (module docstring)."""
        if self._base_rate is None:
            trained = ([self.splits["train"]] if self.periods is None
                       else self.periods[self.first_period: self.last_period + 1])
            self._base_rate = _mean_label(trained)
        return self._base_rate

    @property
    def dataset_name(self) -> str:
        return self.dataset.name

    def data_parts(self) -> dict[str, tuple]:
        data, examples = self.dataset, self.dataset.examples
        return {"fields": (data.field_names, data.bag_names, data.dense_names),
                "examples": (examples.keys, examples.bags, examples.dense, examples.labels, examples.timestamps)}

    def table(self) -> TableSpec:
        width = CTR_MODELS.get(self.config.model.name).row_width(self.config.model.dim)
        return TableSpec(None, width, self.config.model.init_std,
                         derive_seed(self.config.seed, "ctr-table"))

    def build_dense(self) -> nn.Module:
        torch.manual_seed(derive_seed(self.config.seed, "ctr-model"))
        return CTR_MODELS.get(self.config.model.name)(self.num_fields, self.num_dense, self.config.model.dim,
                                                      tuple(self.config.ctr.hidden), self.config.ctr.dropout)

    def vocabulary(self) -> Vocabulary:
        """A growing table: each feature's key is a hash of its field and value, its own name; the
        fields (the dense module's inputs) cannot change."""
        data = self.dataset
        return Vocabulary(None, same={"fields": tuple(data.field_names), "bags": tuple(data.bag_names),
                                      "dense features": tuple(data.dense_names)})

    def keeping(self, kept: Vocabulary, keys: Tensor) -> "CtrTask":
        """Kept feature keys join the keys of the data (``known_keys``)."""
        task = CtrTask(self.config, self.dataset)
        task.kept_keys = keys
        return task

    def known_keys(self) -> Tensor:
        examples = self.dataset.examples
        kept = getattr(self, "kept_keys", None)
        return torch.unique(torch.cat([examples.keys.flatten(), examples.bags[examples.bags >= 0],
                                       *(() if kept is None else (kept,))]))

    # ---- batches --------------------------------------------------------------------------------
    def num_epochs(self) -> int:
        if self.periods is None:
            return self.config.train.epochs
        return self.config.train.epochs * (self.last_period - self.first_period + 1)

    def _period(self, epoch: int) -> int:
        return -1 if self.periods is None else self.first_period + epoch // self.config.train.epochs

    def training_examples(self, epoch: int) -> CtrExamples:
        period = self._period(epoch)
        return self.splits["train"] if period < 0 else self.periods[period]

    def plan(self, epoch: int) -> list[BatchPlan]:
        period = self._period(epoch)
        local_epoch = epoch if period < 0 else epoch % self.config.train.epochs
        plans = plan_epoch(len(self.training_examples(epoch)), self.config.train.batch_size, self.config.seed,
                           local_epoch, "ctr-shuffle", period)
        return [BatchPlan(epoch, plan.index, plan.examples) for plan in plans]

    def prepare(self, plan: BatchPlan) -> Batch:
        return examples_batch(plan, self.training_examples(plan.epoch).subset(plan.examples))

    def loss(self, batch: Batch, rows: Tensor, dense: nn.Module) -> Tensor:
        return F.binary_cross_entropy_with_logits(batch_logits(dense, batch.inputs, rows), batch.inputs["labels"])

    # ---- evaluation -----------------------------------------------------------------------------
    def validation(self, epoch: int) -> Validation | None:
        if self.periods is None:
            return super().validation(epoch)
        if epoch % self.config.train.epochs:
            return None
        period = self._period(epoch - 1)
        return Validation(f"period:{period + 1}", "next_period", (("period", period),), early_stopping=False)

    def _split(self, split: str) -> CtrExamples:
        if split.startswith("period:") and self.periods is not None:
            return self.periods[int(split.split(":")[1])]
        if split not in self.splits:
            choices = ", ".join(self.splits) or "period:N"
            raise ConfigError(f"split {split!r} does not exist in this run (choose {choices})")
        return self.splits[split]

    @torch.no_grad()
    def split_size(self, split: str) -> int | None:
        return len(self.splits[split]) if split in self.splits else None

    def evaluate(self, params: ParameterView, dense: nn.Module, split: str, device: torch.device,
                 progress: Progress) -> dict[str, float]:
        examples = self._split(split)
        dense.eval()
        scores = examples_logits(dense, examples, lambda keys: params.values(keys).to(device), device, progress,
                                 EVAL_BATCH)
        dense.train()
        area = auc(scores, examples.labels)
        if math.isnan(area):
            log.warning("auc of the %s split is undefined: its %d labels are all one class (reported as null)",
                        split, len(examples))
        ne = normalized_entropy(scores, examples.labels, self.base_rate)
        if math.isnan(ne):
            log.warning("ne of the %s split is undefined: the training labels' mean is %s (reported as null)",
                        split, self.base_rate)
        return {"auc": area, "logloss": logloss(scores, examples.labels), "ne": ne}

    def final_metrics(self, evaluate: Callable[[str], dict[str, float]],
                      history: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, Any]]:
        if self.periods is None:
            return super().final_metrics(evaluate, history)
        aucs = [r["auc"] for r in history if r["split"] == "next_period"]
        return {}, {"auc": sum(aucs) / len(aucs) if aucs else None, "next_period_auc": aucs}

    # ---- prediction ------------------------------------------------------------------------------
    predictor_type = CtrPredictor

    def predictor(self, params: ParameterView, dense: nn.Module) -> CtrPredictor:
        return CtrPredictor(self.config, self.dataset, params, dense,
                            functools.partial(rows_reader, self.config.data.dataset))

    # ---- outputs --------------------------------------------------------------------------------
    def export(self, params: ParameterView, dense: nn.Module, run_dir: Path, out: Path, format: str) -> list[Path]:
        """``npy``: ``feature_keys.npy`` [K] int64 (``(field << 40) | value``), ``embeddings.npy`` [K, dim] (not
        for LR) and ``linear_weights.npy`` [K] of every key in the data, ``fields.tsv`` (field index and
        name), and ``dense.safetensors`` (the model's dense parameters). ``tsv``: ``features.tsv`` (not
        for LR) and ``linear_weights.tsv``, each feature named ``FIELD=VALUE`` (its field's name and its
        value's index within the field), then its embedding or its weight."""
        from safetensors.torch import save_file

        keys = self.known_keys()
        rows = params.values(keys)
        if format == "tsv":
            fields = self.dataset.field_names + self.dataset.bag_names
            names = [f"{fields[field]}={value}" for field, value in
                     zip(field_of(keys).tolist(), (keys & MAX_VALUE_INDEX).tolist())]
            written = [write_vectors_tsv(out / "features.tsv", names, rows[:, :-1])] if rows.shape[1] > 1 else []
            return [*written, write_vectors_tsv(out / "linear_weights.tsv", names, rows[:, -1:])]
        files = {"feature_keys.npy": keys, "linear_weights.npy": rows[:, -1]}
        if rows.shape[1] > 1:
            files["embeddings.npy"] = rows[:, :-1]
        written = []
        for name, value in files.items():
            np.save(out / name, value.detach().cpu().numpy())
            written.append(out / name)
        names = self.dataset.field_names + self.dataset.bag_names
        (out / "fields.tsv").write_text("".join(f"{i}\t{n}\n" for i, n in enumerate(names)))
        save_file({k: v.detach().cpu().contiguous() for k, v in dense.state_dict().items()}, out / "dense.safetensors")
        return [*written, out / "fields.tsv", out / "dense.safetensors"]


BASE_RATE_SAMPLE = 1_000_000  # examples read for NE's background CTR, at most


def _mean_label(parts: list[CtrExamples]) -> float:
    """The background CTR of ``parts`` (their examples' mean label; past ``BASE_RATE_SAMPLE``
    examples, of that many evenly spaced over the parts); nan without examples."""
    count = sum(len(part) for part in parts)
    total, seen = 0.0, 0
    for part in parts:
        size = len(part)
        share = size if count <= BASE_RATE_SAMPLE else max(1, round(BASE_RATE_SAMPLE * size / count))
        labels = part.labels if share >= size else part.subset(torch.linspace(0, size - 1, share).long()).labels
        total, seen = total + float(labels.double().sum()), seen + len(labels)
    return total / seen if seen else math.nan
