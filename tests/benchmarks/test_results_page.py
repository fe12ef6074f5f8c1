"""docs/results.md and the README's paper table are what benchmarks/results_page.py renders from the
result files (issue 49): rendered again here and compared; a result from an uncommitted tree (or one
that records no commit) is refused and named, and none of its numbers reach the page."""

from __future__ import annotations

import json
import shutil

from tests.benchmarks import benchmark_script

page = benchmark_script("results_page")
tables = benchmark_script("doc_tables")


def test_the_page_and_the_readme_table_are_what_the_result_files_give() -> None:
    sections = page.build()
    assert page.PAGE.read_text() == page.page(sections), "docs/results.md is stale: run `make results`"
    readme = tables.block(page.README.read_text(), page.README_BLOCK, page.SCRIPT)
    assert readme == page.readme_table(sections), "the README's paper table is stale: run `make results`"
    for section in sections:
        for figure in section.figures:
            assert (page.FIGURES / f"{figure.name}.svg").exists(), f"docs/results/{figure.name}.svg: run `make results`"
    # every paper has a section quoting at least one clean result file
    assert len(sections) == 5 and all(section.sources for section in sections)


def copy_results(tmp_path, *names):
    for name in names:
        shutil.copy(page.RESULTS / name, tmp_path / name)
    return tmp_path


def test_a_result_from_an_uncommitted_tree_is_refused_and_named(tmp_path) -> None:
    folder = copy_results(tmp_path, "gba_stragglers_quota.json")
    clean = page.page(page.build(folder))
    auc = json.loads((folder / "gba_stragglers_quota.json").read_text())["by_severity"]["4x"]["gba_minus_sync_test_auc"]
    assert f"{auc['mean']:+.4f}" in clean
    data = json.loads((folder / "gba_stragglers_quota.json").read_text())
    data["provenance"]["dirty"] = True
    (folder / "gba_stragglers_quota.json").write_text(json.dumps(data))
    dirty = page.page(page.build(folder))
    assert f"{auc['mean']:+.4f}" not in dirty
    assert "Not quoted: `benchmarks/results/gba_stragglers_quota.json`: refused: measured from a tree with uncommitted" in dirty


def test_a_result_that_records_no_commit_is_refused(tmp_path) -> None:
    folder = copy_results(tmp_path, "out_of_core.json")
    data = json.loads((folder / "out_of_core.json").read_text())
    del data["provenance"]
    (folder / "out_of_core.json").write_text(json.dumps(data))
    sections = page.build(folder)
    oac = sections[0]
    assert not oac.sources and oac.refused[0].name == "out_of_core.json" and "records no commit" in oac.refused[0].why
    assert "bit for bit" not in page.page(sections)


def test_a_changed_number_changes_the_page_and_its_figure(tmp_path) -> None:
    """The page (and a figure's recorded data hash) follows the files: what the first test compares."""
    names = ["gba_stragglers_quota.json", "out_of_core.json"]
    folder = copy_results(tmp_path, *names)
    before = page.page(page.build(folder))
    data = json.loads((folder / "out_of_core.json").read_text())
    data["ratios"]["oac_over_async"] += 0.5
    (folder / "out_of_core.json").write_text(json.dumps(data))
    data = json.loads((folder / "gba_stragglers_quota.json").read_text())
    data["aggregates"]["sync"]["4x"]["time_to_target"]["mean"] += 1.0
    (folder / "gba_stragglers_quota.json").write_text(json.dumps(data))
    after = page.page(page.build(folder))
    changed = [line for line in after.splitlines() if line not in before.splitlines()]
    assert any("OAC's speed against async's" in line for line in changed)
    assert any("figure data sha256" in line for line in changed)
