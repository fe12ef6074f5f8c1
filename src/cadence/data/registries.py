"""Every task's dataset registry, for ``cadence data list`` and ``cadence data fetch``."""

from __future__ import annotations

from cadence.data.corpus import CORPORA
from cadence.data.ctr import CTR_DATASETS
from cadence.data.datasets import DATASETS
from cadence.data.images import IMAGE_DATASETS
from cadence.data.ratings import RATING_DATASETS
from cadence.registry import Registry


def dataset_registries() -> dict[str, Registry]:
    """task -> its dataset registry (entries have ``description``, ``source``, ``fetch``, ``is_fetched``)."""
    return {"kge": DATASETS, "ctr": CTR_DATASETS, "mf": RATING_DATASETS, "w2v": CORPORA, "image": IMAGE_DATASETS}
