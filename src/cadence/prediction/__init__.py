"""Asking a trained run (``cadence.load``, ``cadence predict``): a predictor per task, built by the
task (``Task.predictor``) over the run's final rows and dense module; top-k answers over a table read a
block of rows at a time (``top``)."""

from cadence.prediction.base import Names, Prediction, Predictor, Query  # noqa: F401
