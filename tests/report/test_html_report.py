"""``cadence report``: one self-contained HTML page. Checked against the runs' own files (each
validation record of metrics.jsonl is a point of its curve; the commit is git's), for what makes the
page self-contained (no script, nothing fetched), and rendered in a real headless browser (Debian's
chromium: ``make chromium``, or ``$CADENCE_CHROMIUM``, or one on the PATH; skipped without one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cadence import api
from cadence.errors import CadenceError
from cadence.report.html import write_report
from tests.conftest import make_config
from tests.test_cli import run_cli

REPO = Path(__file__).resolve().parents[2]


class Page(HTMLParser):
    """The tags of a page: charts (their polylines by run), tables (their rows), every attribute."""

    def __init__(self, text: str):
        super().__init__()
        self.charts: list[dict[str, int]] = []
        self.tables: dict[str, int] = {}
        self.attributes: list[tuple[str, str, str]] = []
        self.tags: list[str] = []
        self._table: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        self.attributes += [(tag, k, v or "") for k, v in attrs.items()]
        if tag == "svg" and "chart" in attrs.get("class", ""):
            self.charts.append({"title": attrs.get("aria-label", "")})
        if tag == "polyline" and self.charts:
            self.charts[-1][attrs["data-run"]] = len(attrs["points"].split())
        if tag == "table":
            self._table = attrs.get("class", "")
            self.tables.setdefault(self._table, 0)
        if tag == "tr" and self._table is not None:
            self.tables[self._table] += 1


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    from tests.conftest import random_triples, write_graph

    root = tmp_path_factory.mktemp("report")
    triples = random_triples(30, 4, 260, seed=1)
    graph = write_graph(root / "graph", triples[:220], triples[220:240], triples[240:])
    api.compare(make_config(None, f"data.dataset={graph}", "train.epochs=3", "eval.every=1", "eval.test=false"),
                ["sync", "async"], root / "cmp")
    api.train(make_config(root / "ps", f"data.dataset={graph}", "train.epochs=2", "eval.every=1", "strategy=gba",
                          "ps.workers=2"))
    return root


def valid_records(run: Path) -> int:
    return sum(json.loads(line)["split"] == "valid" for line in (run / "metrics.jsonl").read_text().splitlines())


def test_the_page_shows_every_runs_curves_counters_config_machine_and_commit(runs: Path, tmp_path: Path) -> None:
    out = write_report([runs / "cmp", runs / "ps"], tmp_path / "report.html")
    text = out.read_text()
    page = Page(text)
    names = {"cmp/sync": runs / "cmp" / "sync", "cmp/async": runs / "cmp" / "async", "ps": runs / "ps"}
    assert page.tables["runs"] == 1 + len(names)  # the header and a row per run
    per_epoch = next(c for c in page.charts if c["title"] == "mrr per epoch")
    per_second = next(c for c in page.charts if c["title"] == "mrr against training time")
    for name, run in names.items():  # a point per validation record of each run's metrics.jsonl
        assert per_epoch[name] == per_second[name] == valid_records(run), name
        assert (run / "config.yaml").read_text().split("\n")[0] in text
    counters = {c["title"] for c in page.charts} - {"mrr per epoch", "mrr against training time"}
    summaries = {name: json.loads((run / "summary.json").read_text()) for name, run in names.items()}
    assert {"global_steps", "gradients_dropped"} <= counters  # the parameter server's, over time
    assert "stale_reads" in counters or "inline_epochs" in counters  # the pipeline's
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert all(s["environment"]["commit"] == commit for s in summaries.values())
    assert page.tables["environment"] == 2 * len(names) and commit in text


def test_the_page_needs_nothing_else(runs: Path, tmp_path: Path) -> None:
    page = Page(write_report([runs / "cmp"], tmp_path / "report.html").read_text())
    assert "script" not in page.tags and "link" not in page.tags and "img" not in page.tags and "iframe" not in page.tags
    fetched = [(tag, key, value) for tag, key, value in page.attributes if key in ("src", "href") or "url(" in value]
    assert not fetched


def chromium() -> str | None:
    for candidate in (os.environ.get("CADENCE_CHROMIUM"), str(REPO / ".chromium" / "chromium"),
                      shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


HEADLESS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]


@pytest.mark.skipif(chromium() is None, reason="no chromium here (make chromium fetches Debian's)")
def test_a_real_browser_renders_the_plots_and_tables(runs: Path, tmp_path: Path) -> None:
    from PIL import Image

    out = write_report([runs / "cmp", runs / "ps"], tmp_path / "report.html")
    env = {**os.environ, "HOME": str(tmp_path)}  # (its profile goes there)
    dom = subprocess.run([chromium(), *HEADLESS, "--dump-dom", out.as_uri()], capture_output=True, text=True,
                         timeout=120, env=env).stdout
    rendered, written = Page(dom), Page(out.read_text())
    assert rendered.charts == written.charts and rendered.tables == written.tables and len(rendered.charts) >= 4
    shot = tmp_path / "report.png"
    subprocess.run([chromium(), *HEADLESS, f"--screenshot={shot}", "--window-size=1200,1400", out.as_uri()],
                   capture_output=True, timeout=120, env=env, check=True)
    image = Image.open(shot).convert("RGB")
    colors = {color for _, color in image.getcolors(maxcolors=1 << 20)}
    assert image.size == (1200, 1400) and (0x1F, 0x77, 0xB4) in colors and (0xD6, 0x27, 0x28) in colors  # two runs' lines


def test_bad_paths_are_one_line_errors_and_nothing_is_written(runs: Path, tmp_path: Path) -> None:
    with pytest.raises(CadenceError, match="not a cadence run or comparison directory"):
        write_report([runs / "cmp", tmp_path], tmp_path / "report.html")
    done = run_cli("report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r.html"))
    assert done.returncode != 0 and done.stderr.startswith("cadence: error: ") and "nowhere" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r.html").exists()
    done = run_cli("report", str(runs / "ps"), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 0 and (tmp_path / "r.html").is_file()


def test_two_runs_of_one_last_name_keep_a_curve_each(runs: Path, tmp_path: Path) -> None:
    """``report a/run b/run``: both runs on the page, each its own curve (their names are as much of
    their paths as tells them apart); the same directory twice is two named entries too."""
    for parent in ("a", "b"):
        shutil.copytree(runs / "ps", tmp_path / parent / "run")
    out = write_report([tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "b" / "run"], tmp_path / "r.html")
    page = Page(out.read_text())
    per_epoch = page.charts[0]
    assert {"a/run", "b/run", "b/run (2)"} <= set(per_epoch), per_epoch
    assert per_epoch["a/run"] == per_epoch["b/run"] == valid_records(runs / "ps")


def test_names_and_values_are_escaped(runs: Path, tmp_path: Path) -> None:
    """A run directory named with HTML's special characters, and a config value holding them, reach
    the page as text: no tag or attribute of theirs appears."""
    name = 'x<b>&"q"'
    shutil.copytree(runs / "ps", tmp_path / name)
    config = tmp_path / name / "config.yaml"
    config.write_text(config.read_text() + "# <script>alert(1)</script>\n")
    text = write_report([tmp_path / name], tmp_path / "r.html").read_text()
    page = Page(text)
    assert "script" not in page.tags and "b" not in page.tags
    assert "&lt;script&gt;" in text and "x&lt;b&gt;&amp;&quot;q&quot;" in text


@pytest.mark.parametrize("damage", ["metrics-not-utf8", "summary-a-list", "metrics-a-number", "config-not-utf8",
                                    "environment-a-string", "counters-a-list"])
def test_a_damaged_run_file_is_one_line_naming_it(runs: Path, tmp_path: Path, damage: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs / "ps", run)
    summary = json.loads((run / "summary.json").read_text())
    file = {"metrics-not-utf8": "metrics.jsonl", "summary-a-list": "summary.json", "metrics-a-number": "metrics.jsonl",
            "config-not-utf8": "config.yaml", "environment-a-string": "summary.json",
            "counters-a-list": "metrics.jsonl"}[damage]
    if damage.endswith("not-utf8"):
        (run / file).write_bytes((run / file).read_bytes() + b"\xff\xfe\n")
    elif damage == "summary-a-list":
        (run / file).write_text("[1, 2]")
    elif damage == "metrics-a-number":
        (run / file).write_text((run / file).read_text() + "7\n")
    elif damage == "environment-a-string":
        (run / file).write_text(json.dumps({**summary, "environment": "here"}))
    else:
        (run / file).write_text((run / file).read_text() + json.dumps({"split": "valid", "counters": [1]}) + "\n")
    done = run_cli("report", str(run), "--out", str(tmp_path / "r.html"))
    assert done.returncode != 0 and done.stderr.startswith("cadence: error: "), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert str(run / file) in done.stderr and not (tmp_path / "r.html").exists()
