"""The vectorised validation cache against a dictionary reference under random operations."""

import random
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cadence.strategies.pipelined.validation_cache import ValidationCache
from cadence.core.rows import RowBlock


def test_cache_matches_a_dictionary_reference() -> None:
    rng = random.Random(0)
    cache = ValidationCache(num_rows=40, device=torch.device("cpu"))
    reference: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
    stamp = 0
    for _ in range(3000):
        ids = torch.tensor(sorted(rng.sample(range(40), rng.randint(1, 10))))
        action = rng.random()
        if action < 0.4:
            block = RowBlock(torch.randn(len(ids), 3), torch.rand(len(ids), 1), torch.full((len(ids),), stamp))
            cache.insert(ids, block)
            for i, row in enumerate(ids.tolist()):
                reference[row] = (block.values[i].clone(), block.state[i].clone(), stamp)
            stamp += 1
        elif action < 0.5:
            bound = rng.randint(-1, stamp)
            reference = {k: v for k, v in reference.items() if v[2] > bound}
            cache.evict_upto(bound)
        elif action < 0.55 and cache.landed(stamp):
            # a landed batch cut down to the rows of its block some pending batch still reads
            landed = rng.choice(cache.landed(stamp))
            rows_of = cache.block_ids[landed].tolist()
            needed = torch.tensor([rng.random() < 0.5 for _ in rows_of])
            reference = {k: v for k, v in reference.items() if v[2] != landed or bool(needed[rows_of.index(k)])}
            cache.compact(landed, needed)
        else:
            read = torch.tensor([rng.randint(-1, stamp) for _ in ids])
            block = RowBlock(torch.zeros(len(ids), 3), torch.zeros(len(ids), 1), read.clone())
            repaired = cache.repair(ids, block)
            expected = 0
            for i, row in enumerate(ids.tolist()):
                if row in reference and reference[row][2] > int(read[i]):
                    expected += 1
                    assert torch.equal(block.values[i], reference[row][0])
                    assert torch.equal(block.state[i], reference[row][1])
                    assert int(block.versions[i]) == reference[row][2]
                else:
                    assert int(block.versions[i]) == int(read[i]) and not block.values[i].any()
            assert repaired == expected
        assert sorted(cache.cached_ids().tolist()) == sorted(reference) and len(cache) == len(reference)


def test_the_cache_keeps_a_batchs_rows_not_a_copy_and_drops_them_when_evicted() -> None:
    """Out of core, a copy of every row in flight is page cache the table loses (issue 46)."""
    cache = ValidationCache(num_rows=10, device=torch.device("cpu"))
    block = RowBlock(torch.randn(3, 2), torch.rand(3, 1), torch.full((3,), 4))
    cache.insert(torch.tensor([1, 5, 7]), block)
    assert cache.blocks[4] is block
    read = RowBlock(torch.zeros(2, 2), torch.zeros(2, 1), torch.tensor([3, 3]))
    assert cache.repair(torch.tensor([7, 2]), read) == 1 and torch.equal(read.values[0], block.values[2])
    cache.evict_upto(4)
    assert not cache.blocks and len(cache) == 0


def repair_operators(owners: int) -> Counter:
    """The operators one repair dispatches when its stale rows come from ``owners`` batches."""
    cache = ValidationCache(num_rows=1000, device=torch.device("cpu"))
    for stamp in range(owners):
        ids = torch.arange(stamp * 10, stamp * 10 + 10)
        cache.insert(ids, RowBlock(torch.randn(10, 3), torch.rand(10, 1), torch.full((10,), stamp + 1)))
    ids = torch.arange(0, owners * 10, 5)  # two rows of each batch, read before any was computed
    read = RowBlock(torch.zeros(len(ids), 3), torch.zeros(len(ids), 1), torch.zeros(len(ids), dtype=torch.int64))

    class Count(TorchDispatchMode):
        seen: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        assert cache.repair(ids, read) == len(ids)
    return Count.seen


def test_a_repair_waits_on_the_device_once_whatever_the_batches_it_takes_rows_from() -> None:
    """On a GPU an operator is a launch and a ``nonzero`` a wait for the device: a repair that looped
    over its owning batches with a ``nonzero`` each made OAC 683 launches a batch against async's 72
    (benchmarks/results/gpu_profile_kge-10m_oac_async.json). Per owning batch, two gathers (its values
    and state) and nothing else."""
    few, many = repair_operators(4), repair_operators(20)
    assert many["aten.nonzero"] == few["aten.nonzero"] == 1
    assert sum(many.values()) - sum(few.values()) <= 2 * (20 - 4)
