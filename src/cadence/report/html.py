"""``cadence report RUN_OR_COMPARISON_DIR... --out report.html``: one self-contained HTML page of
runs to look at: no server, no network, no script; the plots are inline SVG drawn here (no plotting
library needed).

The page: a table of the runs (task, data, model, strategy, speed, the primary metric), the primary
metric per epoch and against training wall time for every run, the strategy's own counters over time
(each validation record of metrics.jsonl keeps them: staleness, drops, repairs, bytes, sync gap...),
and per run its resolved config, the machine and the commit it ran at (summary.json's
``environment``), what it grew from (``init_from``) and why its strategy (``auto``).
"""

from __future__ import annotations

import html
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from cadence.errors import CadenceError

LOWER_IS_BETTER = ("rmse", "mae", "logloss", "ne", "cross_entropy")
CURVE_SPLITS = ("valid", "next_period")
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
SUMMARY_KEYS = ("task", "dataset", "model", "strategy", "runtime", "epochs", "train_seconds", "examples_per_second")


@dataclass
class Run:
    name: str
    path: Path
    config: str  # config.yaml as written
    summary: dict[str, Any] = field(default_factory=dict)  # empty: the run has not finished
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def metric(self) -> str | None:
        return self.summary.get("primary_metric") or next(
            (k for k in ("mrr", "auc", "rmse", "wordsim353", "accuracy") if any(k in r for r in self.records)), None)

    def curve(self, x: str) -> list[tuple[float, float]]:
        metric = self.metric
        return [(float(r[x]), float(r[metric])) for r in self.records
                if r.get("split") in CURVE_SPLITS and _number(r.get(metric)) and _number(r.get(x))]


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """The runs of run directories and of comparison directories (each of its strategies' runs)."""
    runs: list[Run] = []
    for given in paths:
        path = Path(given)
        if (path / "comparison.json").is_file():
            comparison = _json(path / "comparison.json")
            strategies = comparison.get("strategies", {})
            if not isinstance(strategies, (dict, list)) or not all(isinstance(name, str) for name in strategies):
                raise CadenceError(f"{path / 'comparison.json'}: 'strategies' is not the strategies' names")
            runs += [_run(path / name, f"{path.name}/{name}") for name in strategies]
        elif (path / "config.yaml").is_file():
            runs.append(_run(path, path.name))
        else:
            raise CadenceError(f"{path}: not a cadence run or comparison directory (no config.yaml or comparison.json)")
    if not runs:
        raise CadenceError("report: no runs to show")
    return _distinct(runs)


def _distinct(runs: list[Run]) -> list[Run]:
    """Runs of the same name (``a/run``, ``b/run``) are named by as many of their paths' last parts as
    tell them apart (a run's name keys its curves and its colour: one must not replace another); the
    same directory given twice is numbered."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.name, []).append(run)
    for group in groups.values():
        paths = {run.path.resolve() for run in group}
        if len(group) < 2 or len(paths) < 2:
            continue
        depth = 2
        while len({path.parts[-depth:] for path in paths}) < len(paths):
            depth += 1
        for run in group:
            run.name = "/".join(run.path.resolve().parts[-depth:]).lstrip("/")
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            run.name = f"{run.name} ({seen[run.name]})"
    return runs


def _run(path: Path, name: str) -> Run:
    if not (path / "config.yaml").is_file():
        raise CadenceError(f"{path}: not a cadence run directory (no config.yaml)")
    summary = _json(path / "summary.json") if (path / "summary.json").is_file() else {}
    records = []
    metrics = path / "metrics.jsonl"
    if metrics.is_file():
        for number, line in enumerate(_text(metrics).splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError:
                    raise CadenceError(f"{metrics}:{number}: not a JSON line") from None
                if not isinstance(record, dict):
                    raise CadenceError(f"{metrics}:{number}: not a JSON object (a {type(record).__name__})")
                _shaped(record, RECORD_SHAPES, f"{metrics}:{number}")
                records.append(record)
    _shaped(summary, SUMMARY_SHAPES, str(path / "summary.json"))
    return Run(name, path, _text(path / "config.yaml"), summary, records)


# the fields of summary.json and of a metrics.jsonl record that the page reads, and their JSON types
SUMMARY_SHAPES: dict[str, type | tuple[type, ...]] = {"primary_metric": str, "environment": dict, "auto": dict,
                                                      "init_from": dict}
RECORD_SHAPES: dict[str, type | tuple[type, ...]] = {"counters": dict, "split": str}


def _shaped(record: dict[str, Any], shapes: dict[str, type | tuple[type, ...]], where: str) -> None:
    """A field the page reads holding another kind of value (a damaged or foreign file): one line."""
    for key, kind in shapes.items():
        if record.get(key) is not None and not isinstance(record[key], kind):
            raise CadenceError(f"{where}: {key!r} is a {type(record[key]).__name__}, not what cadence writes there")


def _text(path: Path) -> str:
    """A run file's text; one that is not UTF-8 (damaged, or not cadence's) is a one-line error."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CadenceError(f"{path}: not UTF-8 text (byte {err.start}): a damaged or foreign file") from None
    except OSError as err:
        raise CadenceError(f"{path}: cannot be read ({err.strerror})") from None


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(_text(path))
    except ValueError as err:
        raise CadenceError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise CadenceError(f"{path}: not a JSON object (a {type(value).__name__})")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---- the page ---------------------------------------------------------------------------------------------
def render(runs: list[Run], title: str = "cadence report") -> str:
    metrics = sorted({run.metric for run in runs if run.metric})
    palette = {run.name: COLORS[index % len(COLORS)] for index, run in enumerate(runs)}
    parts = [f"<h1>{_e(title)}</h1>",
             f"<p class=note>{len(runs)} run(s); generated {_e(time.strftime('%Y-%m-%d %H:%M:%S'))} by cadence report</p>",
             "<h2>Runs</h2>", _summary_table(runs, metrics)]
    for metric in metrics:
        mine = [run for run in runs if run.metric == metric]
        direction = " (lower is better)" if metric in LOWER_IS_BETTER else ""
        parts.append(f"<h2>{_e(metric)}{direction}</h2><div class=row>")
        parts.append(line_chart({run.name: run.curve("epoch") for run in mine}, "epoch", metric,
                                f"{metric} per epoch", palette))
        parts.append(line_chart({run.name: run.curve("wall_seconds") for run in mine}, "training wall seconds", metric,
                                f"{metric} against training time", palette))
        parts.append("</div>")
    counters = sorted({key for run in runs for r in run.records for key, v in (r.get("counters") or {}).items()
                       if _number(v)})
    if counters:
        parts.append("<h2>The strategies' counters over time</h2><div class=row>")
        for key in counters:
            series = {run.name: [(float(r["wall_seconds"]), float(r["counters"][key])) for r in run.records
                                 if _number((r.get("counters") or {}).get(key)) and _number(r.get("wall_seconds"))]
                      for run in runs}
            if any(series.values()):
                parts.append(line_chart({k: v for k, v in series.items() if v}, "training wall seconds", key, key, palette))
        parts.append("</div>")
    parts.append("<h2>Each run</h2>")
    parts += [_run_details(run) for run in runs]
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.row{display:flex;flex-wrap:wrap;gap:12px}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:420px}.note{color:#666}
svg{background:#fff;border:1px solid #ddd}details{margin:6px 0}h2{margin-top:28px}"""


def _summary_table(runs: list[Run], metrics: list[str]) -> str:
    header = ["run", *SUMMARY_KEYS, *(f"test {m}" for m in metrics), *(f"best valid {m}" for m in metrics)]
    rows = []
    for run in runs:
        s = run.summary
        cells = [run.name, *(_cell(s.get(k, "-")) for k in SUMMARY_KEYS),
                 *(_cell(s.get(m, "-")) for m in metrics), *(_cell(s.get(f"best_valid_{m}", "-")) for m in metrics)]
        if not s:
            cells[1] = "(not finished)"
        rows.append(cells)
    return _table(header, rows, "runs")


def _run_details(run: Run) -> str:
    s, env = run.summary, run.summary.get("environment") or {}
    lines = [f"<h3 id=\"{_e(run.name)}\">{_e(run.name)}</h3>", f"<p class=note>{_e(str(run.path))}</p>"]
    if env:
        commit = env.get("commit") or "unknown (not run from a git checkout)"
        dirty = " (src/ had uncommitted changes)" if env.get("dirty") else ""
        lines.append(_table(["machine", "cpus", "memory GiB", "python", "torch", "cadence", "commit"],
                            [[f"{env.get('host', '?')}: {env.get('platform', '?')}", env.get("cpus", "?"),
                              env.get("memory_gib", "?"), env.get("python", "?"), env.get("torch", "?"),
                              env.get("cadence", "?"), f"{commit}{dirty}"]], "environment"))
    else:
        lines.append("<p class=note>machine and commit: not recorded (a run of an older cadence, or unfinished)</p>")
    if "auto" in s:
        lines.append(f"<p><b>strategy auto</b> chose {_e(s['auto'].get('reason', ''))}</p>")
        trials = s["auto"].get("trials", [])
        lines.append(_table(["candidate", "examples/s", "batches", "seconds", "dropped", "note"],
                            [[t.get("strategy"), _cell(t.get("examples_per_second") or "-"), t.get("batches"),
                              _cell(t.get("seconds")), t.get("gradients_dropped", "-"), t.get("note", "")]
                             for t in trials], "auto trials"))
    if "init_from" in s:
        grown = s["init_from"]
        parts = [(k, v) for k, v in grown.items() if isinstance(v, dict)]
        lines.append(f"<p><b>grown from</b> {_e(str(grown.get('run')))} (train.freeze: {_e(str(grown.get('freeze')))})</p>")
        lines.append(_table(["part", "matched", "added", "dropped"],
                            [[k, v.get("matched"), v.get("added"), v.get("dropped")] for k, v in parts], "growth"))
    lines.append(f"<details><summary>resolved config (config.yaml)</summary><pre>{_e(run.config)}</pre></details>")
    if s:
        lines.append(f"<details><summary>summary.json</summary><pre>{_e(json.dumps(s, indent=1))}</pre></details>")
    return "\n".join(lines)


def _table(header: Sequence[Any], rows: Sequence[Sequence[Any]], kind: str) -> str:
    head = "".join(f"<th>{_e(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class=\"{kind}\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"
    return str(value)


def _e(text: str) -> str:
    return html.escape(text, quote=True)


# ---- an SVG line chart ----------------------------------------------------------------------------------------
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 520, 320, 64, 16, 28, 78


def line_chart(series: dict[str, list[tuple[float, float]]], x_label: str, y_label: str, title: str,
               colors: dict[str, str] | None = None) -> str:
    """An inline ``<svg>``: one polyline (and its points) per series, axes with 5 ticks, a legend;
    ``colors``: each series' colour (a run keeps its colour across charts)."""
    points = [p for values in series.values() for p in values]
    svg = [f"<svg class=chart xmlns=\"http://www.w3.org/2000/svg\" width={WIDTH} height={HEIGHT} "
           f"viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=img aria-label=\"{_e(title)}\">",
           f"<text x={WIDTH / 2} y=18 text-anchor=middle font-size=14>{_e(title)}</text>"]
    if not points:
        svg.append(f"<text x={WIDTH / 2} y={HEIGHT / 2} text-anchor=middle fill=#888>no records</text></svg>")
        return "".join(svg)
    x0, x1 = _span([0.0, *(p[0] for p in points)])  # (time and epochs from 0)
    y0, y1 = _span([p[1] for p in points])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return TOP + plot_h - (y - y0) / (y1 - y0) * plot_h

    svg.append(f"<rect x={LEFT} y={TOP} width={plot_w} height={plot_h} fill=none stroke=#999 />")
    for i in range(5):
        tx, ty = x0 + (x1 - x0) * i / 4, y0 + (y1 - y0) * i / 4
        svg.append(f"<line x1={sx(tx):.1f} y1={TOP + plot_h} x2={sx(tx):.1f} y2={TOP + plot_h + 4} stroke=#999 />"
                   f"<text x={sx(tx):.1f} y={TOP + plot_h + 16} text-anchor=middle font-size=10>{_tick(tx)}</text>"
                   f"<line x1={LEFT} y1={sy(ty):.1f} x2={LEFT + plot_w} y2={sy(ty):.1f} stroke=#eee />"
                   f"<text x={LEFT - 4} y={sy(ty) + 3:.1f} text-anchor=end font-size=10>{_tick(ty)}</text>")
    svg.append(f"<text x={LEFT + plot_w / 2} y={TOP + plot_h + 32} text-anchor=middle font-size=11>{_e(x_label)}</text>")
    svg.append(f"<text x=14 y={TOP + plot_h / 2} text-anchor=middle font-size=11 "
               f"transform=\"rotate(-90 14 {TOP + plot_h / 2})\">{_e(y_label)}</text>")
    for index, (name, values) in enumerate(series.items()):
        color = (colors or {}).get(name, COLORS[index % len(COLORS)])
        if values:
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(values))
            svg.append(f"<polyline class=series data-run=\"{_e(name)}\" points=\"{coords}\" fill=none "
                       f"stroke=\"{color}\" stroke-width=2 />")
            svg += [f"<circle cx={sx(x):.1f} cy={sy(y):.1f} r=2.5 fill=\"{color}\" />" for x, y in values]
        legend_y = TOP + plot_h + 46 + 12 * (index // 3)
        legend_x = LEFT + (index % 3) * 150
        svg.append(f"<rect x={legend_x} y={legend_y - 8} width=10 height=10 fill=\"{color}\" />"
                   f"<text x={legend_x + 14} y={legend_y + 1} font-size=10>{_e(name[:24])}</text>")
    svg.append("</svg>")
    return "".join(svg)


def _span(values: list[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if high == low:
        pad = abs(high) * 0.05 or 1.0
        return low - pad, high + pad
    return low, high


def _tick(value: float) -> str:
    if value != 0 and (abs(value) >= 10000 or abs(value) < 0.01):
        return f"{value:.2g}"
    return f"{value:.4g}"


def write_report(paths: Sequence[str | Path], out: str | Path, title: str | None = None) -> Path:
    """Render the runs of ``paths`` into ``out`` (written whole or not at all)."""
    runs = load_runs(paths)
    page = render(runs, title or "cadence report: " + ", ".join(run.name for run in runs[:4]) +
                  (" ..." if len(runs) > 4 else ""))
    out = Path(out)
    if out.is_dir():
        raise CadenceError(f"--out {out}: a directory; give the HTML file to write")
    if not out.resolve().parent.is_dir():
        raise CadenceError(f"--out {out}: its directory does not exist")
    staging = out.with_name(f".{out.name}.tmp")
    staging.write_text(page, encoding="utf-8")
    staging.replace(out)
    return out
