"""The hash index against a dict, through growth, colliding batches and removals."""

import pytest
import torch

from cadence.store.embedding_table import DynamicEmbeddingTable
from cadence.store.hash_index import HashIndex


@pytest.mark.parametrize("seed", range(3))
def test_the_hash_index_agrees_with_a_dict(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    index, reference = HashIndex(capacity=4), {}
    for _ in range(30):
        keys = torch.unique(torch.randint(0, 1 << 50, (200,), generator=generator))
        keys = torch.cat([keys, torch.randint(0, 64, (50,), generator=generator).unique()])  # dense keys collide more
        keys = torch.unique(keys)
        found = index.lookup(keys)
        expected = torch.tensor([reference.get(int(k), -1) for k in keys])
        assert torch.equal(found, expected)
        new = keys[found < 0]
        rows = torch.arange(len(reference), len(reference) + new.shape[0])
        index.insert(new, rows)
        reference.update(zip(new.tolist(), rows.tolist()))
        assert len(index) == len(reference) and 2 * len(index) <= index.capacity
    everything = torch.tensor(list(reference))
    assert torch.equal(index.lookup(everything), torch.tensor(list(reference.values())))


@pytest.mark.parametrize("seed", range(3))
def test_keys_come_and_go_and_the_index_agrees_with_a_dict_without_growing(seed: int) -> None:
    """Insertions and removals in turn (an AdaPM node's keys arriving and leaving): every lookup
    agrees with a dict, ``keys()`` lists exactly the keys held, and tombstones are reused or
    rebuilt away, so a table whose size stays bounded keeps its capacity."""
    generator = torch.Generator().manual_seed(seed)
    index, reference = HashIndex(capacity=300), {}
    capacity = None
    for step in range(200):
        keys = torch.unique(torch.randint(0, 2000, (150,), generator=generator))
        found = index.lookup(keys)
        expected = torch.tensor([reference.get(int(k), -1) for k in keys])
        assert torch.equal(found, expected), f"step {step}"
        new = keys[found < 0]
        index.insert(new, new * 7)
        reference.update((k, 7 * k) for k in new.tolist())
        held = torch.tensor(sorted(reference))
        leaving = held[torch.randperm(held.shape[0], generator=generator)[:max(0, held.shape[0] - 250)]]
        index.remove(leaving)
        for key in leaving.tolist():
            del reference[key]
        assert len(index) == len(reference)
        assert sorted(index.keys().tolist()) == sorted(reference)
        capacity = capacity or index.capacity
    assert index.capacity <= 2 * capacity  # (at most 400 keys at a time: no growth with the churn)
    twin = index.copy()  # an independent copy: what one does the other does not see
    twin.remove(index.keys()[:3])
    assert len(twin) == len(index) - 3 and sorted(index.keys().tolist()) == sorted(reference)
    with pytest.raises(KeyError):
        index.remove(torch.tensor([10 ** 9]))


def test_a_dynamic_table_exports_sorted_keys_whatever_the_order_they_arrived_in() -> None:
    table = DynamicEmbeddingTable(width=2, state_width=1, init_std=0.1, seed=3, capacity=2)
    table.pull(torch.tensor([50, 7, 1 << 45]))
    table.pull(torch.tensor([7, 3]))
    keys, values, _ = table.export_rows()
    assert keys.tolist() == [3, 7, 50, 1 << 45]
    assert torch.equal(values, table.peek(keys)) and table.added == 4
    with pytest.raises(KeyError):
        table.rows(torch.tensor([99]), create=False)


def test_threads_add_and_read_keys_of_a_dynamic_table_without_a_lock_on_reads() -> None:
    """Hogwild access (module docstring of ``store.embedding_table``): two threads add overlapping
    keys while two others read keys already added, through index rehashes and store growths.
    Every key gets exactly one row, the row holding that key; a reader never misses a key once it
    was added, nor reads another key's row; rows keep their initial values (nobody wrote them)."""
    import threading

    from cadence.core.initial import hashed_normal

    table = DynamicEmbeddingTable(4, 4, 0.1, 7, capacity=4)
    added: list[int] = []  # keys known to be in the table (appended after their add returned)
    errors: list[BaseException] = []
    stop = threading.Event()

    def adder(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        try:
            for _ in range(120):
                keys = torch.unique(torch.randint(0, 8_000, (64,), generator=generator))
                rows = table.rows(keys)
                assert torch.equal(table.keys_of_rows[rows], keys)
                added.extend(keys.tolist())
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    def reader(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        try:
            while not stop.is_set():
                if len(added) < 10:
                    continue
                picks = torch.randint(0, len(added), (32,), generator=generator)
                keys = torch.unique(torch.tensor([added[i] for i in picks.tolist()]))
                rows = table.rows(keys, create=False)  # KeyError: a key added before was missed
                assert torch.equal(table.keys_of_rows[rows], keys), "a reader got another key's row"
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    readers = [threading.Thread(target=reader, args=(s,)) for s in (10, 11)]
    adders = [threading.Thread(target=adder, args=(s,)) for s in (0, 1)]
    for thread in readers + adders:
        thread.start()
    for thread in adders:
        thread.join()
    stop.set()
    for thread in readers:
        thread.join()
    assert not errors, errors[0]
    distinct = torch.unique(torch.tensor(added))
    assert len(table) == distinct.shape[0] == table.added  # no key added twice
    keys, values, _ = table.export_rows()
    assert torch.equal(keys, distinct)
    assert torch.equal(values, hashed_normal(keys, 4, 0.1, 7))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_compiled_probe_finds_the_slots_the_numpy_rounds_find(seed: int) -> None:
    """``compiled.hash_slots`` against ``_find_rounds`` on a table that has churned (tombstones on the
    probe paths): the same slot for every key present, -1 for every key absent."""
    from cadence import compiled

    if not compiled.AVAILABLE:
        pytest.skip("numba is not there: the rounds are the only path")
    generator = torch.Generator().manual_seed(seed)
    index = HashIndex(64)
    keys = torch.randperm(5000, generator=generator)[:3000]
    index.insert(keys, torch.arange(3000))
    index.remove(keys[::3])
    probe = torch.cat([keys, torch.arange(5000, 5200)]).numpy()
    slot_keys = index.slot_keys.numpy()
    compiled_slots = index._find(probe, slot_keys)
    assert (compiled_slots == index._find_rounds(probe, slot_keys)).all()
    assert ((compiled_slots >= 0) == torch.isin(torch.from_numpy(probe), keys[torch.arange(3000) % 3 != 0]).numpy()).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_keys_placed_by_the_compiled_loop_or_the_numpy_rounds_are_found_alike(seed: int, monkeypatch) -> None:
    """The same churn (inserts into tombstones included) through ``compiled.hash_place`` and through
    ``_place_rounds``: every key present answers its row in both, every key removed none, and each
    table's count of tombstones is the number of removed slots it holds."""
    from cadence import compiled
    from cadence.store import hash_index

    if not compiled.AVAILABLE:
        pytest.skip("numba is not there: the rounds are the only path")
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randperm(20000, generator=generator)[:4000]
    tables = []
    for use_compiled in (True, False):
        monkeypatch.setattr(compiled, "AVAILABLE", use_compiled)
        index = HashIndex(64)
        index.insert(keys[:3000], torch.arange(3000))
        index.remove(keys[:3000:2])
        index.insert(keys[3000:], torch.arange(3000, 4000))  # (into the tombstones on their paths)
        tables.append(index)
    monkeypatch.setattr(compiled, "AVAILABLE", True)
    present = torch.arange(4000)[(torch.arange(4000) >= 3000) | (torch.arange(4000) % 2 == 1)]
    for index in tables:
        assert torch.equal(index.lookup(keys[present]), present)
        assert bool((index.lookup(keys[:3000:2]) == -1).all())
        assert index.tombstones == int((index.slot_keys == hash_index.REMOVED).sum())
        assert len(index) == present.shape[0]
