"""The operators a KGE training batch dispatches (issue 46's launches per step) as a default-suite
number: counted with ``benchmarks/step_operators.py``'s dispatch mode around two short sync runs on
the CPU (the same code path a device takes), so that the count cannot grow back unnoticed."""

from __future__ import annotations

import pytest
import torch

from tests.benchmarks import benchmark_script

bench = benchmark_script("step_operators")

# the most a batch may dispatch (issue 46's target, met: 12 with the fused step, 105 before issue 46)
CEILING = {"compiled": 12, "not compiled": 12}


@pytest.mark.parametrize("name, compiled", [("compiled", "true"), ("not compiled", "false")])
def test_a_kge_batch_dispatches_at_most_the_ceiling(name: str, compiled: str) -> None:
    total, each = bench.per_batch(4, 12, [f"train.compiled={compiled}"])
    assert total <= CEILING[name], f"{total:.1f} operators per batch (ceiling {CEILING[name]}): {each}"


def test_the_counter_sees_the_backward_and_the_optimizer_of_a_step() -> None:
    """The count is of the whole step: a plain autograd step's forward, backward and update each show."""
    weight = torch.zeros(3, requires_grad=True)
    with bench.OperatorCounter() as counter:
        loss = (weight * 2.0).sum()
        loss.backward()
        with torch.no_grad():
            weight.sub_(weight.grad)
    assert counter.counts["aten.mul"] >= 2  # forward, and the backward of the product
    assert counter.counts["aten.sub_"] == 1
