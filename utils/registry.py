"""Name -> implementation registries, with "did you mean" errors (after kombu's transport aliases)."""

from __future__ import annotations

import difflib
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


class Registry(Generic[T]):
    """A small mapping of names to implementations (classes or factories)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        self._items[name] = obj

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
