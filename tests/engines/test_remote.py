"""A role in another process called by its methods (``engines.remote``): a caller's calls reach the
role in the caller's order whatever order they arrive in; only the role's verbs are served, named
by the methods themselves; each thread of a process calls through a proxy of its own."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("ray")

from cadence.engines.remote import OrderedRole, PerThread, VerbChannel, VerbServer  # noqa: E402
from cadence.engines.ray import pack, unpack  # noqa: E402

SECRET = bytes(range(32))


class Log:
    """A role: its verbs append to one list."""

    def __init__(self):
        self.seen: list[tuple[str, int]] = []

    def record(self, caller: str, value: int) -> int:
        self.seen.append((caller, value))
        return value * 2

    def other(self) -> str:
        return "other"

    def _private(self) -> None:
        raise AssertionError("never served")


@pytest.mark.parametrize("locked", [False, True])
def test_a_callers_calls_run_in_its_order_whatever_order_they_arrive_in(locked: bool):
    log = Log()
    role = OrderedRole(log, Log, threading.RLock() if locked else None)
    results: dict[tuple[str, int], int] = {}

    def send(caller: str, seq: int) -> None:
        results[caller, seq] = unpack(role.call(caller, seq, "record", *pack((caller, seq))))

    # each caller's calls arrive last first, a few milliseconds apart, the two callers interleaved
    threads = [threading.Thread(target=send, args=(caller, seq)) for seq in reversed(range(6)) for caller in "ab"]
    for thread in threads:
        thread.start()
        time.sleep(0.002)
    for thread in threads:
        thread.join(10)
    assert [value for caller, value in log.seen if caller == "a"] == list(range(6))
    assert [value for caller, value in log.seen if caller == "b"] == list(range(6))
    assert results == {(caller, seq): 2 * seq for caller in "ab" for seq in range(6)}


def test_only_the_roles_public_verbs_are_served():
    role = OrderedRole(Log(), Log)
    for name in ("_private", "missing", "__init__"):
        with pytest.raises(TypeError):
            role.call("a", 0, name)


def test_a_channel_serves_the_verbs_it_was_given_named_by_their_methods():
    server = VerbServer(Log(), Log, (Log.record,), "127.0.0.1", SECRET)
    channel = VerbChannel(server.address, SECRET, Log)
    try:
        assert channel.submit(Log.record, "a", 3).result() == 6
        with pytest.raises(ValueError, match="serves record of Log, not 'other'"):
            channel.submit(Log.other).result()  # a verb of the role, but not one this channel serves
        with pytest.raises(TypeError):
            channel.submit("record", "a", 1)  # a string is not a verb: refused where it is written
        assert channel.submit(Log.record, "a", 4).result() == 8  # (the channel goes on)
    finally:
        channel.close()
        server.close()


def test_each_thread_calls_through_a_copy_of_its_own_and_settle_waits_for_every_copy():
    made = []

    class Proxy:
        def __init__(self):
            self.calls, self.settled, self.direct_calls = [], 0, 0

        def copy(self):
            copy = Proxy()
            made.append(copy)
            return copy

        def direct(self):
            self.direct_calls += 1

        def close_token(self, token, handed_out):
            self.calls.append((threading.current_thread().name, token))

        def settle(self):
            self.settled += 1

        def close_channel(self):
            pass

    shared = PerThread(Proxy())

    def work(token):
        shared.close_token(token, 1)
        shared.close_token(token + 10, 1)

    threads = [threading.Thread(target=work, args=(index,), name=f"t{index}") for index in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 3 and all(proxy.direct_calls == 1 for proxy in made)
    assert sorted(tuple(proxy.calls) for proxy in made) == [
        (("t0", 0), ("t0", 10)), (("t1", 1), ("t1", 11)), (("t2", 2), ("t2", 12))]  # a thread's calls on its own
    shared.settle()
    assert [proxy.settled for proxy in made] == [1, 1, 1]
