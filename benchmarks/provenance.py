"""Every result traces to a commit (issue 26): the commit a benchmark measured, and whether ``src/``
or ``benchmarks/`` had uncommitted changes then.

A benchmark calls ``check(args)`` before it measures anything: with uncommitted changes to ``src/``
or ``benchmarks/`` (results files aside) it stops with a message, unless ``--dirty`` was given; then
it goes on and the record it returns, which the benchmark writes into its result file under
``provenance``, says ``dirty: true`` and lists the changed files. ``add_flag(parser)`` adds
``--dirty`` (and the older spelling ``--allow-dirty``) to a benchmark's parser; ``stamp(report)``
adds the record to what it writes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WATCHED = ("src", "benchmarks", ":!benchmarks/results")


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dirty", "--allow-dirty", dest="dirty", action="store_true",
                        help="measure even with uncommitted changes to src/ or benchmarks/ (the result file says so)")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def record() -> dict[str, Any]:
    """The commit checked out and the uncommitted changes to what a result depends on.

    Where the tree is a copy sent to another machine (a GPU machine, `make gpu-check`), whose git
    view may be missing or stale, the commit is read from ``$CADENCE_COMMIT``, set by whoever sent a
    clean tree of that commit; the record then says so under ``commit_from`` and keeps git's view
    there under ``git_view``."""
    changed = [line[3:] for line in _git("status", "--porcelain", "--", *WATCHED).splitlines() if line.strip()]
    found = {"commit": _git("rev-parse", "HEAD").strip() or None, "dirty": bool(changed), "dirty_files": changed}
    if os.environ.get("CADENCE_COMMIT"):
        return {"commit": os.environ["CADENCE_COMMIT"], "dirty": False, "dirty_files": [],
                "commit_from": "CADENCE_COMMIT (a copy of that commit's clean tree, sent to this machine)",
                "git_view": found}
    return found


_CHECKED: list[dict[str, Any]] = []


def check(args: argparse.Namespace, script: str | None = None) -> dict[str, Any]:
    """``record()``, or a stop where the tree is dirty and ``--dirty`` was not given; ``stamp`` writes
    it into the result."""
    found = record()
    _CHECKED[:] = [found]
    if found["dirty"] and not getattr(args, "dirty", False):
        name = script or Path(sys.argv[0]).name
        raise SystemExit(f"{name}: uncommitted changes to src/ or benchmarks/ ({', '.join(found['dirty_files'][:8])}): "
                         "commit them first, so the numbers trace to a commit, or pass --dirty (the result file "
                         "is then marked dirty)")
    return found


def stamp(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with the record ``check`` took before measuring (or one taken now) as ``provenance``."""
    return {**report, "provenance": _CHECKED[0] if _CHECKED else record()}
