"""The curves of a comparison: a plot of runs without a validation record says so instead of drawing
an empty legend (matplotlib warns on one: a user's `cadence compare` with eval.every: 0 printed it)."""

from __future__ import annotations

import warnings

import pytest

from cadence.report import plots

pytestmark = pytest.mark.skipif(not plots.available(), reason="matplotlib is not installed")


def test_runs_without_validation_records_plot_a_note_and_no_warning(tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.plot_curves({"sync": [{"epoch": 1, "mrr": None}], "async": []}, "mrr", "epoch", "epoch", "t",
                          tmp_path / "empty.png")
        plots.plot_curves({"sync": [{"epoch": 1, "mrr": 0.5}, {"epoch": 2, "mrr": 0.6}]}, "mrr", "epoch", "epoch",
                          "t", tmp_path / "one.png")
    assert (tmp_path / "empty.png").stat().st_size > 0 and (tmp_path / "one.png").stat().st_size > 0
