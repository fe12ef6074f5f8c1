"""The processes a Ray run's roles live in (``cadence.engines.ray.Host``), checked as plain objects
of this process: each role starts from the state a fresh process has, a call for a released role
fails instead of reaching the next one, a call for the next one waits for its build, a failed build
is each call's error, and a process with a call still running is not offered for reuse. (The pool
of such processes on a real cluster: ``tests/ps/test_ray_engine.py``.)"""

import random
import threading
import time

import numpy as np
import pytest
import torch

pytest.importorskip("ray")

from cadence.engines.ray import Host, Hosted, StaleCall  # noqa: E402


class Drawer:
    """A role that draws from every random stream when built, and changes torch's thread count."""

    def __init__(self, label: str):
        self.label = label
        self.draws = (torch.rand(3).tolist(), random.random(), float(np.random.rand()))
        self.threads = torch.get_num_threads()
        torch.manual_seed(12345)
        random.seed(12345)
        np.random.seed(12345)
        torch.set_num_threads(1 if self.threads > 1 else 2)

    def report(self):
        return self.label, self.draws, self.threads


class Gate:
    def __init__(self):
        self.entered, self.leave = threading.Event(), threading.Event()
        self.closed = False

    def hold(self) -> str:
        self.entered.set()
        self.leave.wait(30)
        return "held"

    def close(self) -> None:
        self.closed = True


class Broken:
    def __init__(self):
        raise ValueError("cannot build this role")


def test_each_role_starts_from_the_state_of_a_fresh_process() -> None:
    host = Host()
    host.build(1, Drawer, "first")
    first = host.invoke(1, "report")
    torch.rand(7), random.random(), np.random.rand()  # the process's streams move on meanwhile
    assert host.release()
    host.build(2, Drawer, "second")
    second = host.invoke(2, "report")
    assert second[0] == "second"
    assert second[1:] == first[1:]  # the same draws, the same thread count: as in a new process


def test_a_call_for_a_released_role_is_stale_and_one_for_the_next_role_waits_for_its_build() -> None:
    host = Host()
    host.build(1, Drawer, "first")
    assert host.invoke(1, "report")[0] == "first"
    assert host.release()
    with pytest.raises(StaleCall):
        host.invoke(1, "report")
    answered: list[tuple[float, str]] = []

    def call_early() -> None:
        label = host.invoke(2, "report")[0]
        answered.append((time.monotonic(), label))

    early = threading.Thread(target=call_early)
    early.start()
    time.sleep(0.2)
    assert not answered  # waits: generation 2 is not built yet
    built = time.monotonic()
    host.build(2, Drawer, "second")
    early.join(5)
    assert answered and answered[0][1] == "second" and answered[0][0] >= built
    with pytest.raises(StaleCall):
        host.invoke(1, "report")  # still stale: the released generation never comes back


def test_a_role_that_failed_to_build_fails_each_of_its_calls_with_its_error() -> None:
    host = Host()
    host.build(1, Broken)
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot build this role"):
            host.invoke(1, "ping")
    assert host.release()  # the process itself is fine: the next role may be built in it
    host.build(2, Drawer, "after")
    assert host.invoke(2, "report")[0] == "after"


def test_a_process_with_a_call_still_running_is_not_offered_again_and_its_role_is_closed() -> None:
    host = Host()
    host.build(1, Gate)
    gate = host.role
    running = threading.Thread(target=host.invoke, args=(1, "hold"))
    running.start()
    assert gate.entered.wait(5)
    assert host.release() is False  # a call of the released role still runs here
    assert gate.closed
    gate.leave.set()
    running.join(5)
    host.build(2, Gate)
    assert host.release() is True  # idle: may take another role


class RecordingHost:
    """What ``Hosted`` sends to its process's ``Host``: ``invoke.remote(generation, verb, *args)``."""

    def __init__(self):
        self.sent = []
        self.invoke = self

    def remote(self, *args):
        self.sent.append(args)
        return args


def test_a_hosted_role_is_called_by_its_method_and_a_wrong_verb_fails_where_it_is_written() -> None:
    host = RecordingHost()
    hosted = Hosted(host, 3, Drawer)
    assert hosted.start(Drawer.report, 7) == (3, "report", 7)
    for wrong in ("report", Gate.hold, Drawer.__init__):  # a string, another role's method, not a public one
        with pytest.raises(TypeError, match="is not a verb of Drawer"):
            hosted.start(wrong)
    assert host.sent == [(3, "report", 7)]  # (nothing sent for a wrong one)
