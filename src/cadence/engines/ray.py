"""Ray as a place where code runs: joining a cluster, moving tensors between processes, the actors'
common verbs, and the cluster's nodes. Ray is imported only here and only when a run uses
``--engine ray`` (``import cadence`` never needs it); no strategy is named here."""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
import random
import secrets
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from cadence.engines.channel import Channel, ChannelServer, Reply
from cadence.engines.placement import Handle, Pending, Placement, verb_of
from cadence.errors import ConfigError
from cadence.resources import left_at_exit, stop_at_exit

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ModuleNotFoundError as err:  # pragma: no cover - exercised only without the extra
    if err.name != "ray":
        raise
    raise ConfigError("ps.engine: ray needs Ray; install it with: pip install 'cadence[ray]'") from None


CONNECT_TIMEOUT = 10.0  # seconds to reach a cluster's address before ``ray.init`` is tried
settings: dict[str, Any] = {"address": None, "threads": 1, "idle_processes": 8}
HOST_CONCURRENCY = 64  # calls a kept process runs at once (a run that needs more starts processes of its own)


def connect(address: str | None = None, threads: int = 0, idle_processes: int | None = None) -> None:
    """Join the Ray cluster at ``address`` ("HOST:PORT"), or with None whatever ``ray.init()``
    finds (``RAY_ADDRESS``, the newest local cluster) or starts. ``threads``: torch threads per actor
    (0 = 1); ``idle_processes``: how many actor processes this driver keeps for its next run
    (``Hosts``; None: unchanged). A process already connected to Ray keeps its connection. An
    address that cannot be reached fails within ``CONNECT_TIMEOUT`` seconds (``ray.init`` alone
    would retry for minutes)."""
    settings.update(address=address, threads=max(1, threads))
    if idle_processes is not None:
        settings["idle_processes"] = idle_processes
    if ray.is_initialized():
        return
    if address is not None and address != "auto":
        _reachable(address)
    # Ray's driver takes SIGTERM for itself (``sys.exit(15)``, or its core worker's abort): the
    # handlers this process had (the CLI's: exit 143, the run resumable) are put back after it
    handlers = {sign: signal.getsignal(sign) for sign in (signal.SIGTERM, signal.SIGINT)}
    # (before ray.init: an interrupt while it starts the instance still stops what it started; a
    # forked process ends without atexit: it calls resources.end_process)
    stop_at_exit(ray.shutdown)
    # the session directory of an instance this process starts (Ray names it after the starter's
    # process id, under $RAY_TMPDIR or $TMPDIR): this process's leftover, removed where it is scratch
    left_at_exit(Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray", f"session_*_{os.getpid()}")
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ConfigError(
            f"ps.ray_address: cannot join the Ray cluster at {address}: {err}. If the cluster uses token "
            "authentication (`ray start` turns it on), run with RAY_AUTH_MODE=token and its token in "
            "~/.ray/auth_token or RAY_AUTH_TOKEN") from None
    finally:
        if threading.current_thread() is threading.main_thread():
            for sign, handler in handlers.items():
                if handler is not None:
                    signal.signal(sign, handler)


def _reachable(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"ps.ray_address: {address!r} is not HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as err:
        raise ConfigError(f"ps.ray_address: cannot reach a Ray cluster at {address} ({err}); is `ray start "
                          "--head` running there?") from None



# ---- moving tensors between processes ----------------------------------------------------------------
class Array:
    """A tensor crossing an actor boundary, as a numpy array (zero-copy through the object store)."""

    def __init__(self, array: np.ndarray):
        self.array = array


def pack(value: Any) -> Any:
    """Tensors (also inside tuples, lists, dicts and dataclasses) to ``Array``."""
    if isinstance(value, Tensor):
        try:
            return Array(value.detach().cpu().numpy())
        except TypeError:  # a dtype numpy lacks (bfloat16): pickled as a tensor
            return value
    return map_tensors(value, pack)


def unpack(value: Any) -> Any:
    """``Array`` back to tensors (copied when read-only: torch may write them)."""
    if isinstance(value, Array):
        array = value.array
        return torch.from_numpy(array if array.flags.writeable else array.copy())
    return map_tensors(value, unpack)


def map_tensors(value: Any, convert) -> Any:
    if type(value) in (tuple, list):
        return type(value)(convert(item) for item in value)
    if isinstance(value, dict):
        return type(value)((key, convert(item)) for key, item in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        result = copy.copy(value)
        for item in dataclasses.fields(value):
            object.__setattr__(result, item.name, convert(getattr(value, item.name)))
        return result
    return value


def ray_get(refs: Any) -> Any:
    """``ray.get``, with a remote exception re-raised as itself (``Aborted`` stays catchable) and a
    dead shard actor as ``ShardLost``."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        raise err.as_instanceof_cause() from None



def node_host() -> str:
    """This node's address, where its actors' channels listen."""
    return ray.util.get_node_ip_address()



def on_node(node: str) -> Any:
    """The scheduling strategy that places an actor on Ray node ``node`` and nowhere else."""
    return NodeAffinitySchedulingStrategy(node, soft=False)


def nodes_offering(resource: str) -> list[str]:
    """The alive nodes that offer custom resource ``resource`` (``ray start --resources``), in id
    order; none is a ``ConfigError``."""
    offering = sorted(node["NodeID"] for node in ray.nodes()
                      if node.get("Alive") and node.get("Resources", {}).get(resource, 0) > 0)
    if not offering:
        raise ConfigError(f"no alive node of the Ray cluster offers the resource {resource!r}; start the nodes "
                          f"meant for it with `ray start --resources '{{\"{resource}\": 1}}'`")
    return offering


def cluster_nodes() -> list[str]:
    """The alive nodes that have CPUs (a head started with --num-cpus=0 is left alone), the driver's first."""
    alive = [node for node in ray.nodes() if node.get("Alive")]
    working = [node for node in alive if node.get("Resources", {}).get("CPU", 0) > 0] or alive
    here = ray.get_runtime_context().get_node_id()
    return sorted((node["NodeID"] for node in working), key=lambda node: (node != here, node))



class Actor:
    def node(self) -> str:
        """The id of the Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def ping(self) -> int:
        return 0

    def pid(self) -> int:
        return os.getpid()


# ---- processes kept between runs --------------------------------------------------------------------
class StaleCall(RuntimeError):
    """A call meant for a role that its process has since released (the run that made it is over)."""


class Host(Actor):
    """A Ray actor process that holds one role at a time (``Hosts``): ``build`` makes the role, an
    object of one of cadence's actor classes; ``invoke`` calls its methods; ``release`` drops it, so
    that the driver's next run builds its roles here instead of starting processes (a process
    spends seconds importing torch and cadence). Every role starts from the state a fresh process
    has: torch's, Python's and numpy's random streams and torch's thread count as they were when
    this process started. Each build is a new generation; a call made for an earlier one fails with
    ``StaleCall`` instead of reaching the new role (or a released one), and one for the coming one
    waits for its build (a threaded actor may start calls out of order)."""

    def __init__(self):
        self.fresh = (torch.get_rng_state(), random.getstate(), np.random.get_state(), torch.get_num_threads())
        self.role: Any = None
        self.generation = 0
        self.failure: BaseException | None = None
        self.calls = 0  # invocations running now
        self.turn = threading.Condition()

    def build(self, generation: int, cls: type, *args: Any) -> None:
        rng, state, np_state, threads = self.fresh
        torch.set_rng_state(rng)
        random.setstate(state)
        np.random.set_state(np_state)
        torch.set_num_threads(threads)
        try:
            role, failure = cls(*args), None
        except BaseException as err:  # noqa: BLE001 - raised again by each call of this generation
            role, failure = None, err
        with self.turn:  # (a failure is raised by each call of this generation, not here: nobody waits on a build)
            self.role, self.failure, self.generation = role, failure, generation
            self.turn.notify_all()

    def invoke(self, generation: int, method: str, *args: Any, **kwargs: Any) -> Any:
        with self.turn:
            self.turn.wait_for(lambda: self.generation >= generation)
            if self.failure is not None and self.generation == generation:
                raise self.failure
            if self.generation != generation or self.role is None:
                raise StaleCall(f"{method}: this process's role from that run was released")
            role = self.role
            self.calls += 1
        try:
            return getattr(role, method)(*args, **kwargs)
        finally:
            with self.turn:
                self.calls -= 1

    def release(self) -> bool:
        """Drop the role (after its ``close``, where it has one); whether this process may take
        another: no call of the role still runs, and closing it succeeded."""
        with self.turn:
            role, self.role, self.failure = self.role, None, None  # calls for it are stale from now on
            busy = self.calls > 0
        try:
            close = getattr(role, "close", None)
            if close is not None:
                close()
        except Exception:  # noqa: BLE001 - a role that cannot close leaves its process to be killed
            return False
        del role
        gc.collect()
        return not busy


class Hosted:
    """A role (an object of the class ``kind``) built in a ``Host``; picklable, so roles hold their
    peers' handles. ``host``: the process's actor handle. A verb is named by the role's method
    itself (``hosted.call(Coordinator.take, worker)``, ``hosted.start(...)``: checked by
    ``placement.verb_of``), as on a ``placement.Handle``; ``hosted.verb.remote(*args)``, as a Ray
    actor handle is called, is this module's own (its ``RoleActor`` and ``Host`` plumbing)."""

    def __init__(self, host: Any, generation: int, kind: type, gpus: float = 0.0):
        self.host, self.generation, self.kind, self.gpus = host, generation, kind, gpus
        self.role = kind.__name__

    def start(self, method: Callable, *args: Any) -> Any:
        """Call the role's verb ``method`` without waiting: its Ray object reference."""
        return self.host.invoke.remote(self.generation, verb_of(self.kind, method), *args)

    def call(self, method: Callable, *args: Any) -> Any:
        """Call the role's verb ``method`` and wait: its result (its error raised here)."""
        return ray_get(self.start(method, *args))

    def __getattr__(self, name: str) -> "_HostedVerb":
        if name.startswith("_"):
            raise AttributeError(name)
        return _HostedVerb(self, name)

    def __repr__(self) -> str:
        return f"Hosted({self.role}, generation {self.generation})"


class _HostedVerb:
    def __init__(self, hosted: Hosted, name: str):
        self.hosted, self.name = hosted, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.hosted.host.invoke.remote(self.hosted.generation, self.name, *args, **kwargs)


class Hosts:
    """The driver's Ray actor processes: ``take`` builds a role in a kept idle process on the node
    asked for, or in a new one; ``give_back`` releases roles and keeps up to
    ``settings["idle_processes"]`` idle processes (``ps.ray_idle_processes``; 0: none) for the
    next run, killing the rest. A process whose role is still busy (a call in flight) or that died
    is never kept, nor one holding a GPU share (each run asks Ray for its GPU shares anew)."""

    def __init__(self) -> None:
        self.idle: dict[str, list[tuple[Any, int]]] = {}  # node -> (host, its next generation)
        self.job: Any = None  # the Ray job (connection) the idle processes belong to
        self.lock = threading.Lock()
        self._host = ray.remote(Host)

    def _waiting(self) -> dict[str, list[tuple[Any, int]]]:
        """The idle processes, forgotten when this driver has joined a cluster anew since they were
        kept (they ended with the old connection). Call with the lock held."""
        job = ray.get_runtime_context().get_job_id()
        if job != self.job:
            self.idle, self.job = {}, job
        return self.idle

    def take(self, role: type, args: tuple, node: str | None, concurrency: int, gpus: float = 0.0) -> Hosted:
        kept = None
        if not gpus and concurrency <= HOST_CONCURRENCY and node is not None:
            kept = self._idle_on(node)
        if kept is None:
            where = {"num_gpus": gpus} if gpus else {"scheduling_strategy": on_node(node)} if node else {}
            host = self._host.options(num_cpus=0, max_concurrency=max(concurrency, HOST_CONCURRENCY),
                                      **where).remote()
            kept = (host, 1)
        host, generation = kept
        host.build.remote(generation, role, *args)
        return Hosted(host, generation, role, gpus)

    def _idle_on(self, node: str) -> tuple[Any, int] | None:
        while True:
            with self.lock:
                waiting = self._waiting().get(node)
                if not waiting:
                    return None
                host, generation = waiting.pop()
            ready, _ = ray.wait([host.ping.remote()], timeout=5.0)
            if ready:
                try:
                    ray.get(ready[0])
                    return host, generation
                except ray.exceptions.RayActorError:
                    pass  # died while idle: the next one
            kill(host)

    def give_back(self, handles: Iterable[Hosted]) -> None:
        """Release each role; keep its process where it may take another, kill it otherwise."""
        handles = [handle for handle in handles if isinstance(handle, Hosted)]
        if not handles:
            return
        releases = [handle.host.release.remote() for handle in handles]
        nodes = [handle.host.node.remote() for handle in handles]
        ray.wait(releases + nodes, num_returns=len(releases) + len(nodes), timeout=30.0)
        for handle, release, node in zip(handles, releases, nodes):
            try:
                reusable = ray.get(release, timeout=0) and not handle.gpus
                where = ray.get(node, timeout=0) if reusable else None
            except Exception:  # noqa: BLE001 - dead, or did not answer in time
                reusable, where = False, None
            with self.lock:
                idle = self._waiting()
                if reusable and sum(map(len, idle.values())) < settings["idle_processes"]:
                    idle.setdefault(where, []).append((handle.host, handle.generation + 1))
                    continue
            kill(handle.host)

    def clear(self) -> None:
        """Kill every idle process."""
        if not ray.is_initialized():
            self.idle = {}
            return
        with self.lock:
            idle, self.idle = self._waiting(), {}
        for waiting in idle.values():
            for host, _ in waiting:
                kill(host)


def kill(actor: Any) -> None:
    """Kill an actor's process (a ``Hosted`` role's: its host's); one already gone is no error."""
    try:
        ray.kill(actor.host if isinstance(actor, Hosted) else actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone, or its cluster is
        pass


_HOSTS: list[Hosts] = []


def hosts() -> Hosts:
    """This driver's ``Hosts`` (made when first used: Ray is connected by then)."""
    if not _HOSTS:
        _HOSTS.append(Hosts())
    return _HOSTS[0]


# ---- roles as actors (``engines.placement``) ----------------------------------------------------------
class RoleActor(Actor):
    """One role in an actor of its own: its verbs are called by name through ``call`` (the handle
    checked the name against the role's class), tensors crossing as numpy arrays."""

    def __init__(self, threads: int, role: type, args: Any, secret: bytes | None = None):
        torch.set_num_threads(threads)
        self.role = role(*unpack(args))
        # a direct role (``place(..., direct=True)``) also answers its callers' channels
        self.channel = ChannelServer(lambda request: self.call(*request), node_host(), secret) if secret else None

    def endpoint(self) -> tuple | None:
        return self.channel.address if self.channel is not None else None

    def call(self, verb: str, *args: Any) -> Any:
        return pack(getattr(self.role, verb)(*unpack(args)))

    def close(self) -> None:
        """The run is over (``Host.release``): its channel closed, the role's ``close`` where it has one."""
        if self.channel is not None:
            self.channel.close()
        close = getattr(self.role, "close", None)
        if close is not None:
            close()


class RayPending(Pending):
    def __init__(self, ref: Any):
        self.ref = ref

    def result(self) -> Any:
        return unpack(ray_get(self.ref))


def _large(value: Any) -> bool:
    """A tensor worth putting into the object store once rather than sending to each role."""
    return isinstance(value, Array) and value.array.nbytes >= 1 << 16


WAIT_SLICE = 0.5  # seconds a wait for pendings blocks at a time


def completed(pendings: Iterable[RayPending]) -> Iterator[RayPending]:
    """Ray's pendings in the order they finish. The wait blocks ``WAIT_SLICE`` at a time: a blocking
    ``ray.wait`` holds the main thread in C++, where neither Ctrl-C nor a test's timeout reaches it."""
    by_ref = {pending.ref: pending for pending in pendings}
    while by_ref:
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=WAIT_SLICE)
        if ready:
            yield by_ref.pop(ready[0])


class ChannelPending(Pending):
    """A verb in flight on a channel (a direct role's)."""

    def __init__(self, reply: Reply):
        self.reply = reply

    def result(self) -> Any:
        return unpack(self.reply.result())


class RayHandle(Handle):
    """A role in a ``RoleActor``; picklable, so roles hold their peers' handles. A direct role
    (``address``) is called over a channel each process opens to it on its first call."""

    concurrent = True

    def __init__(self, role: type, index: int, actor: Any, address: tuple | None = None, secret: bytes = b""):
        super().__init__(role, index)
        self.actor = actor
        self.address, self.secret = address, secret
        self._channel: Channel | None = None
        self._opening = threading.Lock()

    def start(self, method, *args: Any) -> Pending:
        if self.address is None:
            return RayPending(self.actor.start(RoleActor.call, self.verb(method), *pack(args)))
        verb = self.verb(method)
        with self._opening:
            if self._channel is None:
                self._channel = Channel(self.address, self.secret)
        return ChannelPending(self._channel.submit((verb, *pack(args))))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_channel"], state["_opening"] = None, None  # (each process opens its own)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _opening=threading.Lock())


class Shipped:
    """The run's task as an actor gets it: built there from its recipe (``Task.recipe``)."""

    def __init__(self, task):
        self.box = [ray.put(task.recipe())]  # in a list: fetched by the actor when it calls

    def __call__(self):
        return ray.get(self.box[0])()


class RayPlacement(Placement):
    """Every role a Ray actor (``ps.engine: ray``: a ``RoleActor`` in a process of ``hosts()``),
    dealt round-robin over the cluster's nodes. ``num_cpus=0``: an actor never waits for a CPU;
    ``CONCURRENCY`` calls at once, so a role answers its peers while its own verbs run."""

    CONCURRENCY = 16
    separate_processes = True

    def __init__(self, address: str | None, threads: int):
        if not ray.is_initialized():
            connect(address, threads)
        self.threads = settings["threads"]
        self.machines = cluster_nodes()
        self.handles: list[RayHandle] = []
        self.actors: list[Hosted] = []  # roles that are actor classes of their own (``actor``)
        self.dealt = 0  # actors dealt to nodes so far
        self.hosts: list[str] = []
        self.start_seconds = 0.0

    def place(self, role: type, index: int, *args: Any, direct: bool = False, resource: str | None = None) -> Handle:
        machines = self.machines if resource is None else nodes_offering(resource)
        machine = machines[index % len(machines)]
        secret = secrets.token_bytes(32) if direct else None  # (admits the handles' processes to its channel)
        actor = hosts().take(RoleActor, (self.threads, role, pack(args), secret), machine, self.CONCURRENCY)
        address = ray_get(actor.start(RoleActor.endpoint)) if direct else None
        handle = RayHandle(role, index, actor, address, secret or b"")
        self.handles.append(handle)
        return handle

    def actor(self, cls: type, *args: Any, concurrency: int = CONCURRENCY, gpus: float = 0.0) -> Hosted:
        """A role that is itself an actor class (an ``Actor`` whose verbs pack what crosses: the
        parameter server's roles), built in a process of ``hosts()`` on the next alive node in turn,
        or, asking for ``gpus`` (a share of one GPU), wherever Ray finds that share (a process of its
        own). ``concurrency``: calls it runs at once. Given back with the others by ``close``."""
        nodes = cluster_nodes()
        node = nodes[self.dealt % len(nodes)]
        self.dealt += 1
        hosted = hosts().take(cls, args, None if gpus else node, concurrency, gpus)
        self.actors.append(hosted)
        return hosted

    def ready(self) -> None:
        started = time.perf_counter()
        waiting = self.handles[len(self.hosts):]  # built (torch imported, data read) before training
        self.hosts += ray_get([handle.actor.start(Actor.node) for handle in waiting])
        self.start_seconds += time.perf_counter() - started

    def ship(self, task) -> Callable[[], Any]:
        return Shipped(task)

    def share(self, thing: Any) -> Any:
        return None

    def each(self, handles: list[Handle], method, *args: Any) -> list[Any]:
        shared = [ray.put(arg) if _large(arg) else arg for arg in pack(args)]  # a big one stored once
        return unpack(ray_get([handle.actor.start(RoleActor.call, handle.verb(method), *shared) for handle in handles]))

    def as_completed(self, pendings: Iterable[Pending]) -> Iterator[Pending]:
        return completed(pendings)

    def fields(self) -> dict[str, Any]:
        return {"engine": "ray", "engine_start_seconds": round(self.start_seconds, 3),
                "node_hosts": len(set(self.hosts))}

    def close(self) -> None:
        """Every role placed so far given back (``Hosts``); the placement may place roles again (the
        actors dealt from the first node again)."""
        hosts().give_back([*self.actors, *(handle.actor for handle in self.handles)])
        self.handles, self.actors, self.hosts, self.dealt = [], [], [], 0
