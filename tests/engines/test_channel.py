"""The Ray engine's data plane: requests on one channel run in order, replies reach their own
requests, failures travel back as themselves, and a dead server fails every reply still owed."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from cadence.engines.channel import Channel, ChannelClosed, ChannelServer

SECRET = bytes(range(32))


class Unpicklable(Exception):
    def __init__(self, handle):
        super().__init__("cannot travel")
        self.handle = handle

    def __reduce__(self):
        raise TypeError("not picklable")


def test_requests_run_in_order_and_replies_reach_their_requests():
    seen = []

    def dispatch(request):
        seen.append(request)
        time.sleep(0.0005 * (request % 3))  # uneven service times
        return request * 2

    server = ChannelServer(dispatch, "127.0.0.1", SECRET)
    channel = Channel(server.address, SECRET)
    replies = [channel.submit(i) for i in range(200)]  # all in flight before any is read
    assert [reply.result() for reply in reversed(replies)] == [2 * i for i in reversed(range(200))]
    assert seen == list(range(200))
    assert channel.outstanding() == 0
    channel.close()
    server.close()


def test_connections_are_served_concurrently():
    """A request that blocks (a worker waiting at a barrier) does not hold up another worker's."""
    release = threading.Event()

    def dispatch(request):
        if request == "wait":
            release.wait(10)
        return request

    server = ChannelServer(dispatch, "127.0.0.1", SECRET)
    first, second = Channel(server.address, SECRET), Channel(server.address, SECRET)
    blocked = first.submit("wait")
    assert second.submit("go").result() == "go"
    release.set()
    assert blocked.result() == "wait"
    server.close()


def test_failures_travel_back_as_themselves_and_the_channel_goes_on():
    def dispatch(request):
        if request == "missing":
            raise KeyError("no such key")
        if request == "strange":
            raise Unpicklable(threading.Lock())
        return np.arange(4, dtype=np.float32) * request

    server = ChannelServer(dispatch, "127.0.0.1", SECRET)
    channel = Channel(server.address, SECRET)
    failing, strange, fine = channel.submit("missing"), channel.submit("strange"), channel.submit(3)
    with pytest.raises(KeyError, match="no such key"):
        failing.result()
    with pytest.raises(RuntimeError, match="Unpicklable: cannot travel"):
        strange.result()
    array = fine.result()
    assert array.dtype == np.float32 and array.tolist() == [0.0, 3.0, 6.0, 9.0] and array.flags.writeable
    big = channel.submit(10**6).result()  # a payload larger than one segment
    assert big[3] == 3 * 10**6
    server.close()


SERVER = """
import sys, time
from cadence.engines.channel import ChannelServer
server = ChannelServer(lambda request: time.sleep(request) or request, "127.0.0.1", b"s" * 32)
print(server.address[1], flush=True)
time.sleep(60)
"""


def test_a_dead_server_fails_every_reply_still_owed():
    process = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
        channel = Channel(("127.0.0.1", port), b"s" * 32)
        assert channel.submit(0).result() == 0
        slow, later = channel.submit(30), channel.submit(0)
        process.kill()
        for reply in (slow, later):
            with pytest.raises(ChannelClosed):
                reply.result()
        with pytest.raises(ChannelClosed):
            channel.submit(0)
    finally:
        process.kill()
        process.wait()


def test_nothing_listening_is_a_closed_channel():
    server = ChannelServer(lambda request: request, "127.0.0.1", SECRET)
    address = server.address
    server.close()
    with pytest.raises(ChannelClosed, match="cannot connect"):
        Channel(address, SECRET, timeout=5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's")
def test_one_machine_takes_the_unix_socket_and_another_takes_tcp():
    server = ChannelServer(lambda request: request + 1, "127.0.0.1", SECRET)
    host, port, local = server.address
    here = Channel(server.address, SECRET)
    assert here.sock.family == socket.AF_UNIX and here.submit(1).result() == 2
    elsewhere = Channel((host, port, "\0cadence-channel-on-another-machine"), SECRET)  # no such socket here
    assert elsewhere.sock.family == socket.AF_INET and elsewhere.submit(2).result() == 3
    assert Channel((host, port), SECRET).submit(3).result() == 4
    server.close()


def test_a_connection_without_the_run_secret_is_closed_unread():
    """A pickle runs code when loaded: the server unpickles nothing from a connection that has not
    sent the run's secret first."""
    served = []
    server = ChannelServer(lambda request: served.append(request) or request, "127.0.0.1", SECRET)
    stranger = Channel(server.address, bytes(32))  # the wrong secret, same length
    with pytest.raises(ChannelClosed):
        stranger.submit("anything").result()
    assert served == []
    assert Channel(server.address, SECRET).submit("friend").result() == "friend"
    assert served == ["friend"]
    server.close()
