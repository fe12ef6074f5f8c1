"""A role in another process, called by its methods: the transport of roles held by Ray actors.

A caller names a verb by the role's method (``proxy.submit(ServerShard.push, ...)``,
``channel.submit(Coordinator.take, worker)``), checked by ``placement.verb_of``; only its name
crosses the process boundary, and only here is a name turned back into the method it names.

- ``OrderedProxy`` / ``OrderedRole``: a caller's calls reach the role in the caller's program
  order without a round trip each. Every call carries the proxy's caller id and sequence number
  and the role's side (``OrderedRole.call``) starts each caller's calls in that order, so one-way
  verbs are sent without waiting and still arrive before the caller's next call. Calls go as Ray
  actor calls, or after ``direct()`` over a channel of the proxy's own (``engines.channel``): tens
  of microseconds a call instead of Ray's 0.5-1 ms of CPU on each side. ``PerThread`` gives each
  thread of a process its own copy of a proxy (its own caller and channel).
- ``VerbServer`` / ``VerbChannel``: a role's chosen verbs served on a channel, one request after
  the other per connection (a worker's per-batch requests to a coordinator).

A process that died surfaces as the proxy's ``lost`` error (a server shard's ``ShardLost``). No
strategy is named here.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable

from cadence.engines.channel import Channel, ChannelClosed, ChannelServer, Reply
from cadence.engines.placement import verb_of
from cadence.engines.ray import pack, ray, ray_get, unpack


def bound_verb(role: Any, kind: type, name: str) -> Callable:
    """The verb ``name`` of ``kind`` bound to ``role`` (a request's name turned back into the method
    it names, as ``role``'s class defines it); a name that is not a verb of ``kind`` is a TypeError."""
    return getattr(role, verb_of(kind, getattr(kind, name, None)))


class Call:
    """A remote call in flight (``result`` waits for it): a Ray object ref, or a channel's reply. A
    process that died is raised as ``lost(error)`` where the caller gave one."""

    def __init__(self, ref: Any, lost: Callable[[BaseException], BaseException] | None = None):
        self.ref, self.lost = ref, lost

    def result(self) -> Any:
        try:
            if isinstance(self.ref, Reply):
                return unpack(self.ref.result())
            return unpack(ray_get(self.ref))
        except (ray.exceptions.RayActorError, ChannelClosed) as err:
            if self.lost is None:
                raise
            raise self.lost(err) from None


class OrderedRole:
    """The role's side of ``OrderedProxy``: runs each caller's calls in its order. With ``lock`` (a
    re-entrant lock or condition: the role's own) a call waits for its turn, takes the lock, and only
    then lets the caller's next call start (a call that waits on the lock's condition releases it);
    without one (a lock-free role) a caller's next call starts when this one has finished, other
    callers' calls run beside it."""

    def __init__(self, role: Any, kind: type, lock: Any = None):
        self.role, self.kind, self.lock = role, kind, lock
        self.turns = threading.Condition()
        self.next_seq: dict[str, int] = {}  # caller -> sequence number of its next call

    def call(self, caller: str, seq: int, name: str, *args: Any) -> Any:
        verb = bound_verb(self.role, self.kind, name)
        if self.lock is None:
            with self.turns:
                self.turns.wait_for(lambda: self.next_seq.get(caller, 0) == seq)
            try:
                return pack(verb(*unpack(args)))
            finally:
                with self.turns:
                    self.next_seq[caller] = seq + 1
                    self.turns.notify_all()
        with self.turns:
            self.turns.wait_for(lambda: self.next_seq.get(caller, 0) == seq)
            self.lock.acquire()
            self.next_seq[caller] = seq + 1
            self.turns.notify_all()
        try:
            return pack(verb(*unpack(args)))
        finally:
            self.lock.release()

    def serve(self, request: tuple) -> Any:
        """A request off a channel: (caller, seq, verb name, packed arguments)."""
        caller, seq, name, args = request
        return self.call(caller, seq, name, *args)


class OrderedProxy:
    """A role of class ``kind`` held by an actor (``handle``, a ``Hosted``) whose verb ``entry`` passes
    calls to an ``OrderedRole``; ``address``: that actor's channel for ``direct()``. ``one_way``: the
    verbs an attribute call sends without waiting (``settle`` waits for those sent so far); any
    other verb of ``kind`` called as an attribute waits for its result, and ``submit`` sends one and
    returns its ``Call``. Picklable: a copy in another process is a caller of its own."""

    def __init__(self, handle: Any, entry: Callable, kind: type, one_way: tuple[Callable, ...] = (),
                 address: tuple | None = None, secret: bytes = b""):
        self.handle, self.entry, self.kind, self.one_way = handle, entry, kind, one_way
        self.address = address  # the actor's channel
        self.secret = secret  # the run's channel secret
        self.caller = uuid.uuid4().hex  # each process's copy of a proxy is a caller of its own
        self._seq = 0
        self._pending: list[Call] = []
        self._lock = threading.Lock()  # the threads of a process may share a proxy
        self._channel: Channel | None = None
        self._one_way = {verb_of(kind, verb) for verb in one_way}

    def lost(self, err: BaseException) -> BaseException:
        """What a call raises when the role's process died (``err``: how that showed)."""
        return err

    def copy(self) -> "OrderedProxy":
        """A proxy of the same role with a caller of its own (its own sequence, its own channel)."""
        cls, args = self.__reduce__()
        return cls(*args)

    def direct(self) -> None:
        """From now on this copy's calls go over a channel to the actor (one caller: a worker)."""
        if self.address is not None and self._channel is None:
            try:
                self._channel = Channel(self.address, self.secret)
            except ChannelClosed as err:
                raise self.lost(err) from None

    def _remote(self, name: str, args: tuple) -> Call:
        packed = pack(args)
        with self._lock:  # sequence numbers in submission order
            seq, self._seq = self._seq, self._seq + 1
            if self._channel is not None:
                return Call(self._channel.submit((self.caller, seq, name, packed)), self.lost)
            return Call(self.handle.start(self.entry, self.caller, seq, name, *packed), self.lost)

    def submit(self, verb: Callable, *args: Any) -> Call:
        """Call ``verb`` (a method of ``kind``, never a string) without waiting for it."""
        return self._remote(verb_of(self.kind, verb), args)

    def settle(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for call in pending:
            call.result()

    def close_channel(self) -> None:
        """This copy's channel closed (its calls go through Ray again)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def __getattr__(self, name: str):
        """``proxy.verb(*args)`` as on the role itself: only its verbs (another name fails here, as
        it would on the role in this process)."""
        if name.startswith("_"):
            raise AttributeError(name)
        verb = getattr(self.kind, name, None)
        if not callable(verb):
            raise AttributeError(name)
        if name in self._one_way:
            return lambda *args: self._send(name, args)
        return lambda *args: self.submit(verb, *args).result()

    def _send(self, name: str, args: tuple) -> None:
        call = self._remote(name, args)
        with self._lock:
            self._pending.append(call)
            settled = self._pending[:128] if len(self._pending) >= 256 else []
            del self._pending[:len(settled)]
        for old in settled:  # long applied by now: collected, so errors surface and replies are read
            old.result()

    def __reduce__(self):
        return OrderedProxy, (self.handle, self.entry, self.kind, self.one_way, self.address, self.secret)


class PerThread:
    """A proxy as the threads of one process see it: each thread calls through a copy of its own
    (``OrderedProxy.copy``) over a channel of its own, so a call that waits in the role holds up only
    its own thread's channel, and each costs a channel's round trip, not a Ray call's. Each thread's
    calls reach the role in its program order; calls of different threads are ordered by the role's
    lock alone. ``settle`` waits for every thread's one-way calls."""

    def __init__(self, proxy: OrderedProxy):
        self.proxy = proxy
        self.local = threading.local()
        self.copies: list[OrderedProxy] = []
        self.lock = threading.Lock()

    def _mine(self) -> OrderedProxy:
        copy = getattr(self.local, "copy", None)
        if copy is None:
            copy = self.local.copy = self.proxy.copy()
            copy.direct()
            with self.lock:
                self.copies.append(copy)
        return copy

    def settle(self) -> None:
        with self.lock:
            copies = list(self.copies)
        for copy in copies:
            copy.settle()

    def close_channels(self) -> None:
        with self.lock:
            copies, self.copies = self.copies, []
        for copy in copies:  # (the run is over: replies still owed are not read)
            copy.close_channel()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._mine(), name)


class VerbServer:
    """Serves ``verbs`` (methods of ``kind``) of ``role`` on a channel at ``host``: a request is the
    verb's name and its arguments (``VerbChannel.submit``); a verb not among ``verbs`` is refused."""

    def __init__(self, role: Any, kind: type, verbs: tuple[Callable, ...], host: str, secret: bytes):
        self.role, self.kind = role, kind
        self.verbs = {verb_of(kind, verb) for verb in verbs}
        self.server = ChannelServer(self._dispatch, host, secret)
        self.address = self.server.address

    def _dispatch(self, request: tuple) -> Any:
        name, *args = request
        if name not in self.verbs:
            raise ValueError(f"this channel serves {', '.join(sorted(self.verbs))} of {self.kind.__name__}, not {name!r}")
        return bound_verb(self.role, self.kind, name)(*args)

    def close(self) -> None:
        self.server.close()


class VerbChannel:
    """The client of a ``VerbServer``: ``submit(verb, *args)`` sends at once and returns the ``Reply``;
    replies come in the order the requests were sent."""

    def __init__(self, address: tuple, secret: bytes, kind: type):
        self.channel = Channel(address, secret)
        self.kind = kind

    def submit(self, verb: Callable, *args: Any) -> Reply:
        return self.channel.submit((verb_of(self.kind, verb), *args))

    def close(self) -> None:
        self.channel.close()
