"""``resources.stop_at_exit`` / ``end_process``: what a process started outside itself (a Ray
instance) is stopped when it ends, also where it ends without ``atexit`` (a forked trial of
``strategy: auto``), and a forked child never stops what its parent started."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from cadence import resources


def _child(log: Path) -> None:
    resources.stop_at_exit(lambda: log.open("a").write("child's\n"))
    resources.end_process()


def test_a_forked_child_stops_its_own_and_never_its_parent_s(tmp_path: Path) -> None:
    log = tmp_path / "stopped"

    def parents() -> None:
        log.open("a").write("parent's\n")

    resources.stop_at_exit(parents)
    try:
        child = multiprocessing.get_context("fork").Process(target=_child, args=(log,))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert log.read_text() == "child's\n"  # (a fork leaves by os._exit: only end_process ran it)
        resources.end_process()
        assert log.read_text() == "child's\nparent's\n"
        resources.end_process()  # each once
        assert log.read_text() == "child's\nparent's\n"
    finally:
        resources.end_process()
