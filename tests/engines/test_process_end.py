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


def test_what_a_stopped_thing_left_goes_only_with_a_scratch_process(tmp_path: Path) -> None:
    """``left_at_exit``: a run's Ray session directory (its logs) stays at a plain end; a scratch
    process's end (a trial of ``strategy: auto``) removes what the pattern matches, nothing else."""
    for name in ("session_1_42", "session_2_43", "other"):
        (tmp_path / name).mkdir()
    resources.left_at_exit(tmp_path, "session_*_42")
    resources.end_process()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "session_1_42", "session_2_43"]
    resources.left_at_exit(tmp_path, "session_*_42")
    resources.end_process(scratch=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "session_2_43"]


def test_sweeping_a_trial_kills_what_carries_its_mark_and_nothing_else() -> None:
    """``auto.sweep_child``: the processes whose environment carries a trial's mark (what it started,
    orphans included) are killed; one without the mark lives on."""
    import os
    import subprocess
    import sys
    import time

    from cadence import auto

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    marked = subprocess.Popen(sleeper, env={**os.environ, auto.TRIAL_MARK: "424242"})
    plain = subprocess.Popen(sleeper)
    try:
        for _ in range(50):  # (its environment is readable once the process runs)
            if marked.pid in resources.processes_marked(auto.TRIAL_MARK, "424242"):
                break
            time.sleep(0.05)
        assert resources.processes_marked(auto.TRIAL_MARK, "424242") == [marked.pid]
        auto.sweep_child(424242)
        assert marked.wait(10) == -9
        assert plain.poll() is None
    finally:
        marked.kill()
        plain.kill()
