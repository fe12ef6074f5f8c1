"""Diagnostic (not a result file): sync vs async's inline epochs, interleaved in one process. Run over
d3b7135's src from an uncommitted copy, it gave the numbers in docs/strategies/pipelined.md ("Inline
epochs run on the calling thread"); committed afterwards. Then it patched ``engines.threads.Worker``
(removed in eb33def) to run the inline epoch on the calling thread ("async-main") beside the epoch
thread ("async-worker"); since eb33def both labels run the same code, on the calling thread.
Usage: .venv/bin/python benchmarks/diagnostics/inline_thread_ab.py CONFIG EPOCHS [OVERRIDES...]"""
import sys
import tempfile
sys.path.insert(0, "src")
from cadence import api
from cadence.config import load_config
cfgfile, epochs = sys.argv[1], sys.argv[2]
extra = sys.argv[3:]
res = {}
for rep in range(3):
    for name in ("sync", "async-worker", "async-main"):
        strat = "sync" if name == "sync" else "async"
        cfg = load_config(cfgfile, [f"strategy={strat}", f"train.epochs={epochs}", "progress=false", "checkpoint.every=0", "seed=0", *extra])
        with tempfile.TemporaryDirectory() as d:
            cfg.out = d
            s = api.train(cfg, overwrite=True).summary
        res.setdefault(name, []).append(s["examples_per_second"])
        print(rep, name, round(s["examples_per_second"]), s.get("inline_epochs"), s.get("intra_op_threads"), flush=True)
for k, v in res.items():
    print(k, [round(x) for x in v], "ratio vs sync", [round(a / b, 3) for a, b in zip(v, res["sync"])])
