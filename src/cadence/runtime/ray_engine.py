"""The ``ray`` engine: the same workers, server shards, data list and gate as the ``threads`` engine,
each living in a Ray actor, so that one epoch can run across the processes (and machines) of a Ray
cluster. Nothing of a mode is re-implemented here: the actors hold the very objects the trainer
built (``ServerShard`` with its ``Aggregation``, ``DataList``, ``StepBarrier``/``BoundedStaleness``,
``Worker``) and call their methods.

One epoch (``RayEngine.run(workers, data, gate)``, the ``threads`` engine's signature):

1. **Place.** Each object is pickled with its references to the others replaced by *links* (a
   pickle persistent id such as ``("shard", 0, width)``) and loaded into an actor of the pool:
   shard i into ``ShardServer`` i, the data list into the ``Coordinator``, worker i's task ``Worker``
   into ``Worker`` i. Unpickling there turns each link into the local object (a shard's own gate) or
   a proxy of the actor that holds it (a worker's ``ShardRouter`` gets one ``_RemoteShard`` per
   shard). Locks and conditions are recreated empty. A gate that waits on a shard (``StepBarrier``)
   is hosted by that shard's actor, so it blocks on the shard's own condition; any other stateful
   gate (``BoundedStaleness``) by the coordinator; ``NoGate`` is copied into every worker.
2. **Run.** Every ``Worker`` actor runs the task worker's ``run(data, gate)`` against the proxies. Per batch
   and at the actor boundary, tensors travel as numpy arrays (faster than pickled tensors; the ones
   that arrive read-only are copied before torch may change them). The verbs that return nothing
   (``push``, ``drop``, ``close_token``) are sent without waiting; the caller's next call to that
   shard first waits for them, so each caller's operations reach each shard in program order, as in
   a thread, while a push overlaps the next ``take``. The actors are threaded (``max_concurrency``):
   a worker blocked in a gate blocks no other call, and each shard serialises its verbs under its
   own lock, as it does in threads.
3. **Bring back.** The actors pickle their objects back (links again), and the driver adopts the
   contents into the trainer's own objects: tables, aggregation buffers, counters, workers' counters,
   and the dense module and optimizer through ``load_state_dict`` (so ``trainer.model`` stays the
   module it holds). Between epochs the trainer validates, flushes and summarises in-process as with
   threads. A worker that died by fault injection has its actor killed.

The pool of actors (``num_cpus=0``, so they never wait for CPUs; dealt round-robin over the nodes
that have CPUs, in the order shards, coordinator, workers) lives as long as the driver's connection
and serves later epochs and runs: starting an actor that imports torch costs about a second of CPU.
The task (its data included) is put into the object store once per run and fetched once by each
worker actor, which keeps it across epochs.
A worker actor that dies unexpectedly fails the epoch at once (every actor is killed, so nobody is
left blocked), without recovering its batch.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import itertools
import pickle
import threading
import warnings
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from cadence.errors import ConfigError
from cadence.runtime.gates import NoGate
from cadence.runtime.server import DataList
from cadence.runtime.worker import Worker as TaskWorker

try:
    import ray
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ModuleNotFoundError as err:  # pragma: no cover - exercised only without the extra
    if err.name != "ray":
        raise
    raise ConfigError("ps.engine: ray needs Ray; install it with: pip install 'cadence[ray]'") from None

GATE_METHODS = ("wait", "done", "leave")
_FRESH = {threading.Condition: threading.Condition, type(threading.Lock()): threading.Lock,
          type(threading.RLock()): threading.RLock}
_settings: dict[str, Any] = {"address": None, "threads": 1}


def connect(address: str | None = None, threads: int = 0) -> None:
    """Join the Ray cluster at ``address`` ("HOST:PORT"), or with None whatever ``ray.init()``
    finds (``RAY_ADDRESS``, the newest local cluster) or starts. ``threads``: torch threads per actor
    (0 = 1). A process already connected to Ray keeps its connection."""
    _settings.update(address=address, threads=max(1, threads))
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, include_dashboard=False)
    except ConnectionError as err:
        raise ConfigError(
            f"ps.ray_address: cannot join the Ray cluster at {address}: {err}. If the cluster uses token "
            "authentication (`ray start` turns it on), run with RAY_AUTH_MODE=token and its token in "
            "~/.ray/auth_token or RAY_AUTH_TOKEN") from err


def shutdown() -> None:
    """Kill the pool of actors (the Ray connection itself stays; ``ray.shutdown()`` ends it)."""
    global _POOL
    with _RUN_LOCK:
        if _POOL is not None and ray.is_initialized():  # (without a connection its actors are gone)
            _POOL.dissolve()
        _POOL = None


class RayEngine:
    """``ENGINES.get("ray")()``: runs one epoch's workers and shards as Ray actors (module docstring)."""

    def run(self, workers: list[TaskWorker], data: DataList, gate: NoGate) -> None:
        if not ray.is_initialized():
            connect(_settings["address"], _settings["threads"])
        with _RUN_LOCK:
            pool = _pool(len(workers))
            try:
                _Epoch(pool, workers, data, gate).run()
            except ray.exceptions.RayActorError as err:  # one that died while placing or bringing back
                pool.dissolve()
                raise RuntimeError(f"ray engine: an actor of the run died ({err}); "
                                   "the epoch is abandoned") from err
            except BaseException:
                pool.dissolve()  # actors may be blocked in a gate or a step: none survives a failed epoch
                raise


# ---- moving objects between processes --------------------------------------------------------------
class _Array:
    """A tensor crossing an actor boundary, as a numpy array."""

    def __init__(self, array: np.ndarray):
        self.array = array


def _pack(value: Any) -> Any:
    """Tensors (also inside tuples, lists, dicts and dataclasses) to ``_Array``."""
    if isinstance(value, Tensor):
        try:
            return _Array(value.detach().cpu().numpy())
        except TypeError:  # a dtype numpy lacks (bfloat16): pickled as a tensor
            return value
    return _map(value, _pack)


def _unpack(value: Any, shared: bool = False) -> Any:
    """``_Array`` back to tensors: copied when read-only (zero-copy from the object store), unless
    ``shared``: then the tensor reads the object store's memory and must never be written."""
    if isinstance(value, _Array):
        array = value.array
        if array.flags.writeable:
            return torch.from_numpy(array)
        if not shared:
            return torch.from_numpy(array.copy())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "not writable": nobody writes it
            return torch.from_numpy(array)
    return _map(value, functools.partial(_unpack, shared=shared))


def _map(value: Any, convert: Callable[[Any], Any]) -> Any:
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


class _Pickler(cloudpickle.CloudPickler):
    """Pickles an object graph with the objects in ``links`` (by id) and proxies replaced by their
    link keys, and locks and conditions by fresh ones (cloudpickle: aggregations hold lambdas).
    ``used``: the keys it wrote."""

    def __init__(self, file: io.BytesIO, root: Any, links: dict[int, tuple]):
        super().__init__(file, protocol=5)
        self.root = root
        self.links = links
        self.used: set[tuple] = set()

    def persistent_id(self, obj: Any) -> tuple | None:
        if obj is self.root:
            return None
        key = obj._key if isinstance(obj, _Remote) else self.links.get(id(obj))
        if key is not None:
            self.used.add(key)
        return key

    def reducer_override(self, obj: Any) -> Any:
        fresh = _FRESH.get(type(obj))
        if fresh is not None:
            return fresh, ()
        if type(obj) is Tensor and obj.untyped_storage().nbytes() > obj.numel() * obj.element_size():
            # a view (a batch of a shuffled order): pickled alone, not with its whole base each time
            return _same, (obj.detach().clone().requires_grad_(obj.requires_grad),)
        return super().reducer_override(obj)


def _same(value: Any) -> Any:
    return value


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, resolve: Callable[[tuple], Any]):
        super().__init__(file)
        self.resolve = resolve

    def persistent_load(self, key: tuple) -> Any:
        return self.resolve(tuple(key))


def _dumps(obj: Any, links: dict[int, tuple]) -> tuple[bytes, set[tuple]]:
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, obj, links)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.used


def _loads(blob: bytes, resolve: Callable[[tuple], Any]) -> Any:
    return _Unpickler(io.BytesIO(blob), resolve).load()


def _adopt(local: Any, remote: Any) -> None:
    """Make ``local`` hold ``remote``'s state, keeping its locks, and its modules and optimizers
    (others hold references to them: the trainer's model is shard 0's dense module)."""
    for name, value in vars(remote).items():
        current = vars(local).get(name)
        if type(value) in _FRESH:
            continue
        if isinstance(current, nn.Module) and isinstance(value, nn.Module):
            current.load_state_dict(value.state_dict())
        elif isinstance(current, torch.optim.Optimizer) and isinstance(value, torch.optim.Optimizer):
            current.load_state_dict(value.state_dict())
        else:
            setattr(local, name, value)


# ---- proxies: what a moved object sees of the objects held by other actors -------------------------
class _Remote:
    """Stands for an object held by an actor: each method call is a (blocking) actor call."""

    def __init__(self, handle: Any, name: str, key: tuple):
        self._handle = handle
        self._name = name
        self._key = key

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return functools.partial(self._call, method)

    def _call(self, method: str, *args: Any) -> Any:
        return _unpack(ray.get(self._handle.call.remote(self._name, method, *_pack(args))))


class _TableShape:
    """What a ``ShardRouter`` reads of a remote shard's table."""

    def __init__(self, width: int):
        self.width = width


class _RemoteShard(_Remote):
    """A server shard in another actor. The verbs that return nothing (``push``, ``drop``,
    ``close_token``) are sent without waiting; any other call first waits for them, so one caller's
    verbs reach the shard in program order, as in a thread."""

    ONE_WAY = ("push", "drop", "close_token")

    def __init__(self, handle: Any, key: tuple):
        super().__init__(handle, "shard", key)
        self.table = _TableShape(key[2])
        self._pending: list = []  # one-way calls not yet known to be applied
        self._lock = threading.Lock()  # the coordinator's threads share its proxies

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method in self.ONE_WAY:
            return functools.partial(self._send, method)
        return super().__getattr__(method)

    @property
    def global_step(self) -> int:
        return self._call("global_step")

    def settle(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            ray.get(pending)

    def _send(self, method: str, *args: Any) -> None:
        with self._lock:
            self._pending.append(self._handle.call.remote(self._name, method, *_pack(args)))

    def _call(self, method: str, *args: Any) -> Any:
        self.settle()
        return super()._call(method, *args)


class _RemoteGate(NoGate):
    """A gate held by an actor; only the methods its class overrides are called remotely."""

    def __init__(self, handle: Any, active: tuple[str, ...]):
        self.handle = handle
        self.active = active

    def wait(self, worker, token):
        if "wait" in self.active:
            ray.get(self.handle.call.remote("gate", "wait", worker, token))

    def done(self, worker):
        if "done" in self.active:
            ray.get(self.handle.call.remote("gate", "done", worker))

    def leave(self, worker):
        if "leave" in self.active:
            ray.get(self.handle.call.remote("gate", "leave", worker))


# ---- the actors ---------------------------------------------------------------------------------------
class _Host:
    """An actor holding named objects (``shard``, ``gate``, ``data``, ``worker``) for one epoch."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.names: dict[tuple, str] = {}  # link key -> name of the object here that it stands for
        self.directory: dict[str, Any] = {}
        self.examples: dict[int, Any] = {}  # key -> the task (with its data), kept across epochs
        self.proxies: list[_RemoteShard] = []

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def load(self, name: str, blob: bytes, directory: dict[str, Any], key: tuple | None = None,
             examples: dict[int, list] | None = None, threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.directory = directory
        if examples is not None:  # [ref] in a list: Ray does not fetch it unless it is new here
            self.examples = {k: self.examples[k] if k in self.examples else _unpack(ray.get(box[0]), shared=True)
                             for k, box in examples.items()}
        self.objects[name] = _loads(blob, self._resolve)
        if key is not None:
            self.names[key] = name

    def call(self, name: str, method: str, *args: Any) -> Any:
        target = getattr(self.objects[name], method)
        return _pack(target(*_unpack(args)) if callable(target) else target)

    def run_worker(self, gate: NoGate, rng_state: Tensor) -> Tensor:
        """Run the worker; returns its torch generator's state (dropout draws from it)."""
        torch.set_rng_state(rng_state)
        try:
            self.objects["worker"].run(self._resolve(("data",)), gate)
        finally:
            self.settle()
        return torch.get_rng_state()

    def settle(self) -> None:
        """Wait until the one-way verbs this actor sent have been applied."""
        for proxy in self.proxies:
            proxy.settle()

    def dump(self, name: str) -> bytes:
        links = {id(self.objects[n]): key for key, n in self.names.items() if n in self.objects}
        links.update({id(examples): ("examples", k) for k, examples in self.examples.items()})
        return _dumps(self.objects[name], links)[0]

    def clear(self) -> None:
        self.objects.clear()
        self.names.clear()
        self.proxies.clear()

    def _resolve(self, key: tuple) -> Any:
        if key in self.names:
            return self.objects[self.names[key]]
        if key[0] == "shard":
            proxy = _RemoteShard(self.directory["shards"][key[1]], key)
            self.proxies.append(proxy)
            return proxy
        if key[0] == "examples":
            return self.examples[key[1]]
        if key[0] == "data":
            return _Remote(self.directory["coordinator"], "data", key)
        raise KeyError(f"unknown link {key}")


class ShardServer(_Host):
    """A server shard, and a gate that waits on it."""


class Coordinator(_Host):
    """The data list, and a gate that needs no shard."""


class Worker(_Host):
    """One task ``Worker`` (``cadence.runtime.worker``)."""


_ACTOR_CLASSES: dict[type, Any] = {}


def _actor(cls: type, concurrency: int, node: str) -> Any:
    """An actor of ``cls`` on ``node`` (an alive node: ``soft`` affinity is not reliably honoured).
    ``num_cpus=0``: actors never wait for a CPU (three 1-CPU actors on a 2-CPU node would leave one
    pending forever)."""
    if cls not in _ACTOR_CLASSES:
        _ACTOR_CLASSES[cls] = ray.remote(cls)
    options = {"num_cpus": 0, "max_concurrency": concurrency,
               "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
    return _ACTOR_CLASSES[cls].options(**options).remote()


def _nodes() -> list[str]:
    """The alive nodes that have CPUs (a head started with --num-cpus=0 is left alone), the driver's first."""
    alive = [node for node in ray.nodes() if node.get("Alive")]
    working = [node for node in alive if node.get("Resources", {}).get("CPU", 0) > 0] or alive
    here = ray.get_runtime_context().get_node_id()
    return sorted((node["NodeID"] for node in working), key=lambda node: (node != here, node))


class _Pool:
    """The actors of one driver connection, reused across epochs and runs."""

    def __init__(self, cluster: tuple, concurrency: int):
        self.cluster = cluster
        self.concurrency = concurrency
        self.shards: list[Any] = []
        self.coordinator: Any = None
        self.workers: dict[int, Any] = {}
        self.shared: dict[int, tuple[Any, int, Any]] = {}  # id(examples) -> (examples, key, ref)
        self.keys = itertools.count()
        self.placed = itertools.count()  # actors are dealt round-robin over the nodes, in creation order

    def _new(self, cls: type) -> Any:
        nodes = _nodes()
        return _actor(cls, self.concurrency, nodes[next(self.placed) % len(nodes)])

    def shard(self, index: int) -> Any:
        while len(self.shards) <= index:
            self.shards.append(self._new(ShardServer))
        return self.shards[index]

    def coordinate(self) -> Any:
        if self.coordinator is None:
            self.coordinator = self._new(Coordinator)
        return self.coordinator

    def worker(self, index: int) -> Any:
        if index not in self.workers:
            self.workers[index] = self._new(Worker)
        return self.workers[index]

    def share(self, datasets: list[Any]) -> dict[int, tuple[Any, Any]]:
        """key -> (examples, object ref) for each distinct data set, put into the object store once
        (its workers then read it zero-copy); a data set no longer used is released."""
        kept = {}
        for examples in datasets:
            entry = self.shared.get(id(examples))
            if entry is None or entry[0] is not examples:
                entry = (examples, next(self.keys), ray.put(_pack(examples)))
            kept[id(examples)] = entry
        self.shared = kept
        return {key: (examples, ref) for examples, key, ref in kept.values()}

    def dissolve(self) -> None:
        for handle in [*self.shards, self.coordinator, *self.workers.values()]:
            if handle is not None:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone, or its cluster is
                    pass
        self.shards, self.coordinator, self.workers, self.shared = [], None, {}, {}


_POOL: _Pool | None = None
_RUN_LOCK = threading.RLock()


def _cluster() -> tuple:
    context = ray.get_runtime_context()
    return context.gcs_address, context.get_job_id(), context.get_node_id()


def _pool(workers: int) -> _Pool:
    global _POOL
    cluster, concurrency = _cluster(), max(32, 3 * workers + 8)
    if _POOL is not None and _POOL.cluster != cluster:
        _POOL = None  # its actors ended with the connection that owned them
    if _POOL is not None and _POOL.concurrency < concurrency:
        _POOL.dissolve()
        _POOL = None
    if _POOL is None:
        _POOL = _Pool(cluster, concurrency)
    return _POOL


class _Epoch:
    """One epoch on the pool: place the objects, run the workers, bring the objects back."""

    def __init__(self, pool: _Pool, workers: list[TaskWorker], data: DataList, gate: NoGate):
        self.pool = pool
        self.workers = workers
        self.data = data
        self.gate = gate
        self.threads = _settings["threads"]
        shards = list(data.shards)
        self.directory = {"shards": [pool.shard(i) for i in range(len(shards))], "coordinator": pool.coordinate()}
        # link key -> the driver's object it stands for
        self.local: dict[tuple, Any] = {("shard", i, shard.table.width): shard for i, shard in enumerate(shards)}
        self.boxes = {}  # examples key -> [object ref], in a list so that Ray does not fetch it eagerly
        for key, (examples, ref) in pool.share([worker.task for worker in workers]).items():
            self.local[("examples", key)] = examples
            self.boxes[key] = [ref]
        self.local[("data",)] = data
        self.links = {id(obj): key for key, obj in self.local.items()}
        self.placed: list[tuple[Any, Any, str]] = []  # (the driver's object, the actor holding it, its name there)

    def run(self) -> None:
        self._place()
        self._run_workers(self._place_gate())
        self._bring_back()

    def _place(self) -> None:
        shards = [(key, obj) for key, obj in self.local.items() if key[0] == "shard"]
        loads = [self._load(shard, host, "shard", key)
                 for (key, shard), host in zip(shards, self.directory["shards"])]
        loads.append(self._load(self.data, self.directory["coordinator"], "data", ("data",)))
        loads += [self._load(worker, self.pool.worker(worker.index), "worker", examples=self.boxes)
                  for worker in self.workers]
        ray.get(loads)

    def _load(self, obj: Any, host: Any, name: str, key: tuple | None = None, examples: dict | None = None,
              blob: bytes | None = None) -> Any:
        self.placed.append((obj, host, name))
        blob = _dumps(obj, self.links)[0] if blob is None else blob
        return host.load.remote(name, blob, self.directory, key, examples, self.threads)

    def _place_gate(self) -> NoGate:
        """What the workers get as their gate. One that never waits travels by value; one that refers
        to a shard is held by that shard's actor (so it waits on the shard's own condition; placed
        after the shards), any other by the coordinator."""
        active = tuple(m for m in GATE_METHODS if getattr(type(self.gate), m) is not getattr(NoGate, m))
        if not active:
            return self.gate
        blob, used = _dumps(self.gate, self.links)
        on_shards = sorted(key[1] for key in used if key[0] == "shard")
        host = self.directory["shards"][on_shards[0]] if on_shards else self.directory["coordinator"]
        ray.get(self._load(self.gate, host, "gate", blob=blob))
        return _RemoteGate(host, active)

    def _run_workers(self, gate: NoGate) -> None:
        # Dropout draws from torch's default generator. A single worker continues this process's
        # stream and hands it back, exactly as a thread would; several get streams of their own,
        # seeded from it (threads would interleave draws from the one stream).
        if len(self.workers) == 1:
            states = [torch.get_rng_state()]
        else:
            seeds = torch.randint(0, 1 << 62, (len(self.workers),)).tolist()
            states = [torch.Generator().manual_seed(seed).get_state() for seed in seeds]
        runs = {self.pool.worker(w.index).run_worker.remote(gate, state): w
                for w, state in zip(self.workers, states)}
        while runs:
            ready, _ = ray.wait(list(runs), num_returns=1)
            for ref in ready:
                worker = runs.pop(ref)
                try:
                    state = ray.get(ref)
                except ray.exceptions.RayTaskError as err:
                    raise err.as_instanceof_cause() from None
                except ray.exceptions.RayActorError as err:
                    raise RuntimeError(f"ray engine: worker {worker.index}'s actor died ({err}); "
                                       "the epoch is abandoned") from err
                if len(self.workers) == 1:
                    torch.set_rng_state(state)

    def _bring_back(self) -> None:
        ray.get(self.directory["coordinator"].settle.remote())  # the data list's drops and closes are applied
        blobs = ray.get([host.dump.remote(name) for _, host, name in self.placed])
        for (obj, _, _), blob in zip(self.placed, blobs):
            _adopt(obj, _loads(blob, self.local.__getitem__))
        ray.get([host.clear.remote() for host in {id(host): host for _, host, _ in self.placed}.values()])
        for worker in self.workers:
            if worker.died:  # fault injection: its actor goes with it
                ray.kill(self.pool.workers.pop(worker.index), no_restart=True)
