"""Name -> implementation registries, with "did you mean" errors (after kombu's transport aliases).

A name is registered once: a second registration (two sites' endpoints with one task name, a
provider name taken twice) is a `DuplicateNameError` naming both modules, instead of the last
import silently winning.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, LookupError):
    """Raised for a name no implementation was registered under."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        hint = difflib.get_close_matches(name, known, n=1)
        msg = f"unknown {kind} {name!r}"
        msg += (
            f"; did you mean {hint[0]!r}?"
            if hint
            else f"; known: {', '.join(sorted(known)) or 'none'}"
        )
        super().__init__(msg)
        self.kind, self.name = kind, name

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class DuplicateNameError(ValueError):
    """Raised for a name registered a second time; names the modules of both registrations."""

    def __init__(self, kind: str, name: str, first: str, second: str) -> None:
        super().__init__(f"{kind} {name!r} is registered twice: first by {first}, then by {second}")
        self.kind, self.name, self.first, self.second = kind, name, first, second


class Registry(Generic[T]):
    """A small mapping of names to implementations (classes or factories)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}  # name -> the module that registered it

    def register(self, name: str) -> Callable[[T], T]:
        origin = _caller_module(1)

        def deco(obj: T) -> T:
            self._put(name, obj, origin)
            return obj

        return deco

    def add(self, name: str, obj: T, *, origin: str | None = None) -> None:
        """Register `obj` as `name`; `origin` is the registering module (default: the caller)."""
        self._put(name, obj, origin or _caller_module(1))

    def _put(self, name: str, obj: T, origin: str) -> None:
        if name in self._items:
            raise DuplicateNameError(self.kind, name, self._origins[name], origin)
        self._items[name] = obj
        self._origins[name] = origin

    def remove(self, name: str) -> None:
        """Forget `name` (a test's own registration, when the test ends)."""
        self._items.pop(name, None)
        self._origins.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, list(self._items)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def names(self) -> list[str]:
        return sorted(self._items)


def _caller_module(depth: int) -> str:
    """The module of the function `depth` frames above the caller of this function."""
    return str(sys._getframe(depth + 1).f_globals.get("__name__", "?"))
