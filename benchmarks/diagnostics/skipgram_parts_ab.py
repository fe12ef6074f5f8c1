"""Diagnostic (not a result file): skip-gram's kernel in one part vs two, 10 interleaved reps. Run at
ad95782 (clean src: the two-part kernel of cdfaad1) from an uncommitted copy; it gave the 13.4 vs
11.5 ms of issue 27's note; committed afterwards (it needs cdfaad1's ``threads`` argument)."""
import sys, time, torch, statistics
sys.path.insert(0, "src")
from cadence import compiled
g = torch.Generator().manual_seed(0)
n, pairs = 12000, 5700
rows = torch.randn(n, 100, generator=g) * 0.1
inputs = torch.randint(0, n // 2, (pairs,), generator=g)
outputs = torch.randint(n // 2, n, (pairs, 6), generator=g)
for t in (1, 2): compiled.skipgram_loss_and_gradient(rows, inputs, outputs, 0.5, threads=t)
res = {1: [], 2: [], "zeros": []}
for rep in range(10):
    for t in (1, 2):
        s = time.perf_counter()
        for _ in range(20): compiled.skipgram_loss_and_gradient(rows, inputs, outputs, 0.5, threads=t)
        res[t].append((time.perf_counter() - s) / 20 * 1e3)
    s = time.perf_counter()
    for _ in range(20): a = torch.zeros(rows.shape); b = torch.zeros(rows.shape); a += b
    res["zeros"].append((time.perf_counter() - s) / 20 * 1e3)
print({t: round(statistics.median(v), 2) for t, v in res.items()}, torch.get_num_threads())
