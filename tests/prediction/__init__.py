"""Predictions from trained runs (``cadence.load``, ``cadence predict``) against independent references."""
