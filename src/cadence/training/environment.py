"""Where a run ran: the machine, the software and the commit of cadence's source (summary.json's
``environment``; the report shows it)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).resolve().parents[3]  # the checkout, where cadence runs from one


def environment() -> dict[str, Any]:
    """The machine (host, platform, CPUs usable, memory), Python, torch, cadence's version and, where
    cadence runs from a git checkout, its commit and whether ``src/`` had uncommitted changes."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cpus = os.cpu_count()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {"host": socket.gethostname(), "platform": platform.platform(), "cpus": cpus,
            "memory_gib": round(memory / 2**30, 1), "python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda if torch.cuda.is_available() else None,
            "cadence": _version(), **_commit()}


def _version() -> str | None:
    try:
        return metadata.version("cadence")
    except metadata.PackageNotFoundError:  # (run from a source tree that was never installed)
        return None


def _commit() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(SOURCE), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit or not (SOURCE / "src" / "cadence").is_dir():
        return {"commit": None, "dirty": None}
    changed = git("status", "--porcelain", "--", "src")
    return {"commit": commit.strip(), "dirty": bool(changed and changed.strip())}
