"""Models: scorers (interaction functions), the KGE model, losses and regularisers."""

from cadence.models.kge import KgeModel
from cadence.models.scorers import SCORERS, Scorer

__all__ = ["SCORERS", "KgeModel", "Scorer"]
