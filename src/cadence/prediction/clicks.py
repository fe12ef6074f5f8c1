"""Click probabilities from a trained CTR model (``task: ctr``).

``clicks(path)``: the probability of a click for each example of a file in the format of the run's
training data, read and hashed by the same reader (``cadence.data.ctr.rows_reader``: a Criteo-format
file for a run on one); a feature value training never saw reads its key's initial row, as training
would have. The label column may be present or absent: the file's first example decides (Criteo: 40
columns with it, 39 without) and every line must agree; a present label is shown beside the
probability and never used. ``probabilities(examples)``: the same for examples in hand. The logits
are evaluation's (``cadence.models.ctr.examples_logits``), the model in evaluation mode (no dropout).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from cadence.config import Config
from cadence.core.rows import ParameterView
from cadence.data.ctr import CtrDataset, CtrExamples, CtrRows
from cadence.models.ctr import examples_logits
from cadence.prediction.base import Names, Prediction, Predictor, Query

BATCH = 4096  # examples scored at a time


class CtrPredictor(Predictor):
    task = "ctr"

    def __init__(self, config: Config, dataset: CtrDataset, params: ParameterView, dense: nn.Module,
                 read_rows: Callable[[], Callable[[Path], CtrRows]]):
        """``read_rows``: gives the reader of the run's data format (a ``QueryError`` when it has none)."""
        super().__init__(config, (Names("field", "fields", [*dataset.field_names, *dataset.bag_names]),
                                  Names("dense feature", "dense features", dataset.dense_names)))
        self.params, self.dense, self.read_rows = params, dense.eval(), read_rows

    def probabilities(self, examples: CtrExamples) -> Tensor:
        """[n] click probabilities of ``examples`` (their labels are not read), float64: logits that
        differ keep their order (a float32 sigmoid would tie some, and move an AUC)."""
        logits = examples_logits(self.dense, examples, self.params.values, torch.device("cpu"), batch_size=BATCH)
        return torch.sigmoid(logits.double())

    def clicks(self, path: str | Path) -> Prediction:
        """The click probability of each example of ``path``: columns ``line`` (of the file),
        ``probability``, and ``label`` where the file has labels."""
        rows = self.read_rows()(Path(path))
        probabilities = self.probabilities(rows.examples).tolist()
        if not rows.labelled:
            return Prediction(("line", "probability"), tuple(zip(rows.lines, probabilities)))
        labels = rows.examples.labels.int().tolist()
        return Prediction(("line", "probability", "label"), tuple(zip(rows.lines, probabilities, labels)))

    queries = (Query("clicks", clicks, ("FILE",)),)
