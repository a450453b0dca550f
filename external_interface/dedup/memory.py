"""`MemoryDedup`: the in-process twin of the Redis store, for tests and single-process tools."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

from external_interface.dedup.base import (
    DedupBase,
    Id,
    Seen,
    Status,
    Value,
    _values,
    content_fp,
    id_bytes,
)


class MemoryDedup(DedupBase):
    """A dict-backed store with the same answers (128-bit keys: no practical collisions).

    For tests and single-process tools; forgets everything on exit. Ignores the Redis options
    so configuration can switch implementations without changing call sites.
    """

    def __init__(
        self, namespace: str = "", *, clock: Callable[[], float] = time.time, **_: object
    ) -> None:
        self.namespace = namespace
        self.clock = clock
        self._data: dict[bytes, tuple[int, int]] = {}  # key -> (first-seen hour, content fp)

    def check_many(self, ids: Sequence[Id], values: Sequence[Value] | None = None) -> list[Seen]:
        return self._run(False, False, ids, values)

    def mark_many(
        self, ids: Sequence[Id], values: Sequence[Value] | None = None, *, refresh: bool = False
    ) -> list[Seen]:
        return self._run(True, refresh, ids, values)

    def _run(
        self, mark: bool, refresh: bool, ids: Sequence[Id], values: Sequence[Value] | None
    ) -> list[Seen]:
        now = int(self.clock() // 3600)
        out = []
        for x, v in zip(ids, _values(ids, values), strict=True):
            k = hashlib.blake2b(id_bytes(x), digest_size=16).digest()
            cfp = content_fp(v)
            old = self._data.get(k)
            if old is None:
                out.append(Seen(Status.NEW))
                if mark:
                    self._data[k] = (now, cfp)
                continue
            hour, scfp = old
            st = Status.UNCHANGED if cfp in (0, scfp) else Status.CHANGED
            out.append(Seen(st, hour))
            if mark:
                self._data[k] = (now if refresh else hour, cfp if st is Status.CHANGED else scfp)
        return out

    def clear(self) -> None:
        self._data.clear()
