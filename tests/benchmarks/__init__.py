"""Tests of the benchmark scripts (benchmarks/), loaded as modules with their folder on the path, as
when they are run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` as a module."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (as an import would: a dataclass of the script looks its module up)
    spec.loader.exec_module(module)
    return module
