"""benchmarks/out_of_core.py's own measurement: the cgroup's anonymous memory, sampled while a run
runs (what OAC holds beside async out of core, issue 46)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.benchmarks import benchmark_script

bench = benchmark_script("out_of_core")


def test_the_sampler_reads_the_cgroups_anonymous_memory_until_stopped(tmp_path: Path) -> None:
    stat = tmp_path / "memory.stat"
    stat.write_text("cache 4096\nrss 1\ntotal_cache 8192\ntotal_rss 10485760\n")
    stop, seen = threading.Event(), []
    sampler = threading.Thread(target=bench.sample_anon, args=(tmp_path, stop, seen, 0.01))
    sampler.start()
    deadline = time.monotonic() + 30  # (a sampler that died fails the test here, never hangs it)
    while len(seen) < 3 and time.monotonic() < deadline:
        stop.wait(0.01)
    stat.write_text("total_cache 0\ntotal_rss 31457280\n")  # (a sample may catch it half written)
    while 30 not in seen and time.monotonic() < deadline:
        stop.wait(0.01)
    stop.set()
    sampler.join(5)
    assert not sampler.is_alive() and set(seen) == {10, 30}  # MiB, total_rss (not rss)


def test_the_sampler_ends_when_the_cgroup_is_gone(tmp_path: Path) -> None:
    seen: list[int] = []
    bench.sample_anon(tmp_path / "removed", threading.Event(), seen, 0.01)
    assert seen == []


def test_a_variant_is_a_named_strategy_with_its_overrides() -> None:
    assert bench.parse_variant("oac-nocoalesce:oac:pipeline.coalesce_writes=false,pipeline.writer_threads=2") == (
        "oac-nocoalesce", "oac", ["pipeline.coalesce_writes=false", "pipeline.writer_threads=2"])
    for bad in ("oac:pipeline.coalesce_writes=false", "x:hogwild:a=b", "oac:oac:a=b"):
        try:
            bench.parse_variant(bad)
        except SystemExit as stop:
            assert "--variant" in str(stop)
        else:
            raise AssertionError(f"{bad} accepted")


def test_time_to_accuracy_is_the_first_validation_at_sync_best() -> None:
    """--curve's figure against a hand-worked case: per repetition, the target is that repetition's
    sync best; a strategy's time is its first validation at or above it; never reached is None."""
    def run(*points):
        return {"history": [{"epoch": i + 1, "wall_seconds": t, "mrr": m} for i, (t, m) in enumerate(points)]}

    runs = {"sync": [run((10, 0.1), (20, 0.3), (30, 0.25)), run((12, 0.2), (24, 0.4))],
            "oac": [run((5, 0.2), (10, 0.31)), run((6, 0.39), (12, 0.4))],
            "async": [run((4, 0.1), (8, 0.2)), run((5, 0.4), (10, 0.1))]}
    reach = bench.time_to_accuracy(runs)
    assert reach["targets"] == [0.3, 0.4]
    assert reach["seconds"] == {"sync": [20, 24], "oac": [10, 12], "async": [None, 5]}
    assert reach["sync_over"] == {"oac": [2.0, 2.0], "async": [None, 24 / 5]}


def test_mean_curve_target_is_the_best_of_sync_averaged_over_repetitions() -> None:
    """The paper's figure: epoch by epoch means over the repetitions (cut to the shortest run), the
    target the best point of sync's mean curve, each strategy's first mean point at or above it."""
    def run(*points):
        return {"history": [{"epoch": i + 1, "wall_seconds": t, "mrr": m} for i, (t, m) in enumerate(points)]}

    runs = {"sync": [run((10, 0.2), (20, 0.5), (30, 0.4)), run((14, 0.4), (24, 0.3), (34, 0.4))],
            "oac": [run((4, 0.3), (8, 0.35), (12, 0.6)), run((6, 0.3), (12, 0.5), (18, 0.0))],
            "async": [run((3, 0.1), (6, 0.2)), run((5, 0.2), (10, 0.2), (15, 0.9))]}
    mean = bench.time_to_accuracy(runs)["mean_curve"]
    assert mean["curves"]["sync"] == [(12, 0.30000000000000004), (22, 0.4), (32, 0.4)]
    assert len(mean["curves"]["async"]) == 2  # the shortest run bounds the curve
    assert mean["target"] == 0.4
    assert mean["seconds"] == {"sync": 22, "oac": 10, "async": None}
    assert mean["sync_over"] == {"oac": 2.2, "async": None}


def test_the_within_noise_target_is_sync_s_best_less_the_paired_half_width() -> None:
    """OAC equals sync only within the seeds' noise: the second target is sync's best (of its mean
    curve) less the 95% half-width of OAC's best minus sync's, paired by seed (worked by hand: gaps
    -0.02 and 0, half-width t(0.975, 1) x 0.01414 / sqrt(2) = 0.127)."""
    def run(*points):
        return {"history": [{"epoch": i + 1, "wall_seconds": t, "mrr": m} for i, (t, m) in enumerate(points)]}

    runs = {"sync": [run((10, 0.5), (20, 0.6)), run((10, 0.5), (20, 0.6))],
            "oac": [run((5, 0.55), (10, 0.58)), run((5, 0.5), (10, 0.6))],
            "async": [run((4, 0.1), (8, 0.2)), run((4, 0.1), (8, 0.2))]}
    mean = bench.time_to_accuracy(runs)["mean_curve"]
    assert mean["seconds"]["oac"] is None and mean["sync_over"]["oac"] is None  # 0.59 < 0.6: never, strictly
    near = mean["within_noise"]
    assert near["tolerance"] == pytest.approx(12.706 * 0.02 / 2 ** 0.5 / 2 ** 0.5, rel=1e-3)
    assert near["target"] == pytest.approx(0.6 - near["tolerance"])
    assert near["seconds"] == {"sync": 10, "oac": 5, "async": None}
    assert near["sync_over"] == {"oac": 2.0, "async": None}


def test_resummarize_recomputes_the_bars_and_keeps_the_runs_and_their_commit(tmp_path: Path) -> None:
    """``--resummarize``: a complete file's summaries and bars from its runs, with this commit's code;
    the runs and the commit they ran at stay as they were; an incomplete file is refused."""
    def run(*points, speed=100.0, mrr=0.5):
        return {"history": [{"epoch": i + 1, "wall_seconds": t, "mrr": m} for i, (t, m) in enumerate(points)],
                "examples_per_second": speed, "mrr": mrr, "major_page_faults": 0}

    runs = {"sync": [run((10, 0.5), (20, 0.6)), run((10, 0.5), (20, 0.6))],
            "async": [run((4, 0.1), (8, 0.2), speed=250), run((4, 0.1), (8, 0.2), speed=250)],
            "oac": [run((5, 0.55), (10, 0.58), speed=240), run((5, 0.5), (10, 0.6), speed=240)]}
    measured = {"commit": "0" * 40, "dirty": False, "dirty_files": []}
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"slowfs": {"latencies": {"5.0": {"runs": runs, "oac_replay": {"bit_identical": True}}}},
                                "complete": True, "provenance": measured}))
    bench.resummarize(path)
    again = json.loads(path.read_text())
    assert again["provenance"] == measured and again["summarized"]["commit"] != measured["commit"]
    assert again["slowfs"]["latencies"]["5.0"]["runs"] == runs
    assert again["slowfs"]["time_to_accuracy_bar"]["passed"] is False  # strictly: never
    assert again["slowfs"]["time_to_accuracy_within_noise_bar"]["value"] == 2.0
    path.write_text(json.dumps({**again, "complete": False}))
    with pytest.raises(SystemExit, match="not a complete result file"):
        bench.resummarize(path)
