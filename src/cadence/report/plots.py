"""Time-to-accuracy and accuracy-per-epoch plots of compared runs (the two views of OAC's
Figures 2 and 3). matplotlib is imported lazily: it is the optional ``plot`` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadence.errors import CadenceError

LOWER_IS_BETTER = ("rmse", "mae", "logloss", "ne")  # the metrics whose axis says so


def available() -> bool:
    """Whether matplotlib can be imported (``compare`` writes its plots only then)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise CadenceError("plots need matplotlib: pip install 'cadence[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(curves: dict[str, list[dict[str, Any]]], metric: str, x_key: str, x_label: str,
                title: str, path: Path) -> None:
    """One line per run: ``metric`` of each validation record against ``x_key``."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for name, records in curves.items():
        points = [(r[x_key], r[metric]) for r in records if r.get(metric) is not None]  # null: undefined
        if points:
            xs, ys = zip(*points)
            axis.plot(xs, ys, marker="o", markersize=3, label=name)
    axis.set_xlabel(x_label)
    lower = " (lower is better)" if metric in LOWER_IS_BETTER else ""
    axis.set_ylabel(f"validation {metric.upper() if len(metric) <= 4 else metric}{lower}")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    if axis.lines:
        axis.legend()
    else:  # no run has a validation record of this metric (eval.every: 0)
        axis.text(0.5, 0.5, f"no validation {metric} recorded", ha="center", va="center", transform=axis.transAxes)
    figure.tight_layout()
    temporary = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(temporary)
    plt.close(figure)
    temporary.replace(path)
