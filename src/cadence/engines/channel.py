"""Direct TCP channels between processes: the data plane of the Ray engine.

A Ray actor call costs 0.5-1 ms of CPU on each side (task spec, gRPC, scheduling on the actor's
thread pool); a worker makes two or three calls per batch, and a batch of a CTR model computes in
a few milliseconds. Ray keeps placing the processes, watching them and carrying every control call
(epochs, checkpoints, evaluation, faults); the per-batch calls of a worker (pull, push, take) go
over a plain TCP connection from the worker to the actor instead, which costs tens of
microseconds.

``ChannelServer(dispatch, host, secret)`` listens on ``host`` (the node's address, so workers on other
nodes reach it) and serves each connection on a thread of its own: it reads a request, calls
``dispatch(request)``, and writes back the result or the exception it raised, one request after
the other, so one connection's requests run in the order they were sent. ``Channel(address, secret)`` is
the client: ``submit(request)`` sends at once and returns a ``Reply``; replies come back in order
and ``Reply.result()`` reads up to its own. Several requests may be in flight (a push sent without
waiting, a take asked for ahead). A closed connection (the other process died) raises
``ChannelClosed`` in every reply still owed.

A server listens on TCP and, on Linux, also on a Unix socket in the abstract namespace (a random
name, nothing on disk); a client tries the Unix socket first and takes TCP where it is not there
(another machine). Between two processes of one machine the Unix socket skips the TCP stack: about
half the kernel time per message. Messages are pickles (protocol 5; numpy arrays travel as raw
bytes) behind an 8-byte length. A pickle can run code when it is loaded, so a server loads nothing
from a connection before the client has sent the run's secret (random bytes the engine hands every
process of the run through Ray); a connection that sends anything else is closed unread. Nothing
here knows Ray, shards or tasks.
"""

from __future__ import annotations

import hmac
import pickle
import socket
import struct
import sys
import threading
import uuid
from collections import deque
from typing import Any, Callable

_HEADER = struct.Struct("<Q")


class ChannelClosed(ConnectionError):
    """The process at the other end of a channel is gone."""


def _send(sock: socket.socket, value: Any) -> None:
    payload = pickle.dumps(value, protocol=5)
    header = _HEADER.pack(len(payload))
    if len(payload) < 65536:  # one segment
        sock.sendall(header + payload)
    else:  # no copy of a large payload
        sock.sendall(header)
        sock.sendall(payload)


def _receive_exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        count = sock.recv_into(view[got:], size - got)
        if count == 0:
            raise ChannelClosed("the connection was closed")
        got += count
    return buffer


def _receive(sock: socket.socket) -> Any:
    (size,) = _HEADER.unpack(_receive_exactly(sock, _HEADER.size))
    return pickle.loads(_receive_exactly(sock, size))


def _connected(sock: socket.socket) -> socket.socket:
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # requests are small and awaited
    return sock


def _portable(err: BaseException) -> BaseException:
    """The exception itself where it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(err, protocol=5))
        return err
    except Exception:  # noqa: BLE001 - any exception that cannot travel is described instead
        return RuntimeError(f"{type(err).__name__}: {err}")


class ChannelServer:
    """Serves ``dispatch`` to every connection on ``host`` (port chosen by the OS: ``address``)."""

    def __init__(self, dispatch: Callable[[Any], Any], host: str, secret: bytes):
        self.dispatch = dispatch
        self.secret = secret
        self.listeners = [socket.create_server((host, 0))]
        local = None
        if sys.platform.startswith("linux"):
            local = f"\0cadence-channel-{uuid.uuid4().hex}"  # abstract: gone with the process
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.bind(local)
            unix.listen()
            self.listeners.append(unix)
        # (host, port, Unix name or None): what a Channel connects to
        self.address = (host, self.listeners[0].getsockname()[1], local)
        for listener in self.listeners:
            threading.Thread(target=self._accept, args=(listener,), name="channel-accept", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(_connected(sock),), name="channel", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            try:
                sock.settimeout(30.0)
                offered = bytes(_receive_exactly(sock, len(self.secret)))
                sock.settimeout(None)
            except (ChannelClosed, OSError):
                return
            if not hmac.compare_digest(offered, self.secret):
                return  # not one of the run's processes: nothing it sent is unpickled
            while True:
                try:
                    request = _receive(sock)
                except (ChannelClosed, OSError):
                    return  # the client is gone (or finished)
                try:
                    reply = (True, self.dispatch(request))
                except BaseException as err:  # noqa: BLE001 - every failure goes back to the caller
                    reply = (False, _portable(err))
                try:
                    _send(sock, reply)
                except OSError:
                    return

    def close(self) -> None:
        """Stop listening (connections already open are served until their clients go)."""
        for listener in self.listeners:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
            except OSError:
                pass
            listener.close()


def _local(name: str) -> socket.socket | None:
    """A connection to the Unix socket ``name`` where it exists on this machine, else None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(name)
        return sock
    except OSError:
        sock.close()
        return None


class Reply:
    """A request in flight on a ``Channel``."""

    _EMPTY = object()

    def __init__(self, channel: "Channel"):
        self.channel = channel
        self.value: Any = Reply._EMPTY
        self.error: BaseException | None = None

    def result(self) -> Any:
        self.channel._collect(self)
        if self.error is not None:
            raise self.error
        return self.value


class Channel:
    """The client end: one connection, requests answered in the order they were sent."""

    def __init__(self, address: tuple, secret: bytes, timeout: float = 30.0):
        host, port, local = (*address, None)[:3]
        self.sock = _local(local) if local else None
        if self.sock is None:
            try:
                self.sock = socket.create_connection((host, port), timeout=timeout)
            except OSError as err:
                raise ChannelClosed(f"cannot connect to {host}:{port}: {err}") from None
        _connected(self.sock).settimeout(None)
        try:
            self.sock.sendall(secret)
        except OSError as err:
            raise ChannelClosed(f"cannot connect to {host}:{port}: {err}") from None
        self.owed: deque[Reply] = deque()  # sent, reply not read yet, in order
        self.send_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self.closed: ChannelClosed | None = None

    def submit(self, request: Any) -> Reply:
        reply = Reply(self)
        with self.send_lock:
            if self.closed is not None:
                raise self.closed
            self.owed.append(reply)
            try:
                _send(self.sock, request)
            except OSError as err:
                self._fail(ChannelClosed(f"the connection was lost: {err}"))
        return reply

    def outstanding(self) -> int:
        return len(self.owed)

    def _collect(self, target: Reply) -> None:
        with self.read_lock:
            while target.value is Reply._EMPTY and target.error is None:
                if self.closed is not None:
                    target.error = self.closed
                    return
                try:
                    ok, value = _receive(self.sock)
                except (ChannelClosed, OSError) as err:
                    self._fail(err if isinstance(err, ChannelClosed) else ChannelClosed(str(err)))
                    continue
                if not self.owed:  # failed meanwhile (a send broke)
                    continue
                reply = self.owed.popleft()
                if ok:
                    reply.value = value
                else:
                    reply.error = value

    def _fail(self, err: ChannelClosed) -> None:
        self.closed = err
        while self.owed:
            self.owed.popleft().error = err

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
