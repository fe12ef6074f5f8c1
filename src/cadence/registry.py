"""One small registry per pluggable family (stores, strategies, scorers, datasets).

The name in a config is the registry key, so ``model.name: complex`` picks the class registered as
``"complex"``. Registration is a decorator beside the class::

    SCORERS = Registry("scorer")

    @SCORERS.register("complex")
    class ComplExScorer(Scorer): ...
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from cadence.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, key: str | None = None):
        self.kind = kind
        self.key = key  # the config key that names an entry (errors start with it)
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return add

    def unregister(self, name: str) -> T:
        """Remove an entry (a plug-in's ``register`` undone, e.g. at the end of a test)."""
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            hint = difflib.get_close_matches(name, self._entries, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            where = f"{self.key}: " if self.key else ""
            raise ConfigError(
                f"{where}unknown {self.kind} {name!r}{suggestion}; choose one of: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
