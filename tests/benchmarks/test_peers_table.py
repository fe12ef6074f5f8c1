"""docs/benchmarks.md's table of every task against its peer is generated from the committed result
files (benchmarks/peers_table.py), never typed: a number changed by hand, or a result file re-measured
without regenerating the table, fails here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks import REPO, benchmark_script


def peers_table():
    return benchmark_script("peers_table")


def test_the_docs_table_is_the_one_the_result_files_give() -> None:
    module = peers_table()
    documented = module.block((REPO / "docs" / "benchmarks.md").read_text())
    assert documented is not None, "docs/benchmarks.md lost its peers-table markers"
    assert documented == module.render(), "run: python3 benchmarks/peers_table.py --write"


def test_a_changed_result_changes_the_table(tmp_path: Path) -> None:
    module = peers_table()
    for name, _ in module.SOURCES:
        source = REPO / "benchmarks" / "results" / name
        if source.exists():
            (tmp_path / name).write_text(source.read_text())
    report = json.loads((tmp_path / "mf_vs_surprise.json").read_text())
    report["summary"]["speed_ratio_cadence_over_surprise_default"]["median"] = 9.99
    (tmp_path / "mf_vs_surprise.json").write_text(json.dumps(report))
    assert "**9.99x**" in module.render(tmp_path) and module.render(tmp_path) != module.render()
