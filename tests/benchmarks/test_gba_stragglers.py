"""benchmarks/gba_stragglers.py: every run it plans is one the library accepts (a setting the run
leaves unread is refused since issue 50, and the harness's no-straggler runs once carried the
straggler's cause), and the switch protocol's speed and quality against a hand-worked case."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence import api
from cadence.config import load_config
from tests.benchmarks import benchmark_script

bench = benchmark_script("gba_stragglers")


def accepted(overrides: list[str]) -> None:
    api.prepare_config(load_config(bench.CONFIG, ["progress=false", *overrides]))


@pytest.mark.parametrize("quota", [None, "relative", "absolute"])
@pytest.mark.parametrize("switch", [False, True])
def test_every_planned_run_is_accepted(quota, switch, tmp_path: Path) -> None:
    common, cause = bench.shared_overrides(2, 0.0 if quota else 0.02, quota, switch)
    plan = bench.plan_runs([0], tuple(bench.SEVERITIES), [*bench.MODES, bench.REFERENCE[0], *bench.ABLATIONS])
    assert {mode for _, _, mode in plan} == {*bench.MODES, bench.REFERENCE[0], *bench.ABLATIONS}
    assert {severity for _, severity, _ in plan} == set(bench.SEVERITIES)
    base = tmp_path / "base"
    if switch:
        accepted(bench.switch_base_overrides(0, common))
    for seed, severity, mode in plan:
        overrides = bench.run_overrides(mode, severity, seed, common, cause)
        accepted(bench.switched(overrides, base) if switch else overrides)


def test_only_a_run_with_a_straggler_says_how_it_is_slowed() -> None:
    common, cause = bench.shared_overrides(2, 0.0, "relative", False)
    assert not set(cause) & set(bench.run_overrides("gba", "1x", 0, common, cause))
    assert set(cause) <= set(bench.run_overrides("gba", "4x", 0, common, cause))


def record(mode: str, seed: int, seconds: float, auc: float) -> dict:
    return {"mode": mode, "severity": "4x", "seed": seed, "summary": {
        "auc": auc, "train_seconds": seconds, "examples_per_second": 1.0, "token_staleness_mean": 0.0,
        "token_staleness_max": 0, "gradients_dropped": 0}, "applied_examples_per_second": 1.0,
        "drop_fraction": 0.0, "best_valid_auc": auc}


def test_the_switch_protocol_compares_seconds_to_train_the_same_periods_and_their_next_period_auc() -> None:
    runs = [record("sync", 0, 30.0, 0.700), record("gba", 0, 10.0, 0.6995), record("hop_bw", 0, 20.0, 0.698),
            record("sync", 1, 40.0, 0.710), record("gba", 1, 25.0, 0.7105), record("hop_bw", 1, 20.0, 0.711)]
    results = {"protocol": "switch", "runs": runs}
    bench.finish(results)
    faster = results["bars"]["1_gba_2x_faster_than_sync"]
    assert faster["per_seed_ratio"] == [3.0, 1.6]
    assert faster["ratio_of_means"] == pytest.approx(70 / 35)
    assert not faster["passed"]  # seed 1 is 1.6x
    gap = results["bars"]["2_gba_test_auc_at_least_sync_minus_0.001"]
    assert gap["gba_minus_sync_test_auc"]["mean"] == pytest.approx(0.0)
    assert gap["passed"]
    over = results["bars"]["4_gba_test_auc_at_least_hop_bw"]
    assert over["gba_minus_hop_bw_test_auc"]["mean"] == pytest.approx((0.0015 - 0.0005) / 2)
    assert results["bars"]["3_hop_bw_faster_than_sync"]["ratio_of_means"] == pytest.approx(70 / 40)
    assert "target" not in results  # no target AUC: every mode trains the same periods
