"""``cadence compare`` tells signal from noise: repeats interleaved, medians with ranges, ``≈`` where
ranges overlap, one-time costs paid before the timed part, a closing sentence made from the table."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from cadence import api, comparison
from cadence.cli import main
from cadence.tasks.kge import KgeTask
from tests.conftest import make_config
from tests.test_cli import run_cli


def runs(*speeds: float, metric: float = 0.5) -> list[dict]:
    return [{"examples_per_second": s, "train_seconds": 100.0 / s, "mrr": metric} for s in speeds]


def test_spread_is_the_median_and_range_of_the_runs() -> None:
    values = [5.0, 1.0, 4.0, 2.0]
    spread = comparison.Spread.of(values)
    assert (spread.median, spread.low, spread.high, spread.runs) == (sorted(values)[1] / 2 + sorted(values)[2] / 2, 1, 5, 4)
    assert spread.median == statistics.median(values)


@pytest.mark.parametrize("contender, reference, cell", [
    ((100, 110, 120), (100, 105, 115), "≈"),        # the ranges overlap: level, whatever the ratio of medians
    ((150, 160, 170), (100, 105, 115), "1.52x"),    # apart: the ratio of medians
    ((50, 55, 60), (100, 105, 115), "0.52x"),
    ((116, 200, 300), (100, 105, 115), "1.90x"),    # just apart
    ((115, 200, 300), (100, 105, 115), "≈"),        # touching counts as overlapping
])
def test_a_speedup_is_shown_only_where_the_ranges_keep_apart(contender, reference, cell) -> None:
    stats = comparison.statistics_of({"sync": runs(*reference), "oac": runs(*contender)}, ["mrr"])
    against = comparison.Against(**stats["oac"]["speedup"])
    assert against.cell == cell
    # the reference against a naive computation: medians' ratio, and ranges compared by hand
    assert against.ratio == pytest.approx(statistics.median(contender) / statistics.median(reference))
    assert against.distinct == (min(contender) > max(reference) or max(contender) < min(reference))


def test_one_run_each_shows_the_ratio_and_says_it_is_one_measurement() -> None:
    stats = comparison.statistics_of({"sync": runs(100), "async": runs(101)}, ["mrr"])
    assert comparison.Against(**stats["async"]["speedup"]).cell == "1.01x"
    sentence = comparison.verdict(stats, "mrr", 1)
    assert "single measurement" in sentence and "--repeats" in sentence


def test_the_closing_sentence_agrees_with_the_table() -> None:
    stats = comparison.statistics_of({"sync": runs(100, 104, 98, metric=0.94),
                                      "async": runs(101, 97, 105, metric=0.89),
                                      "oac": runs(200, 190, 210, metric=0.94)}, ["mrr"])
    sentence = comparison.verdict(stats, "mrr", 3)
    assert "async runs at sync's speed" in sentence
    assert "oac 2.00x sync's examples/s" in sentence
    assert "oac reaches sync's mrr" in sentence and "async's is worse (0.8900 against 0.9400)" in sentence
    # lower is better for an error metric
    stats = comparison.statistics_of({"sync": [{"examples_per_second": 1.0, "rmse": 0.9}] * 2,
                                      "gba": [{"examples_per_second": 1.0, "rmse": 0.8}] * 2}, ["rmse"])
    assert "gba's is better" in comparison.verdict(stats, "rmse", 2)


def test_repeats_run_interleaved_and_every_run_is_summarised(tiny_graph: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    code = main(["-q", "compare", "--strategies", "sync,async,oac", "--dataset", str(tiny_graph), "--dim", "8",
                 "--epochs", "1", "--batch-size", "32", "--out", str(out), "--no-progress", "--repeats", "2",
                 "--set", "train.negatives=8", "--set", "eval.every=0"])
    assert code == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "comparison.json").read_text())
    assert result["repeats"] == 2 and result["verdict"] in printed
    order = []
    for name, entry in result["strategies"].items():
        assert entry["runs"] == [str(out / name), str(out / "repeats" / "2" / name)]
        for run in entry["runs"]:
            order.append((Path(run, "summary.json").stat().st_mtime_ns, name))
        assert result["stats"][name]["examples_per_second"]["runs"] == 2
        speeds = [json.loads(Path(run, "summary.json").read_text())["examples_per_second"] for run in entry["runs"]]
        assert result["stats"][name]["examples_per_second"]["median"] == pytest.approx(statistics.median(speeds))
    # finished in the order A B C A B C (each run's summary is its last file)
    assert [name for _, name in sorted(order)] == ["sync", "async", "oac"] * 2
    # sync's and oac's runs train the same model, every time: their mrr has no range
    assert result["stats"]["sync"]["mrr"]["low"] == result["stats"]["sync"]["mrr"]["high"]


def test_a_one_time_cost_is_paid_before_the_timed_part(tiny_graph: Path, tmp_path: Path, monkeypatch) -> None:
    """A task whose first batch in the process is slow (as compiling a kernel is): with the warm-up the
    pause falls outside ``train_seconds`` and is reported apart; without it, inside."""
    pause = 1.0
    prepare = KgeTask.prepare

    def slow_first(self, plan):
        if not slow_first.paid:
            slow_first.paid = True
            time.sleep(pause)  # (a unit-test device standing for a one-time cost)
        return prepare(self, plan)

    monkeypatch.setattr(KgeTask, "prepare", slow_first)
    for warm in (True, False):
        slow_first.paid = False
        config = make_config(None, f"data.dataset={tiny_graph}", "train.epochs=1", "eval.every=0", "eval.test=false")
        result = api.compare(config, ["sync"], tmp_path / str(warm), warm=warm)
        summary = result["strategies"]["sync"]["summary"]
        if warm:
            assert summary["train_seconds"] < pause <= summary["warmup_seconds"]
        else:
            assert summary["train_seconds"] >= pause and "warmup_seconds" not in summary


def test_the_warm_up_leaves_the_model_as_a_run_without_it(tiny_graph: Path, tmp_path: Path) -> None:
    # epochs inline (pipeline.overlap: never): under auto a loaded machine may run an epoch in the
    # pipeline's threads, whose computation order (and so which batch stamps a row last) is the run's
    # own; OAC equals the replay of that order (tests/test_task_matrix.py), not another run
    config = make_config(None, f"data.dataset={tiny_graph}", "train.epochs=2", "eval.every=0", "eval.test=false",
                         "pipeline.overlap=never")
    for warm in (True, False):
        api.compare(config, ["sync", "oac"], tmp_path / str(warm), warm=warm)
    for name in ("sync", "oac"):
        warmed, cold = (load_file(tmp_path / str(warm) / name / "checkpoints" / "final" / "tensors.safetensors")
                        for warm in (True, False))
        assert warmed.keys() == cold.keys()
        for key in warmed:
            assert warmed[key].equal(cold[key]), (name, key)


@pytest.mark.parametrize("args, message", [
    (["--repeats", "0"], "--repeats 0: at least 1"),
    (["--repeats", "2", "--record-order", "order.jsonl"], "each repeat would record or replay the same file"),
])
def test_repeats_mistakes_are_one_line(tiny_graph: Path, tmp_path: Path, args, message) -> None:
    extra = [a if a != "order.jsonl" else str(tmp_path / a) for a in args]
    if "--record-order" in extra:  # (compare has no --record-order flag: the config key)
        extra = ["--repeats", "2", "--set", f"record_order={tmp_path / 'order.jsonl'}"]
    done = run_cli("compare", "--strategies", "sync,oac", "--dataset", str(tiny_graph), "--out", str(tmp_path / "c"),
                   *extra)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "c").exists()
