"""The slow filesystem of the out-of-core benchmark (``benchmarks/slowfs.py``): a read really waits
for the latency, in the FUSE server's process; holes and sequential continuations do not."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.benchmarks import benchmark_script

slowfs = benchmark_script("slowfs")

pytestmark = pytest.mark.skipif(slowfs.usable() is not None, reason=f"slowfs: {slowfs.usable()}")
PAGE, PAGES, LATENCY_MS = 4096, 64, 25.0


def timed_reads(mount: Path, offsets: list[int]) -> float:
    fd = os.open(mount / "table", os.O_RDONLY)
    try:
        began = time.perf_counter()
        for offset in offsets:
            assert len(os.pread(fd, PAGE, offset)) == PAGE
        return time.perf_counter() - began
    finally:
        os.close(fd)


def test_each_random_read_waits_for_the_latency_and_a_scan_streams(tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "table").write_bytes(os.urandom(PAGE * PAGES))
    scattered = [PAGE * page for page in range(0, PAGES, 4)]  # no read continues the previous one
    random.Random(0).shuffle(scattered)
    elapsed = {}
    for latency in (0.0, LATENCY_MS):
        with slowfs.SlowMount(backing, tmp_path / "mount", latency) as mount:  # a fresh mount: nothing cached
            elapsed[latency] = timed_reads(mount.mount, scattered)
        served = mount.stats()
        assert served["reads"] >= len(scattered) and served["hole_reads"] == 0
    assert elapsed[LATENCY_MS] >= len(scattered) * LATENCY_MS / 1000
    assert elapsed[0.0] < elapsed[LATENCY_MS] / 3
    assert served["mean_random_read_ms"] >= LATENCY_MS

    with slowfs.SlowMount(backing, tmp_path / "mount", LATENCY_MS) as mount:  # a scan: one access, then streaming
        scan = timed_reads(mount.mount, [PAGE * page for page in range(PAGES)])
    assert scan < PAGES * LATENCY_MS / 1000 / 4
    assert mount.stats()["streamed_reads"] >= PAGES - 2


def test_a_hole_is_answered_without_the_device(tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    with open(backing / "table", "wb") as handle:  # sparse: nothing written
        handle.truncate(PAGE * PAGES)
    scattered = [PAGE * page for page in range(0, PAGES, 4)]
    with slowfs.SlowMount(backing, tmp_path / "mount", LATENCY_MS) as mount:
        elapsed = timed_reads(mount.mount, scattered)
    assert elapsed < len(scattered) * LATENCY_MS / 1000 / 2
    assert mount.stats()["hole_reads"] >= len(scattered)
