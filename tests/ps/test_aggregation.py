"""Each parameter-server mode's aggregation rule against its definition (GBA paper, SPEC section 3)."""

import math

import pytest
import torch

from cadence.ps.aggregation import ApplyEach, Buffered, Gradient, PerStep


class RecordingShard:
    """Records which gradients each step applies, with which normaliser."""

    def __init__(self):
        self.global_step = 0
        self.steps: list[tuple[list[int], float]] = []
        self.staleness: list[int] = []
        self.dropped = 0

    def apply(self, gradients, normalizer):
        self.steps.append(([g.batch for g in gradients], normalizer))
        self.global_step += 1

    def record_applied(self, gradient):
        self.staleness.append(self.global_step - gradient.pulled_step)

    def record_dropped(self, gradients):
        self.dropped += len(gradients)


def grad(batch: int, token: int, pulled_step: int | None = None) -> Gradient:
    return Gradient(worker=0, batch=batch, token=token, examples=1, keys=torch.tensor([batch]),
                    rows=torch.ones(1, 2), pulled_step=token if pulled_step is None else pulled_step)


def test_async_applies_every_gradient_alone() -> None:
    shard, rule = RecordingShard(), ApplyEach()
    for j, pulled in enumerate([0, 0, 1, 0]):  # workers pulled at these steps
        rule.push(shard, grad(j, j, pulled_step=pulled))
    assert shard.steps == [([0], 1.0), ([1], 1.0), ([2], 1.0), ([3], 1.0)]
    assert shard.staleness == [0, 1, 1, 3]  # updates applied between each pull and its gradient


def test_gba_drops_exactly_the_gradients_staler_than_iota() -> None:
    shard, rule = RecordingShard(), Buffered(capacity=3, tolerance=1)
    shard.global_step = 5
    # tokens 5, 3 (staleness 2 > 1: dropped), 4 (staleness 1: kept); aggregated in batch order
    for j, token in [(7, 5), (2, 3), (4, 4)]:
        rule.push(shard, grad(j, token))
    assert shard.steps == [([4, 7], 3.0)]  # normalised by the buffer capacity M (the default)
    assert shard.dropped == 1 and shard.staleness == [1, 0]


def test_gba_kept_normalizer_divides_by_the_gradients_kept() -> None:
    shard, rule = RecordingShard(), Buffered(capacity=3, tolerance=0, normalizer="kept")
    for j, token in [(0, 0), (1, -2), (2, 0)]:
        rule.push(shard, grad(j, token))
    assert shard.steps == [([0, 2], 2.0)]


@pytest.mark.parametrize("seed", range(5))
def test_gba_with_infinite_tolerance_equals_bsp(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    pushes = [(j, int(t)) for j, t in enumerate(torch.randint(0, 6, (23,), generator=generator))]
    order = torch.randperm(len(pushes), generator=generator).tolist()
    results = []
    for rule in (Buffered(capacity=4, tolerance=math.inf), Buffered(capacity=4)):  # bsp is gba with iota=inf
        shard = RecordingShard()
        for index in order:
            rule.push(shard, grad(*pushes[index]))
        rule.flush(shard)
        results.append((shard.steps, shard.dropped))
    assert results[0] == results[1] and results[0][1] == 0
    assert sum(len(batches) for batches, _ in results[0][0]) == 23


def test_sync_waits_for_every_batch_of_its_step_and_survives_a_dropped_one() -> None:
    shard, rule = RecordingShard(), PerStep()
    rule.close_token(shard, 0, 3)
    rule.push(shard, grad(1, 0))
    rule.push(shard, grad(0, 0))
    assert shard.steps == []  # batch 2 of step 0 is still out
    rule.push(shard, grad(2, 0))
    assert shard.steps == [([0, 1, 2], 3.0)]
    rule.close_token(shard, 1, 3)
    rule.push(shard, grad(3, 1))
    rule.drop(shard, 1)  # a killed worker's batch: never pushed
    assert shard.global_step == 1
    rule.push(shard, grad(5, 1))
    assert shard.steps[-1] == ([3, 5], 2.0) and shard.global_step == 2 and shard.dropped == 0


def test_backup_workers_apply_the_first_quorum_and_drop_late_gradients() -> None:
    shard, rule = RecordingShard(), PerStep(quorum=2)  # N = 3 workers, b = 1 backup
    rule.close_token(shard, 0, 3)
    rule.push(shard, grad(2, 0))
    rule.push(shard, grad(0, 0))
    assert shard.steps == [([0, 2], 2.0)]
    rule.push(shard, grad(1, 0))  # the late third gradient of step 0
    assert shard.dropped == 1
    rule.push(shard, grad(4, 1))
    rule.close_token(shard, 1, 1)  # the data ended after one batch of step 1
    assert shard.steps[-1] == ([4], 1.0)


def test_an_exponential_decay_weighs_gradients_by_their_token_staleness() -> None:
    shard, rule = RecordingShard(), Buffered(capacity=4, tolerance=2, decay="exponential")
    shard.global_step = 5
    gradients = [grad(j, token) for j, token in [(0, 5), (1, 4), (2, 3), (3, 2)]]  # staleness 0, 1, 2, 3
    for gradient in gradients:
        rule.push(shard, gradient)
    assert shard.steps == [([0, 1, 2], 4.0)] and shard.dropped == 1  # staleness 3 > iota = 2
    assert [g.weight for g in gradients[:3]] == [1.0, 0.5, 0.25]
    cutoff = [grad(j, token) for j, token in [(0, 5), (1, 4)]]
    rule = Buffered(capacity=2, tolerance=2)
    for gradient in cutoff:
        rule.push(shard, gradient)
    assert [g.weight for g in cutoff] == [1.0, 1.0]


def test_the_drop_of_a_batch_that_did_arrive_is_ignored() -> None:
    """A dead worker's batches are dropped by position; one it pushed before dying still counts."""
    shard, rule = RecordingShard(), PerStep()
    rule.close_token(shard, 0, 3)
    rule.push(shard, grad(0, 0))
    rule.drop(shard, 0, batch=0)  # pushed already: ignored
    rule.drop(shard, 0, batch=1)  # never pushed
    assert shard.steps == []  # batch 2 is still out
    rule.push(shard, grad(2, 0))
    assert shard.steps == [([0, 2], 2.0)]
