"""Classes of images from a trained image classifier (``task: image``).

``classify(path)``: the class of each image of an IDX file (unsigned bytes, N x H x W, as the data
set's own image files; gzip or not): its index in the file, the class the model scores highest (as
accuracy counts it: the argmax of the logits), the class's name where the data set names its classes,
and the model's probability of it. ``classes(images)``: the same for images in hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from cadence.config import Config
from cadence.data.images import read_idx
from cadence.errors import DataError
from cadence.prediction.base import Names, Prediction, Predictor, Query


class ImagePredictor(Predictor):
    task = "image"

    def __init__(self, config: Config, classes: Sequence[str], shape: tuple[int, int], dense: nn.Module):
        self.classes = Names("class", "classes", classes)
        super().__init__(config, (self.classes,))
        self.shape, self.dense = tuple(shape), dense.eval()
        self.batch_size = config.eval.batch_size
        # a data set of IDX files alone numbers its classes: no names to show beside the numbers
        self.named = any(name != str(index) for index, name in enumerate(self.classes.names))

    def classes_of(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """([n] class, [n] its probability) of images [n, H, W] (uint8, as the data set's)."""
        if tuple(images.shape[1:]) != self.shape:
            raise DataError(f"images of {' x '.join(map(str, images.shape[1:]))} pixels; the run's model reads "
                            f"{' x '.join(map(str, self.shape))}")
        classes, probabilities = [], []
        with torch.no_grad():
            for start in range(0, images.shape[0], self.batch_size):
                logits = self.dense(images[start:start + self.batch_size])
                best = logits.argmax(1)  # (as accuracy counts: the logits' argmax)
                classes.append(best)
                probabilities.append(torch.softmax(logits, dim=1).gather(1, best.unsqueeze(1)).squeeze(1))
        if not classes:
            return torch.empty(0, dtype=torch.int64), torch.empty(0)
        return torch.cat(classes), torch.cat(probabilities)

    def classify(self, path: str | Path) -> Prediction:
        """Each image of an IDX file: columns ``image`` (its index), ``class``, ``name`` (where the data
        set names its classes) and ``probability``."""
        images = read_idx(Path(path), 3)
        try:
            classes, probabilities = self.classes_of(images)
        except DataError as err:
            raise DataError(err.reason, path) from None
        if not self.named:
            return Prediction(("image", "class", "probability"),
                              tuple(zip(range(len(classes)), classes.tolist(), probabilities.tolist())))
        return Prediction(("image", "class", "name", "probability"),
                          tuple((index, label, self.classes[label], probability) for index, (label, probability)
                                in enumerate(zip(classes.tolist(), probabilities.tolist()))))

    queries = (Query("classify", classify, ("FILE",)),)
