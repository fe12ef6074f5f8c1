"""pandas' side of benchmarks/import_edges.py, run in .venv-bench-pandas (never imports cadence).

Reads a graph directory's train.txt, valid.txt and test.txt (head<TAB>relation<TAB>tail per line) with
``pandas.read_csv`` (the C engine, every column as text), then, as cadence's reader does, gives the
names ids in sorted order over train (``pandas.factorize(sort=True)``) and looks the other splits up.
Prints one JSON line: rows, the seconds to read the files, the seconds to ids, and the peak RSS.

    python benchmarks/peers/pandas_contender.py GRAPH_DIR
"""

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd


def main() -> None:
    directory = Path(sys.argv[1])
    started = time.perf_counter()
    frames = {split: pd.read_csv(directory / f"{split}.txt", sep="\t", header=None, names=["h", "r", "t"],
                                 dtype=str, quoting=3, engine="c", keep_default_na=False, na_filter=False)
              for split in ("train", "valid", "test")}
    read = time.perf_counter() - started
    train = frames["train"]
    entity_codes, entities = pd.factorize(pd.concat([train["h"], train["t"]], ignore_index=True), sort=True)
    relation_codes, relations = pd.factorize(train["r"], sort=True)
    n = len(train)
    ids = {"train": np.stack([entity_codes[:n], relation_codes, entity_codes[n:]], axis=1)}
    for split in ("valid", "test"):
        frame = frames[split]
        ids[split] = np.stack([entities.get_indexer(frame["h"]), relations.get_indexer(frame["r"]),
                               entities.get_indexer(frame["t"])], axis=1)
    to_ids = time.perf_counter() - started
    print(json.dumps({"rows": sum(len(frame) for frame in frames.values()), "read_seconds": read,
                      "seconds": to_ids, "entities": len(entities), "relations": len(relations),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
