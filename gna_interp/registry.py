"""A registry of named entries, the one shape behind the head-kind registry (:mod:`gna_interp.models.registry`)
and the task-kind registry (:mod:`gna_interp.tasks.kinds`): lower-case names, registration order, one error type."""

from __future__ import annotations

import re
from typing import Any, Generic, TypeVar

from gna_interp.errors import GnaError

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Entries by name, in registration order; every refusal raises ``error`` and names ``what`` is registered
    (``"head kind"``, ``"task kind"``)."""

    def __init__(self, what: str, error: type[GnaError]) -> None:
        self.what, self.error = what, error
        self._entries: dict[str, T] = {}

    def add(self, name: Any, entry: T) -> T:
        """Register ``entry`` as ``name`` (lower case, not taken); returns ``entry``."""
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise self.error(f"a {self.what} needs a lower-case name, got {name!r}")
        if name in self._entries:
            raise self.error(f"{self.what} {name!r} is already registered ({self._entries[name]!r})")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Forget ``name``."""
        if self._entries.pop(name, None) is None:
            raise self.error(f"{self.what} {name!r} is not registered; registered: {self.names()}")

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def get(self, name: str) -> T:
        """The entry registered as ``name``; a clear error naming the registered ones for an unknown name."""
        try:
            return self._entries[name]
        except KeyError:
            raise self.error(f"unknown {self.what} {name!r}; registered: {self.names()}") from None

    def entries(self) -> list[T]:
        """The registered entries, in registration order."""
        return list(self._entries.values())
