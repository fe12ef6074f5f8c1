"""benchmarks/shadowsync.py: every contender it runs is a run the library accepts (a key a strategy
does not read is refused: the harness was once broken so), and the BMUF ablation sets what it says."""

from __future__ import annotations

from cadence import api
from cadence.config import load_config
from tests.benchmarks import benchmark_script

bench = benchmark_script("shadowsync")


def config_of(contender):
    overrides = [*bench.base_overrides(True), *bench.scale(bench.TRAINERS, bench.WORKER_THREADS),
                 *contender.overrides(), "seed=0"]
    return api.prepare_config(load_config(bench.CONFIG, overrides))


def test_every_contender_is_accepted() -> None:
    for contender in {*bench.CONTENDERS, *bench.BMUF_CONTENDERS}:
        assert config_of(contender).strategy == contender.strategy


def test_the_bmuf_ablation_sets_its_momentum_and_alpha() -> None:
    seen = {(c.strategy, config_of(c).shadow.block_momentum, config_of(c).shadow.alpha)
            for c in (*bench.BMUF_SHADOW, *bench.BMUF_FOREGROUND)}
    alpha = 0.9 / bench.TRAINERS
    assert seen == {("shadow-bmuf", 0.875, None), ("shadow-bmuf", 1 - 1 / bench.TRAINERS, None),
                    ("shadow-bmuf", 0.0, None), ("shadow-bmuf", 0.875, 2 * alpha),
                    ("shadow-bmuf", 1 - 1 / bench.TRAINERS, 2 * alpha),
                    ("fr-bmuf", 0.875, None), ("fr-bmuf", 1 - 1 / bench.TRAINERS, None)}
