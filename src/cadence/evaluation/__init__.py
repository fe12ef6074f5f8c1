"""Evaluation: filtered link-prediction ranking."""

from cadence.evaluation.ranking import FilterIndex, FilteredRankingMetric, filtered_ranks

__all__ = ["FilterIndex", "FilteredRankingMetric", "filtered_ranks"]
