"""Lookups scale (issue 8, deliverable 3): the parameter server's key index at 10M keys.

Side by side in one invocation, on the same keys:

- ``hash``: ``HashIndex`` (open addressing, vectorised probes), the index the server shards use;
- ``sorted``: the sorted key array it replaced (``searchsorted`` lookups; an insertion re-sorts).

Measured per index size (1M, 10M keys by default): looking up 10k known keys, looking up 10k keys of
which 10% are new and inserting those, and (hash only, the table the shards hold) pulling the rows
of 10k keys from a ``DynamicEmbeddingTable`` of that many rows. Times are medians of ``--repeats``.

    .venv/bin/python benchmarks/key_index.py [--sizes 1000000,10000000] [--repeats 20]

Writes benchmarks/results/key_index.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from provenance import add_flag, check, stamp  # same folder: every result traces to a commit

import torch

from cadence.store.embedding_table import DynamicEmbeddingTable
from cadence.store.hash_index import HashIndex

RESULTS = Path(__file__).parent / "results"
BATCH = 10_000


class SortedIndex:
    """The replaced design: sorted keys, a row per sorted position, re-sorted on every insertion."""

    def __init__(self, keys: torch.Tensor, rows: torch.Tensor):
        order = torch.argsort(keys)
        self.keys, self.rows = keys[order], rows[order]

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        position = torch.searchsorted(self.keys, keys).clamp(max=self.keys.shape[0] - 1)
        return torch.where(self.keys[position] == keys, self.rows[position], -1)

    def insert(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        merged, order = torch.cat([self.keys, keys]), None
        order = torch.argsort(merged)
        self.keys, self.rows = merged[order], torch.cat([self.rows, rows])[order]


def median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 3)


def measure(size: int, repeats: int, generator: torch.Generator) -> dict:
    keys = torch.unique(torch.randint(0, 1 << 62, (size + size // 100,), generator=generator))[:size]
    keys = keys[torch.randperm(keys.shape[0], generator=generator)]
    rows = torch.arange(keys.shape[0])
    started = time.perf_counter()
    hashed = HashIndex()
    for start in range(0, size, 100_000):  # grown batch by batch, as a server sees new keys
        hashed.insert(keys[start:start + 100_000], rows[start:start + 100_000])
    build_seconds = time.perf_counter() - started
    ordered = SortedIndex(keys, rows)
    known = keys[torch.randint(0, size, (BATCH,), generator=generator)].unique()
    fresh = torch.randint(1 << 62, (1 << 62) + (1 << 40), (BATCH // 10,), generator=generator).unique()
    result = {"keys": size, "batch": BATCH, "hash_build_seconds_in_100k_batches": round(build_seconds, 2)}
    for name, index in (("hash", hashed), ("sorted", ordered)):
        result[f"{name}_lookup_10k_ms"] = median_ms(lambda: index.lookup(known), repeats)
    mixed = torch.cat([known[: BATCH - fresh.shape[0]], fresh])

    def add_batch(index) -> None:  # look up a batch with 10% unseen keys, insert those, then remove them again
        found = index.lookup(mixed)
        new = mixed[found < 0]
        index.insert(new, torch.arange(size, size + new.shape[0]))

    for name, factory in (("hash", lambda: HashIndex(size)), ("sorted", None)):
        if name == "hash":
            copies = []
            for _ in range(min(repeats, 5)):
                copy = hashed.copy()
                copies.append(copy)
        else:
            copies = [SortedIndex(keys, rows) for _ in range(min(repeats, 5))]
        pool = iter(copies)
        result[f"{name}_lookup_and_add_10k_ms"] = median_ms(lambda: add_batch(next(pool)), len(copies))
    del ordered
    table = DynamicEmbeddingTable(width=9, state_width=1, init_std=0.01, seed=0, capacity=size)
    for start in range(0, size, 1_000_000):
        table.rows(keys[start:start + 1_000_000])
    result["table_pull_10k_rows_ms"] = median_ms(lambda: table.pull(known), repeats)
    result["speedup_lookup_and_add"] = round(result["sorted_lookup_and_add_10k_ms"] / result["hash_lookup_and_add_10k_ms"], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--repeats", type=int, default=20)
    add_flag(parser)
    args = parser.parse_args()
    check(args)
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    results = [measure(int(size), args.repeats, generator) for size in args.sizes.split(",")]
    for row in results:
        print(json.dumps(row))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "key_index.json"
    out.write_text(json.dumps(stamp({"command": "benchmarks/key_index.py --sizes " + args.sizes,
                               "machine": platform.platform(), "torch_threads": 1, "results": results}), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
