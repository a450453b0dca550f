"""The dedup interface (`Dedup`: check, mark, filter) and what every store shares: statuses,
id and content fingerprints."""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

import orjson

Id = str | bytes | int


Value = Any  # bytes / str are hashed as is; anything else as sorted-key JSON (orjson)


class Status(enum.IntEnum):
    NEW = 0
    UNCHANGED = 1
    CHANGED = 2


_STATUSES = (Status.NEW, Status.UNCHANGED, Status.CHANGED)


class Seen(NamedTuple):
    """One answer: the status and, unless NEW, the first-seen hour (hours since 1970, UTC)."""

    status: Status
    first_seen_hour: int | None = None

    @property
    def first_seen(self) -> datetime | None:
        if self.first_seen_hour is None:
            return None
        return datetime.fromtimestamp(self.first_seen_hour * 3600, tz=UTC)

    def age(self, now: float | None = None) -> timedelta | None:
        """Time since first seen, at hour resolution (the start of the first-seen hour)."""
        if self.first_seen_hour is None:
            return None
        now = time.time() if now is None else now
        return timedelta(hours=int(now // 3600) - self.first_seen_hour)


_NEW = Seen(Status.NEW)


class Dedup(Protocol):
    """What a chain step needs; `RedisDedup` is the default, `MemoryDedup` the in-process twin."""

    def check_many(self, ids: Sequence[Id], values: Sequence[Value] | None = None) -> list[Seen]:
        """Read-only: what each id is now."""
        ...

    def mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        """Record the ids (call after the items are durably stored); returns the prior state."""
        ...

    def filter_new(
        self,
        ids: Sequence[Id],
        values: Sequence[Value] | None = None,
        *,
        within: timedelta | None = None,
        changed: bool = True,
    ) -> list[Id]:
        """Read-only: the ids to (re)process (see `DedupBase.filter_new`)."""
        ...


def id_bytes(x: Id) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, int):
        return str(x).encode()
    raise TypeError(f"dedup ids are str, bytes or int, not {type(x).__name__}")


def value_bytes(value: Value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def content_fp(value: Value) -> int:
    """16-bit content fingerprint, 1..65535; 0 is reserved for "no value given"."""
    if value is None:
        return 0
    return 1 + int.from_bytes(hashlib.blake2b(value_bytes(value), digest_size=4).digest()) % 0xFFFF


class DedupBase:
    """Single-item and filtering helpers on top of the two batch methods."""

    clock: Callable[[], float]

    def check_many(self, ids: Sequence[Id], values: Sequence[Value] | None = None) -> list[Seen]:
        raise NotImplementedError

    def mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        raise NotImplementedError

    def check_and_mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        """Alias of `mark_many`, which is atomic check-and-mark per bucket."""
        return self.mark_many(ids, values, refresh=refresh)

    def check(self, id: Id, value: Value = None) -> Seen:
        return self.check_many([id], [value])[0]

    def mark(self, id: Id, value: Value = None, *, refresh: bool = False) -> Seen:
        return self.mark_many([id], [value], refresh=refresh)[0]

    def filter_new(
        self,
        ids: Sequence[Id],
        values: Sequence[Value] | None = None,
        *,
        within: timedelta | None = None,
        changed: bool = True,
    ) -> list[Id]:
        """The ids a step should (re)process, in order. Read-only: mark after storing.

        Keeps NEW ids; CHANGED ones if `changed`; and any other seen id first seen `within`
        or longer ago ("skip if seen within 7 days"). Ages are whole hours. With `mark_many(...,
        refresh=True)` the clock restarts at each mark, which makes `within` a re-crawl period.
        """
        now_h = int(self.clock() // 3600)
        keep: list[Id] = []
        for x, seen in zip(ids, self.check_many(ids, values), strict=True):
            st = seen.status
            if (
                st is Status.NEW
                or (st is Status.CHANGED and changed)
                or (
                    within is not None
                    and seen.first_seen_hour is not None
                    and timedelta(hours=now_h - seen.first_seen_hour) >= within
                )
            ):
                keep.append(x)
        return keep


def _values(ids: Sequence[Id], values: Sequence[Value] | None) -> Sequence[Value]:
    if values is None:
        return [None] * len(ids)
    if len(values) != len(ids):
        raise ValueError(f"{len(ids)} ids but {len(values)} values")
    return values
