"""Image classification (``task: image``): a dense model, for the dense strategies (pdASGD,
ShadowSync's replicas, Hogwild) and their baselines, on the same loop as the embedding tasks.

    loss = mean over the batch of cross-entropy(model(images), labels)

Rows: none (``TableSpec`` of 0 rows): every parameter is in the dense module (``models/image.py``:
``mlp`` or ``cnn``), so the runtimes move no rows and the strategies differ only in how the dense
module is trained. Metrics: ``accuracy`` (primary) and ``cross_entropy``.

Data (``data.dataset``): ``fashion-mnist`` (Debian's ``dataset-fashion-mnist``, ``data/images.py``)
or a directory of IDX files. Splits: the last ``image.valid_size`` training images (in file order)
are held out for validation and early stopping; ``test`` is the data set's test file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cadence.config import Config
from cadence.data.images import ImageDataset, load_image_dataset
from cadence.errors import ConfigError
from cadence.models.image import IMAGE_MODELS
from cadence.prediction.images import ImagePredictor
from cadence.core.batch import Batch, BatchPlan, plan_epoch
from cadence.seeding import derive_seed
from cadence.tasks.base import TASKS, ParameterView, Progress, TableSpec, Task, Vocabulary, write_vectors_tsv

NO_ROWS = torch.empty(0, dtype=torch.int64)


@TASKS.register("image")
class ImageTask(Task):
    name = "image"
    primary_metric = "accuracy"
    own_keys = ("image",)

    @property
    def dense_keys(self) -> tuple[str, ...]:  # type: ignore[override]
        return IMAGE_MODELS.get(self.config.model.name).reads
    export_formats = ("npy", "tsv")

    def __init__(self, config: Config, dataset: ImageDataset | None = None):
        super().__init__(config)
        self.data_given = dataset is not None
        IMAGE_MODELS.get(config.model.name)
        self.dataset = dataset if dataset is not None else load_image_dataset(config.data.dataset)
        images, labels = self.dataset.train_images, self.dataset.train_labels
        held = config.image.valid_size
        if held >= images.shape[0]:
            raise ConfigError(f"image.valid_size: {held} held-out images leave none of the {images.shape[0]} "
                              f"training images of {self.dataset.name} to train on")
        cut = images.shape[0] - held
        self.splits = {"train": (images[:cut], labels[:cut]), "valid": (images[cut:], labels[cut:]),
                       "test": (self.dataset.test_images, self.dataset.test_labels)}
        pixels = self.splits["train"][0].float().div_(255.0)
        self.mean, self.std = float(pixels.mean()), float(pixels.std())

    @property
    def dataset_name(self) -> str:
        return self.dataset.name

    def data_parts(self) -> dict[str, tuple]:
        data = self.dataset
        return {"images": (data.train_images, data.train_labels, data.test_images, data.test_labels),
                "classes": tuple(data.classes), "split": (self.config.image.valid_size,)}

    def table(self) -> TableSpec:
        return TableSpec(0, 1, 0.0, derive_seed(self.config.seed, "image-table"))

    def build_dense(self) -> nn.Module:
        torch.manual_seed(derive_seed(self.config.seed, "image-model"))
        return IMAGE_MODELS.get(self.config.model.name)(self.dataset.shape, self.dataset.num_classes, self.mean,
                                                        self.std, self.config.image)

    def keeping(self, kept: Vocabulary, keys: Tensor) -> "ImageTask":
        return self  # (no rows; the classes cannot change)

    def vocabulary(self) -> Vocabulary:
        """No rows; the classes (the output layer's rows) cannot change."""
        return Vocabulary({}, same={"classes": tuple(map(str, self.dataset.classes))})

    # ---- batches --------------------------------------------------------------------------------
    def plan(self, epoch: int) -> list[BatchPlan]:
        return plan_epoch(self.splits["train"][0].shape[0], self.config.train.batch_size, self.config.seed, epoch,
                          "image-shuffle")

    def prepare(self, plan: BatchPlan) -> Batch:
        images, labels = self.splits["train"]
        return Batch(plan, NO_ROWS, {"images": images.index_select(0, plan.examples),
                                     "labels": labels.index_select(0, plan.examples)})

    def loss(self, batch: Batch, rows: Tensor, dense: nn.Module) -> Tensor:
        return F.cross_entropy(dense(batch.inputs["images"]), batch.inputs["labels"])

    # ---- evaluation -----------------------------------------------------------------------------
    def split_size(self, split: str) -> int | None:
        return int(self.splits[split][0].shape[0]) if split in self.splits else None

    @torch.no_grad()
    def evaluate(self, params: ParameterView, dense: nn.Module, split: str, device: torch.device,
                 progress: Progress) -> dict[str, float]:
        if split not in self.splits:
            raise ConfigError(f"split must be train, valid or test, got {split!r}")
        images, labels = self.splits[split]
        dense.eval()
        correct, entropy = 0, 0.0
        size = self.config.eval.batch_size
        for start in progress(range(0, images.shape[0], size)):
            target = labels[start:start + size].to(device)
            logits = dense(images[start:start + size].to(device))
            correct += int((logits.argmax(1) == target).sum())
            entropy += float(F.cross_entropy(logits, target, reduction="sum"))
        dense.train()
        count = max(1, images.shape[0])
        return {"accuracy": correct / count, "cross_entropy": entropy / count}

    # ---- prediction ------------------------------------------------------------------------------
    predictor_type = ImagePredictor

    def predictor(self, params: ParameterView, dense: nn.Module) -> ImagePredictor:
        return ImagePredictor(self.config, self.dataset.classes, self.dataset.shape, dense)

    # ---- outputs --------------------------------------------------------------------------------
    def write_metadata(self, run_dir: Path) -> None:
        (run_dir / "classes.txt").write_text("".join(f"{name}\n" for name in self.dataset.classes))

    def export(self, params: ParameterView, dense: nn.Module, run_dir: Path, out: Path, format: str) -> list[Path]:
        """One ``<parameter>.npy`` per entry of the model's state dict (``layers.1.weight.npy``, ...,
        the standardisation's ``standardise.mean.npy`` and ``.std``) and ``classes.txt``; ``tsv``:
        ``classes.tsv``, each class's name, then its row of the output layer's weights and its bias."""
        if format == "tsv":
            output = [module for module in dense.modules() if isinstance(module, nn.Linear)][-1]
            rows = torch.cat([output.weight, output.bias.unsqueeze(1)], dim=1)
            return [write_vectors_tsv(out / "classes.tsv", self.dataset.classes, rows)]
        files = []
        for name, value in dense.state_dict().items():
            np.save(out / f"{name}.npy", value.detach().cpu().numpy())
            files.append(out / f"{name}.npy")
        self.write_metadata(out)
        return files + [out / "classes.txt"]
