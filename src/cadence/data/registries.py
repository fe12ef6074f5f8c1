"""Every task's dataset registry, for ``cadence data list`` and ``cadence data fetch``."""

from __future__ import annotations

from cadence.registry import Registry


def dataset_registries() -> dict[str, Registry]:
    """task -> its dataset registry (entries have ``description``, ``source``, ``fetch``, ``is_fetched``)."""
    from cadence.data.ctr import CTR_DATASETS
    from cadence.data.datasets import DATASETS

    registries: dict[str, Registry] = {"kge": DATASETS, "ctr": CTR_DATASETS}
    try:
        from cadence.data.ratings import RATING_DATASETS

        registries["mf"] = RATING_DATASETS
    except ImportError:  # pragma: no cover - while the module is being written
        pass
    try:
        from cadence.data.corpus import CORPORA

        registries["w2v"] = CORPORA
    except ImportError:  # pragma: no cover
        pass
    return registries
