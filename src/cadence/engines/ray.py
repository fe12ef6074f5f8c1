"""Ray as a place where code runs: joining a cluster, moving tensors between processes, the actors'
common verbs, and the cluster's nodes. Ray is imported only here and only when a run uses
``--engine ray`` (``import cadence`` never needs it); no strategy is named here."""

from __future__ import annotations

import copy
import dataclasses
import os
import socket
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import Tensor

from cadence.engines.placement import Handle, Pending, Placement
from cadence.errors import ConfigError

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ModuleNotFoundError as err:  # pragma: no cover - exercised only without the extra
    if err.name != "ray":
        raise
    raise ConfigError("ps.engine: ray needs Ray; install it with: pip install 'cadence[ray]'") from None


CONNECT_TIMEOUT = 10.0  # seconds to reach a cluster's address before ``ray.init`` is tried
settings: dict[str, Any] = {"address": None, "threads": 1}


def connect(address: str | None = None, threads: int = 0) -> None:
    """Join the Ray cluster at ``address`` ("HOST:PORT"), or with None whatever ``ray.init()``
    finds (``RAY_ADDRESS``, the newest local cluster) or starts. ``threads``: torch threads per actor
    (0 = 1). A process already connected to Ray keeps its connection. An address that cannot be
    reached fails within ``CONNECT_TIMEOUT`` seconds (``ray.init`` alone would retry for minutes)."""
    settings.update(address=address, threads=max(1, threads))
    if ray.is_initialized():
        return
    if address is not None and address != "auto":
        _reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ConfigError(
            f"ps.ray_address: cannot join the Ray cluster at {address}: {err}. If the cluster uses token "
            "authentication (`ray start` turns it on), run with RAY_AUTH_MODE=token and its token in "
            "~/.ray/auth_token or RAY_AUTH_TOKEN") from None


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


# ---- roles as actors (``engines.placement``) ----------------------------------------------------------
class RoleActor(Actor):
    """One role in an actor of its own: its verbs are called by name through ``call`` (the handle
    checked the name against the role's class), tensors crossing as numpy arrays."""

    def __init__(self, threads: int, role: type, args: Any):
        torch.set_num_threads(threads)
        self.role = role(*unpack(args))

    def call(self, verb: str, *args: Any) -> Any:
        return pack(getattr(self.role, verb)(*unpack(args)))


class RayPending(Pending):
    def __init__(self, ref: Any):
        self.ref = ref

    def result(self) -> Any:
        return unpack(ray_get(self.ref))


def _large(value: Any) -> bool:
    """A tensor worth putting into the object store once rather than sending to each role."""
    return isinstance(value, Array) and value.array.nbytes >= 1 << 16


def completed(pendings: Iterable[RayPending]) -> Iterator[RayPending]:
    """Ray's pendings in the order they finish."""
    by_ref = {pending.ref: pending for pending in pendings}
    while by_ref:
        ready, _ = ray.wait(list(by_ref), num_returns=1)
        yield by_ref.pop(ready[0])


class RayHandle(Handle):
    """A role in a ``RoleActor``; picklable, so roles hold their peers' handles."""

    concurrent = True

    def __init__(self, role: type, index: int, actor: Any):
        super().__init__(role, index)
        self.actor = actor

    def start(self, method, *args: Any) -> Pending:
        return RayPending(self.actor.call.remote(self.verb(method), *pack(args)))


class Shipped:
    """The run's task as an actor gets it: built there from its recipe (``Task.recipe``)."""

    def __init__(self, task):
        self.box = [ray.put(task.recipe())]  # in a list: fetched by the actor when it calls

    def __call__(self):
        return ray.get(self.box[0])()


_ROLE_ACTOR: list[Any] = []


class RayPlacement(Placement):
    """Every role a Ray actor (``ps.engine: ray``), dealt round-robin over the cluster's nodes.
    ``num_cpus=0``: an actor never waits for a CPU; ``CONCURRENCY`` calls at once, so a role answers
    its peers while its own verbs run."""

    CONCURRENCY = 16

    def __init__(self, address: str | None, threads: int):
        if not ray.is_initialized():
            connect(address, threads)
        self.threads = settings["threads"]
        self.machines = cluster_nodes()
        self.handles: list[RayHandle] = []
        self.hosts: list[str] = []
        self.start_seconds = 0.0

    def place(self, role: type, index: int, *args: Any) -> Handle:
        if not _ROLE_ACTOR:
            _ROLE_ACTOR.append(ray.remote(RoleActor))
        machine = self.machines[index % len(self.machines)]
        actor = _ROLE_ACTOR[0].options(num_cpus=0, max_concurrency=self.CONCURRENCY,
                                       scheduling_strategy=on_node(machine)).remote(self.threads, role, pack(args))
        handle = RayHandle(role, index, actor)
        self.handles.append(handle)
        return handle

    def ready(self) -> None:
        started = time.perf_counter()
        waiting = self.handles[len(self.hosts):]  # built (torch imported, data read) before training
        self.hosts += ray_get([handle.actor.node.remote() for handle in waiting])
        self.start_seconds += time.perf_counter() - started

    def ship(self, task) -> Callable[[], Any]:
        return Shipped(task)

    def share(self, thing: Any) -> Any:
        return None

    def each(self, handles: list[Handle], method, *args: Any) -> list[Any]:
        shared = [ray.put(arg) if _large(arg) else arg for arg in pack(args)]  # a big one stored once
        return unpack(ray_get([handle.actor.call.remote(handle.verb(method), *shared) for handle in handles]))

    def as_completed(self, pendings: Iterable[Pending]) -> Iterator[Pending]:
        return completed(pendings)

    def fields(self) -> dict[str, Any]:
        return {"engine": "ray", "engine_start_seconds": round(self.start_seconds, 3),
                "node_hosts": len(set(self.hosts))}

    def close(self) -> None:
        for handle in self.handles:
            try:
                ray.kill(handle.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone, or its cluster is
                pass
        self.handles = []
