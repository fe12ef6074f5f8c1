"""The library states the torch versions it supports; the project's own install pins the exact CPU wheel."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def torch_requirement() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(Requirement(spec) for spec in project["dependencies"] if Requirement(spec).name == "torch")


def test_torch_is_a_range_not_a_pin():
    """A user with another torch (a CUDA build, the version other libraries need) can install cadence beside it."""
    requirement = torch_requirement()
    operators = {spec.operator for spec in requirement.specifier}
    assert operators and not operators & {"==", "==="}, requirement
    assert ">=" in operators, f"{requirement}: no floor"
    assert requirement.specifier.contains("2.3.0") and requirement.specifier.contains("2.15.0")


def test_the_installed_torch_is_in_the_range_and_the_makefile_pins_it():
    requirement = torch_requirement()
    installed = Version(torch.__version__).public
    assert requirement.specifier.contains(installed), (installed, requirement)
    pinned = re.search(r"^TORCH \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pinned, "the Makefile's install pins no exact torch"
    assert requirement.specifier.contains(pinned.group(1))
