"""Count the corpus's handled cases by category, every command a real process.

    python -m tests.reliability.count [--src OTHER_CHECKOUT/src] [--out results.json] [-k SUBSTRING]
        [--categories unread_keys,hangs,...]

``--src`` runs the commands of another checkout (the same corpus, the before of a change); the
JSON lists each case's outcome and the first line of what went wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.reliability.corpus import CASES, CATEGORIES
from tests.reliability.harness import CannotRun, Runner, TrainedRuns, Workspace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, help="the src directory of the checkout to test (default: this one)")
    parser.add_argument("--out", type=Path, default=Path("reliability-corpus.json"))
    parser.add_argument("-k", default="", help="run only cases whose id contains this")
    parser.add_argument("--categories", default="", help="comma-separated: run only these categories")
    args = parser.parse_args()
    runner = Runner(in_process=False, src=args.src)
    scratch = Path(tempfile.mkdtemp(prefix="cdn-corpus-"))
    runs = TrainedRuns(scratch / "runs", runner)
    outcomes = []
    only = {name for name in args.categories.split(",") if name}
    if only - set(CATEGORIES):
        parser.error(f"--categories takes some of {', '.join(CATEGORIES)}")
    for index, item in enumerate(c for c in CASES if args.k in c.id and (not only or c.category in only)):
        if item.root and os.geteuid() != 0:
            outcomes.append({"case": item.id, "category": item.category, "outcome": "skipped"})
            continue
        workspace = Workspace(scratch / f"case-{index}", runner, runs)
        workspace.root.mkdir(parents=True)
        start = time.monotonic()
        try:
            item.run(workspace)
            outcome, why = "handled", ""
        except CannotRun as err:
            outcome, why = "skipped", str(err)
        except AssertionError as err:
            outcome, why = "not handled", str(err)
        except Exception as err:  # the case itself could not run (a helper failed on this checkout)
            outcome, why = "not handled", f"{type(err).__name__}: {err}"
        finally:
            for note in workspace.notes:
                if note.startswith("umount "):
                    subprocess.run(["umount", "-l", note.split(" ", 1)[1]], check=False)
        outcomes.append({"case": item.id, "category": item.category, "outcome": outcome,
                         "seconds": round(time.monotonic() - start, 1), "why": why[:600]})
        print(f"{outcome:12s} {item.id}  {why.splitlines()[0] if why else ''}"[:200], flush=True)
    handled = Counter(o["category"] for o in outcomes if o["outcome"] == "handled")
    total = Counter(o["category"] for o in outcomes if o["outcome"] != "skipped")
    table = {category: {"handled": handled[category], "cases": total[category]} for category in CATEGORIES
             if not only or category in only}
    report = {"src": str(args.src or "this checkout"), "by_category": table,
              "handled": sum(handled.values()), "cases": sum(total.values()), "outcomes": outcomes}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for category, counts in table.items():
        print(f"{category:12s} {counts['handled']:4d} / {counts['cases']}")
    print(f"{'total':12s} {report['handled']:4d} / {report['cases']}")


if __name__ == "__main__":
    main()
