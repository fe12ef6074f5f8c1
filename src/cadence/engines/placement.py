"""Where a protocol's roles run: in this process or as Ray actors, the same role code either way.

A *role* is a plain class (an AdaPM node, ...) whose public methods are its *verbs*. A
``Placement`` starts roles and hands back a ``Handle`` for each; a caller names a verb by the role's
method itself, never by a string (``handle.call(NodeRunner.round)``), so a renamed or mistyped verb
fails where it is written, and the code that drives the roles is written once for every engine:

- ``call(verb, *args)`` runs the verb and returns its result; ``start(verb, *args)`` runs it
  concurrently with the caller and returns a ``Pending``; ``Placement.each`` calls one verb on many
  roles (one after the other in this process, in parallel on Ray); ``Placement.as_completed``
  yields pendings as they finish, so a driver reports each role's result as it arrives.
- ``InProcess`` (``ps.engine: threads``): a role is an object of this process; ``call`` is a plain
  method call, ``start`` a thread of its own. ``Placement.share(thing)`` hands a role an object of
  the driver by reference (a callable reporting each batch live, the run's module).
- ``engines.ray.RayPlacement`` (``ps.engine: ray``): a role lives in an actor of its own, dealt
  round-robin over the cluster's nodes; tensors cross as numpy arrays (``engines.ray.pack``); a role
  gets its peers' handles and calls them the same way. Nothing is shared by reference:
  ``share(thing)`` is None there, and a role returns what it would have reported.

No strategy is named here.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Iterator



def verb_of(role: type, method: Callable) -> str:
    """The name of ``method``, checked to be a public method of ``role`` (a verb): what crosses a
    process boundary is this name, what the caller writes is the method itself."""
    name = getattr(method, "__name__", "")
    if not callable(method) or not name or name.startswith("_") or getattr(role, name, None) is not method:
        raise TypeError(f"{method!r} is not a verb of {role.__name__}")
    return name


class Pending(ABC):
    """A verb in flight."""

    @abstractmethod
    def result(self) -> Any:
        """Wait for the verb; its return value, or its exception raised here."""


def finish(pending: Pending) -> None:
    """Wait for a role told to stop (after another one failed, or Ctrl-C); its error is that
    failure's consequence, not news, and is dropped."""
    try:
        pending.result()
    except Exception:  # noqa: BLE001
        pass


class Handle(ABC):
    """A role started by a ``Placement``: ``call`` and ``start`` its verbs."""

    concurrent = False  # whether verbs started on several handles run at once (roles in other processes)

    def __init__(self, role: type, index: int):
        self.role = role  # the role's class
        self.index = index

    def verb(self, method: Callable) -> str:
        return verb_of(self.role, method)

    def call(self, method: Callable, *args: Any) -> Any:
        return self.start(method, *args).result()

    @abstractmethod
    def start(self, method: Callable, *args: Any) -> Pending: ...


class Placement(ABC):
    """Starts a protocol's roles somewhere (module docstring); built once per run."""

    start_seconds: float = 0.0  # spent starting the roles' processes
    # whether each role runs in a process of its own (nothing shared by reference: ``share`` is None)
    separate_processes: bool = False

    @abstractmethod
    def place(self, role: type, index: int, *args: Any, direct: bool = False, resource: str | None = None) -> Handle:
        """Start role ``index`` as ``role(*args)``; role ``i`` of a protocol goes where ``i`` falls.
        ``direct``: a role called often (per batch) is called over a channel of each caller's own
        where it runs in another process (``engines.channel``: tens of microseconds, not a Ray call's
        milliseconds); its calls from one process are then served one at a time. ``resource``: on a
        cluster, only the nodes that offer this custom resource (``ray start --resources``) are
        candidates (in one process there is nowhere else to go: ignored)."""

    def ready(self) -> None:
        """Wait until every role placed so far is built (setup, not the first epoch's time)."""

    @abstractmethod
    def ship(self, task) -> Callable[[], Any]:
        """What a role calls to get the run's task (in this process: the task itself; in an actor:
        the task built there from its recipe, reading its own data)."""

    def share(self, thing: Any) -> Any:
        """``thing`` itself where roles can use it by reference (a callable, the run's module), or
        None where it cannot reach them (another process)."""
        return thing

    @abstractmethod
    def each(self, handles: list[Handle], method: Callable, *args: Any) -> list[Any]:
        """``method(*args)`` on every role, results in ``handles`` order."""

    @abstractmethod
    def as_completed(self, pendings: Iterable[Pending]) -> Iterator[Pending]:
        """The pendings in the order they finish."""

    def fields(self) -> dict[str, Any]:
        """This placement's fields in summary.json."""
        return {}

    def close(self) -> None:
        """Stop every role this placement started."""


class _Done(Pending):
    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class _Thread(Pending):
    """A verb running on a thread of its own; it tells ``finished`` when it ends."""

    def __init__(self, run: Callable[[], Any], name: str, finished: "queue.Queue[_Thread]"):
        self.outcome: _Done | None = None
        self.finished = finished
        self.thread = threading.Thread(target=self._run, args=(run,), name=name, daemon=True)
        self.thread.start()

    def _run(self, run: Callable[[], Any]) -> None:
        try:
            self.outcome = _Done(run())
        except BaseException as err:  # raised on the caller's thread by ``result``
            self.outcome = _Done(error=err)
        self.finished.put(self)

    def result(self) -> Any:
        self.thread.join()
        return self.outcome.result()


class LocalHandle(Handle):
    def __init__(self, role: type, index: int, instance: Any, finished: "queue.Queue[_Thread]"):
        super().__init__(role, index)
        self.instance = instance  # the role object itself
        self._finished = finished

    def call(self, method: Callable, *args: Any) -> Any:
        return getattr(self.instance, self.verb(method))(*args)

    def start(self, method: Callable, *args: Any) -> Pending:
        bound = getattr(self.instance, self.verb(method))
        return _Thread(lambda: bound(*args), f"cadence-{self.role.__name__.lower()}-{self.index}", self._finished)


class InProcess(Placement):
    """Every role an object of this process (``ps.engine: threads``)."""

    def __init__(self, address: str | None = None, threads: int = 0):
        self._finished: "queue.Queue[_Thread]" = queue.Queue()

    def place(self, role: type, index: int, *args: Any, direct: bool = False, resource: str | None = None) -> Handle:
        return LocalHandle(role, index, role(*args), self._finished)  # (a method call: direct already)

    def ship(self, task) -> Callable[[], Any]:
        return lambda: task

    def each(self, handles: list[Handle], method: Callable, *args: Any) -> list[Any]:
        return [handle.call(method, *args) for handle in handles]

    def run(self, job: Callable[[], Any], name: str) -> Pending:
        """``job()`` on a thread of its own, as a pending ``as_completed`` takes (a role's threads)."""
        return _Thread(job, name, self._finished)

    def as_completed(self, pendings: Iterable[Pending]) -> Iterator[Pending]:
        waiting = set(pendings)
        for pending in list(waiting):
            if not isinstance(pending, _Thread):  # (finished when made)
                waiting.discard(pending)
                yield pending
        while waiting:
            pending = self._finished.get()
            if pending in waiting:
                waiting.discard(pending)
                yield pending
