"""Every case of the reliability corpus (``cases.py``), one test each; cases that need real
processes run them, the rest run the command in this process. Cases that need root (a mount,
another user's permissions) skip without it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.reliability.cases import Case
from tests.reliability.corpus import CASES
from tests.reliability.harness import CannotRun, Runner, TrainedRuns, Workspace


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory) -> TrainedRuns:
    return TrainedRuns(tmp_path_factory.mktemp("corpus-runs"), Runner(in_process=True))


def _param(item: Case):
    marks = [pytest.mark.slow] if item.slow else []
    return pytest.param(item, id=item.id, marks=marks)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("item", [_param(item) for item in CASES])
def test_case(item: Case, trained_runs: TrainedRuns, tmp_path: Path) -> None:
    if item.root and os.geteuid() != 0:
        pytest.skip("needs root (a mount or another user's permissions)")
    workspace = Workspace(tmp_path, Runner(in_process=not item.processes), trained_runs)
    try:
        item.run(workspace)
    except CannotRun as err:
        pytest.skip(str(err))
    finally:
        for note in workspace.notes:
            if note.startswith("umount "):
                subprocess.run(["umount", "-l", note.split(" ", 1)[1]], check=False)
