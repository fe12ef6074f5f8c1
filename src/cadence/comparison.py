"""What a side-by-side comparison of strategies says, told apart from noise.

``cadence compare --repeats N`` trains every contender N times, interleaved (A B C A B C ...), so a
slow minute of a shared machine falls on every contender alike. Each contender's cell is the median
of its runs with their range (lowest to highest); a contender is faster or slower than the first
(the reference) only where the two ranges do not overlap, else the two are level (``≈``). One run
each has no range: its ratio is a single measurement, said so. The closing sentence is made from
the same numbers as the table, so the two cannot disagree.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

SPEED = "examples_per_second"
# a metric's runs whose ranges touch count as level; single runs within this many of each other do too
METRIC_TOLERANCE = 5e-4
# the metrics a comparison reports beside each task's primary one
SECONDARY_METRICS = {"mrr": ["hits@10"], "auc": ["logloss", "ne"], "rmse": ["mae"],
                     "wordsim353": ["simlex999", "analogy"]}
LOWER_IS_BETTER = {"rmse", "mae", "logloss", "ne", "cross_entropy", "mean_rank"}


@dataclass(frozen=True)
class Spread:
    """The median of a contender's runs and their range."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: Iterable[float]) -> "Spread":
        values = [float(v) for v in values]
        return cls(statistics.median(values), min(values), max(values), len(values))

    def overlaps(self, other: "Spread", tolerance: float = 0.0) -> bool:
        return self.low - tolerance <= other.high and other.low - tolerance <= self.high


@dataclass(frozen=True)
class Against:
    """One contender against the reference: the ratio of medians and whether the ranges keep apart."""

    ratio: float
    distinct: bool  # the ranges do not overlap: a real difference (with one run each: unknown)
    measured: bool  # each side has a range (more than one run)

    @property
    def cell(self) -> str:
        """The table's cell: ``1.31x`` where the ranges keep apart (or there is one run), ``≈`` where they overlap."""
        if self.measured and not self.distinct:
            return "≈"
        return f"{self.ratio:.2f}x"


def metrics_of(primary: str) -> list[str]:
    """The metrics a comparison reports: the primary one, then its task's secondary ones."""
    return [primary, *SECONDARY_METRICS.get(primary, [])]


def spreads(runs: Sequence[dict[str, Any]], keys: Iterable[str]) -> dict[str, Spread]:
    """Each numeric key's spread over a contender's runs (summaries); keys a run lacks are left out."""
    found = {}
    for key in keys:
        values = [run[key] for run in runs if isinstance(run.get(key), (int, float)) and not isinstance(run.get(key), bool)]
        if len(values) == len(runs) and values:
            found[key] = Spread.of(values)
    return found


def against(contender: Spread, reference: Spread) -> Against:
    measured = contender.runs > 1 and reference.runs > 1
    ratio = contender.median / reference.median if reference.median > 0 else float("nan")
    return Against(ratio, measured and not contender.overlaps(reference), measured)


def statistics_of(runs: dict[str, list[dict[str, Any]]], metrics: Sequence[str]) -> dict[str, Any]:
    """comparison.json's ``stats``: per contender, the spread of its speed, training seconds and
    metrics, and its speed against the first contender's."""
    names = list(runs)
    keys = [SPEED, "train_seconds", *metrics]
    table = {name: spreads(runs[name], keys) for name in names}
    reference = table[names[0]].get(SPEED)
    stats = {}
    for name in names:
        entry: dict[str, Any] = {key: asdict(spread) for key, spread in table[name].items()}
        if reference is not None and SPEED in table[name] and name != names[0]:
            entry["speedup"] = asdict(against(table[name][SPEED], reference))
        stats[name] = entry
    return stats


def verdict(stats: dict[str, Any], metric: str, repeats: int) -> str:
    """The closing sentence: how each contender's speed and primary metric stand against the first's."""
    names = list(stats)
    reference = names[0]
    if len(names) < 2:
        return f"{reference}: one contender, nothing to compare."
    speed, level = [], []
    for name in names[1:]:
        entry = stats[name].get("speedup")
        if entry is None:
            continue
        if entry["measured"] and not entry["distinct"]:
            level.append(name)
        else:
            speed.append(f"{name} {entry['ratio']:.2f}x {reference}'s examples/s")
    parts = []
    if level:
        parts.append(f"{_join(level)} {'runs' if len(level) == 1 else 'run'} at {reference}'s speed "
                     f"(the ranges of {repeats} runs overlap)")
    if speed:
        parts.append(", ".join(speed) + (f" (the ranges of {repeats} runs keep apart)" if repeats > 1 else ""))
    sentence = "; ".join(parts) if parts else "no speed to compare"
    quality = _quality(stats, metric, reference, names[1:])
    closing = f"{sentence}. {quality}"
    if repeats == 1:
        closing += (" One run each: a ratio is a single measurement, not told from noise (--repeats 3 or more "
                    "gives each a range).")
    return closing


def _quality(stats: dict[str, Any], metric: str, reference: str, others: Sequence[str]) -> str:
    base = stats[reference].get(metric)
    if base is None:
        return f"No {metric} to compare."
    base_spread = Spread(**base)
    same, differ = [], []
    for name in others:
        if metric not in stats[name]:
            continue
        spread = Spread(**stats[name][metric])
        if spread.overlaps(base_spread, METRIC_TOLERANCE):
            same.append(name)
        else:
            sign = spread.median - base_spread.median
            better = (sign < 0) if metric in LOWER_IS_BETTER else (sign > 0)
            differ.append(f"{name}'s is {'better' if better else 'worse'} ({spread.median:.4f} against "
                          f"{base_spread.median:.4f})")
    parts = []
    if same:
        parts.append(f"{_join(same)} {'reaches' if len(same) == 1 else 'reach'} {reference}'s {metric} "
                     f"({base_spread.median:.4f})")
    parts += differ
    return ("; ".join(parts) + ".") if parts else ""


def _join(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def cell(spread: dict[str, Any] | None, fmt: str) -> str:
    """A table cell: the median, and the range where there is more than one run."""
    if spread is None:
        return "-"
    median = format(spread["median"], fmt)
    if spread["runs"] < 2 or format(spread["low"], fmt) == format(spread["high"], fmt):
        return median
    return f"{median} ({format(spread['low'], fmt)}-{format(spread['high'], fmt)})"
