"""The store's verbs against a naive per-row reference, for every backend."""

from pathlib import Path

import pytest
import torch

from cadence.core.rows import RowBlock
from cadence.store import STORE_BACKENDS, create_store


@pytest.fixture(params=STORE_BACKENDS.names())
def store(request, tmp_path: Path):
    store = create_store(50, 6, 2, request.param, str(tmp_path / "table"))
    store.initialize(std=0.5, seed=3)
    return store


def test_initial_state_and_versions(store) -> None:
    assert store.values.shape == (50, 6) and store.state.shape == (50, 2)
    assert torch.all(store.versions == -1) and torch.all(store.state == 0)
    assert 0.3 < store.values.std() < 0.7


def test_pull_matches_per_row_reads(store) -> None:
    ids = torch.tensor([7, 0, 49, 7, 12])
    block = store.pull(ids, with_versions=True)
    for i, row in enumerate(ids.tolist()):
        assert torch.equal(block.values[i], store.values[row])
        assert torch.equal(block.state[i], store.state[row])
        assert block.versions[i] == store.versions[row]
    block.values.add_(1.0)  # a pulled block is a copy
    assert not torch.equal(block.values[0], store.values[7])


def test_set_overwrites_only_given_rows(store) -> None:
    before = store.values.clone()
    ids = torch.tensor([3, 40, 11])
    block = RowBlock(torch.randn(3, 6), torch.rand(3, 2), torch.tensor([5, 6, 7]))
    store.set(ids, block)
    expected = before.clone()
    for i, row in enumerate(ids.tolist()):
        expected[row] = block.values[i]
        assert torch.equal(store.state[row], block.state[i])
        assert store.versions[row] == block.versions[i]
    assert torch.equal(store.values, expected)


@pytest.mark.parametrize("kept", [[0, 1, 2, 5, 6, 9], [3], list(range(0, 40, 2)), list(range(40))],
                         ids=["runs", "one", "many gaps", "all"])
def test_set_at_writes_exactly_the_rows_at_the_positions(store, kept: list[int], monkeypatch) -> None:
    """A few runs as slices, many gaps through gathers (MAX_RUNS and GATHER_ROWS lowered so both
    paths, and several gathers, run here):
    either way what a per-row write of the kept positions leaves."""
    monkeypatch.setattr(type(store), "MAX_RUNS", 8)
    monkeypatch.setattr(type(store), "GATHER_ROWS", 7)
    ids = torch.randperm(50, generator=torch.Generator().manual_seed(2))[:40]
    block = RowBlock(torch.randn(40, 6), torch.rand(40, 2), torch.arange(40) + 100)
    expected = [store.values.clone(), store.state.clone(), store.versions.clone()]
    for position in kept:
        row = int(ids[position])
        expected[0][row], expected[1][row], expected[2][row] = block.values[position], block.state[position], \
            block.versions[position]
    store.set_at(ids, block, torch.tensor(kept))
    for mine, theirs in zip((store.values, store.state, store.versions), expected):
        assert torch.equal(mine, theirs)


def test_set_without_versions_keeps_versions(store) -> None:
    store.set(torch.tensor([1]), RowBlock(torch.zeros(1, 6), torch.zeros(1, 2)))
    assert store.versions[1] == -1


def test_push_adds_including_repeated_ids(store) -> None:
    before = store.values.clone()
    ids = torch.tensor([2, 2, 9])
    delta = torch.ones(3, 6)
    store.push(ids, delta)
    expected = before.clone()
    for i, row in enumerate(ids.tolist()):
        expected[row] += delta[i]
    assert torch.allclose(store.values, expected)


def test_initialization_is_identical_across_backends(tmp_path: Path) -> None:
    tables = []
    for backend in STORE_BACKENDS.names():
        store = create_store(70_000, 3, 1, backend, str(tmp_path / backend))  # spans two init chunks
        store.initialize(std=1.0, seed=11)
        tables.append(store.values.clone())
    assert all(torch.equal(tables[0], t) for t in tables[1:])


def test_mmap_backend_persists_to_files(tmp_path: Path) -> None:
    import numpy as np

    store = create_store(10, 4, 1, "mmap", str(tmp_path / "t"))
    store.initialize(std=1.0, seed=0)
    store.set(torch.tensor([4]), RowBlock(torch.full((1, 4), 2.5), torch.ones(1, 1)))
    store.flush()
    on_disk = np.load(tmp_path / "t" / "values.npy", mmap_mode="r")
    assert np.all(on_disk[4] == 2.5)


def _advice_flags(path: Path) -> set[str]:
    """The kernel's read-advice flags of the mapping of ``path`` in this process (smaps VmFlags:
    ``rr`` random, ``sr`` sequential)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for index, line in enumerate(lines):
        if line.endswith(str(path)):
            flags = next(l for l in lines[index + 1:] if l.startswith("VmFlags:")).split()[1:]
            return {flag for flag in flags if flag in ("rr", "sr")}
    raise AssertionError(f"{path} is not mapped")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_mmap_tables_are_read_at_random_unless_readahead_is_asked_for(tmp_path: Path) -> None:
    store = create_store(4096, 8, 1, "mmap", str(tmp_path / "t"))
    values = (tmp_path / "t" / "values.npy").resolve()
    store.initialize(std=1.0, seed=0)
    assert _advice_flags(values) == set()  # the kernel's default until the run says
    store.advise(readahead=False)
    assert _advice_flags(values) == {"rr"}
    store.load_tensors({name: tensor.clone() for name, tensor in store.tensors().items()})
    assert _advice_flags(values) == {"rr"}  # a sweep reads ahead, then the advice is back
    store.advise(readahead=True)
    assert _advice_flags(values) == set()


def test_mmap_needs_a_path() -> None:
    from cadence.errors import ConfigError

    with pytest.raises(ConfigError, match="store.path"):
        create_store(10, 4, 1, "mmap", None)


@pytest.mark.parametrize("latency", [0.0, 0.002])
def test_conditional_writes_of_concurrent_writers_keep_the_newest_row(latency: float) -> None:
    """``write_if_newer`` from four threads against the rule itself: after every writer is done, each
    row holds the block with the largest timestamp that touched it, values and state. With latency
    injected between a write's values and its versions (a page fault mid-copy), writers' copies of
    the same rows overlap unless the per-row claims keep them apart."""
    import threading
    import time

    generator = torch.Generator().manual_seed(0)
    rows, dim = 500, 4
    store = create_store(rows, dim, 1)
    store.values.zero_()

    def slow_set(ids, block):
        store.values.index_copy_(0, ids, block.values)
        time.sleep(latency)
        store.state.index_copy_(0, ids, block.state)
        store.versions.index_copy_(0, ids, block.versions)

    if latency:
        store.set = slow_set
    writes = []
    for timestamp in range(64):
        ids = torch.randperm(rows, generator=generator)[:200]
        values = torch.full((200, dim), float(timestamp))
        writes.append((ids, RowBlock(values, values[:, :1] + 0.5, torch.full((200,), timestamp))))
    expected = torch.full((rows,), -1)
    for timestamp, (ids, _) in enumerate(writes):
        expected[ids] = torch.maximum(expected[ids], torch.tensor(timestamp))

    def writer(mine):
        for ids, block in mine:
            store.write_if_newer(ids, block)

    threads = [threading.Thread(target=writer, args=(writes[k::4][::-1] if k % 2 else writes[k::4],))
               for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    touched = expected >= 0
    assert torch.equal(store.versions[touched], expected[touched])
    assert torch.equal(store.values[touched, 0], expected[touched].float())
    assert torch.equal(store.state[touched, 0], expected[touched].float() + 0.5)
    skipped, _, _ = store.write_if_newer(*writes[0])  # everything it touches is newer by now, or itself
    assert skipped == 200
