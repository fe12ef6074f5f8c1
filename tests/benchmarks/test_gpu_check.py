"""benchmarks/gpu_check.py's parts, checked on the CPU so that a short lease of a GPU machine is not
spent on a mistyped key: every contender's config of every part loads and passes the run's checks,
and the FB15k-sized setting trains (shrunk) on the CPU."""

from __future__ import annotations

import pytest

from cadence import api
from cadence.config import load_config
from tests.benchmarks import benchmark_script

bench = benchmark_script("gpu_check")
EVERY = [(part, contender) for parts in bench.PARTS.values() for part in parts for contender in part.contenders]


@pytest.mark.parametrize("part, contender", EVERY, ids=[f"{p.name}-{c.name}-{c.device}" for p, c in EVERY])
def test_every_contender_of_every_part_is_a_valid_run(part, contender, tmp_path) -> None:
    config = load_config(bench.CONFIGS / part.config, [*part.overrides, *contender.overrides, "device=cpu",
                                                       f"out={tmp_path / 'run'}"])
    api.prepare_config(config)


def test_the_fb15k_sized_setting_trains_and_names_marius_figure(tmp_path) -> None:
    part = bench.PARTS["kge-fb15k"][0]
    assert part.name in bench.MARIUS_EDGES_PER_SECOND
    shrunk = ["data.synthetic.num_entities=500", "data.synthetic.num_edges=2600", "data.synthetic.holdout=50",
              "model.dim=8", "train.negatives=20", "train.batch_size=500"]
    config = load_config(bench.CONFIGS / part.config, [*part.overrides, *shrunk, "strategy=oac", "device=cpu",
                                                       "train.epochs=1", "progress=false", "checkpoint.every=0",
                                                       f"out={tmp_path / 'run'}"])
    summary = api.train(config).summary
    assert summary["examples_seen"] == 2500 and 0 <= summary["mrr"] <= 1


def test_the_step_profile_counts_launches_per_batch_and_the_busy_share() -> None:
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    profile = benchmark_script("gpu_profile")
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    events = [SimpleNamespace(key="cudaLaunchKernel", count=300, self_device_time_total=0.0, device_type=cpu),
              # a CPU operator's device time is its kernels': not counted twice
              SimpleNamespace(key="aten::mm", count=100, self_device_time_total=250_000.0, device_type=cpu),
              SimpleNamespace(key="ampere_sgemm", count=100, self_device_time_total=250_000.0, device_type=cuda),
              SimpleNamespace(key="elementwise_kernel", count=200, self_device_time_total=250_000.0, device_type=cuda)]
    assert profile.step_profile(events, batches=100, wall=2.0) == {
        "batches": 100, "launches_per_batch": 3.0, "gpu_busy_share": 0.25, "host_seconds_per_batch": 0.02}


def test_the_summary_table_has_a_row_per_contender_with_marius_figure_beside_the_fb15k_parts() -> None:
    def row(rate: float, ratio: float) -> dict:
        return {"examples_per_second": {"mean": rate}, "mrr": {"mean": 0.5}, "throughput_vs_sync_cuda": ratio}

    report = {"parts": {"kge-fb15k-complex": {"summary": {"sync@cuda": row(1e6, 1.0), "oac@cuda": row(1.2e6, 1.2)}},
                        "kge-umls": {"summary": {"sync@cpu": {"error": "exit 1"}}}}}
    lines = bench.summary_table(report).splitlines()
    assert len(lines) == 4
    assert "1,200,000" in lines[2] and "1.20x" in lines[2] and "520,000" in lines[2]
    assert "FAILED" in lines[3] and "520,000" not in lines[3]
